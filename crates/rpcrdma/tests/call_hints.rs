//! What the RPC-over-RDMA server tells a program about a call's neighbours
//! (`oncrpc::CallHints`), over soft-iWARP on 127.0.0.1: a call is alone when the Responder
//! holds no other call of its connection, and not alone while one executes.

use std::sync::Arc;

use oncrpc::service::BoxFuture;
use oncrpc::{Call, Dispatcher, Outcome, Program, ReplyExpectation, RpcClient};
use rpcrdma::ulb::InlineBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use tokio::sync::Semaphore;
use xdr::Decoder;

const PROG: u32 = 0x2000_00a2;
/// Answers 1 if the call came marked alone, 0 if not.
const ALONE: u32 = 1;
/// Signals `entered`, waits for a permit of `release`, then answers like ALONE.
const HOLD: u32 = 2;

struct HintProg {
    entered: Semaphore,
    release: Semaphore,
}

impl Program for HintProg {
    fn program(&self) -> u32 {
        PROG
    }
    fn versions(&self) -> (u32, u32) {
        (1, 1)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            let alone = call.hints.alone;
            if call.header.proc_ == HOLD {
                self.entered.add_permits(1);
                self.release.acquire().await.unwrap().forget();
            } else if call.header.proc_ != ALONE {
                return Outcome::ProcUnavail;
            }
            let mut enc = call.reply_encoder();
            enc.put_u32(u32::from(alone));
            Outcome::Success(enc.finish())
        })
    }
}

async fn ask(c: &RpcClient, proc_: u32) -> u32 {
    let r = c
        .call(proc_, |_| {}, ReplyExpectation::default())
        .await
        .unwrap();
    Decoder::from_bytes(&r).u32().unwrap()
}

async fn client(srv: &RdmaServer) -> RpcClient {
    let t = RdmaClient::connect(
        srv.local_addr(),
        TransportConfig::default(),
        vec![Arc::new(InlineBinding::new(PROG, 1..=1))],
    )
    .await
    .unwrap();
    RpcClient::new(Arc::new(t), PROG, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_alone_only_while_no_other_call_of_its_connection_executes() {
    let prog = Arc::new(HintProg {
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let d = Dispatcher::new().with(prog.clone());
    let srv = RdmaServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        d,
        Vec::new(),
        TransportConfig::default(),
    )
    .await
    .unwrap();
    let c = client(&srv).await;

    assert_eq!(ask(&c, ALONE).await, 1);
    assert_eq!(ask(&c, ALONE).await, 1);

    let held = {
        let c = c.clone();
        tokio::spawn(async move { ask(&c, HOLD).await })
    };
    prog.entered.acquire().await.unwrap().forget();
    assert_eq!(ask(&c, ALONE).await, 0);

    // Another connection's call is not a neighbour.
    assert_eq!(ask(&client(&srv).await, ALONE).await, 1);

    prog.release.add_permits(1);
    assert_eq!(held.await.unwrap(), 1);
    assert_eq!(ask(&c, ALONE).await, 1);
}
