//! `RdmaServer::quiesce` through the drivers, over soft-iWARP on 127.0.0.1: calls executing
//! when it begins are answered before their connection closes, calls sent after it began are
//! dropped unanswered and counted, and the report says so.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use oncrpc::{CallRequest, ReplyExpectation, RpcTransport};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use verbs::Device;

const HELD: usize = 8;
const LATE: usize = 4;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

/// An ECHO call of `n` DDP-eligible bytes: a Read chunk there, a Write chunk back.
fn echo(tag: u32, n: usize) -> (CallRequest, Bytes) {
    let data = pattern(n, tag as u8);
    let d = data.clone();
    let req = CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(d.clone());
        e.put_opaque_bytes(Bytes::new());
    })
    .with_reply(ReplyExpectation {
        max_len: Some(n + 64),
        ddp_items: vec![n],
    })
    .with_timeout(Duration::from_secs(30));
    (req, echo_results_bytes(tag, &data, &[]))
}

/// Poll `f` (bounded) until it holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waited too long for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiesce_answers_the_calls_under_way_and_drops_later_ones() {
    let dev = Device::soft_iwarp();
    let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let scfg = TransportConfig {
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = Arc::new(
        RdmaServer::bind(local, dispatcher(), vec![Arc::new(EchoUlb)], scfg)
            .await
            .unwrap(),
    );
    let ccfg = TransportConfig {
        device: Some(dev),
        reconnect_attempts: 0,
        ..TransportConfig::default()
    };
    let cl = Arc::new(
        RdmaClient::connect_with(srv.local_addr(), ccfg, vec![Arc::new(EchoUlb)], None)
            .await
            .unwrap(),
    );
    // The connection works: a 64 KiB echo both ways.
    let (req, want) = echo(1, 64 << 10);
    assert!(cl.call(req).await.unwrap() == want);
    let conn = srv.connections().pop().expect("one connection");

    // HELD calls the program holds until it is given permits.
    let held: Vec<_> = (0..HELD)
        .map(|_| {
            let cl = cl.clone();
            tokio::spawn(async move {
                cl.call(
                    CallRequest::new(PROG, VERS, HOLD_Q, |_| {})
                        .with_timeout(Duration::from_secs(30)),
                )
                .await
            })
        })
        .collect();
    until("the held calls to execute", || {
        conn.stats().in_progress == HELD as u32
    })
    .await;

    let quiesce = tokio::spawn({
        let srv = srv.clone();
        async move { srv.quiesce(Instant::now() + Duration::from_secs(30)).await }
    });
    until("the quiesce to begin", || conn.quiescing()).await;
    // Calls sent from now on are dropped (64 KiB echoes: their Read chunks are never pulled).
    let late: Vec<_> = (0..LATE)
        .map(|i| {
            let cl = cl.clone();
            let (req, _) = echo(100 + i as u32, 64 << 10);
            tokio::spawn(async move { cl.call(req).await })
        })
        .collect();
    until("the late calls to be dropped", || {
        conn.stats().quiesce_dropped == LATE as u64
    })
    .await;
    assert!(
        !quiesce.is_finished(),
        "the held calls are not answered yet"
    );

    HOLD_Q_GATE.add_permits(HELD);
    let report = quiesce.await.unwrap();
    assert_eq!(report.connections.len(), 1, "{report:?}");
    let c = &report.connections[0];
    assert!(c.drained && report.drained(), "{report:?}");
    assert_eq!((c.calls_at_start, c.answered), (HELD as u32, HELD as u32));
    assert_eq!(c.dropped, LATE as u64);
    assert!(c.left.is_empty() && c.left_unposted == 0 && !c.left_sends);
    assert!(!c.closed_early);
    for h in held {
        h.await
            .unwrap()
            .expect("a held call is answered before the close");
    }
    for l in late {
        let r = tokio::time::timeout(Duration::from_secs(30), l)
            .await
            .expect("a dropped call ends when the connection closes")
            .unwrap();
        assert!(r.is_err(), "a dropped call got a reply: {r:?}");
    }
    // Nothing is accepted any more.
    let again = RdmaClient::connect_with(
        srv.local_addr(),
        TransportConfig {
            reconnect_attempts: 0,
            ..TransportConfig::default()
        },
        vec![Arc::new(EchoUlb)],
        None,
    )
    .await;
    assert!(again.is_err(), "a quiesced server accepted a connection");
}
