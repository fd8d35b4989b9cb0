//! The backward direction (RFC 8167): on this connection the Responder is the Requester of
//! reverse calls, within the peer's backward credits.

use std::time::Instant;

use bytes::Bytes;

use super::{Action, BackError, Incoming, Responder};
use crate::header::{Body, Chunks, Header};
use crate::header_v2::Direction;

impl Responder {
    /// The Upper Layer says the peer handles backward calls (RFC 8167 §6:
    /// for NFSv4.1 a CREATE_SESSION or BIND_CONN_TO_SESSION asking for the back channel).
    pub fn enable_backchannel(&mut self) {
        self.back_ready = true;
    }

    /// True once [`Responder::enable_backchannel`] was called.
    pub fn backchannel_ready(&self) -> bool {
        self.back_ready
    }

    fn back_limit(&self) -> usize {
        self.cfg.back_credits.max(1).min(self.back_granted.max(1)) as usize
    }

    /// Send (or queue, when out of backward credits) a backward call: RDMA_MSG with empty
    /// chunk lists (RFC 8167 §5.1). `message` is the whole RPC call, XID `xid`.
    pub fn back_call(&mut self, xid: u32, message: Bytes) -> Result<Vec<Action>, BackError> {
        self.back_call_until(xid, message, None)
    }

    /// [`Responder::back_call`] with a deadline: at `deadline` the call is abandoned and
    /// reported by [`Responder::handle_timeout`].
    pub fn back_call_until(
        &mut self,
        xid: u32,
        message: Bytes,
        deadline: Option<Instant>,
    ) -> Result<Vec<Action>, BackError> {
        // A closed connection's calls would never be answered, and no deadline of it is
        // waited for any more.
        // A quiescing one is about to close (see `quiesce`).
        if self.is_closed() || self.quiescing {
            return Err(BackError::Closed);
        }
        if !self.back_ready {
            return Err(BackError::NotReady);
        }
        // Backward calls are Short messages only: no Long Call (NFSv4.1 callbacks, which
        // are what this carries, have no DDP-eligible items).
        //= specs/rfc8267.txt#section-6.5.2
        //# Otherwise, an NFS
        //# version 4 server MUST use only Short messages to convey backchannel
        if Header::new(xid, 0, Body::Msg(Chunks::default())).encoded_len() + message.len()
            > self.params.inline_send
        {
            return Err(BackError::TooLarge(message.len()));
        }
        self.back_queue.push_back((xid, message));
        self.deadlines.back_started(xid, deadline);
        Ok(self.pump_back())
    }

    pub(super) fn pump_back(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while self.back_outstanding.len() < self.back_limit() {
            let Some((xid, message)) = self.back_queue.pop_front() else {
                break;
            };
            // cel-05 §7.2.2: a backward call carries our own XID: direction CALL.
            let mut data = self.header_bytes(
                xid,
                self.cfg.back_credits.max(1),
                Body::Msg(Chunks::default()),
                Direction::Call,
                message.len(),
            );
            data.extend_from_slice(&message);
            self.back_outstanding.insert(xid);
            self.stats.back_calls += 1;
            self.stats.back_max_outstanding = self
                .stats
                .back_max_outstanding
                .max(self.back_outstanding.len() as u32);
            out.push(Action::Send {
                data: data.freeze(),
                invalidate: None,
            });
        }
        out
    }

    pub(super) fn on_back_reply(&mut self, h: &Header, inline: Bytes) -> Incoming {
        if !self.back_outstanding.remove(&h.xid) {
            self.stats.dropped += 1;
            return Incoming::Nothing;
        }
        self.deadlines.back_done(h.xid);
        // RFC 8167 §4.1: backward credits, never zero.
        self.back_granted = h.credits.max(1);
        Incoming::BackReply {
            xid: h.xid,
            message: inline,
        }
    }

    /// Backward calls that became sendable (after a backward reply freed a credit).
    #[must_use = "every action the engine returns must be performed"]
    pub fn poll_back(&mut self) -> Vec<Action> {
        self.pump_back()
    }

    /// Abandon a backward call (timeout): frees its credit.
    #[must_use = "every action the engine returns must be performed"]
    pub fn cancel_back(&mut self, xid: u32) -> Vec<Action> {
        self.back_queue.retain(|(x, _)| *x != xid);
        self.back_outstanding.remove(&xid);
        self.deadlines.back_done(xid);
        self.pump_back()
    }

    /// Backward calls sent and not yet answered.
    pub fn back_outstanding(&self) -> usize {
        self.back_outstanding.len()
    }
}
