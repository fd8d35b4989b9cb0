//! Responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02, read as in
//! [`crate::rrc`]): a reply too large for the inline threshold and for any Reply chunk goes
//! back as RDMA2_NOMSG with a Position-Zero Read chunk registered for remote read only; the
//! chunk waits in a bounded table, by XID, until its pull-completion notification, its pull
//! deadline or the end of the connection invalidates it.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use super::{Action, Incoming, Responder};
use crate::engine::Registrar;
use crate::header::{Chunks, ReadChunk, WriteChunk};
use crate::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2};
use crate::rrc::{Admit, PullDone, PullTable, Waiting};

/// A reply that found the table full: built, not yet registered.
#[derive(Debug)]
pub(super) struct Parked {
    xid: u32,
    /// RDMA Writes of its Write chunks (performed when it goes, before its Send).
    writes: Vec<Action>,
    write_list: Vec<WriteChunk>,
    payload: Bytes,
    swi: Option<u32>,
}

/// The Responder's state for responder-provided Read chunks.
pub(super) struct RrcState {
    /// Registers the replies' Payload streams (remote read only) and invalidates them.
    pub(super) reg: Option<Box<dyn Registrar + Send>>,
    pub(super) table: PullTable,
    /// Replies waiting for room in the table, oldest first; at most one per credit.
    pub(super) parked: VecDeque<Parked>,
}

impl RrcState {
    pub(super) fn new(cfg: &crate::rrc::RrcConfig) -> Self {
        RrcState {
            reg: None,
            table: PullTable::new(cfg.max_chunks, cfg.max_bytes),
            parked: VecDeque::new(),
        }
    }
}

impl Responder {
    /// The memory registration for responder-provided Read chunks (the driver's protection
    /// domain; a [`crate::engine::MemRegistrar`] in tests). Without one the Responder never
    /// uses them, whatever it announced.
    pub fn set_registrar(&mut self, reg: Box<dyn Registrar + Send>) {
        self.rrc.reg = Some(reg);
    }

    /// Chunks waiting for their notification, and their bytes.
    pub fn rrc_waiting(&self) -> (usize, usize) {
        (self.rrc.table.len(), self.rrc.table.bytes())
    }

    /// Replies waiting for room in the table.
    pub fn rrc_parked(&self) -> usize {
        self.rrc.parked.len()
    }

    /// Both sides announced the capability on this version 2 connection (draft §6: "MUST be
    /// used only when both peers support them"), and memory can be registered.
    pub(super) fn rrc_usable(&self) -> bool {
        self.cfg.rrc.enabled && self.v2() && self.props.rrc_agreed() && self.rrc.reg.is_some()
    }

    /// The reply to `xid` fits neither inline nor a Reply chunk: send it as a Position-Zero
    /// Read chunk, or park it while the table is full.
    // reliable-reply-02 §4.1.1:
    // A responder MUST send a Position Zero Read chunk when the actual size of the RPC Reply's
    // Payload stream exceeds all requester-provided reply resources
    pub(super) fn reply_by_read_chunk(
        &mut self,
        xid: u32,
        writes: Vec<Action>,
        write_list: Vec<WriteChunk>,
        payload: Bytes,
        swi: Option<u32>,
        now: Instant,
    ) -> Vec<Action> {
        let p = Parked {
            xid,
            writes,
            write_list,
            payload,
            swi,
        };
        match self.rrc.table.admit(xid, p.payload.len()) {
            Admit::Room if self.rrc.parked.is_empty() => self.send_read_chunk(p, now),
            Admit::TooLarge => self.reply_resource(xid, p.payload.len()),
            // Backpressure: the reply waits (holding its call's credit) for a notification or
            // a pull deadline to free a slot. One per credit at most: beyond that the
            // requester exceeded its grant, and the reply is refused rather than held.
            _ if self.rrc.parked.len() >= self.cfg.credits.max(1) as usize => {
                self.stats.rrc_refused += 1;
                self.reply_resource(xid, p.payload.len())
            }
            _ => {
                self.stats.rrc_parked += 1;
                self.rrc.parked.push_back(p);
                Vec::new()
            }
        }
    }

    fn reply_resource(&mut self, xid: u32, len: usize) -> Vec<Action> {
        self.error2_actions(
            xid,
            ErrorBody2::ReplyResource {
                length_needed: u32::try_from(len).unwrap_or(u32::MAX),
            },
        )
    }

