//! Responder-provided Read chunks through the drivers over soft-iWARP on 127.0.0.1: the
//! client (read-chunk reply mode) sends calls with no Write or Reply chunk, the server returns
//! large replies as Position-Zero Read chunks, the client pulls them with RDMA Read, and its
//! pull-completion notification (by Send With Invalidate) lets the server invalidate them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use oncrpc::{CallRequest, ReplyExpectation, RpcTransport};
use rpcrdma::engine::Config;
use rpcrdma::rrc::{ReplyMode, RrcConfig};
use rpcrdma::version::{Version, VersionPolicy};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use verbs::Device;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn rrc(mode: ReplyMode) -> RrcConfig {
    RrcConfig {
        enabled: true,
        reply_mode: mode,
        ..RrcConfig::default()
    }
}

async fn pair(server_rrc: bool, mode: Option<ReplyMode>) -> (RdmaServer, RdmaClient) {
    let dev = Device::soft_iwarp();
    let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let scfg = TransportConfig {
        rpc: Config {
            max_version: Version::V2,
            rrc: RrcConfig {
                enabled: server_rrc,
                ..RrcConfig::default()
            },
            ..cfg_4k()
        },
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(local, dispatcher(), vec![Arc::new(EchoUlb)], scfg)
        .await
        .unwrap();
    let ccfg = TransportConfig {
        rpc: Config {
            version_policy: VersionPolicy::V2,
            rrc: mode.map(rrc).unwrap_or_default(),
            ..cfg_4k()
        },
        device: Some(dev),
        ..TransportConfig::default()
    };
    let cl = RdmaClient::connect_with(srv.local_addr(), ccfg, vec![Arc::new(EchoUlb)], None)
        .await
        .unwrap();
    (srv, cl)
}

async fn echo(cl: &RdmaClient, tag: u32, d: usize, x: usize) -> Result<(), oncrpc::RpcError> {
    let data = pattern(d, tag as u8);
    let extra = pattern(x, 3);
    let reply = ReplyExpectation {
        max_len: Some(64 + d + x),
        ddp_items: vec![d],
    };
    let (dd, xx) = (data.clone(), extra.clone());
    let req = CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(dd.clone());
        e.put_opaque_bytes(xx.clone());
    })
    .with_reply(reply)
    .with_timeout(Duration::from_secs(20));
    let got = cl.call(req).await?;
    assert!(
        got == echo_results_bytes(tag, &data, &extra),
        "tag {tag}: not bit-exact"
    );
    Ok(())
}

/// Wait (bounded) until the server's chunks are all notified and invalidated.
async fn settled(srv: &RdmaServer) -> rpcrdma::responder::ResponderStats {
    let conn = srv.connections().pop().expect("a connection");
    for _ in 0..500 {
        if conn.rrc_waiting() == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(conn.rrc_waiting(), (0, 0), "every chunk notified");
    conn.stats()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_replies_come_back_through_responder_read_chunks() {
    let (srv, cl) = pair(true, Some(ReplyMode::ReadChunk)).await;
    echo(&cl, 1, 8, 8).await.unwrap();
    let sizes = [
        (10usize, 10usize),
        (4097, 3),
        (0, 6001),
        (65_536, 0),
        (1 << 20, 5),
        ((1 << 20) + 3, 0),
    ];
    for (i, (d, x)) in sizes.into_iter().enumerate() {
        echo(&cl, 10 + i as u32, d, x)
            .await
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
    }
    let s = cl.stats();
    assert_eq!(s.rrc_pulls, 5, "{s:?}");
    assert_eq!(s.rrc_notifications, 5);
    assert_eq!(
        s.rrc_notified_by_invalidate, 5,
        "both sides allow remote invalidation"
    );
    assert_eq!(cl.live_registrations(), 0);
    let r = settled(&srv).await;
    assert_eq!((r.rrc_replies, r.rrc_notified), (5, 5), "{r:?}");
    assert_eq!(r.rrc_remote_invalidated, 5);
    // Each chunk was held in the server's memory budget until its notification: the peak
    // covers a 1 MiB chunk, and once they are invalidated none of it is held.
    let b = srv.budget();
    assert!(b.peak() >= 1 << 20, "peak {}", b.peak());
    let idle = b.used();
    assert!(idle < 1 << 20, "still held: {idle}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_a_chunk_beyond_the_memory_budget_is_refused() {
    // A connection's share of a 4 MiB budget is 4 MiB (the floor). An ECHO of 3 MiB: the
    // server holds the call's 3 MiB Read chunk while it builds the reply, so the reply's 3 MiB
    // Read chunk does not fit beside it: refused (RDMA2_ERR_SYSTEM), the call fails at once,
    // and the connection goes on.
    let dev = Device::soft_iwarp();
    let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let scfg = TransportConfig {
        rpc: Config {
            max_version: Version::V2,
            max_call_size: 8 << 20,
            rrc: RrcConfig {
                enabled: true,
                ..RrcConfig::default()
            },
            ..cfg_4k()
        },
        device: Some(dev.clone()),
        budget: Some(oncrpc::MemoryBudget::with_limit(4 << 20)),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(local, dispatcher(), vec![Arc::new(EchoUlb)], scfg)
        .await
        .unwrap();
    let ccfg = TransportConfig {
        rpc: Config {
            version_policy: VersionPolicy::V2,
            max_call_size: 8 << 20,
            rrc: rrc(ReplyMode::ReadChunk),
            ..cfg_4k()
        },
        device: Some(dev),
        ..TransportConfig::default()
    };
    let cl = RdmaClient::connect_with(srv.local_addr(), ccfg, vec![Arc::new(EchoUlb)], None)
        .await
        .unwrap();
    echo(&cl, 1, 8, 8).await.unwrap();
    echo(&cl, 2, 0, 100_000).await.unwrap();
    match echo(&cl, 3, 0, 3 << 20).await {
        Err(oncrpc::RpcError::Transport(m)) => assert!(m.contains("System"), "{m}"),
        other => panic!("expected RDMA2_ERR_SYSTEM, got {other:?}"),
    }
    echo(&cl, 4, 0, 100_000).await.unwrap();
    assert_eq!(cl.stats().rrc_pulls, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_without_the_capability_nothing_changes() {
    // The server has it, the client does not ask: Write and Reply chunks as before.
    let (srv, cl) = pair(true, None).await;
    for (i, (d, x)) in [(9000usize, 0usize), (0, 7000), (1 << 20, 0)]
        .into_iter()
        .enumerate()
    {
        echo(&cl, i as u32, d, x).await.unwrap();
    }
    assert_eq!(cl.stats().rrc_pulls, 0);
    let conn = srv.connections().pop().unwrap();
    assert_eq!(conn.stats().rrc_replies, 0);
}
