//! The server's memory budget against clients that ask for more than it allows (issue 20):
//! calls whose Read chunks would take the server past its budget wait for memory instead of
//! allocating it, a connection whose receive buffers do not fit is refused, a well-behaved
//! client on another connection keeps being served, and a closed connection gives its memory
//! back at once. Over soft-iWARP on 127.0.0.1; assertions read the budget's own counters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use oncrpc::{CallRequest, MemoryBudget, ReplyExpectation, RpcError, RpcTransport};
use rpcrdma::engine::Config;
use rpcrdma::ulb::UpperLayerBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use verbs::Device;

fn echo_req(tag: u32, data: Bytes) -> CallRequest {
    let reply = ReplyExpectation {
        max_len: Some(64 + data.len()),
        ddp_items: vec![data.len()],
    };
    CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(data.clone());
        e.put_opaque_bytes(Bytes::new());
    })
    .with_reply(reply)
    .with_timeout(Duration::from_secs(60))
}

fn ulb_list() -> Vec<Arc<dyn UpperLayerBinding>> {
    vec![Arc::new(EchoUlb)]
}

async fn server(budget: Arc<MemoryBudget>) -> RdmaServer {
    server_with(budget, TransportConfig::default().rdma_timeout).await
}

/// A server whose calls wait up to `rdma_timeout` for memory and for their RDMA Reads.
async fn server_with(budget: Arc<MemoryBudget>, rdma_timeout: Duration) -> RdmaServer {
    let cfg = TransportConfig {
        rdma_timeout,
        rpc: Config {
            credits: 32,
            ..cfg_4k()
        },
        device: Some(Device::soft_iwarp()),
        budget: Some(budget),
        ..TransportConfig::default()
    };
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    RdmaServer::bind(addr, dispatcher(), ulb_list(), cfg)
        .await
        .unwrap()
}

async fn client(srv: &RdmaServer) -> Result<RdmaClient, rpcrdma::driver::DriverError> {
    let cfg = TransportConfig {
        rpc: Config {
            credits: 32,
            ..cfg_4k()
        },
        device: Some(Device::soft_iwarp()),
        reconnect_attempts: 0,
        ..TransportConfig::default()
    };
    RdmaClient::connect_with(srv.local_addr(), cfg, ulb_list(), None).await
}