    /// Register `p`'s Payload stream for remote read only and send RDMA2_NOMSG with it as a
    /// Position-Zero Read chunk (draft §4.1: "always sent using an RPC-over-RDMA RDMA_NOMSG
    /// message"), after the RDMA Writes of its Write chunks (§4.1: "a responder must still make
    /// use of Write chunks provided by the requester").
    fn send_read_chunk(&mut self, p: Parked, now: Instant) -> Vec<Action> {
        let grant = self.grant();
        let (inline_send, accept_inv) =
            (self.params.inline_send, self.cfg.accept_remote_invalidate);
        let deadline = now + self.cfg.rrc.pull_timeout;
        let Some(reg) = self.rrc.reg.as_mut() else {
            return self.reply_resource(p.xid, p.payload.len());
        };
        let len = p.payload.len();
        // Security considerations (§7): "exposed for read-only access"; the registrar picks a
        // fresh, unpredictable handle (RFC 8166 §8.1.2).
        let region = match reg.register_source(p.payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(xid = p.xid, error = %e, "no registration for a reply's Read chunk");
                return self.error2_actions(p.xid, ErrorBody2::System);
            }
        };
        let mut chunks = Chunks {
            reads: Vec::new(),
            writes: p.write_list,
            reply: None,
        };
        // reliable-reply-02 §4.1:
        // Position Zero Read chunks are always sent using an RPC-over-RDMA RDMA_NOMSG message.
        chunks.set_read_chunks(&[ReadChunk {
            position: 0,
            segments: region.segments.clone(),
        }]);
        let mut lists = ChunkLists::new(Direction::Reply, chunks);
        // §4.1.4: the requester may invalidate this chunk's handle with Send With Invalidate
        // when we accept remote invalidation (RFC 8797) and the chunk has one handle; the
        // version 2 header says which handle (`rdma_inv_handle`, cel-05 §7.2.3).
        let first = region.segments.first().map(|s| s.handle);
        if accept_inv
            && let Some(h) = first
            && region.segments.iter().all(|s| s.handle == h)
        {
            lists.inv_handle = h;
        }
        let h = Header2::new(p.xid, grant, Body2::NoMsg(lists));
        if h.encoded_len() > inline_send {
            // The header alone (a Write list of many segments) cannot be sent.
            let _ = reg.invalidate(region.id, false);
            return self.reply_resource(p.xid, len);
        }
        let w = Waiting {
            region,
            len,
            deadline,
        };
        if let Err(w) = self.rrc.table.insert(p.xid, w) {
            // `admit` said there was room; nothing changed since. Never leave it registered.
            let _ = reg.invalidate(w.region.id, false);
            return self.error2_actions(p.xid, ErrorBody2::System);
        }
        self.stats.rrc_replies += 1;
        let mut out = p.writes;
        out.extend(self.connprop(p.xid));
        out.push(Action::Send {
            data: h.to_bytes(),
            invalidate: p.swi,
        });
        out
    }

    /// A pull-completion notification for `xid`; `invalidated` is the handle the peer
    /// invalidated with Send With Invalidate, if it used it.
    pub(super) fn on_pull_done(&mut self, n: PullDone, invalidated: Option<u32>) -> Incoming {
        let Some(w) = self.rrc.table.remove(n.xid) else {
            // reliable-reply-02 §4.1.3:
            // Whenever a responder receives a pull completion notification for an XID for
            // which there is no Read chunk waiting to be invalidated, the responder MUST
            // silently drop the notification.
            self.stats.rrc_notifications_dropped += 1;
            return Incoming::Nothing;
        };
        self.stats.rrc_notified += 1;
        let remote = invalidated.is_some_and(|h| w.region.segments.iter().all(|s| s.handle == h));
        self.stats.rrc_remote_invalidated += u64::from(remote);
        let mut out = self.release(w, remote);
        out.extend(self.unpark(Instant::now()));
        if out.is_empty() {
            Incoming::Nothing
        } else {
            Incoming::Respond(out)
        }
    }

    /// Invalidate a waiting chunk's memory; one that cannot be invalidated is fenced by closing
    /// the connection (RFC 8166 §4.5.4's rule for memory that cannot be invalidated).
    fn release(&mut self, w: Waiting, remote: bool) -> Vec<Action> {
        let Some(reg) = self.rrc.reg.as_mut() else {
            return vec![Action::Close];
        };
        match reg.invalidate(w.region.id, remote) {
            Ok(()) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "a reply's Read chunk could not be invalidated");
                vec![Action::Close]
            }
        }
    }

    /// Send the parked replies there is room for now, oldest first.
    pub(super) fn unpark(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        while let Some(p) = self.rrc.parked.front() {
            match self.rrc.table.admit(p.xid, p.payload.len()) {
                Admit::Room => {
                    let Some(p) = self.rrc.parked.pop_front() else {
                        break;
                    };
                    out.extend(self.send_read_chunk(p, now));
                }
                _ => break,
            }
        }
        out
    }

    /// Pull deadlines due at `now`: their chunks are invalidated (draft §4.1.3, "a responder
    /// can choose to invalidate its Read chunks after waiting for a short period"), and parked
    /// replies take the slots.
    pub(super) fn expire_pulls(&mut self, now: Instant) -> Vec<Action> {
        let due = self.rrc.table.expire(now);
        if due.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (xid, w) in due {
            tracing::debug!(
                xid,
                "no pull-completion notification in time; chunk invalidated"
            );
            self.stats.rrc_timed_out += 1;
            out.extend(self.release(w, false));
        }
        out.extend(self.unpark(now));
        out
    }

    /// The connection is gone: every waiting chunk is invalidated (draft §5.4.3: "explicitly
    /// invalidating waiting Read chunks after a connection loss"), parked replies dropped.
    pub(super) fn close_pulls(&mut self) {
        self.rrc.parked.clear();
        for (_, w) in self.rrc.table.drain() {
            self.stats.rrc_invalidated_on_close += 1;
            if let Some(reg) = self.rrc.reg.as_mut() {
                let _ = reg.invalidate(w.region.id, false);
            }
        }
    }
}
