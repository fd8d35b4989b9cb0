//! The Responder (server) engine, sans-IO.
//!
//! Flow for one received message:
//! 1. [`Responder::on_receive`] decodes the transport header. Errors become an RDMA_ERROR to
//!    send (RFC 8166 §4.5) or nothing. A call whose chunks must be pulled returns
//!    [`Incoming::NeedReads`]: the driver RDMA Reads each [`PendingCall::reads`] chunk and hands
//!    the data to [`Responder::complete_reads`].
//! 2. The reassembled call is checked (XID match, chunk limits, DDP-eligibility of every Read
//!    chunk against the Upper-Layer Binding) and returned as [`Incoming::Call`], with the
//!    [`xdr::DdpPolicy`] the driver passes to the `oncrpc::Dispatcher`.
//! 3. [`Responder::reply`] turns the dispatcher's reply into RDMA Writes (Write list, Reply
//!    chunk) and one Send, choosing RDMA_MSG or RDMA_NOMSG (RFC 8166 §3.5, §4.3.3).
//!
//! The same engine is the Requester of the backward direction (RFC 8167): once the Upper
//! Layer says the peer is ready ([`Responder::enable_backchannel`]), [`Responder::back_call`]
//! sends reverse calls within the peer's backward credits.

mod timers;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use oncrpc::message::MessageHeader;
use oncrpc::{AcceptStat, Credential, ReplyMessage};
use xdr::DdpPolicy;

use crate::engine::{Config, Params, fill_segments, reassemble};
use crate::header::{
    Body, Chunks, ErrorResponse, Header, HeaderError, RDMA_MSG, ReadChunk, Segment, WriteChunk,
    chunk_len,
};
use crate::header_v2::{
    Body2, ChunkLists, Decode2Limits, Direction, ErrorBody2, ErrorResponse2, Header2,
    error_vers_bytes, peek_version,
};
use crate::props::BackwardSupport;
use crate::ulb::UpperLayerBinding;
use crate::version::{CallVersion, ResponderVersion, V2Properties, Version};

/// Something the driver does for the Responder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// RDMA Write `data` to the peer's `segment` (Write list or Reply chunk).
    Write { segment: Segment, data: Bytes },
    /// Post a Send of `data` (transport header and any inline payload). With `invalidate`,
    /// use Send With Invalidate on that handle.
    Send {
        data: Bytes,
        invalidate: Option<u32>,
    },
    /// Close the connection (RFC 8166 §4.5.4: a reply that cannot be sent).
    Close,
}

/// What became of a received message.
#[derive(Debug)]
#[must_use = "every action the engine returns must be performed"]
pub enum Incoming {
    /// Nothing to do (dropped).
    Nothing,
    /// Send these (an RDMA_ERROR or an RPC-level error reply).
    Respond(Vec<Action>),
    /// RDMA Read the chunks, then call [`Responder::complete_reads`].
    NeedReads(PendingCall),
    /// A complete call for the dispatcher.
    Call(ReadyCall),
    /// A backward-direction reply (RFC 8167) for a call made with [`Responder::back_call`].
    BackReply { xid: u32, message: Bytes },
}

/// A call waiting for its Read chunks.
#[derive(Debug)]
pub struct PendingCall {
    /// Chunks to pull, in order; Position-Zero first when present.
    pub reads: Vec<ReadChunk>,
    header: Header,
    inline: Bytes,
    /// Version 2: the handle the requester lets us invalidate with Send With Invalidate
    /// (`rdma_inv_handle` naming one of the call's segments, cel-05 §7.2.3).
    inv_handle: Option<u32>,
    /// Names the call's RDMA Read deadline ([`Responder::reads_started`]).
    id: u64,
}

/// The most bytes a reply can put on the wire beyond one inline message: what the requester
/// offered in its Write chunks and Reply chunk (the Responder writes no more than a chunk
/// offers, RFC 8166 §3.4.6, §4.3.3). A server reserves memory for it before it builds the reply.
fn offered_len(writes: &[WriteChunk], reply: Option<&WriteChunk>) -> usize {
    writes
        .iter()
        .flatten()
        .chain(reply.into_iter().flatten())
        .map(|s| s.length as usize)
        .fold(0, usize::saturating_add)
}

