//! Call deadlines and cancellation: a driver sleeps until [`Requester::next_deadline`] and
//! calls [`Requester::poll_timeouts`].

use std::time::Instant;

use oncrpc::RpcError;

use super::{Action, Requester};
use crate::engine::Registrar;

impl Requester {
    /// Abandon a call (timeout, or a caller that stopped waiting). The call leaves the
    /// pending table and every region it registered (Read chunks, Write chunks, Reply chunk,
    /// Position-Zero Read chunk) is invalidated through `reg` before this returns; the
    /// actions hold its `Complete` (with `err`) and a `Close` if some region could not be
    /// invalidated. If it was sent, it keeps its credit until a reply for it arrives (that
    /// reply is then discarded and counted in [`RequesterStats::late_replies`]) or the
    /// connection ends. Unknown or already completed XIDs: nothing happens.
    #[must_use = "every action the engine returns must be performed"]
    pub fn cancel(&mut self, xid: u32, err: RpcError, reg: &mut dyn Registrar) -> Vec<Action> {
        let Some(o) = self.calls.get(&xid) else {
            return Vec::new();
        };
        // RFC 8166 §4.4.1: segments of canceled RPCs are fenced too, since "A Responder
        // cannot know that the Requester is no longer waiting for a reply".
        self.stats.cancelled += 1;
        if o.sent && self.connected {
            self.abandoned.insert(xid);
        } else {
            self.queue.retain(|x| *x != xid);
        }
        self.finish(xid, Err(err), None, reg)
    }

    /// Fail every call whose deadline passed.
    #[must_use = "every action the engine returns must be performed"]
    pub fn poll_timeouts(&mut self, now: Instant, reg: &mut dyn Registrar) -> Vec<Action> {
        let expired: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, o)| o.call.deadline.is_some_and(|d| d <= now))
            .map(|(x, _)| *x)
            .collect();
        let mut out = Vec::new();
        for xid in expired {
            out.extend(self.cancel(xid, RpcError::Timeout, reg));
        }
        out
    }

    /// Earliest deadline among pending calls.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.calls.values().filter_map(|o| o.call.deadline).min()
    }
}
