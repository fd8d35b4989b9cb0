//! Many NULL calls kept in flight on one soft-iWARP connection (what `oxrdma rpc bench`
//! does): every call succeeds, the connection is never re-established, and no call needs a
//! Reply chunk.

use std::sync::Arc;

use oncrpc::{Dispatcher, RpcClient, null_program};
use rpcrdma::ulb::InlineBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

const PROG: u32 = 0x2000_0099;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_null_calls_depth_16() {
    let d = Dispatcher::new().with(null_program(PROG, 1, 1));
    let srv = RdmaServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        d,
        Vec::new(),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    let cl = Arc::new(
        RdmaClient::connect(
            srv.local_addr(),
            TransportConfig::default(),
            // RFC 8166 §6: the program needs a binding; NULL has nothing DDP-eligible.
            vec![Arc::new(InlineBinding::new(PROG, 1..=1))],
        )
        .await
        .unwrap(),
    );
    let rpc = RpcClient::new(cl.clone(), PROG, 1);
    rpc.null().await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..16 {
        let rpc = rpc.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                if let Err(e) = rpc.null().await {
                    return Err(format!("worker {w} call {i}: {e}"));
                }
            }
            Ok(())
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            failures.push(e);
        }
    }
    assert_eq!(cl.reconnects(), 0, "stats {:?}; {failures:?}", cl.stats());
    assert!(failures.is_empty(), "{failures:?}; stats {:?}", cl.stats());
    assert_eq!(
        srv.counters()
            .calls
            .load(std::sync::atomic::Ordering::Relaxed),
        1601
    );
    // NULL returns no results (RFC 5531 §12.1): its reply always fits inline, so no call
    // offered a Reply chunk even though no bound was given.
    let s = cl.stats();
    assert_eq!((s.short, s.long_reply), (1601, 0), "{s:?}");
    // Every answered call's round-trip time (transmission to reply), under NULL.
    let rtt = oncrpc::RpcTransport::rtt(&*cl)
        .expect("the RDMA client measures round-trip times")
        .snapshot();
    assert_eq!(rtt.count(), 1601);
    assert_eq!(rtt.count_of((PROG, 1, 0)), 1601);
}
