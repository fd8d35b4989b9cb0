//! Reply building: RDMA Writes for the Write list and Reply chunk, then one Send (RDMA_MSG or
//! RDMA_NOMSG), and what happens when a reply cannot be sent.

use std::collections::HashSet;

use bytes::Bytes;
use oncrpc::ReplyMessage;

use super::{Action, ReplyToken, Responder};
use crate::engine::fill_segments;
use crate::header::{Body, Chunks, ErrorResponse, Header, Segment, WriteChunk, chunk_len};
use crate::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2};

impl Responder {
    /// Form the reply to a call. `reply` is what the dispatcher returned (`None`: send no RPC
    /// reply; the credit is still released).
    #[must_use = "every action the engine returns must be performed"]
    pub fn reply(&mut self, token: ReplyToken, reply: Option<ReplyMessage>) -> Vec<Action> {
        self.in_progress.remove(&token.xid);
        self.stats.in_progress = self.in_progress.len() as u32;
        let Some(reply) = reply else {
            return Vec::new();
        };
        let xid = token.xid;
        let msg = reply.message;
        let mut actions = Vec::new();
        // Write list: item i goes to Write chunk i, segments filled in array order; pad bytes
        // are never written (5666bis §4.4.6, §4.4.6.1); unused chunks come back with every
        // segment length zero (5666bis §4.4.6.2).
        let mut writes: Vec<WriteChunk> = Vec::with_capacity(token.writes.len());
        for (i, chunk) in token.writes.iter().enumerate() {
            match msg.reduced.get(i) {
                Some(item) => match fill_segments(chunk, &item.data) {
                    Some((w, updated)) => {
                        actions.extend(
                            w.into_iter()
                                .map(|(segment, data)| Action::Write { segment, data }),
                        );
                        writes.push(updated);
                    }
                    // The Write chunk is too small (5666bis §5.5.3; cel-05 §7.2.4
                    // RDMA2_ERR_WRITE_RESOURCE names the chunk, from 1, and what it needs).
                    None if self.v2() => {
                        return self.error2_actions(
                            xid,
                            ErrorBody2::WriteResource {
                                chunk_index: u32::try_from(i + 1).unwrap_or(u32::MAX),
                                length_needed: u32::try_from(item.data.len()).unwrap_or(u32::MAX),
                            },
                        );
                    }
                    None => return self.error_actions(ErrorResponse::ErrChunk { xid }),
                },
                None => writes.push(chunk.iter().map(|s| Segment { length: 0, ..*s }).collect()),
            }
        }
        if msg.reduced.len() > token.writes.len() {
            // The dispatcher reduced more than the policy allowed: cannot be expressed.
            return self.error_actions(ErrorResponse::ErrChunk { xid });
        }
        let payload = msg.to_bytes();
        let mut chunks = Chunks {
            reads: Vec::new(),
            writes,
            reply: None,
        };
        let hdr_len = if self.v2() {
            Header2::new(
                xid,
                0,
                Body2::Msg(ChunkLists::new(Direction::Reply, chunks.clone())),
            )
            .encoded_len()
        } else {
            Header::new(xid, 0, Body::Msg(chunks.clone())).encoded_len()
        };
        let inline_len = hdr_len + payload.len();
        let (body, inline) = if inline_len <= self.params.inline_send {
            (Body::Msg(chunks), payload)
        } else {
            // Long Reply: the Payload stream goes through the Reply chunk
            // (5666bis §5.3.3: "the responder MUST use the provided Reply chunk").
            let fits = token
                .reply_chunk
                .as_ref()
                .is_some_and(|rc| chunk_len(rc) >= payload.len() as u64);
            if !fits && self.v2() {
                // cel-05 §7.2.4: "the responder MUST set the rdma_err field to
                // RDMA2_ERR_REPLY_RESOURCE ... rdma_length_needed to the number of Reply chunk
                // bytes needed to convey the reply".
                return self.error2_actions(
                    xid,
                    ErrorBody2::ReplyResource {
                        length_needed: u32::try_from(payload.len()).unwrap_or(u32::MAX),
                    },
                );
            }
            let Some(rc) = &token.reply_chunk else {
                return self.error_actions(ErrorResponse::ErrChunk { xid });
            };
            if chunk_len(rc) < payload.len() as u64 {
                return self.error_actions(ErrorResponse::ErrChunk { xid });
            }
            let Some((w, updated)) = fill_segments(rc, &payload) else {
                return self.error_actions(ErrorResponse::ErrChunk { xid });
            };
            actions.extend(
                w.into_iter()
                    .map(|(segment, data)| Action::Write { segment, data }),
            );
            chunks.reply = Some(updated);
            (Body::NoMsg(chunks), Bytes::new())
        };
        let mut data = self.header_bytes(xid, self.grant(), body, Direction::Reply, inline.len());
        data.extend_from_slice(&inline);
        actions.push(Action::Send {
            data: data.freeze(),
            invalidate: token.swi_handle,
        });
        actions
    }

    /// The driver reports that a Send or RDMA Write it posted for `xid` (a reply) or for no
    /// particular call failed, and whether an RDMA operational error was seen on the
    /// connection. 5666bis §5.5.4: the connection is closed ([`Action::Close`]); §5.5.3: only
    /// a reply lost to an operational error is remembered as lost (answered with
    /// RDMA_ERR_CHUNK once the Requester reconnects and retransmits): a Send flushed because
    /// the connection broke without one is executed again, or answered from the Upper
    /// Layer's duplicate request cache.
    #[must_use = "every action the engine returns must be performed"]
    pub fn send_failed(&mut self, xid: Option<u32>, operational_error: bool) -> Vec<Action> {
        match xid {
            Some(x) if operational_error => self.reply_failed(x),
            _ => vec![Action::Close],
        }
    }

    /// The driver reports that a reply could not be delivered (an RDMA Write or Send failed).
    /// 5666bis §5.5.4: the connection is closed; §5.5.3: once the Requester reconnects and
    /// retransmits, this XID is answered with RDMA_ERR_CHUNK.
    #[must_use = "every action the engine returns must be performed"]
    pub fn reply_failed(&mut self, xid: u32) -> Vec<Action> {
        self.in_progress.remove(&xid);
        if self.lost.len() < 4096 {
            self.lost.insert(xid);
        }
        vec![Action::Close]
    }

    /// Add XIDs whose replies were lost on another connection from the same peer.
    pub fn note_lost(&mut self, xids: impl IntoIterator<Item = u32>) {
        for x in xids {
            if self.lost.len() < 4096 {
                self.lost.insert(x);
            }
        }
    }

    /// XIDs to carry to the next connection from the same peer.
    pub fn take_lost(&mut self) -> HashSet<u32> {
        std::mem::take(&mut self.lost)
    }
}
