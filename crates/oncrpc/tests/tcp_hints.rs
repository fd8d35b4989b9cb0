//! What the TCP server tells a program about a call's neighbours (`CallHints`): a call is
//! alone when no other call of its connection is executing, and not alone while one is.

use std::sync::Arc;

use oncrpc::service::BoxFuture;
use oncrpc::{
    Call, Dispatcher, Outcome, Program, ReplyExpectation, RpcClient, ServerConfig, TcpClient,
    TcpServer,
};
use tokio::sync::Semaphore;
use xdr::Decoder;

const PROG: u32 = 0x2000_00a1;
/// Answers 1 if the call came marked alone, 0 if not.
const ALONE: u32 = 1;
/// Signals `entered`, then waits for a permit of `release`, then answers like ALONE.
const HOLD: u32 = 2;

struct HintProg {
    entered: Semaphore,
    release: Semaphore,
}

impl HintProg {
    async fn run(&self, call: Call) -> Outcome {
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
    }
}

struct Handle(Arc<HintProg>);

impl Program for Handle {
    fn program(&self) -> u32 {
        PROG
    }
    fn versions(&self) -> (u32, u32) {
        (1, 1)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.0.run(call))
    }
}

async fn ask(c: &RpcClient, proc_: u32) -> u32 {
    let r = c
        .call(proc_, |_| {}, ReplyExpectation::default())
        .await
        .unwrap();
    Decoder::from_bytes(&r).u32().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_alone_only_while_no_other_call_of_its_connection_executes() {
    let prog = Arc::new(HintProg {
        entered: Semaphore::new(0),
        release: Semaphore::new(0),
    });
    let dispatcher = Dispatcher::new().with(Arc::new(Handle(prog.clone())));
    let server = TcpServer::bind("127.0.0.1:0", Arc::new(dispatcher), ServerConfig::default())
        .await
        .unwrap();
    let t = Arc::new(TcpClient::connect(server.local_addr()).await.unwrap());
    let c = RpcClient::new(t.clone(), PROG, 1);

    // One call at a time: each is alone.
    assert_eq!(ask(&c, ALONE).await, 1);
    assert_eq!(ask(&c, ALONE).await, 1);

    // A call held in the program: the next one on the same connection has a neighbour.
    let held = {
        let c = c.clone();
        tokio::spawn(async move { ask(&c, HOLD).await })
    };
    prog.entered.acquire().await.unwrap().forget();
    assert_eq!(ask(&c, ALONE).await, 0);

    // Another connection's call is not a neighbour.
    let t2 = Arc::new(TcpClient::connect(server.local_addr()).await.unwrap());
    assert_eq!(ask(&RpcClient::new(t2, PROG, 1), ALONE).await, 1);

    // The held call was itself alone when it came; once it is done, calls are alone again.
    prog.release.add_permits(1);
    assert_eq!(held.await.unwrap(), 1);
    assert_eq!(ask(&c, ALONE).await, 1);
}
