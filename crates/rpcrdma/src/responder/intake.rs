//! Call intake: decoding a received transport header (either version), property exchange, and
//! the checks every call passes before its Read chunks are pulled.

use bytes::Bytes;

use super::{Action, Incoming, PendingCall, Responder, msg_type};
use crate::header::{
    Body, Chunks, ErrorResponse, Header, HeaderError, MIN_MSG_LEN, RDMA_MSG, ReadChunk,
};
use crate::header_v2::{
    Body2, Decode2Limits, Direction, ErrorBody2, ErrorResponse2, Header2, RPCRDMA_VERSION_2,
    error_vers_bytes, peek_version,
};
use crate::version::{CallVersion, Version};

impl Responder {
    /// Handle one received message (a full receive buffer as filled by the Send).
    pub fn on_receive(&mut self, buf: Bytes) -> Incoming {
        self.on_receive_with(buf, None)
    }

    /// [`Responder::on_receive`] for a message that came by Send With Invalidate of
    /// `invalidated` (a pull-completion notification may invalidate its chunk so).
    pub fn on_receive_with(&mut self, buf: Bytes, invalidated: Option<u32>) -> Incoming {
        // RFC 8166 §4.2 / cel-05 §8: the version decides how the rest is read; one the
        // connection does not (or no longer) accept gets ERR_VERS with the range it does.
        let Some((xid, vers)) = peek_version(&buf) else {
            return self.error(ErrorResponse::Discard);
        };
        // Version 2 has shorter valid messages (an RDMA2_CONNPROP with empty sets is 24
        // bytes); every other version falls under version 1's minimum.
        if buf.len() < MIN_MSG_LEN && vers != RPCRDMA_VERSION_2 {
            //= specs/rfc8166.txt#section-4.5
            //# If an incoming RPC-over-RDMA message is not as long as a minimal size RPC-over-RDMA
            //# header (28 bytes), the receiver cannot trust the value of the XID field; therefore,
            //# it MUST silently discard the message before performing any parsing.
            return self.error(ErrorResponse::Discard);
        }
        match self.version.check(vers) {
            //= specs/rfc8166.txt#section-4.5.1
            //# When a Responder detects an RPC-over-RDMA header version that it does not support
            //# (currently this document defines only version 1), it MUST reply with an RDMA_ERROR
            //# procedure and set the rdma_err value to ERR_VERS, also providing the low and high
            //# inclusive version numbers it does, in fact, support.
            CallVersion::ErrVers { low, high } => {
                self.stats.err_vers += 1;
                return Incoming::Respond(vec![Action::Send {
                    data: error_vers_bytes(xid, vers, self.grant(), low, high),
                    invalidate: None,
                }]);
            }
            CallVersion::Serve(Version::V2) => return self.on_receive_v2(buf, invalidated),
            CallVersion::Serve(Version::V1) => {}
        }
        let (header, hlen) = match Header::decode(&buf) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "bad transport header");
                //= specs/rfc8166.txt#section-4.5
                //# If other errors are detected in the RPC-over-RDMA header of an RPC Call message,
                //# a Responder MUST send an RDMA_ERROR message back to the Requester.
                return self.error(e.response());
            }
        };
        let xid = header.xid;
        match &header.body {
            Body::Msg(_) | Body::NoMsg(_) => {}
            // RFC 8166 §4.6.1: RDMA_MSGP gets RDMA_ERR_CHUNK (a SHOULD).
            Body::MsgP { .. } => {
                return self.error(HeaderError::BadProc { xid, proc_: 0 }.response());
            }
            //= specs/rfc8166.txt#section-4.6.2
            //# Receivers MUST silently discard RDMA_DONE messages.
            Body::Done => return self.error(ErrorResponse::Discard),
            // An RDMA_ERROR sent to a Responder has no transaction to end: drop it (and never
            // answer an error with an error, RFC 8166 §4.5).
            //= specs/rfc8166.txt#section-4.2.4
            //# A Responder MUST silently discard RDMA_ERROR procedures.
            Body::Error(_) => {
                self.stats.dropped += 1;
                return Incoming::Nothing;
            }
        }
        let inline = buf.slice(hlen..);
        // A backward-direction reply (RFC 8167 §5): RDMA_MSG with a REPLY inside.
        if header.body.proc_() == RDMA_MSG && msg_type(&inline) == Some(oncrpc::message::REPLY) {
            return self.on_back_reply(&header, inline);
        }
        if self.version.lock(Version::V1) {
            tracing::info!(
                xid,
                "RPC-over-RDMA connection speaks version 1: the client's first call"
            );
        }
        self.on_call(header, inline, None)
    }

    /// A version 2 message (cel-05 §7.2).
    fn on_receive_v2(&mut self, buf: Bytes, invalidated: Option<u32>) -> Incoming {
        let lim = Decode2Limits::default();
        let (h, hlen) = match Header2::decode_with(&buf, &lim) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "bad version 2 transport header");
                // A header of a version this connection may speak but that does not parse
                // locks nothing; the error still goes out in version 2.
                return self.error2(e.response());
            }
        };
        let xid = h.xid;
        let inline = buf.slice(hlen..);
        match h.body {
            Body2::Msg(l) | Body2::NoMsg(l) if l.direction == Direction::Reply => {
                // A backward-direction reply: only inline ones are expected (we offer no
                // chunks in backward calls).
                if msg_type(&inline) != Some(oncrpc::message::REPLY) {
                    return self.error2(ErrorResponse2::Error {
                        xid,
                        body: ErrorBody2::BadXdr,
                    });
                }
                let v1 = Header::new(xid, h.credits, Body::Msg(Chunks::default()));
                self.on_back_reply(&v1, inline)
            }
            body @ (Body2::Msg(_) | Body2::NoMsg(_)) => {
                let nomsg = matches!(body, Body2::NoMsg(_));
                let (Body2::Msg(l) | Body2::NoMsg(l)) = body else {
                    return Incoming::Nothing;
                };
                // §7.2.2: "the value of the rdma_direction field MUST be the same as the value
                // of the associated RPC message's msg_type field".
                if !nomsg && msg_type(&inline) != Some(oncrpc::message::CALL) {
                    return self.error2(ErrorResponse2::Error {
                        xid,
                        body: ErrorBody2::BadXdr,
                    });
                }
                if self.version.lock(Version::V2) {
                    tracing::info!(
                        xid,
                        "RPC-over-RDMA connection speaks version 2: the client's first call"
                    );
                }
                let inv = l.invalidate();
                let mut v1 = Header::msg_or_nomsg(xid, h.credits, l.chunks, nomsg);
                v1.vers = 2;
                self.on_call(v1, inline, inv)
            }
            // §7.2.4: "error messages never flow from requester to responder".
            Body2::Error(_) => {
                self.stats.dropped += 1;
                Incoming::Nothing
            }
            Body2::Optional(o) => {
                // Gap 2: only CALL-direction OPTIONAL messages are answered.
                if o.direction == Direction::Reply {
                    self.stats.dropped += 1;
                    return Incoming::Nothing;
                }
                // A pull-completion notification (crate::rrc), understood only when we
                // announced the capability; otherwise its opttype is unknown, as before.
                if self.cfg.rrc.enabled
                    && let Some(n) = crate::rrc::PullDone::from_optional(xid, &o)
                {
                    return match n {
                        Ok(n) => self.on_pull_done(n, invalidated),
                        Err(_) => self.error2(ErrorResponse2::Error {
                            xid,
                            body: ErrorBody2::BadXdr,
                        }),
                    };
                }
                match o.property_message(&lim.props) {
                    Some(Ok(m)) => self.on_property(xid, m),
                    Some(Err(_)) => self.error2(ErrorResponse2::Error {
                        xid,
                        body: ErrorBody2::BadXdr,
                    }),
                    // §5.1 / §7.2.4: an rdma_opttype the responder does not recognise.
                    None => self.error2(ErrorResponse2::Error {
                        xid,
                        body: ErrorBody2::InvalOption,
                    }),
                }
            }
            Body2::ConnProp(c) => {
                self.on_property(xid, crate::header_v2::PropertyMessage::ConnProp(c))
            }
            Body2::ReqProp(r) => {
                self.on_property(xid, crate::header_v2::PropertyMessage::ReqProp(r))
            }
            Body2::ResProp(r) => {
                self.on_property(xid, crate::header_v2::PropertyMessage::ResProp(r))
            }
            Body2::UpdProp(u) => {
                self.on_property(xid, crate::header_v2::PropertyMessage::UpdProp(u))
            }
        }
    }

    /// A transport property message from the peer (cel-05 §6.3).
    fn on_property(&mut self, xid: u32, m: crate::header_v2::PropertyMessage) -> Incoming {
        use crate::header_v2::PropertyMessage as P;
        match m {
            // §6.3.1, §6.3.4: the peer's values; unknown properties are ignored. Its RBSIZ is
            // the largest message we may send it (§3.3: 4096 until it says).
            P::ConnProp(c) => self.apply_peer(&c.start),
            P::UpdProp(u) => self.apply_peer(&u.now),
            // §6.3.2-§6.3.3: answered with RDMA2_RESPROP under the request's XID. Our values
            // are fixed for the connection, so changes are refused (§6.2: "peers MAY reject a
            // request to change a property for any reason").
            P::ReqProp(r) => {
                let res = self.props.answer_reqprop(&r);
                Incoming::Respond(vec![Action::Send {
                    data: Header2::new(xid, self.grant(), Body2::ResProp(res)).to_bytes(),
                    invalidate: None,
                }])
            }
            // We never send RDMA2_REQPROP, so no response is awaited.
            P::ResProp(_) => {
                self.stats.dropped += 1;
                Incoming::Nothing
            }
        }
    }

    fn apply_peer(&mut self, set: &crate::props::PropSet) -> Incoming {
        match self.props.apply_peer(set) {
            Ok(()) => {
                // Bounded by the largest message this Responder handles at all.
                self.params.inline_send =
                    (self.props.send_limit() as usize).min(self.cfg.max_call_size);
                Incoming::Nothing
            }
            // Decoding already checked known values; nothing is left to refuse here.
            Err(_) => Incoming::Nothing,
        }
    }

    /// A call (either version, its header in version 1's shape): the checks common to both,
    /// then its Read chunks or the dispatcher.
    fn on_call(&mut self, header: Header, inline: Bytes, inv_handle: Option<u32>) -> Incoming {
        let xid = header.xid;
        let Some(chunks) = header.body.chunks() else {
            return Incoming::Nothing;
        };
        // A quiescing connection takes no new call (see `quiesce`).
        if self.drop_while_quiescing(xid) {
            return Incoming::Nothing;
        }
        let read_chunks = chunks.read_chunks();
        // Structural checks that need no Upper-Layer Binding (RFC 8166 §4.5.2: RDMA_ERR_CHUNK).
        let pz = read_chunks.iter().filter(|c| c.position == 0).count();
        let nomsg = !matches!(header.body, Body::Msg(_));
        let mut last = 0u32;
        let bad_positions = read_chunks.iter().any(|c| {
            // RFC 8166 §3.4.5: "The value in this field MUST be a multiple of four."
            //= specs/rfc8166.txt#section-3.4.5
            //# The value in this field MUST be a multiple of four.
            let bad = c.position % 4 != 0 || c.position < last;
            last = c.position;
            bad
        });
        let total: u64 = read_chunks.iter().map(ReadChunk::len).sum::<u64>() + inline.len() as u64;
        if bad_positions
            || pz > 1
            || (nomsg && pz == 0)
            || (!nomsg && pz > 0)
            || total > self.cfg.max_call_size as u64
        {
            return self.error(ErrorResponse::ErrChunk { xid });
        }
        // RFC 8166 §4.5.3: a call whose reply was lost to an operational error on an earlier
        // connection gets RDMA_ERR_CHUNK: no RPC-level reply is possible for that XID.
        // (Empty on almost every connection: no hash of the XID then.)
        if !self.lost.is_empty() && self.lost.remove(&xid) {
            return self.error(ErrorResponse::ErrChunk { xid });
        }
        let pending = PendingCall {
            reads: read_chunks,
            header,
            inline,
            inv_handle,
            id: self.deadlines.read_id(),
        };
        if pending.reads.is_empty() {
            self.complete_reads(pending, Vec::new())
        } else {
            self.pulling.insert(pending.id);
            Incoming::NeedReads(pending)
        }
    }
}
