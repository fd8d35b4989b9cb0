//! What the TCP server tells a program about a call's neighbours (`CallHints`): a call is
//! alone when no other call of its connection is executing, and not alone while one is
//! (`oncrpc::testing::check_alone_hints`).

use std::sync::Arc;

use oncrpc::testing::{HintProbe, check_alone_hints};
use oncrpc::{Dispatcher, RpcClient, ServerConfig, TcpClient, TcpServer};

const PROG: u32 = 0x2000_00a1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_alone_only_while_no_other_call_of_its_connection_executes() {
    let probe = HintProbe::new(PROG);
    let dispatcher = Dispatcher::new().with(probe.clone());
    let server = TcpServer::bind("127.0.0.1:0", Arc::new(dispatcher), ServerConfig::default())
        .await
        .unwrap();
    let addr = server.local_addr();
    check_alone_hints(&probe, || async move {
        RpcClient::new(Arc::new(TcpClient::connect(addr).await.unwrap()), PROG, 1)
    })
    .await;
}
