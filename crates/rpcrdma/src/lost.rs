//! Replies lost to RDMA operational errors (RFC 8166 §4.5.3), sans-IO.
//!
//! A reply whose Send fails because of an RDMA operational error cannot be sent again on the
//! next connection as it was: the retransmission of its call is answered with RDMA_ERR_CHUNK.
//! One connection's [`crate::responder::Responder`] records such XIDs; a server keeps them
//! per peer host in a [`LostReplies`] between connections and hands them to the Responder of
//! the next connection from that host ([`crate::responder::Responder::note_lost`]). This
//! module decides which failed Sends count ([`reply_lost`]); the driver only stores the
//! registry and moves XIDs in and out of it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// XIDs kept per peer host, as a Responder keeps them per connection.
pub const LOST_PER_PEER: usize = 4096;

/// How the Send of a reply completed, as far as RFC 8166 §4.5.3 is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendCompletion {
    /// Sent.
    Success,
    /// Flushed: the connection broke before the Send was executed.
    Flushed,
    /// Any other completion error (an RDMA operational error).
    Failed,
}

/// Whether a reply whose Send completed with `completion` is lost in the sense of RFC 8166
/// §4.5.3 (its retransmission answered with RDMA_ERR_CHUNK). That section is about RDMA
/// operational errors, which a retransmission would run into again. A Send flushed because
/// the connection broke with no such error (a peer or a network that went away) is not:
/// its retransmission is executed again or, for a non-idempotent call, answered from the
/// Upper Layer's duplicate request cache. `operational_error_seen`: some completion of the
/// connection failed with an operational error (a flush that follows one counts).
pub fn reply_lost(completion: SendCompletion, operational_error_seen: bool) -> bool {
    match completion {
        SendCompletion::Success => false,
        SendCompletion::Flushed => operational_error_seen,
        SendCompletion::Failed => true,
    }
}

/// The lost XIDs of a server's peers, by host (a client reconnects from another port).
#[derive(Debug, Default)]
pub struct LostReplies {
    by_peer: HashMap<IpAddr, HashSet<u32>>,
}

impl LostReplies {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record `xids` as lost for `peer` (at most [`LOST_PER_PEER`] per host).
    pub fn record(&mut self, peer: IpAddr, xids: impl IntoIterator<Item = u32>) {
        let mut xids = xids.into_iter().peekable();
        if xids.peek().is_none() {
            return;
        }
        let set = self.by_peer.entry(peer).or_default();
        for x in xids {
            if set.len() >= LOST_PER_PEER {
                break;
            }
            set.insert(x);
        }
    }

    /// Take every XID recorded for `peer`, for a Responder of that host.
    pub fn take(&mut self, peer: IpAddr) -> HashSet<u32> {
        // Asked once per received call: with nothing recorded (the usual case) this costs no
        // hash of the address (`remove` hashes before it looks; stop 38).
        if self.by_peer.is_empty() {
            return HashSet::new();
        }
        self.by_peer.remove(&peer).unwrap_or_default()
    }

    /// Hosts with lost XIDs.
    pub fn peers(&self) -> usize {
        self.by_peer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_operational_errors_lose_a_reply() {
        assert!(!reply_lost(SendCompletion::Success, true));
        assert!(!reply_lost(SendCompletion::Flushed, false));
        assert!(reply_lost(SendCompletion::Flushed, true));
        assert!(reply_lost(SendCompletion::Failed, false));
    }

    #[test]
    fn registry_is_per_host_and_bounded() {
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let mut r = LostReplies::new();
        r.record(a, []);
        assert_eq!(r.peers(), 0);
        r.record(a, [1, 2]);
        r.record(b, 0..(LOST_PER_PEER as u32 + 10));
        assert_eq!(r.take(a), HashSet::from([1, 2]));
        assert!(r.take(a).is_empty());
        assert_eq!(r.take(b).len(), LOST_PER_PEER);
        assert_eq!(r.peers(), 0);
    }
}
