//! The drivers over real verbs: the in-memory loopback provider and soft-iWARP on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use oncrpc::{AcceptStat, CallRequest, ReplyExpectation, RpcError, RpcTransport};
use rpcrdma::engine::Config;
use rpcrdma::ulb::{InlineBinding, UpperLayerBinding};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use verbs::{Device, LoopbackFabric};

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn echo_req(tag: u32, data: Bytes, extra: Bytes, ddp: bool) -> CallRequest {
    let reply = ReplyExpectation {
        max_len: Some(64 + data.len() + extra.len()),
        ddp_items: if ddp { vec![data.len()] } else { vec![] },
    };
    CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(data.clone());
        e.put_opaque_bytes(extra.clone());
    })
    .with_reply(reply)
    .with_timeout(Duration::from_secs(20))
}

/// The echo program's binding, and one for a program the server does not run (so a bound
/// client can see PROG_UNAVAIL).
fn ulb_list() -> Vec<Arc<dyn UpperLayerBinding>> {
    vec![
        Arc::new(EchoUlb),
        Arc::new(InlineBinding::new(PROG + 1, 1..=1)),
    ]
}

async fn pair(
    device: Device,
    addr: SocketAddr,
    client: Config,
    server: Config,
) -> (RdmaServer, RdmaClient) {
    let scfg = TransportConfig {
        rpc: server,
        device: Some(device.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(addr, dispatcher(), ulb_list(), scfg)
        .await
        .unwrap();
    let ccfg = TransportConfig {
        rpc: client,
        device: Some(device),
        ..TransportConfig::default()
    };
    let cl = RdmaClient::connect_with(srv.local_addr(), ccfg, ulb_list(), None)
        .await
        .unwrap();
    (srv, cl)
}

async fn check_forms(cl: &RdmaClient) {
    // (data, extra, ddp): Short, Chunked (odd lengths), Long Call, Long Reply, both at once.
    let cases = [
        (10usize, 10usize, false),
        (4097, 3, true),
        (4099, 1, true),
        (8192, 0, true),
        (10, 6001, false),
        (9001, 5003, true),
        (100, 5, true),
    ];
    for (i, (d, x, ddp)) in cases.into_iter().enumerate() {
        let data = pattern(d, i as u8);
        let extra = pattern(x, 3);
        let got = cl
            .call(echo_req(i as u32, data.clone(), extra.clone(), ddp))
            .await
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(got, echo_results_bytes(i as u32, &data, &extra), "case {i}");
    }
    let s = cl.stats();
    assert!(
        s.short >= 1 && s.chunked >= 3 && s.long_call >= 2 && s.long_reply >= 2,
        "{s:?}"
    );
    assert_eq!(cl.live_registrations(), 0, "every registration fenced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_every_message_form() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let (_srv, cl) = pair(dev, "10.0.0.1:20049".parse().unwrap(), cfg_4k(), cfg_4k()).await;
    check_forms(&cl).await;
    assert!(cl.describe().starts_with("rdma://"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_iwarp_every_message_form() {
    let (_srv, cl) = pair(
        Device::soft_iwarp(),
        "127.0.0.1:0".parse().unwrap(),
        cfg_4k(),
        cfg_4k(),
    )
    .await;
    check_forms(&cl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_thousand_calls_with_32_credits() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let client = Config {
        credits: 128,
        ..cfg_4k()
    };
    let server = Config {
        credits: 32,
        ..cfg_4k()
    };
    let (srv, cl) = pair(dev, "10.0.0.2:20049".parse().unwrap(), client, server).await;
    let cl = Arc::new(cl);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let cl = cl.clone();
        set.spawn(async move {
            let data = pattern((i as usize * 37) % 6000, i as u8);
            let got = cl.call(echo_req(i, data.clone(), Bytes::new(), true)).await;
            (i, data, got)
        });
    }
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    while let Some(r) = tokio::time::timeout_at(deadline, set.join_next())
        .await
        .expect("no deadlock: all calls finish")
    {
        let (i, data, got) = r.unwrap();
        assert_eq!(got.unwrap(), echo_results_bytes(i, &data, &[]));
        n += 1;
    }
    assert_eq!(n, 1000);
    let s = cl.stats();
    assert_eq!(s.over_limit, 0);
    assert!(s.max_outstanding <= 32 && s.max_outstanding > 1, "{s:?}");
    let c = srv.counters();
    assert_eq!(c.over_credit.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(c.max_in_progress.load(std::sync::atomic::Ordering::Relaxed) <= 32);
    assert_eq!(cl.live_registrations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_error_paths() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let (_srv, cl) = pair(dev, "10.0.0.3:20049".parse().unwrap(), cfg_4k(), cfg_4k()).await;
    // A non-eligible item reduced into a Read chunk: GARBAGE_ARGS (the call is longer than the
    // 4 KiB inline threshold, so it is not sent whole).
    let bad = CallRequest::new(PROG, VERS, ECHO, |e| {
        e.put_u32(1);
        e.put_opaque(b"x");
        e.put_ddp_opaque(Bytes::from(vec![7u8; 6000]));
    })
    .with_reply(ReplyExpectation {
        max_len: Some(4000),
        ddp_items: vec![],
    });
    assert!(matches!(
        cl.call(bad).await,
        Err(RpcError::Accepted(AcceptStat::GarbageArgs))
    ));
    // Unknown program and procedure: RFC 5531 errors pass through.
    assert!(matches!(
        cl.call(CallRequest::null(PROG + 1, 1)).await,
        Err(RpcError::Accepted(AcceptStat::ProgUnavail))
    ));
    assert!(matches!(
        cl.call(CallRequest::new(PROG, VERS, 77, |_| {})).await,
        Err(RpcError::Accepted(AcceptStat::ProcUnavail))
    ));
    // The connection is still good.
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    assert_eq!(cl.live_registrations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_url_schemes() {
    assert!(
        rpcrdma::connect("udp://127.0.0.1:1", TransportConfig::default(), Vec::new())
            .await
            .is_err()
    );
    let srv = RdmaServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        dispatcher(),
        ulb_list(),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    let t = rpcrdma::connect(
        &format!("rdma://{}", srv.local_addr()),
        TransportConfig::default(),
        ulb_list(),
    )
    .await
    .unwrap();
    t.call(CallRequest::null(PROG, VERS)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_backchannel_interleaved_with_forward_calls() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let cfg = |credits| TransportConfig {
        rpc: Config {
            credits,
            back_credits: 2,
            ..cfg_4k()
        },
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(
        "10.0.0.4:20049".parse().unwrap(),
        dispatcher(),
        ulb_list(),
        cfg(32),
    )
    .await
    .unwrap();
    // The client offers a callback service (RFC 8167): a NULL-only program.
    let back =
        oncrpc::Dispatcher::new().with(Arc::new(oncrpc::null::NullProgram::new(0x4000_0000, 1, 1)));
    let cl = Arc::new(
        RdmaClient::connect_with(srv.local_addr(), cfg(64), ulb_list(), Some(back))
            .await
            .unwrap(),
    );
    // The first forward call guarantees the server has registered the connection.
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    let conns = srv.connections();
    assert_eq!(conns.len(), 1);
    let sc = conns[0].clone();
    // RFC 8167 §6: refused until the Upper Layer says the client is ready, and nothing
    // reaches the client.
    let early = sc
        .back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(5))
        .await;
    assert!(
        matches!(&early, Err(RpcError::Transport(s)) if s.contains("not enabled the backward direction")),
        "{early:?}"
    );
    // The forward call after it is answered only after anything sent before it (one
    // connection, in order), so a backward call sent by mistake would be counted by now.
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    assert_eq!(cl.stats().back_calls, 0);
    sc.enable_backchannel();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50u32 {
        let cl = cl.clone();
        set.spawn(async move {
            let data = pattern((i as usize * 101) % 5000, i as u8);
            let got = cl
                .call(echo_req(i, data.clone(), Bytes::new(), true))
                .await
                .unwrap();
            assert_eq!(got, echo_results_bytes(i, &data, &[]));
        });
        let sc = sc.clone();
        set.spawn(async move {
            let r = sc
                .back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(20))
                .await;
            assert_eq!(r.unwrap(), Bytes::new());
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    while let Some(r) = tokio::time::timeout_at(deadline, set.join_next())
        .await
        .expect("no deadlock")
    {
        r.unwrap();
    }
    // An unknown callback program is answered by the client's dispatcher.
    assert!(matches!(
        sc.back_call(0x4000_0001, 1, 0, |_| {}, Duration::from_secs(5))
            .await,
        Err(RpcError::Accepted(AcceptStat::ProgUnavail))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_url_tcp() {
    let srv = oncrpc::TcpServer::bind(
        "127.0.0.1:0",
        Arc::new(dispatcher()),
        oncrpc::ServerConfig::default(),
    )
    .await
    .unwrap();
    let t = rpcrdma::connect(
        &format!("tcp://{}", srv.local_addr()),
        TransportConfig::default(),
        Vec::new(),
    )
    .await
    .unwrap();
    let data = pattern(5000, 1);
    let got = t
        .call(echo_req(5, data.clone(), Bytes::new(), true))
        .await
        .unwrap();
    assert_eq!(got, echo_results_bytes(5, &data, &[]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_reconnect_after_server_disconnect() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let (srv, cl) = pair(dev, "10.0.0.5:20049".parse().unwrap(), cfg_4k(), cfg_4k()).await;
    let cl = Arc::new(cl);
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    // Five calls held inside the server while the connection drops.
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let cl = cl.clone();
        set.spawn(async move { cl.call(CallRequest::new(PROG, VERS, HOLD, |_| {})).await });
    }
    let calls = || {
        srv.counters()
            .calls
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    for _ in 0..2000 {
        if calls() >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(calls(), 6, "the held calls reached the program");
    let sent_before = cl.stats().sent;
    srv.connections()[0].disconnect().await;
    // Let every held call (and any retransmission) finish.
    HOLD_GATE.add_permits(100);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    while let Some(r) = tokio::time::timeout_at(deadline, set.join_next())
        .await
        .expect("every call ends")
    {
        match r.unwrap() {
            Ok(_) => {}
            // RFC 8166 §4.5.3: a reply lost to the broken connection is answered with
            // RDMA_ERR_CHUNK when the call is retransmitted.
            Err(RpcError::RdmaErrChunk) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(cl.reconnects(), 1);
    assert!(
        cl.stats().sent >= sent_before + 5,
        "outstanding calls were retransmitted"
    );
    // The client works on the new connection.
    let data = pattern(7000, 9);
    let got = cl
        .call(echo_req(99, data.clone(), Bytes::new(), true))
        .await
        .unwrap();
    assert_eq!(got, echo_results_bytes(99, &data, &[]));
    assert_eq!(cl.live_registrations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_with_an_inline_binding_never_reduces() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let tc = TransportConfig {
        device: Some(dev.clone()),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind(
        "10.0.0.6:20049".parse().unwrap(),
        dispatcher(),
        ulb_list(),
        tc.clone(),
    )
    .await
    .unwrap();
    // The client's binding for the echo program makes nothing DDP-eligible: the item the
    // caller marks travels inline (or in a Position-Zero chunk when long), and no Write chunk
    // is offered although the caller lists a DDP-eligible result.
    let inline: Arc<dyn UpperLayerBinding> = Arc::new(InlineBinding::new(PROG, VERS..=VERS));
    let cl = RdmaClient::connect(srv.local_addr(), tc, vec![inline])
        .await
        .unwrap();
    for n in [100usize, 2000, 9000] {
        let data = pattern(n, 4);
        let got = cl
            .call(echo_req(1, data.clone(), Bytes::new(), true))
            .await
            .unwrap();
        assert_eq!(got, echo_results_bytes(1, &data, &[]));
    }
    let s = cl.stats();
    assert_eq!((s.chunked, s.write_chunk_calls), (0, 0), "{s:?}");
    assert!(s.long_call >= 1);
}

/// RFC 8166 §6: "Each RPC Program and Version tuple that utilizes RPC-over-RDMA version 1
/// needs to have a ULB specification." Over the verbs driver: the refused calls
/// fail with `NoBinding` and never reach the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refuses_programs_without_a_binding() {
    let fabric = LoopbackFabric::new();
    let dev = Device::loopback(&fabric);
    let (srv, cl) = pair(
        dev.clone(),
        "10.0.0.7:20049".parse().unwrap(),
        cfg_4k(),
        cfg_4k(),
    )
    .await;
    let calls = || {
        srv.counters()
            .calls
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    assert_eq!(calls(), 1);
    // A program the client has no binding for (a sent call would come back PROG_UNAVAIL) and
    // a version the echo binding does not cover (PROG_MISMATCH).
    for (prog, vers) in [(PROG + 2, 1), (PROG, VERS + 1)] {
        let r = cl.call(CallRequest::null(prog, vers)).await;
        assert!(
            matches!(r, Err(RpcError::NoBinding { prog: p, vers: v }) if (p, v) == (prog, vers)),
            "{r:?}"
        );
    }
    let data = pattern(5000, 1);
    let r = cl
        .call(CallRequest::new(PROG + 2, 1, ECHO, move |e| {
            e.put_ddp_opaque(data.clone());
        }))
        .await;
    assert!(matches!(r, Err(RpcError::NoBinding { .. })), "{r:?}");
    let s = cl.stats();
    assert_eq!((s.sent, s.no_binding), (1, 3), "{s:?}");
    assert_eq!(cl.live_registrations(), 0);
    // A client with no binding at all sends nothing.
    let bare = RdmaClient::connect(
        srv.local_addr(),
        TransportConfig {
            device: Some(dev),
            ..TransportConfig::default()
        },
        Vec::new(),
    )
    .await
    .unwrap();
    assert!(matches!(
        bare.call(CallRequest::null(PROG, VERS)).await,
        Err(RpcError::NoBinding { .. })
    ));
    assert_eq!(bare.stats().sent, 0);
    cl.call(CallRequest::null(PROG, VERS)).await.unwrap();
    assert_eq!(calls(), 2, "only the two bound calls reached the server");
}
