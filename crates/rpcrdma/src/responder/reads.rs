//! Chunk pulls: a call whose Read chunks were RDMA Read is reassembled, checked against the
//! Upper-Layer Binding and handed to the dispatcher.

use bytes::Bytes;
use oncrpc::Credential;
use xdr::DdpPolicy;

use super::{Incoming, PendingCall, ReadyCall, ReplyToken, Responder, call_header, rpc_xid};
use crate::engine::reassemble;
use crate::header::{Chunks, ErrorResponse};
use crate::header_v2::{ErrorBody2, ErrorResponse2};

impl Responder {
    /// Continue a call once every Read chunk has been pulled (`data[i]` for `reads[i]`).
    pub fn complete_reads(&mut self, p: PendingCall, data: Vec<Bytes>) -> Incoming {
        self.deadlines.reads_done(p.id);
        self.pulling.remove(&p.id);
        let xid = p.header.xid;
        if data.len() != p.reads.len() {
            // The driver pulled other than what was asked: the responder's own problem
            // (cel-05 §7.2.4 RDMA2_ERR_SYSTEM in version 2).
            if self.v2() {
                return self.error2(ErrorResponse2::Error {
                    xid,
                    body: ErrorBody2::System,
                });
            }
            return self.error(ErrorResponse::ErrChunk { xid });
        }
        let Some(chunks) = p.header.body.chunks().cloned() else {
            return Incoming::Nothing;
        };
        let mut data = data.into_iter();
        let mut others: Vec<(usize, Bytes)> = Vec::new();
        let mut stream = p.inline.clone();
        for (c, d) in p.reads.iter().zip(&mut data) {
            if c.position == 0 {
                // Long Call: the Position-Zero Read chunk is the Payload stream.
                stream = d;
            } else {
                others.push((c.position as usize, d));
            }
        }
        let message = match reassemble(&stream, &others) {
            Ok(m) => m,
            // Positions that do not fit the Payload stream: the XID may still be readable.
            Err(_) => {
                return match rpc_xid(&stream) {
                    Some(x) if x == xid => self.garbage(xid),
                    _ => self.error(ErrorResponse::ErrChunk { xid }),
                };
            }
        };
        self.reassembled(p, chunks, message, others)
    }

    /// Continue a call whose one Read chunk (see [`PendingCall::frame`]) was pulled into a
    /// buffer that already holds the whole call: the inline bytes before the chunk's contents,
    /// `data_len` bytes of them, their XDR round-up, and the inline bytes after. The result is
    /// the same as [`Responder::complete_reads`] with the chunk's contents.
    pub fn complete_reads_framed(
        &mut self,
        p: PendingCall,
        message: Bytes,
        data_len: usize,
    ) -> Incoming {
        self.deadlines.reads_done(p.id);
        self.pulling.remove(&p.id);
        let xid = p.header.xid;
        let Some(chunks) = p.header.body.chunks().cloned() else {
            return Incoming::Nothing;
        };
        let Some((at, pre, post)) = p.frame() else {
            return self.error(ErrorResponse::ErrChunk { xid });
        };
        let end = at + data_len;
        if message.len() != end + xdr::pad_len(data_len) + post.len() || message[..at] != *pre {
            return self.error(ErrorResponse::ErrChunk { xid });
        }
        let others = vec![(at, message.slice(at..end))];
        self.reassembled(p, chunks, message, others)
    }

