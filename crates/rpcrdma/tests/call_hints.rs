//! What the RPC-over-RDMA server tells a program about a call's neighbours
//! (`oncrpc::CallHints`), over soft-iWARP on 127.0.0.1: a call is alone when the Responder
//! holds no other call of its connection, and not alone while one executes
//! (`oncrpc::testing::check_alone_hints`).

use std::sync::Arc;

use oncrpc::testing::{HintProbe, check_alone_hints};
use oncrpc::{Dispatcher, RpcClient};
use rpcrdma::ulb::InlineBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

const PROG: u32 = 0x2000_00a2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_alone_only_while_no_other_call_of_its_connection_executes() {
    let probe = HintProbe::new(PROG);
    let srv = RdmaServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Dispatcher::new().with(probe.clone()),
        Vec::new(),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    let addr = srv.local_addr();
    check_alone_hints(&probe, || async move {
        let t = RdmaClient::connect(
            addr,
            TransportConfig::default(),
            vec![Arc::new(InlineBinding::new(PROG, 1..=1))],
        )
        .await
        .unwrap();
        RpcClient::new(Arc::new(t), PROG, 1)
    })
    .await;
}
