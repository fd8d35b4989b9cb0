//! Counters of the RDS-over-RDMA driver, for profiling (`oxrdma rds stress --counters`).

use std::sync::atomic::{AtomicU64, Ordering};

/// What the RDS-over-RDMA driver did, summed over a stack's connections (for profiling:
/// `oxrdma rds stress --counters`). Ack-only messages the engine built are in
/// [`crate::engine::PathInfo::ack_only_sent`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaCounters {
    /// Sends posted (every message fragment, ack-only message and credit update).
    pub sends: u64,
    /// Of those, standalone credit updates the driver added (ack-only headers carrying
    /// `h_credit` that the engine did not ask for).
    pub credit_updates: u64,
    /// Calls to post work requests on the send queue (one call may post several Sends).
    pub post_calls: u64,
    /// Receive completions taken.
    pub recvs: u64,
    /// Times posting stopped because the peer had granted no credit.
    pub credit_stalls: u64,
    /// Wake-ups of the connection task (receives are taken without one, and most Sends are
    /// posted by whoever queued them: `direct_passes`).
    pub runs: u64,
    /// Transmit passes run by whoever had something to send (the application, the receive
    /// handler) instead of the connection task.
    pub direct_passes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct CounterCells {
    pub(crate) sends: AtomicU64,
    pub(crate) credit_updates: AtomicU64,
    pub(crate) post_calls: AtomicU64,
    pub(crate) recvs: AtomicU64,
    pub(crate) credit_stalls: AtomicU64,
    pub(crate) runs: AtomicU64,
    pub(crate) direct_passes: AtomicU64,
}

impl CounterCells {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RdmaCounters {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RdmaCounters {
            sends: l(&self.sends),
            credit_updates: l(&self.credit_updates),
            post_calls: l(&self.post_calls),
            recvs: l(&self.recvs),
            credit_stalls: l(&self.credit_stalls),
            runs: l(&self.runs),
            direct_passes: l(&self.direct_passes),
        }
    }
}