impl PendingCall {
    /// See [`ReplyToken::offered_len`].
    pub fn reply_offered_len(&self) -> usize {
        self.header
            .body
            .chunks()
            .map_or(0, |c| offered_len(&c.writes, c.reply.as_ref()))
    }

    /// For a call with one Read chunk at a non-zero Position (an NFS WRITE's data): its
    /// Position and the inline bytes that go before and after its contents. A driver can pull
    /// the chunk into memory with room for both and hand the whole call to
    /// [`Responder::complete_reads_framed`], so the data is never copied into a new buffer.
    pub fn frame(&self) -> Option<(usize, &[u8], &[u8])> {
        match &self.reads[..] {
            [c] if c.position > 0 && (c.position as usize) <= self.inline.len() => {
                let at = c.position as usize;
                Some((at, &self.inline[..at], &self.inline[at..]))
            }
            _ => None,
        }
    }

    /// Total bytes to read.
    pub fn read_len(&self) -> u64 {
        self.reads.iter().map(ReadChunk::len).sum()
    }
}

/// A complete call, ready for `oncrpc::Dispatcher::dispatch`.
#[derive(Debug)]
pub struct ReadyCall {
    /// The whole RPC call message with every chunk in place.
    pub message: Bytes,
    /// Pass this to the dispatcher (Write list size, RPCSEC_GSS).
    pub policy: DdpPolicy,
    /// Hand back to [`Responder::reply`].
    pub token: ReplyToken,
}

/// What [`Responder::reply`] needs to answer a call.
#[derive(Debug, Clone)]
pub struct ReplyToken {
    pub xid: u32,
    writes: Vec<WriteChunk>,
    reply_chunk: Option<WriteChunk>,
    /// Handle usable for Send With Invalidate (every segment of the call shares it).
    swi_handle: Option<u32>,
}

impl ReplyToken {
    /// Bytes the requester offered for the reply in Write chunks and its Reply chunk: with
    /// one inline message, the most the reply can take.
    pub fn offered_len(&self) -> usize {
        offered_len(&self.writes, self.reply_chunk.as_ref())
    }
}

/// Counters a test or a monitor can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponderStats {
    pub calls: u64,
    pub in_progress: u32,
    pub max_in_progress: u32,
    /// Calls that arrived while `credits` calls were already in progress.
    pub over_credit: u64,
    pub err_vers: u64,
    pub err_chunk: u64,
    pub garbage_args: u64,
    pub dropped: u64,
    pub back_calls: u64,
    pub back_max_outstanding: u32,
}

/// Why a backward call was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackError {
    /// RFC 8167 §6: the peer has not said it handles backward calls.
    #[error("the peer has not enabled the backward direction")]
    NotReady,
    /// RFC 8167 §6: backward messages travel inline only.
    #[error("backward call of {0} bytes exceeds the inline threshold")]
    TooLarge(usize),
}

/// One connection's Responder.
pub struct Responder {
    cfg: Config,
    params: Params,
    ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>,
    /// XIDs whose reply was lost to an RDMA operational error on an earlier connection.
    lost: HashSet<u32>,
    in_progress: HashSet<u32>,
    stats: ResponderStats,
    // Backward direction (we are its Requester).
    back_ready: bool,
    back_granted: u32,
    back_outstanding: HashSet<u32>,
    back_queue: VecDeque<(u32, Bytes)>,
    /// Which version the connection speaks, locked at its first valid call (cel-05 §8.3).
    version: ResponderVersion,
    /// Version 2 transport properties (ours and the peer's, cel-05 §6).
    props: V2Properties,
    /// Deadlines of RDMA Reads and backward calls.
    deadlines: timers::Deadlines,
}

