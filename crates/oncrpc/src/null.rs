//! A program that only answers the NULL procedure: for `rpcinfo`, benchmarks and tests.

use std::sync::Arc;

use crate::service::{BoxFuture, Call, Outcome, Program};

/// RFC 5531 §12.1 (by convention): procedure 0 of every program is NULL, with no arguments and
/// no results.
pub const NULLPROC: u32 = 0;

/// Serves procedure 0 (NULL) of `prog` for versions `low..=high`; every other procedure gets
/// PROC_UNAVAIL. Versions outside the range get PROG_MISMATCH from the [`crate::Dispatcher`].
#[derive(Debug, Clone, Copy)]
pub struct NullProgram {
    prog: u32,
    low: u32,
    high: u32,
}

impl NullProgram {
    /// The program number and version range.
    pub fn new(prog: u32, low: u32, high: u32) -> Self {
        NullProgram { prog, low, high }
    }
}

impl Program for NullProgram {
    fn program(&self) -> u32 {
        self.prog
    }

    fn versions(&self) -> (u32, u32) {
        (self.low, self.high)
    }

    fn name(&self) -> &'static str {
        "null"
    }

    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let outcome = if call.header.proc_ == NULLPROC {
            // NULL takes no arguments; anything more is tolerated, as common servers do.
            Outcome::Success(call.reply_encoder().finish())
        } else {
            Outcome::ProcUnavail
        };
        Box::pin(std::future::ready(outcome))
    }
}

/// A [`NullProgram`] ready to register with a [`crate::Dispatcher`].
pub fn null_program(prog: u32, vers_low: u32, vers_high: u32) -> Arc<dyn Program> {
    Arc::new(NullProgram::new(prog, vers_low, vers_high))
}
