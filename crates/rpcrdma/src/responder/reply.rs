//! Reply building: RDMA Writes for the Write list and Reply chunk, then one Send (RDMA_MSG or
//! RDMA_NOMSG), and what happens when a reply cannot be sent.

use std::collections::HashSet;

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
        // The clock is read only for a reply that needs it: a reply a driver forms for every
        // call should not cost a system call where the clock source has no vDSO.
        self.reply_with(token, reply, std::time::Instant::now)
    }

    /// [`Responder::reply`] at `now` (which starts the pull deadline of a responder-provided
    /// Read chunk).
    #[must_use = "every action the engine returns must be performed"]
    pub fn reply_at(
        &mut self,
        token: ReplyToken,
        reply: Option<ReplyMessage>,
        now: std::time::Instant,
    ) -> Vec<Action> {
        self.reply_with(token, reply, || now)
    }

    /// [`Responder::reply_at`], with `now` asked for only when a responder-provided Read
    /// chunk's pull deadline starts.
    fn reply_with(
        &mut self,
        token: ReplyToken,
        reply: Option<ReplyMessage>,
        now: impl FnOnce() -> std::time::Instant,
    ) -> Vec<Action> {
        self.in_progress.remove(&token.xid);
        self.stats.in_progress = self.in_progress.len() as u32;
        let Some(reply) = reply else {
            return Vec::new();
        };
        let xid = token.xid;
        let msg = reply.message;
        let mut actions = Vec::new();
        // Write list: item i goes to Write chunk i, segments filled in array order; pad bytes
        // are never written (RFC 8166 §3.4.6, §3.4.6.2); unused chunks come back with every
        // segment length zero (RFC 8166 §4.3.2.2).
        //= specs/rfc8166.txt#section-3.4.4.4
        //# Except in special cases (covered in Section 3.5.3), a chunk MUST contain exactly one XDR
        //# data item.
        //= specs/rfc8166.txt#section-4.3.2.2
        //# If there is a subsequent DDP-eligible result data item in the RPC Reply message, it MUST
        //# be placed in that unconsumed Write chunk.
        let mut writes: Vec<WriteChunk> = Vec::with_capacity(token.writes.len());
        for (i, chunk) in token.writes.iter().enumerate() {
            match msg.reduced.get(i) {
                //= specs/rfc8166.txt#section-3.4.6.2
                //# A Responder MUST NOT write XDR roundup padding into a Write chunk, even if the
                //# Requester made space available for it.
                //= specs/rfc8166.txt#section-3.4.6.2
                //# Therefore, when returning a single variable-length result data item, a returned
                //# Write chunk's total length MUST be the same as the encoded length of the result
                //# data item.
                Some(item) => match fill_segments(chunk, &item.data) {
                    Some((w, updated)) => {
                        actions.extend(
                            w.into_iter()
                                .map(|(segment, data)| Action::Write { segment, data }),
                        );
                        writes.push(updated);
                    }
                    // The Write chunk is too small (RFC 8166 §4.5.3; cel-05 §7.2.4
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
                //= specs/rfc8166.txt#section-4.3.2.2
                //# If this is the last or only Write chunk available and it remains unconsumed, the
                //# Responder MUST return this Write chunk as an unused Write chunk (see Section
                //# 3.4.6).
                None => writes.push(chunk.iter().map(|s| Segment { length: 0, ..*s }).collect()),
            }
        }
        if msg.reduced.len() > token.writes.len() {
            // The dispatcher reduced more than the policy allowed: cannot be expressed. A
            // problem of the responder's own: cel-05 §7.2.4 RDMA2_ERR_SYSTEM in version 2.
            if self.v2() {
                return self.error2_actions(xid, ErrorBody2::System);
            }
            return self.error_actions(ErrorResponse::ErrChunk { xid });
        }
        let mut chunks = Chunks {
            //= specs/rfc8166.txt#section-4.3.1
            //# Responders MUST leave the Read list empty in all replies.
            reads: Vec::new(),
            writes,
            // An inline reply does not copy the Requester's Reply chunk back (as Linux does),
            // although RFC 8166 §4.3.3 asks for it whenever one was provided.
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
        let inline_len = hdr_len + msg.len();
        //= specs/rfc8166.txt#section-4.3.3
        //# If the Transport stream and Payload stream together are smaller than the reply inline
        //# threshold, the Responder MAY return the RPC Reply message as a Short message rather than
        //# using the Requester-provided Reply chunk.
        //= specs/rfc8166.txt#section-3.5.3
        //# If there are no DDP- eligible data items in the Payload stream, or the Payload stream is
        //# still too large after it has been reduced, the RDMA transport MUST use RDMA Read or
        //# Write operations to convey the Payload stream itself.
        // A Short reply's Payload stream is copied once, from its parts into the message after
        // the header (made contiguous first, it was copied twice).
        let (body, inline) = if inline_len <= self.params.inline_send {
            (Body::Msg(chunks), Some(&msg))
        } else {
            let payload = msg.to_bytes();
            // Long Reply: the Payload stream goes through the Reply chunk (RFC 8166 §3.5.3: "the
            // Responder MUST use the Requester-provided Reply chunk for the reply").
            //= specs/rfc8166.txt#section-3.5.3
            //# If a Reply chunk was provided and the reduced Payload stream is larger than the
            //# reply inline threshold, the Responder MUST use the Requester-provided Reply
            //# chunk for the reply.
            let fits = token
                .reply_chunk
                .as_ref()
                .is_some_and(|rc| chunk_len(rc) >= payload.len() as u64);
            if !fits && self.rrc_usable() {
                // Responder-provided Read chunks (reliable-reply-02 §4.1.1, §5.3.2): the
                // Payload stream exceeds the inline threshold and any Reply chunk.
                return self.reply_by_read_chunk(
                    xid,
                    actions,
                    chunks.writes,
                    payload,
                    token.swi_handle,
                    now(),
                );
            }
            // Without the capability: reliable-reply-02 §4.1.1, "it MUST return an appropriate
            // permanent transport error to terminate the requester's RPC transaction":
            // REPLY_RESOURCE in version 2 (below), ERR_CHUNK in version 1 (further down).
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
            (Body::NoMsg(chunks), None)
        };
        let inline_len = inline.map_or(0, |m| m.len());
        let mut data = self.header_bytes(xid, self.grant(), body, Direction::Reply, inline_len);
        if let Some(m) = inline {
            m.put_into(&mut data);
        }
        actions.extend(self.connprop(xid));
        actions.push(Action::Send {
            data: data.freeze(),
            invalidate: token.swi_handle,
        });
        actions
    }

    /// The driver reports that a Send or RDMA Write it posted for `xid` (a reply) or for no
    /// particular call failed, and whether an RDMA operational error was seen on the
    /// connection. RFC 8166 §4.5.4: the connection is closed ([`Action::Close`]); §4.5.3: only
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
    /// RFC 8166 §4.5.4: the connection is closed; §4.5.3: once the Requester reconnects and
    /// retransmits, this XID is answered with RDMA_ERR_CHUNK.
    #[must_use = "every action the engine returns must be performed"]
    //= specs/rfc8166.txt#section-4.5.4
    //# If a Responder is unable to construct and transmit an RPC Reply or RPC-over-RDMA error
    //# message, the Responder MUST close the connection to signal to the Requester that a reply was
    //# lost.
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