/// Wait (bounded) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_chunks_beyond_the_budget_wait_and_the_budget_holds() {
    // 6 MiB for the server, 5 MiB per connection: 32 calls of 1 MiB in flight would need
    // 32 MiB of sinks.
    let budget = MemoryBudget::new(6 << 20, 5 << 20);
    let srv = server(budget.clone()).await;
    let greedy = Arc::new(client(&srv).await.unwrap());
    let baseline = budget.used();
    assert!(baseline > 0, "the connection's receive buffers are counted");
    let data = Bytes::from(vec![0x5a; 1 << 20]);
    let mut set = tokio::task::JoinSet::new();
    for tag in 0..32 {
        let (c, d) = (greedy.clone(), data.clone());
        set.spawn(async move { c.call(echo_req(tag, d)).await });
    }
    // Meanwhile a well-behaved client on another connection is served.
    let polite = client(&srv).await.unwrap();
    let small = Bytes::from(vec![7u8; 100]);
    for tag in 0..5 {
        let got = polite.call(echo_req(tag, small.clone())).await.unwrap();
        assert_eq!(got, echo_results_bytes(tag, &small, &[]));
    }
    let mut ok = 0;
    while let Some(r) = set.join_next().await {
        r.unwrap()
            .expect("every greedy call completes, queued behind the budget");
        ok += 1;
    }
    assert_eq!(ok, 32);
    assert!(
        budget.peak() <= budget.limit(),
        "peak {} over limit {}",
        budget.peak(),
        budget.limit()
    );
    assert!(
        budget.refusals() > 0,
        "some calls had to wait for memory (the test would not show the bound otherwise)"
    );
    // Both connections close: everything comes back, at once.
    drop(polite);
    drop(set);
    drop(Arc::try_unwrap(greedy).ok());
    eventually("memory returned after the connections closed", || {
        budget.used() == 0
    })
    .await;
    assert_eq!(budget.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_receive_buffers_do_not_fit_is_refused() {
    // Room for one connection's receive buffers (32 credits of 4 KiB, and a few more), not two.
    let budget = MemoryBudget::new(200 << 10, 200 << 10);
    let srv = server(budget.clone()).await;
    let first = client(&srv).await.expect("the first connection fits");
    let second = client(&srv).await;
    assert!(
        second.is_err(),
        "the second connection is refused, not accepted beyond the budget"
    );
    assert!(budget.refusals() >= 1);
    assert!(budget.peak() <= budget.limit());
    // The first one is still served.
    let d = Bytes::from_static(b"still here");
    assert_eq!(
        first.call(echo_req(1, d.clone())).await.unwrap(),
        echo_results_bytes(1, &d, &[])
    );
    drop(first);
    eventually("memory returned", || budget.used() == 0).await;
    // With the room back, a new connection is accepted.
    let third = client(&srv).await.expect("accepted once memory came back");
    assert_eq!(
        third.call(echo_req(2, d.clone())).await.unwrap(),
        echo_results_bytes(2, &d, &[])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_memory_ends_when_its_connection_closes() {
    // Issue 20. A call whose Read chunk needs memory the budget does not have waits for it;
    // its connection closes meanwhile. The call ends with the connection: it neither keeps the
    // connection's share (and its receive buffers' reservation) until its wait runs out, nor
    // is given memory later to post RDMA Reads on a queue pair nobody routes completions of
    // any more, where its wait and its reservation would never end.
    let budget = MemoryBudget::new(4 << 20, 4 << 20);
    // No deadline of the server's ends the wait within this test.
    let srv = server_with(budget.clone(), Duration::from_secs(3600)).await;
    let c = Arc::new(client(&srv).await.unwrap());
    eventually("the connection counted", || budget.connections() == 1).await;
    // Everything the connection's receive buffers left is held elsewhere.
    let other = budget.connection();
    let hog = other.try_reserve(budget.limit() - budget.used()).unwrap();
    let refusals = budget.refusals();
    let call = {
        let c = c.clone();
        tokio::spawn(async move { c.call(echo_req(1, Bytes::from(vec![0x33; 1 << 20]))).await })
    };
    eventually("the call waits for memory", || budget.refusals() > refusals).await;
    assert!(!call.is_finished());
    // The client goes away.
    c.disconnect().await;
    assert!(call.await.unwrap().is_err(), "the call is not answered");
    drop(c);
    eventually("the closed connection released", || {
        budget.connections() == 1
    })
    .await;
    assert_eq!(
        budget.used(),
        hog.bytes(),
        "nothing held for the closed connection"
    );
    // The memory comes back: nothing of the closed connection takes it.
    drop(hog);
    assert_eq!(budget.used(), 0);
    drop(other);
    assert_eq!(budget.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_call_on_a_closed_connection_ends_at_once() {
    // Issue 20, the backward direction: a call made through a handle on a connection that has
    // closed is refused (or ended by the close), not left waiting for a deadline no timer
    // watches any more, holding the connection's share.
    let budget = MemoryBudget::new(4 << 20, 4 << 20);
    let srv = server_with(budget.clone(), Duration::from_secs(3600)).await;
    let back =
        oncrpc::Dispatcher::new().with(Arc::new(oncrpc::null::NullProgram::new(0x4000_0000, 1, 1)));
    let cfg = TransportConfig {
        rpc: Config {
            credits: 32,
            ..cfg_4k()
        },
        device: Some(Device::soft_iwarp()),
        reconnect_attempts: 0,
        ..TransportConfig::default()
    };
    let c = RdmaClient::connect_with(srv.local_addr(), cfg, ulb_list(), Some(back))
        .await
        .unwrap();
    // A forward call: the server has registered the connection by its reply.
    c.call(CallRequest::null(PROG, VERS)).await.unwrap();
    let sc = srv.connections().pop().expect("the connection");
    sc.enable_backchannel();
    assert_eq!(
        sc.back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(60))
            .await
            .unwrap(),
        Bytes::new()
    );
    c.disconnect().await;
    drop(c);
    eventually("the server saw the connection close", || {
        srv.connections().is_empty()
    })
    .await;
    // The caller's own timeout is an hour; the bound here only keeps a failure finite.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        sc.back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(3600)),
    )
    .await
    .expect("a backward call on a closed connection ends");
    assert!(matches!(r, Err(RpcError::Closed)), "{r:?}");
    // The handle was all that held the connection: its memory is back with it.
    drop(sc);
    eventually("the closed connection released", || {
        budget.connections() == 0
    })
    .await;
    assert_eq!(budget.used(), 0);
}
