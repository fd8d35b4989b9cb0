//! Quiescing a connection before a clean close (a server shutting down): from
//! [`Responder::quiesce`] on, new calls are dropped unanswered and counted, while every call
//! already accepted runs to its reply. [`Responder::unfinished`] says what is left; a driver
//! closes the connection once that is nothing and every reply it posted has completed on the
//! send queue (`rpcrdma::driver`'s `ServerConnection::drain`).
//!
//! Why dropping is right: a Requester learns of a lost reply by losing the connection (RFC
//! 8166 §4.5.4: a Responder that cannot transmit a reply "MUST close the connection to signal
//! to the Requester that a reply was lost"), and it retransmits the calls it still waits for
//! on its next connection, as after any connection loss. A call dropped here is such a call:
//! nothing of it was executed, and the next instance of the server executes it. A call
//! accepted before the quiesce began has executed, or will: its reply must reach the client,
//! or its retransmission would execute a second time where no duplicate request cache
//! remembers it.
//!
//! Replies sent as responder-provided Read chunks (`crate::rrc`) still wait for their
//! pull-completion notification: the client pulls the reply, then notifies. A quiescing
//! Responder keeps their chunks registered until the notification, or their pull deadline,
//! as at any other time (reliable-reply-02 §4.1.3), so a driver waits for them too; closing
//! before the pull would lose the reply, as the connection's end invalidates the chunk
//! (§5.4.3). Backward calls (RFC 8167) are not waited for, and no new one is accepted.

use super::Responder;

/// What a quiescing connection still has to finish before it can close without losing a
/// reply. Replies built but not yet posted, and posted but not yet complete, are the driver's
/// to count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unfinished {
    /// Calls accepted whose Read chunks are being pulled (each will be executed).
    pub pulling: u32,
    /// Calls handed to the Upper Layer whose reply the Responder has not built yet
    /// ([`Responder::reply`]).
    pub executing: u32,
    /// Replies sent as responder-provided Read chunks whose client has not yet said it
    /// pulled them.
    pub rrc_waiting: u32,
    /// Replies waiting for room among the responder-provided Read chunks.
    pub rrc_parked: u32,
}

impl Unfinished {
    /// Nothing is left.
    pub fn is_empty(&self) -> bool {
        *self == Unfinished::default()
    }
}

impl Responder {
    /// Stop taking calls: from now on every new call is dropped unanswered (its client
    /// retransmits it on its next connection) and counted in
    /// [`ResponderStats::quiesce_dropped`](super::ResponderStats::quiesce_dropped); calls
    /// already accepted go on. Messages that are not calls (pull-completion notifications,
    /// backward-direction replies, transport property messages) are handled as before.
    /// No new backward call is accepted ([`BackError::Closed`](super::BackError::Closed)).
    pub fn quiesce(&mut self) {
        self.quiescing = true;
    }

    /// Whether [`Responder::quiesce`] was called.
    pub fn is_quiescing(&self) -> bool {
        self.quiescing
    }

    /// What is left before the connection can close without losing a reply.
    pub fn unfinished(&self) -> Unfinished {
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        Unfinished {
            pulling: n(self.pulling.len()),
            executing: n(self.in_progress.len()),
            rrc_waiting: n(self.rrc.table.len()),
            rrc_parked: n(self.rrc.parked.len()),
        }
    }

    /// A new call arrived: `true` if it is to be dropped (the connection is quiescing).
    pub(super) fn drop_while_quiescing(&mut self, xid: u32) -> bool {
        if !self.quiescing {
            return false;
        }
        tracing::debug!(xid, "call dropped: the connection is quiescing");
        self.stats.quiesce_dropped += 1;
        true
    }
}
