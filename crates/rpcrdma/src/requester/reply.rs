//! Reply handling: matching replies by XID, fencing a call's memory before it completes,
//! rebuilding the results from inline data and chunks, transport errors, and backward calls
//! (RFC 8167).

use bytes::{Bytes, BytesMut};
use oncrpc::message::{MessageHeader, ReplyHeader};
use oncrpc::{AcceptStat, RpcError};

use super::calls::CallHeader;
use super::{Action, Requester};
use crate::engine::{Registrar, reassemble};
use crate::header::{Body, Chunks, ErrorBody, Header, chunk_len};
use crate::header_v2::{
    Body2, Direction, ErrorBody2, Header2, PropertyMessage, RPCRDMA_VERSION_2, peek_version,
};
use crate::props::PropLimits;
use crate::responder::msg_type;
use crate::version::{ErrVersOutcome, Reason, Version};

impl Requester {
    /// Handle one received message. `remote_invalidated` is the handle the peer invalidated
    /// with Send With Invalidate, if any.
    #[must_use = "every action the engine returns must be performed"]
    pub fn on_receive(
        &mut self,
        buf: Bytes,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let out = self.receive(buf, remote_invalidated, reg);
        self.remember_version();
        out
    }

    pub(super) fn receive(
        &mut self,
        buf: Bytes,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        if peek_version(&buf).map(|(_, v)| v) == Some(RPCRDMA_VERSION_2) {
            return self.on_receive_v2(buf, remote_invalidated, reg);
        }
        let (h, hlen) = match Header::decode(&buf) {
            Ok(x) => x,
            Err(e) => {
                // A Requester has no one to send RDMA_ERROR to for a reply it cannot parse:
                // the XID (if any) stays outstanding until its timeout.
                //= specs/rfc8166.txt#section-4.5
                //# If errors are detected in the RPC-over-RDMA header of an RPC Reply message, a
                //# Requester MUST silently discard the message.
                tracing::debug!(error = %e, "bad reply header");
                self.stats.dropped += 1;
                return Vec::new();
            }
        };
        let inline = buf.slice(hlen..);
        self.on_message(h, inline, remote_invalidated, reg)
    }

