//! Test support (feature `testing`): what the integration tests of this crate and of the
//! transports built on it share.
//!
//! [`HintProbe`] is a program that answers with what the server told it about a call's
//! neighbours ([`crate::CallHints::alone`]), and [`check_alone_hints`] is the scenario every
//! transport's server must pass: a call is alone when no other call of its connection is
//! executing, and not alone while one is.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;
use xdr::Decoder;

use crate::service::BoxFuture;
use crate::{Call, Outcome, Program, ReplyExpectation, RpcClient};

/// [`HintProbe`]'s procedure that answers 1 if the call came marked alone, 0 if not.
pub const ALONE: u32 = 1;
/// [`HintProbe`]'s procedure that signals it has begun, waits to be released, then answers
/// like [`ALONE`].
pub const HOLD: u32 = 2;

/// A program (version 1) that reports the hints each call came with.
#[derive(Debug)]
pub struct HintProbe {
    prog: u32,
    entered: Semaphore,
    release: Semaphore,
}

impl HintProbe {
    /// The probe as program number `prog`.
    pub fn new(prog: u32) -> Arc<Self> {
        Arc::new(HintProbe {
            prog,
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
        })
    }

    async fn run(&self, call: Call) -> Outcome {
        let alone = call.hints.alone;
        if call.header.proc_ == HOLD {
            self.entered.add_permits(1);
            if let Ok(p) = self.release.acquire().await {
                p.forget();
            }
        } else if call.header.proc_ != ALONE {
            return Outcome::ProcUnavail;
        }
        let mut enc = call.reply_encoder();
        enc.put_u32(u32::from(alone));
        Outcome::Success(enc.finish())
    }
}

impl Program for HintProbe {
    fn program(&self) -> u32 {
        self.prog
    }
    fn versions(&self) -> (u32, u32) {
        (1, 1)
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.run(call))
    }
}

/// Call `proc_` of the probe; its answer (panics on any failure: this is for tests).
pub async fn ask(c: &RpcClient, proc_: u32) -> u32 {
    ask_with_args(c, proc_, 0).await
}

/// Like [`ask`], with `n` bytes of arguments (which the probe ignores): over RPC-over-RDMA,
/// past the inline threshold, a Long Call whose arguments are RDMA-Read before it runs.
pub async fn ask_with_args(c: &RpcClient, proc_: u32, n: usize) -> u32 {
    let r = c
        .call(
            proc_,
            move |e| e.put_raw(&vec![0x5a; n]),
            ReplyExpectation::default(),
        )
        .await
        .expect("the probe's call");
    Decoder::from_bytes(&r).u32().expect("the probe's answer")
}

/// The scenario: `connect` makes a new connection to a server that runs `probe`. Panics when
/// the server's hints are wrong.
pub async fn check_alone_hints<F, Fut>(probe: &HintProbe, connect: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = RpcClient>,
{
    let c = connect().await;
    // One call at a time: each is alone, also one whose arguments came by RDMA Read (they
    // are judged once they have arrived).
    assert_eq!(ask(&c, ALONE).await, 1);
    assert_eq!(ask_with_args(&c, ALONE, 256 << 10).await, 1);
    assert_eq!(ask(&c, ALONE).await, 1);
    // A call held in the program: the next one on the same connection has a neighbour.
    let held = {
        let c = c.clone();
        tokio::spawn(async move { ask(&c, HOLD).await })
    };
    probe
        .entered
        .acquire()
        .await
        .expect("the probe's semaphore")
        .forget();
    assert_eq!(ask(&c, ALONE).await, 0);
    assert_eq!(ask_with_args(&c, ALONE, 256 << 10).await, 0);
    // Another connection's call is not a neighbour.
    assert_eq!(ask(&connect().await, ALONE).await, 1);
    // The held call was itself alone when it came; once it is done, calls are alone again.
    probe.release.add_permits(1);
    assert_eq!(held.await.expect("the held call's task"), 1);
    assert_eq!(ask(&c, ALONE).await, 1);
}
