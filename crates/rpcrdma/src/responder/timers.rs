//! The Responder's deadlines, sans-IO: the RDMA Reads of a call's Read chunks (a peer that
//! does not answer them in time loses the connection) and the backward-direction calls (RFC
//! 8167) it makes. A driver sleeps until [`super::Responder::next_deadline`] and hands the
//! Responder `now` ([`super::Responder::handle_timeout`]).

use std::time::{Duration, Instant};

use super::{Action, PendingCall, Responder, TimedOut};

/// Deadlines by what they bound.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    /// How long the peer may take to answer the RDMA Reads of one call; `None`: no bound.
    pub(super) read_timeout: Option<Duration>,
    /// Calls whose Read chunks are being pulled, by [`super::PendingCall`] id.
    reads: crate::engine::IdMap<u64, Instant>,
    next_read: u64,
    /// Backward calls (queued or sent) by XID.
    back: crate::engine::XidMap<Instant>,
    /// The connection is closing or closed: no RDMA Reads start any more.
    closed: bool,
}

/// What expired at some `now`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Expired {
    /// Some call's RDMA Reads were not answered in time.
    pub(super) reads: bool,
    /// Backward calls whose time is up, in XID order.
    pub(super) back_calls: Vec<u32>,
}

impl Deadlines {
    /// An id for a call that waits for its Read chunks.
    pub(super) fn read_id(&mut self) -> u64 {
        self.next_read += 1;
        self.next_read
    }

    /// The driver is about to post the RDMA Reads of call `id` at `now`; `false` once the
    /// connection is closed.
    pub(super) fn reads_started(&mut self, id: u64, now: Instant) -> bool {
        if self.closed {
            return false;
        }
        if let Some(t) = self.read_timeout {
            self.reads.insert(id, now + t);
        }
        true
    }

    /// No more Reads: the connection is closing. The deadlines of those under way go (the
    /// connection's end fails them).
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.reads.clear();
    }

    /// The Reads of call `id` completed or failed.
    pub(super) fn reads_done(&mut self, id: u64) {
        self.reads.remove(&id);
    }

    /// Backward call `xid` must be answered by `deadline`.
    pub(super) fn back_started(&mut self, xid: u32, deadline: Option<Instant>) {
        match deadline {
            Some(d) => {
                self.back.insert(xid, d);
            }
            None => {
                self.back.remove(&xid);
            }
        }
    }

    /// Backward call `xid` was answered or abandoned.
    pub(super) fn back_done(&mut self, xid: u32) {
        self.back.remove(&xid);
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.reads.values().chain(self.back.values()).min().copied()
    }

    /// Take out everything due at `now`.
    pub(super) fn expire(&mut self, now: Instant) -> Expired {
        let before = self.reads.len();
        self.reads.retain(|_, d| *d > now);
        let mut back_calls: Vec<u32> = self
            .back
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(x, _)| *x)
            .collect();
        back_calls.sort_unstable();
        for x in &back_calls {
            self.back.remove(x);
        }
        Expired {
            reads: self.reads.len() != before,
            back_calls,
        }
    }
}

impl Responder {
    /// Bound the time a peer may take to answer the RDMA Reads of one call (`None`, the
    /// default: no bound).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.deadlines.read_timeout = timeout;
    }

    /// The driver is about to post the RDMA Reads of `p` at `now`: they are due by `now` plus
    /// the read timeout. `false` once the connection is closing (the Responder asked for
    /// [`Action::Close`], or [`Responder::connection_closed`]): the driver posts nothing and
    /// drops the call ([`Responder::reads_failed`]). Reads posted on a closed connection would
    /// be flushed at best; and once its completions are no longer routed, their waits (and
    /// the memory the call holds for them) would never end.
    #[must_use = "false: the Reads must not be posted"]
    pub fn reads_started(&mut self, p: &PendingCall, now: Instant) -> bool {
        self.deadlines.reads_started(p.id, now)
    }

    /// The RDMA Reads of `p` failed (or could not be posted): RFC 8166 §4.5.3, RDMA operational
    /// errors are fatal to the connection. The call is dropped.
    #[must_use = "every action the engine returns must be performed"]
    pub fn reads_failed(&mut self, p: PendingCall) -> Vec<Action> {
        self.deadlines.reads_done(p.id);
        self.pulling.remove(&p.id);
        self.deadlines.close();
        vec![Action::Close]
    }

    /// The driver's connection is gone (its queue pair in error, its completions no longer
    /// waited for): no RDMA Reads start from now on ([`Responder::reads_started`] says
    /// `false`), no backward call is accepted ([`BackError::Closed`](super::BackError)), and
    /// nothing is left due: the backward calls under way are dropped (the driver tells their
    /// callers the connection is gone).
    pub fn connection_closed(&mut self) {
        self.close_pulls();
        // Nothing is left to finish: the calls being pulled fail with the connection.
        self.pulling.clear();
        self.deadlines.close();
        self.deadlines.back.clear();
        self.back_queue.clear();
        self.back_outstanding.clear();
    }

    /// Whether the connection is closing or closed (see [`Responder::reads_started`]).
    pub fn is_closed(&self) -> bool {
        self.deadlines.closed
    }

    /// The earliest deadline of this connection: RDMA Reads of a call's Read chunks, backward
    /// calls.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.deadlines.next(), self.rrc.table.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Everything due at `now`: a peer that did not answer RDMA Reads in time loses the
    /// connection (`Close`: its memory and the sinks come back); backward calls whose time is
    /// up are abandoned like [`Responder::cancel_back`].
    pub fn handle_timeout(&mut self, now: Instant) -> TimedOut {
        let expired = self.deadlines.expire(now);
        let mut actions = Vec::new();
        if expired.reads {
            tracing::info!("the peer did not answer an RDMA Read in time; closing the connection");
            self.deadlines.close();
            actions.push(Action::Close);
        }
        for &xid in &expired.back_calls {
            self.back_queue.retain(|(x, _)| *x != xid);
            self.back_outstanding.remove(&xid);
        }
        if !expired.back_calls.is_empty() {
            actions.extend(self.pump_back());
        }
        // Responder-provided Read chunks whose notification is overdue.
        actions.extend(self.expire_pulls(now));
        TimedOut {
            back_calls: expired.back_calls,
            actions,
        }
    }
}
