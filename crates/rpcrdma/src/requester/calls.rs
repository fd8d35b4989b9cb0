//! Call building and chunk planning: admitting a call within the credit limit, registering its
//! memory, choosing the message form and encoding the transport header.

use bytes::{Bytes, BytesMut};
use oncrpc::RpcError;

use super::{Action, NULL_REPLY_MAX, OutCall, Outstanding, Requester};
use crate::engine::{RegError, Registrar, unreduced_positions};
use crate::header::{Body, Chunks, Header, ReadChunk, WriteChunk};
use crate::header_v2::{Body2, ChunkLists, Direction, Header2};
use crate::version::Version;

/// A call's transport header in the connection's version.
pub(super) enum CallHeader {
    V1(Header),
    V2(Header2),
}

impl CallHeader {
    /// A call's header (`direction` CALL), or a backward call's reply's (REPLY).
    pub(super) fn new(
        v2: bool,
        xid: u32,
        credits: u32,
        nomsg: bool,
        chunks: Chunks,
        inv: u32,
        direction: Direction,
    ) -> Self {
        if v2 {
            let l = ChunkLists {
                direction,
                inv_handle: inv,
                chunks,
            };
            CallHeader::V2(Header2::new(
                xid,
                credits,
                if nomsg {
                    Body2::NoMsg(l)
                } else {
                    Body2::Msg(l)
                },
            ))
        } else {
            CallHeader::V1(Header::new(
                xid,
                credits,
                if nomsg {
                    Body::NoMsg(chunks)
                } else {
                    Body::Msg(chunks)
                },
            ))
        }
    }

    pub(super) fn encoded_len(&self) -> usize {
        match self {
            CallHeader::V1(h) => h.encoded_len(),
            CallHeader::V2(h) => h.encoded_len(),
        }
    }

    pub(super) fn encode(&self, out: &mut BytesMut) {
        match self {
            CallHeader::V1(h) => h.encode(out),
            CallHeader::V2(h) => h.encode(out),
        }
    }
}

/// cel-05 §7.2.3: the handle a requester offers for Send With Invalidate must be one of the
/// header's; the first Write chunk's, else the Reply chunk's, else the first Read segment's
/// (every one of them is registered for this call only and fenced when it completes).
fn offered_handle(c: &Chunks) -> u32 {
    c.writes
        .iter()
        .flatten()
        .chain(c.reply.iter().flatten())
        .map(|s| s.handle)
        .chain(c.reads.iter().map(|r| r.target.handle))
        .find(|&h| h != 0)
        .unwrap_or(0)
}

fn reg_failed(e: RegError) -> RpcError {
    RpcError::Transport(e.to_string())
}

/// The transport header of an inline reply in this version that returns `writes` (the Write
/// list the call offers, echoed with the lengths written) and no Reply chunk: version 1's
/// RDMA_MSG is 28 bytes with an empty Write list, version 2's RDMA2_MSG 36 (its direction and
/// rdma_inv_handle words, cel-05 §6.3). The Requester sizes inline replies with the same
/// encoder the Responder builds them with.
fn inline_reply_header_len(v2: bool, writes: &[WriteChunk]) -> usize {
    let chunks = Chunks {
        writes: writes.to_vec(),
        ..Chunks::default()
    };
    CallHeader::new(v2, 0, 0, false, chunks, 0, Direction::Reply).encoded_len()
}