/// What [`Responder::handle_timeout`] found due.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use = "every action the engine returns must be performed"]
pub struct TimedOut {
    /// Backward calls whose time is up: they are abandoned (their credit is free again) and
    /// their callers are told.
    pub back_calls: Vec<u32>,
    /// What to do: `Close` when a peer did not answer the RDMA Reads of a call in time;
    /// backward calls that became sendable.
    pub actions: Vec<Action>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("cfg", &self.cfg)
            .field("params", &self.params)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Offset of the arguments in an RPC call message, and the decoded header.
fn call_header(msg: &Bytes) -> Option<(oncrpc::CallHeader, usize)> {
    match MessageHeader::decode_message(msg) {
        Ok((MessageHeader::Call(h), args)) => Some((h, msg.len() - args.len())),
        _ => None,
    }
}

/// `msg_type` of an RPC message (the second word), if present.
pub(crate) fn msg_type(payload: &[u8]) -> Option<u32> {
    let w = payload.get(4..8)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

fn rpc_xid(payload: &[u8]) -> Option<u32> {
    let w = payload.get(0..4)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

impl Responder {
    /// A Responder for a new connection. `lost` carries XIDs whose replies were lost on
    /// earlier connections (see [`Responder::take_lost`]).
    pub fn new(
        cfg: Config,
        params: Params,
        ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>,
        lost: HashSet<u32>,
    ) -> Self {
        Responder {
            params,
            ulbs,
            lost,
            in_progress: HashSet::new(),
            stats: ResponderStats::default(),
            back_ready: false,
            back_granted: 1,
            back_outstanding: HashSet::new(),
            back_queue: VecDeque::new(),
            version: ResponderVersion::new(Version::V1, cfg.max_version),
            props: V2Properties::new(cfg.inline_recv, BackwardSupport::Inline),
            deadlines: timers::Deadlines::default(),
            cfg,
        }
    }

    /// The version the connection is locked to, once a valid call came.
    pub fn version(&self) -> Option<Version> {
        self.version.locked()
    }

    /// Our version 2 transport properties, for the RDMA2_CONNPROP a driver may send once the
    /// connection speaks version 2, and the peer's as announced.
    pub fn v2_properties(&self) -> &V2Properties {
        &self.props
    }

    fn v2(&self) -> bool {
        self.version.locked() == Some(Version::V2)
    }

    /// A transport header in the connection's version, followed by `extra` bytes of room.
    /// Version 2 headers carry `direction` and no invalidation handle (replies and backward
    /// calls offer none).
    fn header_bytes(
        &self,
        xid: u32,
        credits: u32,
        body: Body,
        direction: Direction,
        extra: usize,
    ) -> BytesMut {
        if self.v2() {
            let b2 = match body {
                Body::NoMsg(c) => Body2::NoMsg(ChunkLists::new(direction, c)),
                Body::Msg(c) => Body2::Msg(ChunkLists::new(direction, c)),
                // Only MSG and NOMSG are built here.
                _ => Body2::Msg(ChunkLists::new(direction, Chunks::default())),
            };
            let h = Header2::new(xid, credits, b2);
            let mut data = BytesMut::with_capacity(h.encoded_len() + extra);
            h.encode(&mut data);
            data
        } else {
            let h = Header::new(xid, credits, body);
            let mut data = BytesMut::with_capacity(h.encoded_len() + extra);
            h.encode(&mut data);
            data
        }
    }

    /// Answer with a version 2 RDMA2_ERROR. cel-05 §7.2.4: "the rdma_credit field is set to
    /// the credit grant value for this connection"; never with Send With Invalidate.
    fn error2(&mut self, resp: ErrorResponse2) -> Incoming {
        let data = match resp {
            ErrorResponse2::Discard => {
                self.stats.dropped += 1;
                return Incoming::Nothing;
            }
            ErrorResponse2::ErrVers { xid, vers } => {
                self.stats.err_vers += 1;
                error_vers_bytes(xid, vers, self.grant(), 1, self.cfg.max_version.number())
            }
            ErrorResponse2::Error { .. } => {
                self.stats.err_chunk += 1;
                match Header2::error_reply(resp, self.grant()) {
                    Some(h) => h.to_bytes(),
                    None => return Incoming::Nothing,
                }
            }
        };
        Incoming::Respond(vec![Action::Send {
            data,
            invalidate: None,
        }])
    }

    /// Counters.
    pub fn stats(&self) -> &ResponderStats {
        &self.stats
    }

    /// Receive buffers the driver keeps posted: the forward grant plus one per outstanding
    /// backward call (RFC 8167 §4.3.2).
    pub fn receives_needed(&self) -> usize {
        self.cfg.credits as usize + self.cfg.back_credits as usize
    }

    /// The forward credit grant; never zero (RFC 8166 §3.3.1).
    //= specs/rfc8166.txt#section-3.3.1
    //# The granted value MUST NOT be zero, since such a value would result in deadlock.
    pub fn grant(&self) -> u32 {
        self.cfg.credits.max(1)
    }

    fn error(&mut self, resp: ErrorResponse) -> Incoming {
        if self.v2() {
            // cel-05 §7.2.4: RDMA2_ERR_BAD_XDR has version 1's ERR_CHUNK code and meaning.
            return self.error2(match resp {
                ErrorResponse::ErrVers { xid, vers } => ErrorResponse2::ErrVers { xid, vers },
                ErrorResponse::ErrChunk { xid } => ErrorResponse2::Error {
                    xid,
                    body: ErrorBody2::BadXdr,
                },
                ErrorResponse::Discard => ErrorResponse2::Discard,
            });
        }
        match resp {
            ErrorResponse::ErrVers { .. } => self.stats.err_vers += 1,
            ErrorResponse::ErrChunk { .. } => self.stats.err_chunk += 1,
            ErrorResponse::Discard => self.stats.dropped += 1,
        }
        match Header::error_reply(resp, self.grant()) {
            // RFC 8166 §4.5: RDMA_ERROR is never sent with Send With Invalidate (Linux does
            // the same).
            Some(h) => Incoming::Respond(vec![Action::Send {
                data: h.to_bytes(),
                invalidate: None,
            }]),
            None => Incoming::Nothing,
        }
    }

    fn garbage(&mut self, xid: u32) -> Incoming {
        self.stats.garbage_args += 1;
        // RFC 8166 §4.5.2: GARBAGE_ARGS travels in an RDMA_MSG.
        //= specs/rfc8166.txt#section-4.5.2
        //# When a Responder receives a valid RPC-over-RDMA header but the Responder's ULP
        //# implementation cannot parse the RPC arguments in the RPC Call message, the Responder
        //# SHOULD return an RPC Reply message with status GARBAGE_ARGS, using an RDMA_MSG
        //# procedure.
        let r = oncrpc::service::accepted(xid, AcceptStat::GarbageArgs, None);
        let body = r.message.to_bytes();
        let mut data = self.header_bytes(
            xid,
            self.grant(),
            Body::Msg(Chunks::default()),
            Direction::Reply,
            body.len(),
        );
        data.extend_from_slice(&body);
        Incoming::Respond(vec![Action::Send {
            data: data.freeze(),
            invalidate: None,
        }])
    }

    /// Handle one received message (a full receive buffer as filled by the Send).
    pub fn on_receive(&mut self, buf: Bytes) -> Incoming {
        // RFC 8166 §4.2 / cel-05 §8: the version decides how the rest is read; one the
        // connection does not (or no longer) accept gets ERR_VERS with the range it does.
        let Some((xid, vers)) = peek_version(&buf) else {
            return self.error(ErrorResponse::Discard);
        };
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
            CallVersion::Serve(Version::V2) => return self.on_receive_v2(buf),
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
            // RFC 8166 §4.6.1: RDMA_MSGP gets RDMA_ERR_CHUNK. RDMA_DONE gets it too, although
            // §4.6.2 says receivers MUST silently discard RDMA_DONE (not changed here: see
            // docs/traceability.md).
            Body::MsgP { .. } | Body::Done => {
                return self.error(HeaderError::BadProc { xid, proc_: 0 }.response());
            }
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
    fn on_receive_v2(&mut self, buf: Bytes) -> Incoming {
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
                let mut v1 = Header::new(
                    xid,
                    h.credits,
                    if nomsg {
                        Body::NoMsg(l.chunks)
                    } else {
                        Body::Msg(l.chunks)
                    },
                );
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
                self.params.inline_send = self.props.send_limit() as usize;
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
        if self.lost.remove(&xid) {
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
            Incoming::NeedReads(pending)
        }
    }

    /// Continue a call once every Read chunk has been pulled (`data[i]` for `reads[i]`).
    pub fn complete_reads(&mut self, p: PendingCall, data: Vec<Bytes>) -> Incoming {
        self.deadlines.reads_done(p.id);
        let xid = p.header.xid;
        if data.len() != p.reads.len() {
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
    fn reassembled(
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
        let gss = Credential::parse(&call.cred).is_ok_and(|c| c.forbids_reduction());
        let ulb = self.ulbs.get(&call.prog).cloned();
        let n_other = others.len();
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
            if !segs_ok
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
        let policy = if gss || chunks.writes.is_empty() {
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

    fn ready(
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
            // The dispatcher reduced more than the policy allowed: cannot be expressed.
            return self.error_actions(ErrorResponse::ErrChunk { xid });
        }
        let payload = msg.to_bytes();
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
        let inline_len = hdr_len + payload.len();
        //= specs/rfc8166.txt#section-4.3.3
        //# If the Transport stream and Payload stream together are smaller than the reply inline
        //# threshold, the Responder MAY return the RPC Reply message as a Short message rather than
        //# using the Requester-provided Reply chunk.
        //= specs/rfc8166.txt#section-3.5.3
        //# If there are no DDP- eligible data items in the Payload stream, or the Payload stream is
        //# still too large after it has been reduced, the RDMA transport MUST use RDMA Read or
        //# Write operations to convey the Payload stream itself.
        let (body, inline) = if inline_len <= self.params.inline_send {
            (Body::Msg(chunks), payload)
        } else {
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

    fn error2_actions(&mut self, xid: u32, body: ErrorBody2) -> Vec<Action> {
        match self.error2(ErrorResponse2::Error { xid, body }) {
            Incoming::Respond(a) => a,
            _ => Vec::new(),
        }
    }

    fn error_actions(&mut self, resp: ErrorResponse) -> Vec<Action> {
        match self.error(resp) {
            Incoming::Respond(a) => a,
            _ => Vec::new(),
        }
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

    // ---- Deadlines: a driver sleeps until `next_deadline` and calls `handle_timeout`. ----

    /// Bound the time a peer may take to answer the RDMA Reads of one call (`None`, the
    /// default: no bound).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) {
        self.deadlines.read_timeout = timeout;
    }

    /// The driver posted the RDMA Reads of `p` at `now`: they are due by `now` plus the read
    /// timeout.
    pub fn reads_started(&mut self, p: &PendingCall, now: Instant) {
        self.deadlines.reads_started(p.id, now);
    }

    /// The RDMA Reads of `p` failed (or could not be posted): RFC 8166 §4.5.3, RDMA operational
    /// errors are fatal to the connection. The call is dropped.
    #[must_use = "every action the engine returns must be performed"]
    pub fn reads_failed(&mut self, p: PendingCall) -> Vec<Action> {
        self.deadlines.reads_done(p.id);
        vec![Action::Close]
    }

    /// The earliest deadline of this connection: RDMA Reads of a call's Read chunks, backward
    /// calls.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.next()
    }

    /// Everything due at `now`: a peer that did not answer RDMA Reads in time loses the
    /// connection (`Close`: its memory and the sinks come back); backward calls whose time is
    /// up are abandoned like [`Responder::cancel_back`].
    pub fn handle_timeout(&mut self, now: Instant) -> TimedOut {
        let expired = self.deadlines.expire(now);
        let mut actions = Vec::new();
        if expired.reads {
            tracing::info!("the peer did not answer an RDMA Read in time; closing the connection");
            actions.push(Action::Close);
        }
        for &xid in &expired.back_calls {
            self.back_queue.retain(|(x, _)| *x != xid);
            self.back_outstanding.remove(&xid);
        }
        if !expired.back_calls.is_empty() {
            actions.extend(self.pump_back());
        }
        TimedOut {
            back_calls: expired.back_calls,
            actions,
        }
    }

    // ---- Backward direction (RFC 8167): this end is the Requester. ----

    /// The Upper Layer says the peer handles backward calls (RFC 8167 §6:
    /// for NFSv4.1 a CREATE_SESSION or BIND_CONN_TO_SESSION asking for the back channel).
    pub fn enable_backchannel(&mut self) {
        self.back_ready = true;
    }

    /// True once [`Responder::enable_backchannel`] was called.
    pub fn backchannel_ready(&self) -> bool {
        self.back_ready
    }

    fn back_limit(&self) -> usize {
        self.cfg.back_credits.max(1).min(self.back_granted.max(1)) as usize
    }

    /// Send (or queue, when out of backward credits) a backward call: RDMA_MSG with empty
    /// chunk lists (RFC 8167 §5.1). `message` is the whole RPC call, XID `xid`.
    pub fn back_call(&mut self, xid: u32, message: Bytes) -> Result<Vec<Action>, BackError> {
        self.back_call_until(xid, message, None)
    }

    /// [`Responder::back_call`] with a deadline: at `deadline` the call is abandoned and
    /// reported by [`Responder::handle_timeout`].
    pub fn back_call_until(
        &mut self,
        xid: u32,
        message: Bytes,
        deadline: Option<Instant>,
    ) -> Result<Vec<Action>, BackError> {
        if !self.back_ready {
            return Err(BackError::NotReady);
        }
        if Header::new(xid, 0, Body::Msg(Chunks::default())).encoded_len() + message.len()
            > self.params.inline_send
        {
            return Err(BackError::TooLarge(message.len()));
        }
        self.back_queue.push_back((xid, message));
        self.deadlines.back_started(xid, deadline);
        Ok(self.pump_back())
    }

    fn pump_back(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while self.back_outstanding.len() < self.back_limit() {
            let Some((xid, message)) = self.back_queue.pop_front() else {
                break;
            };
            // cel-05 §7.2.2: a backward call carries our own XID: direction CALL.
            let mut data = self.header_bytes(
                xid,
                self.cfg.back_credits.max(1),
                Body::Msg(Chunks::default()),
                Direction::Call,
                message.len(),
            );
            data.extend_from_slice(&message);
            self.back_outstanding.insert(xid);
            self.stats.back_calls += 1;
            self.stats.back_max_outstanding = self
                .stats
                .back_max_outstanding
                .max(self.back_outstanding.len() as u32);
            out.push(Action::Send {
                data: data.freeze(),
                invalidate: None,
            });
        }
        out
    }

    fn on_back_reply(&mut self, h: &Header, inline: Bytes) -> Incoming {
        if !self.back_outstanding.remove(&h.xid) {
            self.stats.dropped += 1;
            return Incoming::Nothing;
        }
        self.deadlines.back_done(h.xid);
        // RFC 8167 §4.1: backward credits, never zero.
        self.back_granted = h.credits.max(1);
        Incoming::BackReply {
            xid: h.xid,
            message: inline,
        }
    }

    /// Backward calls that became sendable (after a backward reply freed a credit).
    #[must_use = "every action the engine returns must be performed"]
    pub fn poll_back(&mut self) -> Vec<Action> {
        self.pump_back()
    }

    /// Abandon a backward call (timeout): frees its credit.
    #[must_use = "every action the engine returns must be performed"]
    pub fn cancel_back(&mut self, xid: u32) -> Vec<Action> {
        self.back_queue.retain(|(x, _)| *x != xid);
        self.back_outstanding.remove(&xid);
        self.deadlines.back_done(xid);
        self.pump_back()
    }

    /// Backward calls sent and not yet answered.
    pub fn back_outstanding(&self) -> usize {
        self.back_outstanding.len()
    }
}
