//! The iwpeer driver in one process: a server and a client over soft-iWARP on 127.0.0.1 run
//! every op, driven by both ends, and report it through events (no CLI in between).

use std::time::Duration;

use tools::iwpeer::{self, ClientConfig, Drive, Event, Op, PeerConfig, PeerError, ServerConfig};
use verbs::ConnParams;

fn peer() -> PeerConfig {
    PeerConfig {
        params: ConnParams {
            ird: 1,
            ord: 1,
            ..ConnParams::default()
        },
        timeout: Duration::from_secs(30),
        nudge: Duration::from_secs(1),
    }
}

fn passed(events: &[Event]) -> Vec<&'static str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::OpPassed { op, .. } => Some(*op),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_and_client_drive_every_op() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let cfg = ServerConfig {
            size: 8192,
            peer: peer(),
        };
        let mut tx = Some(tx);
        let mut events = Vec::new();
        let mut on = |e: Event| {
            if let (Event::Listening(a), Some(tx)) = (&e, tx.take()) {
                let _ = tx.send(*a);
            }
            events.push(e);
        };
        let r = iwpeer::server("127.0.0.1:0".parse().unwrap(), &cfg, &mut on).await;
        (r, events)
    });
    let addr = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .unwrap()
        .unwrap();
    let cfg = ClientConfig {
        ops: vec![Op::Read, Op::Write, Op::Sendinv, Op::Send],
        size: 4093,
        iters: 2,
        drive: Drive::Both,
        peer: peer(),
    };
    let mut events = Vec::new();
    let r = iwpeer::client(addr, &cfg, &mut |e| events.push(e)).await;
    assert_eq!(r, Ok(0), "{events:?}");
    assert!(
        matches!(events.first(), Some(Event::Connected { crc: false, .. })),
        "{events:?}"
    );
    // The driver runs the ops in protocol order, whatever order they were given in.
    assert_eq!(passed(&events), ["send", "sendinv", "write", "read"]);
    let (sr, sev) = tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sr, Ok(0), "{sev:?}");
    assert_eq!(passed(&sev), ["send", "sendinv", "write", "read"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_beyond_the_limit_are_refused_before_any_io() {
    let cfg = ServerConfig {
        size: iwpeer::MAX_SIZE + 1,
        peer: peer(),
    };
    let r = iwpeer::server("127.0.0.1:0".parse().unwrap(), &cfg, &mut |_| {}).await;
    assert_eq!(r, Err(PeerError::Setup("size too large".into())));
}
