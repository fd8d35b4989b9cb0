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
//!
//! This module keeps the Responder's types and state; its jobs are split by file: `intake`
//! (header decoding, property exchange, call checks), `reads` (pulled Read chunks, reassembly,
//! the checks before dispatch), `reply` (reply building), `errors` (RDMA_ERROR and GARBAGE_ARGS),
//! `backchannel` (RFC 8167 reverse calls), `timers` (deadlines), `rrc` (responder-provided Read
//! chunks), `quiesce` (a clean close: no new calls, every accepted one answered).

mod backchannel;
mod errors;
mod intake;
mod quiesce;
mod reads;
mod reply;
mod rrc;
mod timers;

pub use quiesce::Unfinished;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use oncrpc::message::MessageHeader;
use xdr::DdpPolicy;

use crate::engine::{Config, Params};
use crate::header::{Body, Chunks, Header, ReadChunk, Segment, WriteChunk};
use crate::header_v2::{Body2, ChunkLists, Direction, Header2};
use crate::props::BackwardSupport;
use crate::ulb::Bindings;
use crate::version::{ResponderVersion, V2Properties, Version};

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
    /// Replies sent as a Position-Zero Read chunk (responder-provided Read chunks).
    pub rrc_replies: u64,
    /// Their chunks invalidated on the requester's notification.
    pub rrc_notified: u64,
    /// ... of which the requester had invalidated with Send With Invalidate.
    pub rrc_remote_invalidated: u64,
    /// ... invalidated because no notification came before the pull deadline.
    pub rrc_timed_out: u64,
    /// ... invalidated because the connection ended.
    pub rrc_invalidated_on_close: u64,
    /// Notifications naming no waiting chunk (silently dropped).
    pub rrc_notifications_dropped: u64,
    /// Replies that waited for room in the table (backpressure).
    pub rrc_parked: u64,
    /// Replies refused REPLY_RESOURCE because one per credit was already waiting for room.
    pub rrc_refused: u64,
    /// Calls dropped unanswered because they arrived after [`Responder::quiesce`].
    pub quiesce_dropped: u64,
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
    /// The connection is closing or closed ([`Responder::is_closed`]).
    #[error("the connection is closed")]
    Closed,
}

/// One connection's Responder.
pub struct Responder {
    cfg: Config,
    params: Params,
    ulbs: Arc<Bindings>,
    /// XIDs whose reply was lost to an RDMA operational error on an earlier connection.
    lost: HashSet<u32>,
    in_progress: crate::engine::PeerXidSet,
    /// Calls accepted whose Read chunks are being pulled, by [`PendingCall`] id.
    pulling: crate::engine::IdSet<u64>,
    /// [`Responder::quiesce`] was called: new calls are dropped.
    quiescing: bool,
    stats: ResponderStats,
    // Backward direction (we are its Requester).
    back_ready: bool,
    back_granted: u32,
    back_outstanding: crate::engine::IdSet<u32>,
    back_queue: VecDeque<(u32, Bytes)>,
    /// Which version the connection speaks, locked at its first valid call (cel-05 §8.3).
    version: ResponderVersion,
    /// Version 2 transport properties (ours and the peer's, cel-05 §6).
    props: V2Properties,
    /// Our RDMA2_CONNPROP went out (before the first version 2 reply).
    connprop_sent: bool,
    /// Deadlines of RDMA Reads and backward calls.
    deadlines: timers::Deadlines,
    /// Responder-provided Read chunks waiting for their notification.
    rrc: rrc::RrcState,
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
    pub fn new(cfg: Config, params: Params, ulbs: Arc<Bindings>, lost: HashSet<u32>) -> Self {
        Responder {
            params,
            ulbs,
            lost,
            in_progress: Default::default(),
            pulling: Default::default(),
            quiescing: false,
            stats: ResponderStats::default(),
            back_ready: false,
            back_granted: 1,
            back_outstanding: Default::default(),
            back_queue: VecDeque::new(),
            version: ResponderVersion::new(Version::V1, cfg.max_version),
            // RBSIZ announces the receive buffers the driver posts (`params.inline_recv`).
            props: V2Properties::new(
                u32::try_from(params.inline_recv).unwrap_or(u32::MAX),
                BackwardSupport::Inline,
            )
            .with_rrc(cfg.rrc.enabled),
            connprop_sent: false,
            deadlines: timers::Deadlines::default(),
            rrc: rrc::RrcState::new(&cfg.rrc),
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

    /// The largest message this Responder Sends on its connection now: the lower of its own
    /// send size and the client's receive size (RFC 8797), or the client's RBSIZ once
    /// version 2 properties were exchanged (cel-05 §6.2.1).
    pub fn inline_send(&self) -> usize {
        self.params.inline_send
    }

    /// Counters.
    pub fn stats(&self) -> &ResponderStats {
        &self.stats
    }

    /// Receive buffers the driver keeps posted: the forward grant plus one per outstanding
    /// backward call (RFC 8167 §4.3.2).
    pub fn receives_needed(&self) -> usize {
        // Gap 4 of cel-05 (CONFORMANCE): a version 2 client's RDMA2_CONNPROP carries no
        // credit, so a Responder that may speak version 2 keeps one more receive for it.
        let props = usize::from(self.cfg.max_version == Version::V2);
        // Pull-completion notifications carry no credit either (crate::rrc): one receive per
        // chunk the table may hold.
        let rrc = if self.cfg.rrc.enabled && self.cfg.max_version == Version::V2 {
            self.cfg.rrc.max_chunks
        } else {
            0
        };
        self.cfg.credits as usize + self.cfg.back_credits as usize + props + rrc
    }

    /// Our RDMA2_CONNPROP, once per version 2 connection, sent just before the first reply
    /// (cel-05 §6.3.1; gap 4: by then the client's version is known, and a version 2 client
    /// keeps a receive for it). It carries the XID of that reply.
    fn connprop(&mut self, xid: u32) -> Option<Action> {
        if self.connprop_sent || !self.v2() {
            return None;
        }
        self.connprop_sent = true;
        let h = Header2::new(xid, self.grant(), Body2::ConnProp(self.props.connprop()));
        Some(Action::Send {
            data: h.to_bytes(),
            invalidate: None,
        })
    }

    /// The forward credit grant; never zero (RFC 8166 §3.3.1).
    //= specs/rfc8166.txt#section-3.3.1
    //# The granted value MUST NOT be zero, since such a value would result in deadlock.
    pub fn grant(&self) -> u32 {
        self.cfg.credits.max(1)
    }
}