impl Requester {
    /// Queue a call and send what the credit limit allows. A call whose program and version
    /// have no Upper-Layer Binding completes at once with [`RpcError::NoBinding`]: nothing is
    /// registered or sent.
    #[must_use = "every action the engine returns must be performed"]
    pub fn submit(&mut self, mut call: OutCall, reg: &mut dyn Registrar) -> Vec<Action> {
        let xid = call.xid;
        // RFC 8166 §6: "Each RPC Program and Version tuple that utilizes RPC-over-RDMA
        // version 1 needs to have a ULB specification."
        let Some(ulb) = self
            .ulbs
            .get(&call.prog)
            .filter(|u| u.covers_version(call.vers))
        else {
            self.stats.no_binding += 1;
            return vec![Action::Complete {
                xid,
                result: Err(RpcError::NoBinding {
                    prog: call.prog,
                    vers: call.vers,
                }),
            }];
        };
        if !ulb.has_ddp_items() {
            // RFC 8166 §6.1: nothing of this program may be reduced, so no Write chunks.
            call.no_reduction = true;
        }
        self.calls.insert(
            xid,
            Outstanding {
                call,
                regions: Vec::new(),
                writes: Vec::new(),
                reply_chunk: None,
                sent: false,
                long_call: false,
                reshaped: false,
                pull: None,
            },
        );
        self.queue.push_back(xid);
        self.pump(reg)
    }

    pub(super) fn pump(&mut self, reg: &mut dyn Registrar) -> Vec<Action> {
        let mut out = Vec::new();
        //= specs/rfc8166.txt#section-3.3.1
        //# A Requester MUST NOT send unacknowledged requests in excess of the Responder's granted
        //# credit limit.
        while self.connected && self.in_flight < self.limit() {
            let Some(xid) = self.queue.pop_front() else {
                break;
            };
            match self.build(xid, reg) {
                Ok(data) => {
                    self.in_flight += 1;
                    self.stats.sent += 1;
                    let n = self.in_flight as u32;
                    if n > self.stats.max_outstanding {
                        self.stats.max_outstanding = n;
                        self.stats.limit_at_max = self.limit() as u32;
                    }
                    self.stats.outstanding = n;
                    if self.in_flight > self.limit() {
                        self.stats.over_limit += 1;
                    }
                    out.push(Action::Send { xid, data });
                }
                Err(e) => {
                    out.extend(self.finish(xid, Err(e), None, reg));
                }
            }
        }
        out
    }