    /// A version 2 message (cel-05 §7.2): replies and backward calls take the version 1 path
    /// in version 1's shape; errors are handled here.
    fn on_receive_v2(
        &mut self,
        buf: Bytes,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let (h, hlen) = match Header2::decode(&buf) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "bad version 2 reply header");
                self.stats.dropped += 1;
                return Vec::new();
            }
        };
        let xid = h.xid;
        let inline = buf.slice(hlen..);
        match h.body {
            Body2::Msg(l) | Body2::NoMsg(l) if l.direction == Direction::Call => {
                // A backward-direction call (inline only).
                if msg_type(&inline) != Some(oncrpc::message::CALL) {
                    self.stats.dropped += 1;
                    return Vec::new();
                }
                let v1 = Header::new(xid, h.credits, Body::Msg(l.chunks));
                self.on_message(v1, inline, remote_invalidated, reg)
            }
            // A responder-provided Read chunk (crate::rrc): RDMA2_NOMSG whose Read list holds
            // the reply's Payload stream.
            Body2::NoMsg(l) if !l.chunks.reads.is_empty() => {
                self.on_read_chunk_reply(xid, h.credits, l, remote_invalidated, reg)
            }
            body @ (Body2::Msg(_) | Body2::NoMsg(_)) => {
                let nomsg = matches!(body, Body2::NoMsg(_));
                let (Body2::Msg(l) | Body2::NoMsg(l)) = body else {
                    return Vec::new();
                };
                // The first reply to a call of ours settles the probe (cel-05 §8) and lets our
                // RDMA2_CONNPROP go.
                let mut connprop = None;
                if self.version.settled().is_none() && self.calls.get(&xid).is_some_and(|o| o.sent)
                {
                    self.version.on_reply(Version::V2);
                    tracing::info!(
                        xid,
                        "RPC-over-RDMA version 2 negotiated: {}",
                        Reason::ServerAnsweredV2
                    );
                    connprop = self.connprop(xid);
                }
                let mut v1 = Header::msg_or_nomsg(xid, h.credits, l.chunks, nomsg);
                v1.vers = RPCRDMA_VERSION_2;
                let mut out = self.on_message(v1, inline, remote_invalidated, reg);
                if let Some(c) = connprop {
                    out.insert(0, c);
                }
                out
            }
            Body2::Error(e) => self.on_error_v2(xid, h.credits, e, reg),
            // Property messages carry no credit of a call (gap 4).
            Body2::ConnProp(c) => self.on_property(xid, PropertyMessage::ConnProp(c)),
            Body2::ReqProp(r) => self.on_property(xid, PropertyMessage::ReqProp(r)),
            Body2::ResProp(r) => self.on_property(xid, PropertyMessage::ResProp(r)),
            Body2::UpdProp(u) => self.on_property(xid, PropertyMessage::UpdProp(u)),
            Body2::Optional(o) => match o.property_message(&PropLimits::default()) {
                // Gap 1: property messages sent as OPTIONAL opttypes 1-4.
                Some(Ok(m)) => self.on_property(xid, m),
                // §7.2.4: "error messages never flow from requester to responder": a
                // malformed or unknown OPTIONAL from the server is dropped.
                Some(Err(_)) | None => {
                    self.stats.dropped += 1;
                    Vec::new()
                }
            },
        }
    }

    /// Our RDMA2_CONNPROP (cel-05 §6.3.1), once per connection, after the server's first
    /// version 2 reply (gap 4: the version is settled and the server keeps a receive for it).
    /// It carries the XID of the reply that settled the version.
    fn connprop(&mut self, xid: u32) -> Option<Action> {
        if self.connprop_sent || self.version.current() != Version::V2 {
            return None;
        }
        self.connprop_sent = true;
        let h = Header2::new(
            xid,
            self.cfg.credits,
            Body2::ConnProp(self.props.connprop()),
        );
        Some(Action::Send {
            xid,
            data: h.to_bytes(),
        })
    }

    /// A transport property message from the server (cel-05 §6.3).
    fn on_property(&mut self, xid: u32, m: PropertyMessage) -> Vec<Action> {
        self.stats.properties_received += 1;
        match m {
            // §6.3.1 / §6.3.4: the server's values; unknown properties are ignored (§6.3.1).
            // Its RBSIZ raises (or keeps) our send limit. Decoding already checked every known
            // value, so `apply_peer` cannot fail here.
            PropertyMessage::ConnProp(c) => {
                let _ = self.props.apply_peer(&c.start);
                tracing::debug!(
                    xid,
                    rbsiz = self.props.peer_rbsiz,
                    "server's RDMA2_CONNPROP"
                );
                Vec::new()
            }
            PropertyMessage::UpdProp(u) => {
                let _ = self.props.apply_peer(&u.now);
                Vec::new()
            }
            // §6.3.2-§6.3.3: answered with RDMA2_RESPROP under the request's XID; our values
            // are fixed for the connection (our receives are posted at their size).
            PropertyMessage::ReqProp(r) => {
                let res = self.props.answer_reqprop(&r);
                vec![Action::Send {
                    xid,
                    data: Header2::new(xid, self.cfg.credits, Body2::ResProp(res)).to_bytes(),
                }]
            }
            // We send no RDMA2_REQPROP, so no response is awaited.
            PropertyMessage::ResProp(_) => {
                self.stats.dropped += 1;
                Vec::new()
            }
        }
    }

    /// RDMA2_ERROR for one of our calls (cel-05 §7.2.4).
    fn on_error_v2(
        &mut self,
        xid: u32,
        credits: u32,
        e: ErrorBody2,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let known = self.calls.get(&xid).is_some_and(|o| o.sent);
        let was_abandoned = self.abandoned.remove(&xid);
        if !known && !was_abandoned {
            self.stats.dropped += 1;
            return Vec::new();
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.granted = credits.clamp(1, self.cfg.credits.max(1));
        self.stats.rdma_errors += 1;
        let mut out = Vec::new();
        if !known {
            self.stats.late_replies += 1;
            out.extend(self.pump(reg));
            return out;
        }
        if let ErrorBody2::Vers { low, high } = e {
            // §8.2: choose a version in the server's range and go on, on this connection.
            match self.version.on_err_vers(low, high) {
                ErrVersOutcome::Retry(v) => {
                    tracing::info!(
                        xid,
                        "RPC-over-RDMA version {} negotiated: {}",
                        v.number(),
                        Reason::ErrVers { low, high }
                    );
                    self.stats.version_fallbacks += 1;
                    // The same XID again, with fresh registrations, in the new version.
                    if let Some(o) = self.calls.get_mut(&xid) {
                        for r in o.regions.drain(..) {
                            if reg.invalidate(r.id, false).is_err() {
                                out.push(Action::Close);
                            }
                        }
                        o.writes.clear();
                        o.reply_chunk = None;
                        o.sent = false;
                    }
                    self.queue.push_front(xid);
                    out.extend(self.pump(reg));
                    return out;
                }
                ErrVersOutcome::Fail => {
                    let err = RpcError::Transport(format!(
                        "RDMA2_ERR_VERS: the server supports versions {low}..={high}, none of ours"
                    ));
                    out.extend(self.finish(xid, Err(err), None, reg));
                    out.extend(self.pump(reg));
                    return out;
                }
            }
        }
        if let Some(out2) = self.reshape(xid, e, reg) {
            out.extend(out2);
            return out;
        }
        // §7.2.4: BAD_XDR is version 1's ERR_CHUNK. WRITE_RESOURCE and REPLY_RESOURCE may be
        // answered by sending the request again with more reply resources; the server may
        // have executed the call already, so (gap 7) the Upper-Layer Binding decides, as for
        // version 1's short Reply chunk: both end the call with RdmaErrChunk, which the client
        // driver retries as a new transaction with a larger Reply chunk only for the
        // procedures its binding allows (RFC 8267 §3.1). SYSTEM "MUST terminate"; SEGMENTS
        // and the rest end the call with what the server said.
        let err = match e {
            ErrorBody2::BadXdr
            | ErrorBody2::WriteResource { .. }
            | ErrorBody2::ReplyResource { .. } => RpcError::RdmaErrChunk,
            other => RpcError::Transport(format!("RDMA2_ERROR {other:?}")),
        };
        out.extend(self.finish(xid, Err(err), None, reg));
        out.extend(self.pump(reg));
        out
    }

    /// cel-05 §7.2.4's SHOULD retries, under the same XID (the server refused the call before
    /// executing it): after READ_CHUNKS the Payload stream goes whole in a Position-Zero Read
    /// chunk; after WRITE_CHUNKS the call goes with no Write chunks and a Reply chunk large
    /// enough for the whole reply. Once per call; `None` when the error asks for no retry.
    fn reshape(&mut self, xid: u32, e: ErrorBody2, reg: &mut dyn Registrar) -> Option<Vec<Action>> {
        let o = self.calls.get_mut(&xid)?;
        if o.reshaped {
            return None;
        }
        match e {
            // "If this was a request using a Position-Zero Read chunk, the requester MUST
            // terminate the transaction with an error."
            ErrorBody2::ReadChunks { .. } if o.long_call => return None,
            ErrorBody2::ReadChunks { .. } => {
                let whole = o.call.message.unreduced();
                // Too long for a Short message (build() would have sent it whole inline
                // otherwise), so it goes as a Long Call.
                o.call.message = xdr::Encoded::whole(whole);
            }
            ErrorBody2::WriteChunks { .. } if !o.writes.is_empty() => {
                o.call.no_reduction = true;
            }
            _ => return None,
        }
        o.reshaped = true;
        let mut out = Vec::new();
        for r in o.regions.drain(..) {
            if reg.invalidate(r.id, false).is_err() {
                out.push(Action::Close);
            }
        }
        o.writes.clear();
        o.reply_chunk = None;
        o.sent = false;
        self.stats.reshaped += 1;
        tracing::debug!(xid, error = ?e, "version 2 call resent in another form");
        self.queue.push_front(xid);
        out.extend(self.pump(reg));
        Some(out)
    }

    /// A reply or backward call in version 1's shape (either version on the wire).
    fn on_message(
        &mut self,
        h: Header,
        inline: Bytes,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let xid = h.xid;
        // A backward-direction call (RFC 8167): RDMA_MSG carrying an RPC CALL.
        if matches!(h.body, Body::Msg(_)) && msg_type(&inline) == Some(oncrpc::message::CALL) {
            self.stats.back_calls += 1;
            return vec![Action::BackCall {
                xid,
                message: inline,
            }];
        }
        let known = self.calls.get(&xid).is_some_and(|o| o.sent);
        let was_abandoned = self.abandoned.remove(&xid);
        if !known && !was_abandoned {
            self.stats.dropped += 1;
            return Vec::new();
        }
        // Every reply (RDMA_MSG, RDMA_NOMSG or RDMA_ERROR) returns one credit and carries the
        // Responder's current grant; a grant of zero is treated as one (RFC 8166 §3.3.1).
        self.in_flight = self.in_flight.saturating_sub(1);
        self.granted = h.credits.clamp(1, self.cfg.credits.max(1));
        let mut out = Vec::new();
        if known {
            let result = self.reply_result(xid, &h, inline, reg);
            out.extend(self.finish(xid, result, remote_invalidated, reg));
        } else {
            // The reply to a cancelled call: its memory is already fenced, nobody waits.
            self.stats.late_replies += 1;
        }
        out.extend(self.pump(reg));
        out
    }

    pub(super) fn reply_result(
        &mut self,
        xid: u32,
        h: &Header,
        inline: Bytes,
        reg: &mut dyn Registrar,
    ) -> Result<Bytes, RpcError> {
        let o = self
            .calls
            .get(&xid)
            .ok_or_else(|| RpcError::Transport("unknown call".into()))?;
        let chunks = match &h.body {
            Body::Msg(c) | Body::NoMsg(c) => c,
            Body::Error(e) => {
                self.stats.rdma_errors += 1;
                // RFC 8166 §4.5: an RDMA_ERROR completes the transaction with an error.
                return Err(match e {
                    ErrorBody::Vers { low, high } => RpcError::Transport(format!(
                        "RDMA_ERR_VERS: peer supports versions {low}..={high}"
                    )),
                    ErrorBody::Chunk => RpcError::RdmaErrChunk,
                });
            }
            _ => return Err(RpcError::BadReply("unexpected rdma_proc in reply".into())),
        };
        let nomsg = matches!(h.body, Body::NoMsg(_));
        if nomsg {
            self.stats.nomsg_replies += 1;
        }
        let payload = if nomsg {
            let (Some(idx), Some(rc)) = (o.reply_chunk, &chunks.reply) else {
                return Err(RpcError::BadReply(
                    "RDMA_NOMSG reply without a Reply chunk".into(),
                ));
            };
            let region = &o.regions[idx];
            let len = chunk_len(rc) as usize;
            reg.sink_contents(region.id, len)
                .map_err(|e| RpcError::BadReply(e.to_string()))?
        } else {
            inline
        };
        let (rh, results) = MessageHeader::decode_message(&payload)
            .map_err(|e| RpcError::BadReply(e.to_string()))?;
        if rh_xid(&rh) != Some(xid) {
            return Err(RpcError::BadReply("RPC XID differs from rdma_xid".into()));
        }
        match rh {
            MessageHeader::Reply(ReplyHeader::Accepted {
                stat: AcceptStat::Success,
                ..
            }) => {}
            MessageHeader::Reply(ReplyHeader::Accepted { stat, .. }) => {
                return Err(RpcError::Accepted(stat));
            }
            MessageHeader::Reply(ReplyHeader::Denied { reason, .. }) => {
                return Err(RpcError::Rejected(reason));
            }
            MessageHeader::Call(_) => return Err(RpcError::BadReply("CALL in reply".into())),
        }
        // Write chunks: the returned segment lengths say how much was written
        // (RFC 8166 §3.4.6: contents are concatenated in array order).
        if chunks.writes.iter().all(|c| chunk_len(c) == 0) {
            return Ok(results);
        }
        let written: Vec<usize> = chunks
            .writes
            .iter()
            .map(|c| chunk_len(c) as usize)
            .collect();
        self.stats.write_chunk_replies += 1;
        if written.len() > o.writes.len() {
            return Err(RpcError::BadReply("more Write chunks than offered".into()));
        }
        let ulb = self.ulbs.get(&o.call.prog).ok_or_else(|| {
            RpcError::BadReply("Write chunk data without an Upper-Layer Binding".into())
        })?;
        let positions = ulb
            .reply_ddp_positions(o.call.vers, o.call.proc_, &results, &written)
            .map_err(|e| RpcError::BadReply(e.to_string()))?;
        let mut used = written.iter().enumerate().filter(|(_, n)| **n > 0);
        if let ([p], Some((i, &n)), None) = (&positions[..], used.next(), used.next()) {
            // One item (the common case: an NFS READ): rejoin it with the inline results in
            // the sink's own memory when the registrar left room there.
            let p = *p;
            let region = &o.regions[o.writes[i]];
            if p <= results.len()
                && let Some(b) = reg
                    .sink_framed(region.id, n, &results[..p], &results[p..])
                    .map_err(|e| RpcError::BadReply(e.to_string()))?
            {
                self.stats.write_chunk_in_place += 1;
                return Ok(b);
            }
        }
        let mut items = Vec::new();
        let mut shift = 0;
        let mut pos_iter = positions.into_iter();
        for (i, &n) in written.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let region = &o.regions[o.writes[i]];
            let data = reg
                .sink_contents(region.id, n)
                .map_err(|e| RpcError::BadReply(e.to_string()))?;
            let p = pos_iter.next().ok_or_else(|| {
                RpcError::BadReply("Upper-Layer Binding gave too few positions".into())
            })?;
            items.push((p + shift, data));
            shift += xdr::padded(n);
        }
        reassemble(&results, &items)
            .map_err(|_| RpcError::BadReply("Write chunk positions do not fit the results".into()))
    }

    /// Fence a call's memory, then complete it.
    pub(super) fn finish(
        &mut self,
        xid: u32,
        result: Result<Bytes, RpcError>,
        remote_invalidated: Option<u32>,
        reg: &mut dyn Registrar,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(o) = self.calls.remove(&xid) {
            // RFC 8166 §4.4.1: memory is invalidated before the RPC completes.
            for r in o.regions {
                let remote =
                    remote_invalidated.is_some_and(|h| r.segments.iter().all(|s| s.handle == h));
                self.stats.remote_invalidated += u64::from(remote);
                if reg.invalidate(r.id, remote).is_err() {
                    //= specs/rfc8166.txt#section-4.5.4
                    //# After a Requester has received a reply, if it is unable to invalidate a
                    //# memory region due to an unrecoverable problem, the Requester MUST close the
                    //# connection to protect that memory from Responder access before the
                    //# associated RPC transaction is complete.
                    // RFC 8166 §4.5.4: fence by closing the connection.
                    out.push(Action::Close);
                }
            }
            self.stats.completed += 1;
            out.push(Action::Complete { xid, result });
        }
        out
    }

    /// Answer a backward-direction call: RDMA_MSG with empty chunk lists, granting the
    /// backward credits (RFC 8167 §5.2). `message` is the whole RPC reply.
    #[must_use = "every action the engine returns must be performed"]
    pub fn back_reply(&mut self, xid: u32, message: Bytes) -> Option<Action> {
        // cel-05 §7.2.2: the reply to a backward call carries REPLY in version 2.
        let h = CallHeader::new(
            self.version.current() == Version::V2,
            xid,
            self.cfg.back_credits.max(1),
            false,
            Chunks::default(),
            0,
            Direction::Reply,
        );
        self.send_back_reply(xid, h, message)
    }

    fn send_back_reply(&mut self, xid: u32, h: CallHeader, message: Bytes) -> Option<Action> {
        if h.encoded_len() + message.len() > self.params.inline_send {
            // Backward messages are inline only (RFC 8167 §5.3); drop and let the caller
            // time out rather than send what the peer cannot receive.
            return None;
        }
        let mut data = BytesMut::with_capacity(h.encoded_len() + message.len());
        h.encode(&mut data);
        data.extend_from_slice(&message);
        Some(Action::Send {
            xid,
            data: data.freeze(),
        })
    }
}

fn rh_xid(h: &MessageHeader) -> Option<u32> {
    match h {
        MessageHeader::Reply(r) => Some(r.xid()),
        MessageHeader::Call(c) => Some(c.xid),
    }
}