    /// The checks and dispatch that follow reassembly. `others` holds the (Position, contents)
    /// of the Read chunks that are not at Position zero.
    pub(super) fn reassembled(
        &mut self,
        p: PendingCall,
        chunks: Chunks,
        message: Bytes,
        others: Vec<(usize, Bytes)>,
    ) -> Incoming {
        let xid = p.header.xid;
        // RFC 8166 §4.5.2: an rdma_xid that does not match the RPC XID is an XDR error.
        //= specs/rfc8166.txt#section-4.2.1
        //# This XID MUST be the same as the XID in the RPC message.
        if rpc_xid(&message) != Some(xid) {
            return self.error(ErrorResponse::ErrChunk { xid });
        }
        let Some((call, args_at)) = call_header(&message) else {
            // Not a decodable CALL: let the dispatcher apply RFC 5531 (RPC_MISMATCH or drop).
            return self.ready(xid, message, &chunks, DdpPolicy::Inline, p.inv_handle);
        };
        let gss = Credential::forbids_reduction_of(&call.cred);
        let ulb = self.ulbs.get(&call.prog).cloned();
        let n_other = others.len();
        // cel-05 §7.2.4: a version 2 responder that "cannot handle any Write chunks" answers
        // REPLY_RESOURCE when the reply does not fit without them: its Write chunks are left
        // unused and the reply takes the inline or Reply chunk path, which says so.
        let mut no_writes = false;
        if let Some(ulb) = &ulb {
            // RFC 8267 §6.4.2 style complexity limits: RDMA_ERR_CHUNK.
            let lim = ulb.chunk_limits();
            let segs_ok = p.reads.iter().all(|c| c.segments.len() <= lim.max_segments)
                && chunks.writes.iter().all(|c| c.len() <= lim.max_segments)
                && chunks
                    .reply
                    .as_ref()
                    .is_none_or(|c| c.len() <= lim.max_segments);
            let pz = p.reads.len() - n_other;
            if self.v2() {
                // cel-05 §7.2.4: each limit has its own error naming it. Gap 6: only Read
                // chunks at non-zero Positions count against READ_CHUNKS' maximum; one
                // Position-Zero Read chunk is always accepted.
                let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                let body = if n_other > lim.max_read_chunks {
                    Some(ErrorBody2::ReadChunks {
                        max_chunks: count(lim.max_read_chunks),
                    })
                } else if lim.max_write_chunks > 0 && chunks.writes.len() > lim.max_write_chunks {
                    Some(ErrorBody2::WriteChunks {
                        max_chunks: count(lim.max_write_chunks),
                    })
                } else if !segs_ok {
                    Some(ErrorBody2::Segments {
                        max_segments: count(lim.max_segments),
                    })
                } else if pz > lim.max_position_zero_chunks.max(1) {
                    Some(ErrorBody2::BadXdr)
                } else {
                    None
                };
                if let Some(body) = body {
                    return self.error2(ErrorResponse2::Error { xid, body });
                }
                no_writes = lim.max_write_chunks == 0;
            } else if !segs_ok
                || n_other > lim.max_read_chunks
                || pz > lim.max_position_zero_chunks
                || chunks.writes.len() > lim.max_write_chunks
            {
                return self.error(ErrorResponse::ErrChunk { xid });
            }
        }
        if n_other > 0 {
            // RFC 8166 §6.1 / §4.5.2: only DDP-eligible items may travel in Read chunks; a
            // violation is not processed and is reported with GARBAGE_ARGS. Programs without
            // an Upper-Layer Binding have no eligible items, and neither do calls under
            // RPCSEC_GSS integrity or privacy (RFC 8166 §8.2.2.3).
            //= specs/rfc8166.txt#section-6.1
            //# The Responder MUST NOT process this RPC Call message and MUST report the violation
            //# as described in Section 4.5.2.
            let Some(ulb) = ulb.filter(|_| !gss) else {
                return self.garbage(xid);
            };
            let args = &message[args_at..];
            let items = match ulb.call_ddp_items(call.vers, call.proc_, args) {
                Ok(i) => i,
                Err(_) => return self.garbage(xid),
            };
            // The chunk holds the item's contents, with or without its XDR round-up
            // (RFC 8166 §3.4.5.2: the Requester SHOULD NOT include the padding, and may).
            //= specs/rfc8166.txt#section-3.4.5.2
            //# o If the Requester chooses to include roundup padding in a Read chunk,
            //# the chunk's total length MUST be the sum of the encoded length of the
            //# data item and the length of the roundup padding.
            //= specs/rfc8166.txt#section-3.4.5.2
            //# o If the sender chooses not to include roundup padding in the chunk, the
            //# chunk's total length MUST be the same as the encoded length of the data
            //# item.
            let ok = others.iter().all(|(pos, d)| {
                items.iter().any(|r| {
                    r.start + args_at == *pos
                        && (r.len() == d.len() || xdr::padded(r.len()) == d.len())
                })
            });
            if !ok {
                return self.garbage(xid);
            }
        }
        //= specs/rfc8166.txt#section-4.3.2
        //# When a Requester provides a Write list, the Responder MUST push data corresponding to
        //# DDP-eligible result data items to Requester memory referenced in the Write list.
        //= specs/rfc8166.txt#section-8.2.2.3
        //# Therefore, a sender MUST NOT reduce a Payload stream when RPCSEC_GSS integrity or
        //# encryption services are in use.
        let policy = if gss || no_writes || chunks.writes.is_empty() {
            DdpPolicy::Inline
        } else {
            // RFC 8166 §4.3.2: "When a Requester provides a Write list, the Responder MUST push
            // data corresponding to DDP-eligible result data items to Requester memory
            // referenced in the Write list": every eligible item goes to a chunk, however small.
            DdpPolicy::Reduce {
                min_len: 0,
                max_items: chunks.writes.len(),
            }
        };
        self.ready(xid, message, &chunks, policy, p.inv_handle)
    }

    pub(super) fn ready(
        &mut self,
        xid: u32,
        message: Bytes,
        chunks: &Chunks,
        policy: DdpPolicy,
        inv_handle: Option<u32>,
    ) -> Incoming {
        self.stats.calls += 1;
        if self.in_progress.len() >= self.grant() as usize {
            self.stats.over_credit += 1;
        }
        self.in_progress.insert(xid);
        self.stats.in_progress = self.in_progress.len() as u32;
        self.stats.max_in_progress = self.stats.max_in_progress.max(self.stats.in_progress);
        // Linux's rule for Send With Invalidate: the peer allows it and every segment in the
        // call carries the same handle.
        let mut handles = chunks
            .reads
            .iter()
            .map(|r| r.target.handle)
            .chain(chunks.writes.iter().flatten().map(|s| s.handle))
            .chain(chunks.reply.iter().flatten().map(|s| s.handle));
        let swi_handle = if self.v2() {
            // cel-05 §7.2.3: the requester names the handle (gap 5: on version 2 this
            // supersedes RFC 8797's flag and Linux's one-handle rule).
            inv_handle
        } else {
            match handles.next() {
                Some(h) if self.params.peer_remote_invalidate && handles.all(|x| x == h) => Some(h),
                _ => None,
            }
        };
        Incoming::Call(ReadyCall {
            message,
            policy,
            token: ReplyToken {
                xid,
                writes: chunks.writes.clone(),
                reply_chunk: chunks.reply.clone(),
                swi_handle,
            },
        })
    }
}