    /// Register memory and build the Send for one call.
    fn build(&mut self, xid: u32, reg: &mut dyn Registrar) -> Result<Bytes, RpcError> {
        let params = self.params;
        let cfg = self.cfg.clone();
        let version = self.version.current();
        let send_limit = self.send_limit();
        // reliable-reply-02 §5.3.1: with responder-provided Read chunks agreed, a requester in
        // read-chunk mode registers no Write chunks and no Reply chunk.
        let by_read_chunk = self.replies_by_read_chunk();
        let o = self
            .calls
            .get_mut(&xid)
            .ok_or_else(|| RpcError::Transport("unknown call".into()))?;
        o.long_call = false;
        if !o.call.message.reduced.is_empty() {
            // Reduction is the sender's choice (RFC 8166 §3.4.3: "a sender may choose to
            // reduce that data item"): a call whose whole Payload stream fits what the server
            // receives goes inline, unreduced, as §3.5.1's Short message, and the RDMA Read
            // round trip that would pull its argument is saved. Linux's client does the same
            // in version 1 (a call that fits its inline send threshold is sent whole). In
            // version 2 that threshold is the server's RBSIZ (cel-05 §3.3 and §6.2.1), the
            // larger inline threshold version 2 offers.
            // The whole stream is built only when it fits (its length is known without it).
            let msg = &o.call.message;
            let whole_len = msg.len()
                + msg
                    .reduced
                    .iter()
                    .map(xdr::ReducedItem::padded_len)
                    .sum::<usize>();
            let lists = 16 + 8 + 12;
            if lists + whole_len <= send_limit {
                o.call.message = xdr::Encoded::whole(o.call.message.unreduced());
                self.stats.inline_unreduced += 1;
            }
        }
        let msg = &o.call.message;
        // Read chunks for the reduced arguments, Positions in the reassembled stream.
        let mut read_chunks = Vec::new();
        //= specs/rfc8166.txt#section-3.4.4.4
        //# Except in special cases (covered in Section 3.5.3), a chunk MUST contain exactly one XDR
        //# data item.
        //= specs/rfc8166.txt#section-3.4.5
        //# The Position value MUST be computed from the beginning of the unreduced Payload stream,
        //# which begins at Position zero.
        for (item, pos) in msg.reduced.iter().zip(unreduced_positions(&msg.reduced)) {
            //= specs/rfc8166.txt#section-3.4.5.2
            //# When reducing a variable-length argument data item, the Requester SHOULD NOT include
            //# the data item's XDR roundup padding in the chunk.
            //= specs/rfc8166.txt#section-3.4.5.2
            //# o If the sender chooses not to include roundup padding in the chunk, the chunk's
            //# total length MUST be the same as the encoded length of the data item.
            let r = reg.register_source(item.data.clone()).map_err(reg_failed)?;
            read_chunks.push(ReadChunk {
                position: u32::try_from(pos)
                    .map_err(|_| RpcError::Transport("call too large".into()))?,
                segments: r.segments.clone(),
            });
            o.regions.push(r);
        }
        // Write chunks for DDP-eligible results (none under RPCSEC_GSS integrity/privacy).
        // `moved` counts the most Payload-stream bytes they take out of the reply: each item's
        // contents and XDR padding (RFC 8166 §3.4.6.2), its length word stays inline.
        let mut writes: Vec<WriteChunk> = Vec::new();
        let mut moved = 0usize;
        // A reply that fits our receive buffers whole needs no Write chunk: the Responder
        // returns it inline (it may only reduce into chunks the Requester provides, RFC 8166
        // §3.4.6), and the registration, the RDMA Write and the invalidation are saved, as
        // Linux's client does when the largest reply fits its inline receive threshold.
        let v2 = version == Version::V2;
        let fits_inline = o.call.reply.max_len.is_some_and(|m| {
            m.saturating_add(inline_reply_header_len(v2, &[])) <= params.reply_inline
        });
        if !o.call.no_reduction && !by_read_chunk && !fits_inline {
            //= specs/rfc8166.txt#section-3.4.6
            //# Thus, it MUST register Write chunks long enough to accommodate the maximum possible
            //# size of each returned data item.
            //= specs/rfc8166.txt#section-4.3.2.2
            //# Therefore, the Requester MUST provision each Write chunk so it can be filled with
            //# the largest DDP-eligible data item that can be placed in it.
            //= specs/rfc8166.txt#section-3.4.6.2
            //# When provisioning a Write chunk for a variable-length result data item, the
            //# Requester SHOULD NOT include additional space for XDR roundup padding.
            for &len in o.call.reply.ddp_items.iter().take(cfg.max_write_chunks) {
                let r = reg.register_sink(len).map_err(reg_failed)?;
                writes.push(r.segments.clone());
                o.writes.push(o.regions.len());
                o.regions.push(r);
                moved = moved.saturating_add(xdr::padded(len));
            }
        }
        // RFC 8166 §4.3.3: "A Requester MUST provide a Reply chunk whenever the maximum possible
        // size of the RPC Reply message's Transport and Payload streams is larger than the
        // inline threshold for messages from Responder to Requester." The reply that arrives is
        // the reduced one: the Responder fills every Write chunk it is given with a DDP-eligible
        // result (§4.3.2), so only what stays in the Payload stream counts, as in Linux's
        // client. This also keeps a Write list and a Reply chunk apart for READ, which Linux
        // nfsd 6.1 needs: with both, it reports the Reply chunk's length as the whole reply,
        // Write chunk payloads and their padding included (interop/WIRE-NOTES.md).
        let max_reply = match o.call.reply.max_len {
            Some(m) => m.saturating_sub(moved),
            None if o.call.proc_ == 0 => NULL_REPLY_MAX,
            None => cfg.default_reply_chunk,
        };
        let reply_hdr_room = inline_reply_header_len(v2, &writes);
        // RFC 8166 §3.3.2 / RFC 8797: the Responder sends at most its own send size inline,
        // which can be less than our receive buffers.
        //= specs/rfc8166.txt#section-4.3.3
        //# A Requester MUST provide a Reply chunk whenever the maximum possible size of the RPC
        //# Reply message's Transport and Payload streams is larger than the inline threshold for
        //# messages from Responder to Requester.
        let reply = if !by_read_chunk && max_reply + reply_hdr_room > params.reply_inline {
            let r = reg.register_sink(max_reply).map_err(reg_failed)?;
            let segs = r.segments.clone();
            o.reply_chunk = Some(o.regions.len());
            o.regions.push(r);
            Some(segs)
        } else {
            None
        };
        if reply.is_some() {
            self.stats.long_reply += 1;
        }
        if !writes.is_empty() {
            self.stats.write_chunk_calls += 1;
        }
        if by_read_chunk {
            self.stats.rrc_calls += 1;
        }
        let mut chunks = Chunks {
            reads: Vec::new(),
            writes,
            reply,
        };
        chunks.set_read_chunks(&read_chunks);
        let inv = |c: &Chunks| {
            if v2 && cfg.accept_remote_invalidate {
                offered_handle(c)
            } else {
                0
            }
        };
        //= specs/rfc8166.txt#section-4.2.4
        //# A Requester MUST NOT send an RPC-over-RDMA header with the RDMA_ERROR procedure.
        //= specs/rfc8166.txt#section-4.6.1
        //# Therefore, senders MUST NOT send RDMA_MSGP procedures.
        //= specs/rfc8166.txt#section-4.6.2
        //# Therefore, senders MUST NOT send RDMA_DONE messages.
        let short = CallHeader::new(
            v2,
            xid,
            cfg.credits,
            false,
            chunks.clone(),
            inv(&chunks),
            Direction::Call,
        );
        // A Short call's Payload stream is copied once, from its parts into the message after
        // the header (made contiguous first, it was copied twice).
        let (h, inline) = if short.encoded_len() + msg.len() <= send_limit {
            if read_chunks.is_empty() {
                self.stats.short += 1;
            } else {
                self.stats.chunked += 1;
            }
            (short, Some(msg))
        } else {
            let payload = msg.to_bytes();
            // Long Call: the whole Payload stream goes in a Position-Zero Read chunk, sent
            // as RDMA_NOMSG (RFC 8166 §3.5.3).
            //= specs/rfc8166.txt#section-3.5.3
            //# If there are no DDP- eligible data items in the Payload stream, or the Payload
            //# stream is still too large after it has been reduced, the RDMA transport MUST use
            //# RDMA Read or Write operations to convey the Payload stream itself.
            //= specs/rfc8166.txt#section-3.5.3
            //# As these chunks contain a Payload stream, such chunks MUST include appropriate XDR
            //# roundup padding to maintain proper XDR alignment of their contents.
            self.stats.long_call += 1;
            o.long_call = true;
            let r = reg.register_source(payload).map_err(reg_failed)?;
            let mut all = vec![ReadChunk {
                //= specs/rfc8166.txt#section-3.5.3
                //# Every RDMA read segment in this chunk MUST contain zero in its Position field.
                position: 0,
                segments: r.segments.clone(),
            }];
            o.regions.push(r);
            all.extend(read_chunks);
            chunks.set_read_chunks(&all);
            let handle = inv(&chunks);
            let h = CallHeader::new(v2, xid, cfg.credits, true, chunks, handle, Direction::Call);
            if h.encoded_len() > send_limit {
                return Err(RpcError::Transport(
                    "transport header exceeds inline threshold".into(),
                ));
            }
            (h, None)
        };
        let inline_len = inline.map_or(0, xdr::Encoded::len);
        let mut data = BytesMut::with_capacity(h.encoded_len() + inline_len);
        h.encode(&mut data);
        if let Some(m) = inline {
            m.put_into(&mut data);
        }
        o.sent = true;
        Ok(data.freeze())
    }
}
