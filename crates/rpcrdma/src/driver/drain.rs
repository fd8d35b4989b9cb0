//! A clean close of a server's connections, losing no reply: [`ServerConnection::drain`] and
//! [`RdmaServer::quiesce`](super::RdmaServer::quiesce).
//!
//! A reply is posted after the Upper Layer returns it (its RDMA Writes, then its Send,
//! unsignaled), and closing a connection flushes what its send queue has not transmitted yet.
//! So a server that closes as soon as its calls have returned their replies can lose the
//! replies being posted at that instant; their clients resend the calls to the next instance
//! of the server, where no duplicate request cache remembers them. Draining closes that
//! window, in three steps, each bounded by the caller's deadline:
//! 1. the Responder quiesces ([`crate::responder::Responder::quiesce`]): new calls are dropped unanswered and
//!    counted, calls already accepted go on;
//! 2. every call accepted is answered: its Read chunks pulled, executed, its reply built
//!    ([`crate::responder::Responder::unfinished`]) and posted (counted here, from the Responder's reply to the
//!    end of `perform`), and every responder-provided Read chunk pulled by its client (the
//!    client pulls it, then notifies; closing first would invalidate it under the client);
//! 3. every work request posted has completed on the send queue
//!    ([`verbs::QueuePair::send_queue_idle`]: soft-iWARP wrote it to the socket, whose close
//!    sends it before the FIN; rdma-core's device completed it);
//!
//! and then the connection is closed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::back::ServerConnection;
use super::server::ServerConn;
use crate::responder::Unfinished;

/// How often a drain looks at what is left (a shutdown path: no completion to wait on tells
/// it when an unsignaled reply is done).
const DRAIN_POLL: Duration = Duration::from_millis(1);
/// The longest a drained connection waits for its peer to close its side.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What draining one connection achieved ([`ServerConnection::drain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport {
    /// The client.
    pub peer: SocketAddr,
    /// Every call accepted before the drain began was answered and every work request posted
    /// completed before the connection was closed.
    pub drained: bool,
    /// Calls accepted and not yet answered when the drain began (being pulled, executing, or
    /// their reply being posted).
    pub calls_at_start: u32,
    /// Of those, answered before the close.
    pub answered: u32,
    /// Calls that arrived during the drain and were dropped unanswered (their clients resend
    /// them on their next connection).
    pub dropped: u64,
    /// What was left when the deadline passed (nothing when drained).
    pub left: Unfinished,
    /// Replies built but not yet posted when the deadline passed.
    pub left_unposted: u32,
    /// Work requests posted but not complete when the deadline passed.
    pub left_sends: bool,
    /// The connection failed (or its client closed it) before the drain was done.
    pub closed_early: bool,
}

/// Counts a reply from the moment the Responder built it until its last action is performed:
/// the part of a call's life the Responder no longer sees. Taken under the Responder's lock,
/// with [`crate::responder::Responder::reply`], and read under it too ([`left`]), so a drain
/// sees every call in exactly one of the two counts.
pub(super) struct Posting<'a>(&'a ServerConn);

impl<'a> Posting<'a> {
    pub(super) fn new(sc: &'a ServerConn) -> Self {
        sc.posting.fetch_add(1, Ordering::AcqRel);
        Posting(sc)
    }
}

impl Drop for Posting<'_> {
    fn drop(&mut self) {
        self.0.posting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One look at what is left, under the Responder's lock: replies being posted, and what the
/// Responder has.
fn left(sc: &ServerConn) -> (u32, Unfinished) {
    let r = sc.resp.lock();
    (sc.posting.load(Ordering::Acquire), r.unfinished())
}

fn calls(unposted: u32, u: &Unfinished) -> u32 {
    unposted
        .saturating_add(u.pulling)
        .saturating_add(u.executing)
}

impl ServerConnection {
    /// Close this connection without losing a reply: new calls are dropped unanswered from
    /// now on, every call already accepted is answered, every work request posted completes
    /// on the send queue, then the connection closes (see the module's notes). At `deadline`
    /// it closes whatever is left, and the report says what that was.
    pub async fn drain(&self, deadline: Instant) -> DrainReport {
        let sc = &*self.conn;
        let dropped_before = {
            let mut r = sc.resp.lock();
            r.quiesce();
            r.stats().quiesce_dropped
        };
        let (unposted, u) = left(sc);
        let calls_at_start = calls(unposted, &u);
        let mut report = DrainReport {
            peer: sc.peer,
            drained: false,
            calls_at_start,
            answered: 0,
            dropped: 0,
            left: u,
            left_unposted: unposted,
            left_sends: true,
            closed_early: false,
        };
        loop {
            let (unposted, u) = left(sc);
            report.left = u;
            report.left_unposted = unposted;
            let answered = unposted == 0 && u.is_empty();
            // Asked after the calls: a reply posted before this look is in the send queue.
            report.left_sends = !sc.link.qp.send_queue_idle();
            if answered && !report.left_sends {
                report.drained = true;
                break;
            }
            if sc.link.qp.state() == verbs::QpState::Error || sc.resp.lock().is_closed() {
                report.closed_early = true;
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(DRAIN_POLL.min(deadline - now)).await;
        }
        report.answered = calls_at_start.saturating_sub(calls(report.left_unposted, &report.left));
        report.dropped = sc
            .resp
            .lock()
            .stats()
            .quiesce_dropped
            .saturating_sub(dropped_before);
        if !report.drained {
            tracing::warn!(peer = %sc.peer, left = ?report.left, unposted = report.left_unposted,
                sends = report.left_sends, closed_early = report.closed_early,
                "RPC-over-RDMA connection closed before it was drained");
        }
        // Closing sends what the send queue handed to the transport before the FIN
        // (soft-iWARP) and flushes the rest. The wait for the peer's side of the close is
        // bounded as `verbs::Connection::disconnect` bounds it, and by the deadline.
        sc.link.conn.abort();
        let until = deadline
            .min(Instant::now() + CLOSE_WAIT)
            .max(Instant::now());
        let _ = tokio::time::timeout_at(until.into(), sc.link.conn.closed()).await;
        report
    }
}

/// What quiescing a server achieved ([`RdmaServer::quiesce`](super::RdmaServer::quiesce)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuiesceReport {
    /// One report per connection drained.
    pub connections: Vec<DrainReport>,
    /// Connections accepted while the server quiesced, closed before they served a call.
    pub refused: u64,
}

impl QuiesceReport {
    /// Every connection was drained.
    pub fn drained(&self) -> bool {
        self.connections.iter().all(|c| c.drained)
    }

    /// Calls answered during the drain, over every connection.
    pub fn answered(&self) -> u64 {
        self.connections.iter().map(|c| u64::from(c.answered)).sum()
    }

    /// Calls dropped unanswered during the drain, over every connection.
    pub fn dropped(&self) -> u64 {
        self.connections.iter().map(|c| c.dropped).sum()
    }
}

/// Drain every connection of `conns` at once.
pub(super) async fn drain_all(conns: Vec<ServerConnection>, deadline: Instant) -> Vec<DrainReport> {
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|c| tokio::spawn(async move { c.drain(deadline).await }))
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(r) = t.await {
            out.push(r);
        }
    }
    out
}
