//! Responder-provided Read chunks, the Requester's side (draft-cel-nfsv4-rpcrdma-reliable-
//! reply-02, read as in [`crate::rrc`]): an RDMA2_NOMSG reply with a Position-Zero Read chunk
//! is pulled with RDMA Read ([`Action::Pull`], performed by the driver within its ORD into a
//! buffer of the chunk's size), the reply is delivered once, and a pull-completion
//! notification goes back in every case: after the pull, after a failed or refused pull, for
//! an XID nobody waits for, and when the capability was never agreed.

use bytes::Bytes;
use oncrpc::RpcError;

use super::{Action, Requester};
use crate::engine::Registrar;
use crate::header::{Body, Chunks, Header, Segment, WriteChunk};
use crate::header_v2::ChunkLists;
use crate::rrc::{PullDone, PullStatus, ReplyMode};
use crate::version::Version;

/// A pull under way.
#[derive(Debug)]
pub(super) struct Pull {
    xid: u32,
    len: usize,
    /// The handle the responder lets us invalidate with Send With Invalidate, if both sides
    /// allow remote invalidation.
    inv: Option<u32>,
    /// The reply's Write list (its DDP-eligible results went there).
    writes: Vec<WriteChunk>,
    /// The handle the reply's Send With Invalidate already invalidated, if any.
    remote_invalidated: Option<u32>,
}

impl Requester {
    /// Both sides announced responder-provided Read chunks on this version 2 connection and
    /// the server knows it (our RDMA2_CONNPROP went out before any call that relies on it).
    pub fn rrc_agreed(&self) -> bool {
        self.cfg.rrc.enabled
            && self.version.current() == Version::V2
            && self.connprop_sent
            && self.props.rrc_agreed()
    }

    /// Calls go with neither Write chunks nor a Reply chunk (reliable-reply-02 §5.3.1): the
    /// server returns large replies as responder-provided Read chunks.
    pub(super) fn replies_by_read_chunk(&self) -> bool {
        match self.cfg.rrc.reply_mode {
            ReplyMode::WriteChunk => false,
            ReplyMode::ReadChunk => self.rrc_agreed(),
            // Whether or not the server announced the capability (draft §6: one that did not
            // answers with a transport error).
            ReplyMode::SendOnly => {
                self.cfg.rrc.enabled && self.version.current() == Version::V2 && self.connprop_sent
            }
        }
    }

    /// The notification for `xid`, by Send With Invalidate of `inv` when given.
    fn notify(&mut self, xid: u32, status: PullStatus, inv: Option<u32>) -> Action {
        self.stats.rrc_notifications += 1;
        self.stats.rrc_notified_by_invalidate += u64::from(inv.is_some());
        Action::Notify {
            data: PullDone { xid, status }.to_bytes(self.cfg.credits),
            invalidate: inv,
        }
    }

    /// An RDMA2_NOMSG reply carrying Read chunks (a responder-provided Read chunk).
    pub(super) fn on_read_chunk_reply(
        &mut self,
        xid: u32,
        credits: u32,
        lists: ChunkLists,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        // reliable-reply-02 §4.1.4: "If Remote Invalidate support is not indicated by one or
        // both peers, messages carrying pull completion notification MUST be transmitted using
        // RDMA Send. If Remote Invalidation support is indicated by both peers, messages
        // carrying pull completion messages SHOULD be transmitted using RDMA Send With
        // Invalidate." We indicate it with RFC 8797's flag (`accept_remote_invalidate`); the
        // responder with a non-zero `rdma_inv_handle` naming the chunk (cel-05 §7.2.3), and
        // "the requester MUST present only that R_key".
        let chunks = lists.chunks.read_chunks();
        let inv = lists.invalidate().filter(|h| {
            self.cfg.accept_remote_invalidate
                && chunks
                    .iter()
                    .flat_map(|c| c.segments.iter())
                    .all(|s| s.handle == *h)
        });
        let known = self
            .calls
            .get(&xid)
            .is_some_and(|o| o.sent && o.pull.is_none());
        let was_abandoned = self.abandoned.remove(&xid);
        let mut out = Vec::new();
        if !known {
            // reliable-reply-02 §4.1.3: "If a requester receives a reply bearing a Position
            // Zero Read chunk and does not recognize the XID, the requester MUST notify the
            // responder of pull completion."
            self.stats.rrc_unknown_xid += 1;
            if was_abandoned {
                // The reply to a cancelled call returns its credit.
                self.in_flight = self.in_flight.saturating_sub(1);
                self.granted = credits.clamp(1, self.cfg.credits.max(1));
                self.stats.late_replies += 1;
            } else {
                self.stats.dropped += 1;
            }
            out.push(self.notify(xid, PullStatus::UnknownXid, inv));
            out.extend(self.pump(reg));
            return out;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.granted = credits.clamp(1, self.cfg.credits.max(1));
        self.stats.nomsg_replies += 1;
        if !self.rrc_agreed() {
            // §4.1.3: "If a requester receives an RPC Reply via a responder-provided Read
            // chunk, but does not support such chunks, it MUST inform the responder of pull
            // completion and terminate the RPC transaction."
            self.stats.rrc_unsupported += 1;
            out.push(self.notify(xid, PullStatus::Unsupported, inv));
            out.extend(self.finish(
                xid,
                Err(RpcError::BadReply(
                    "reply in a responder-provided Read chunk, which was not agreed".into(),
                )),
                remote_invalidated,
                reg,
            ));
            out.extend(self.pump(reg));
            return out;
        }
        let rrc = &self.cfg.rrc;
        let shape_ok = matches!(&chunks[..], [c] if c.position == 0)
            && lists.chunks.reply.is_none()
            && chunks[0].segments.len() <= rrc.max_segments;
        let len = chunks
            .first()
            .map_or(0, |c| c.segments.iter().map(|s| s.length as usize).sum());
        if !shape_ok || len == 0 || len > rrc.max_reply {
            self.stats.rrc_refused += 1;
            out.push(self.notify(xid, PullStatus::Failed, inv));
            out.extend(self.finish(
                xid,
                Err(RpcError::BadReply(format!(
                    "responder-provided Read chunk refused: {} chunk(s), {len} bytes",
                    chunks.len()
                ))),
                remote_invalidated,
                reg,
            ));
            out.extend(self.pump(reg));
            return out;
        }
        self.next_pull += 1;
        let id = self.next_pull;
        if let Some(o) = self.calls.get_mut(&xid) {
            o.pull = Some(id);
        }
        self.pulls.insert(
            id,
            Pull {
                xid,
                len,
                inv,
                writes: lists.chunks.writes,
                remote_invalidated,
            },
        );
        self.stats.rrc_pulls += 1;
        let segments: Vec<Segment> = chunks.into_iter().flat_map(|c| c.segments).collect();
        out.push(Action::Pull {
            xid,
            pull: id,
            segments,
            len,
        });
        out.extend(self.pump(reg));
        out
    }

    /// The driver's RDMA Reads of pull `pull` ended: `Ok` with the chunk's bytes (exactly the
    /// length [`Action::Pull`] named), or `Err` when a Read failed. The reply is delivered
    /// (once: a call that completed meanwhile, by a timeout or a cancel, gets nothing more)
    /// and the notification goes. A pull of an earlier connection is forgotten: that
    /// connection's responder invalidated its chunks when it ended.
    #[must_use = "every action the engine returns must be performed"]
    pub fn pull_done(
        &mut self,
        pull: u64,
        data: Result<Bytes, String>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let Some(p) = self.pulls.remove(&pull) else {
            return Vec::new();
        };
        let mine = self.calls.get(&p.xid).is_some_and(|o| o.pull == Some(pull));
        let mut out = Vec::new();
        let status = match (&data, mine) {
            (_, false) => PullStatus::UnknownXid,
            (Ok(d), true) if d.len() == p.len => PullStatus::Pulled,
            _ => PullStatus::Failed,
        };
        // reliable-reply-02 §4.1.2: "After RDMA Read operations have completed (successfully
        // or in error), the requester MUST inform the responder that it may invalidate the
        // Read chunk containing the RPC Reply message."
        out.push(self.notify(p.xid, status, p.inv));
        if !mine {
            return out;
        }
        let result = match (status, data) {
            (PullStatus::Pulled, Ok(payload)) => {
                self.stats.rrc_pulled_bytes += payload.len() as u64;
                // The pulled Payload stream is the reply as an inline one would carry it,
                // with the reply's Write list for its DDP-eligible results.
                let h = Header::new(
                    p.xid,
                    self.granted,
                    Body::Msg(Chunks {
                        reads: Vec::new(),
                        writes: p.writes,
                        reply: None,
                    }),
                );
                self.reply_result(p.xid, &h, payload, reg)
            }
            (_, Err(e)) => {
                self.stats.rrc_pull_failed += 1;
                Err(RpcError::Transport(format!(
                    "RDMA Read of a responder-provided Read chunk failed: {e}"
                )))
            }
            (_, Ok(d)) => {
                self.stats.rrc_pull_failed += 1;
                Err(RpcError::Transport(format!(
                    "responder-provided Read chunk: {} bytes pulled, {} expected",
                    d.len(),
                    p.len
                )))
            }
        };
        out.extend(self.finish(p.xid, result, p.remote_invalidated, reg));
        out
    }

    /// Forget the pulls of a connection that ended (their calls are sent again).
    pub(super) fn forget_pulls(&mut self) {
        self.pulls.clear();
        for o in self.calls.values_mut() {
            o.pull = None;
        }
    }
}
