//! The Requester (client) engine, sans-IO.
//!
//! [`Requester::submit`] takes a finished RPC call message (with DDP-eligible arguments already
//! reduced by the encoder) and what the Upper-Layer Binding knows about the reply; it refuses
//! calls of programs without a binding (RFC 8166 §6), registers memory through a
//! [`Registrar`], picks the message form (RFC 8166 §3.5) and emits a Send, or queues the call
//! while the credit limit is reached (RFC 8166 §3.3.1). [`Requester::on_receive`]
//! matches replies by XID, fences the call's memory before completing it (RFC 8166 §4.4.1),
//! rebuilds the results from inline data, the Reply chunk and Write chunks, and releases
//! queued calls. The same engine answers backward-direction calls (RFC 8167) with
//! [`Requester::back_reply`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use oncrpc::message::{MessageHeader, ReplyHeader};
use oncrpc::{AcceptStat, ReplyExpectation, RpcError};
use xdr::Encoded;

use crate::call_policy::CallPolicy;
use crate::engine::{
    Config, Params, RegError, Region, Registrar, XidMap, reassemble, unreduced_positions,
};
use crate::header::{
    Body, Chunks, ErrorBody, Header, ReadChunk, ReadSegment, WriteChunk, chunk_len,
};
use crate::header_v2::{
    Body2, ChunkLists, Direction, ErrorBody2, Header2, RPCRDMA_VERSION_2, peek_version,
};
use crate::responder::msg_type;
use crate::ulb::UpperLayerBinding;
use crate::version::{ErrVersOutcome, Reason, RequesterVersion, SharedVersionMemory, Version};

/// A call's transport header in the connection's version.
enum CallHeader {
    V1(Header),
    V2(Header2),
}

impl CallHeader {
    /// A call's header (`direction` CALL), or a backward call's reply's (REPLY).
    fn new(
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

    fn encoded_len(&self) -> usize {
        match self {
            CallHeader::V1(h) => h.encoded_len(),
            CallHeader::V2(h) => h.encoded_len(),
        }
    }

    fn encode(&self, out: &mut BytesMut) {
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

/// One call to send.
#[derive(Debug, Clone)]
pub struct OutCall {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    /// The whole RPC call message; reduced items (if any) become Read chunks.
    pub message: Encoded,
    /// What the reply may hold (sizes of the Write chunks and of the Reply chunk).
    pub reply: ReplyExpectation,
    /// RPCSEC_GSS integrity or privacy: nothing is reduced in either direction; long
    /// messages use a Position-Zero Read chunk and a Reply chunk (RFC 8166 §8.2.2.3).
    pub no_reduction: bool,
    /// When the call fails with [`RpcError::Timeout`].
    pub deadline: Option<Instant>,
}

/// Something the driver does for the Requester.
#[derive(Debug)]
pub enum Action {
    /// Post a Send of `data`.
    Send { xid: u32, data: Bytes },
    /// The call is over: its memory is already fenced.
    Complete {
        xid: u32,
        result: Result<Bytes, RpcError>,
    },
    /// A backward-direction call (RFC 8167) for the client's callback service.
    BackCall { xid: u32, message: Bytes },
    /// Close the connection (RFC 8166 §4.5.4: memory that cannot be invalidated must be
    /// fenced by closing the connection).
    Close,
}

struct Outstanding {
    call: OutCall,
    regions: Vec<Region>,
    /// Write chunks offered (region index in `regions`) in order.
    writes: Vec<usize>,
    reply_chunk: Option<usize>,
    sent: bool,
}

/// The largest reply to procedure 0: by convention the NULL procedure of every program takes
/// no arguments and returns no results (RFC 5531 §12.1), so its reply is an RPC reply header:
/// XID, message type, reply_stat, a verifier of at most 400 bytes (RFC 5531 §8.2),
/// accept_stat and a version range. It always fits inline, so NULL calls of programs the
/// caller gave no bound for need no Reply chunk.
const NULL_REPLY_MAX: usize = 4 + 4 + 4 + (4 + 4 + 400) + 4 + 8;

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequesterStats {
    pub sent: u64,
    pub completed: u64,
    pub outstanding: u32,
    pub max_outstanding: u32,
    /// The credit limit in force at the busiest moment.
    pub limit_at_max: u32,
    /// Sends that would have exceeded the limit (must stay 0).
    pub over_limit: u64,
    pub short: u64,
    pub chunked: u64,
    pub long_call: u64,
    pub long_reply: u64,
    pub rdma_errors: u64,
    pub dropped: u64,
    pub back_calls: u64,
    /// Calls that offered at least one Write chunk (DDP-eligible results, RFC 8166 §3.4.6).
    pub write_chunk_calls: u64,
    /// Replies whose Write chunks came back with data in them.
    pub write_chunk_replies: u64,
    /// Of those, replies put together around the written data in its own memory (one item,
    /// and the registrar left room: [`Registrar::sink_framed`]); the others were copied.
    pub write_chunk_in_place: u64,
    /// Replies sent as RDMA_NOMSG: the whole reply came through the Reply chunk (Long Reply).
    pub nomsg_replies: u64,
    /// Calls cancelled before their reply ([`Requester::cancel`]: a timeout, or a caller that
    /// gave up); their memory was fenced when they were cancelled.
    pub cancelled: u64,
    /// Replies that arrived for cancelled calls: their credit is taken back, the rest is
    /// discarded.
    /// Calls resent in another version after RDMA2_ERR_VERS (cel-05 §8.2).
    pub version_fallbacks: u64,
    pub late_replies: u64,
    /// Calls refused without being sent: their program or version has no Upper-Layer
    /// Binding (RFC 8166 §6).
    pub no_binding: u64,
}

/// One connection's Requester.
pub struct Requester {
    cfg: Config,
    params: Params,
    ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>,
    granted: u32,
    connected: bool,
    calls: XidMap<Outstanding>,
    queue: VecDeque<u32>,
    /// Calls that were sent, then abandoned: each still holds a credit until its reply
    /// arrives or the connection ends.
    abandoned: HashSet<u32>,
    in_flight: usize,
    stats: RequesterStats,
    /// The version of this connection (cel-05 §8).
    version: RequesterVersion,
    /// The server refused version 2 on an earlier connection (set by the driver, or read
    /// from `memory` on connect).
    peer_v1_only: bool,
    /// Where servers found to speak version 1 only are remembered, with this server's
    /// address (cel-05 §8.2), and whether this connection's finding is recorded there yet.
    memory: Option<(SocketAddr, SharedVersionMemory)>,
    remembered: bool,
    /// What is decided about a call before it is encoded and after RDMA_ERR_CHUNK.
    policy: Arc<CallPolicy>,
}

impl std::fmt::Debug for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requester")
            .field("params", &self.params)
            .field("granted", &self.granted)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn reg_failed(e: RegError) -> RpcError {
    RpcError::Transport(e.to_string())
}

impl Requester {
    /// A Requester; connect it with [`Requester::on_connect`].
    pub fn new(cfg: Config, ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>) -> Self {
        Requester {
            params: Params::default(),
            granted: 1,
            connected: false,
            calls: XidMap::default(),
            queue: VecDeque::new(),
            abandoned: HashSet::new(),
            in_flight: 0,
            stats: RequesterStats::default(),
            version: RequesterVersion::new(cfg.version_policy, false),
            peer_v1_only: false,
            memory: None,
            remembered: false,
            policy: Arc::new(CallPolicy::new(&cfg, ulbs.clone())),
            ulbs,
            cfg,
        }
    }

    /// The decisions about a call that precede [`Requester::submit`] (how to encode it) and
    /// follow its failure (a short Reply chunk retry), for a driver to consult without holding
    /// the Requester.
    pub fn call_policy(&self) -> Arc<CallPolicy> {
        self.policy.clone()
    }

    /// The driver remembers servers that refused version 2 (cel-05 §8.2); tell the Requester
    /// before [`Requester::on_connect`] so the next connection does not probe again.
    pub fn set_peer_v1_only(&mut self, v1_only: bool) {
        self.peer_v1_only = v1_only;
    }

    /// Remember in `memory` whether the server at `peer` speaks version 1 only, and read it
    /// there on each [`Requester::on_connect`] (cel-05 §8.2: "a client can avoid a possible
    /// version negotiation loop when re-establishing another connection by assuming that
    /// particular server does not support RPC-over-RDMA version 2").
    pub fn remember_versions_in(&mut self, peer: SocketAddr, memory: SharedVersionMemory) {
        self.memory = Some((peer, memory));
    }

    /// Record what this connection found (once) in the memory of version-1-only servers.
    fn remember_version(&mut self) {
        if self.remembered || !self.version.learned_v1_only() {
            return;
        }
        if let Some((peer, memory)) = &self.memory {
            memory.lock().remember_v1_only(peer.ip(), peer.port());
        }
        self.remembered = true;
    }

    /// The version calls are sent in now.
    pub fn version(&self) -> Version {
        self.version.current()
    }

    /// Why, once settled (`None` while a version 2 probe is outstanding).
    pub fn version_reason(&self) -> Option<Reason> {
        self.version.settled()
    }

    /// True when this connection found the server to speak version 1 only.
    pub fn learned_v1_only(&self) -> bool {
        self.version.learned_v1_only()
    }

    /// The inline threshold for calls: version 1's negotiated one; version 2's never below
    /// 4096 (cel-05 §3.3: receivers "MUST support" it); 1024 at most for the probe (§8).
    fn send_limit(&self) -> usize {
        if let Some(probe) = self.version.probe_limit() {
            return self.params.inline_send.min(probe);
        }
        match self.version.current() {
            Version::V1 => self.params.inline_send,
            Version::V2 => self
                .params
                .inline_send
                .max(crate::props::DEFAULT_RBSIZ as usize),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &RequesterStats {
        &self.stats
    }

    /// min(requested, granted) (RFC 8166 §3.3.1).
    pub fn limit(&self) -> usize {
        self.cfg.credits.max(1).min(self.granted) as usize
    }

    /// Calls sent and not answered (including abandoned ones that still hold a credit).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Receive buffers to keep posted: one per requested credit plus the backward credits
    /// (RFC 8167 §4.3.1).
    //= specs/rfc8166.txt#section-3.3.1
    //# A Requester MUST maintain enough receive resources to accommodate expected replies.
    pub fn receives_needed(&self) -> usize {
        self.cfg.credits as usize + self.cfg.back_credits as usize
    }

    /// Calls not yet completed.
    pub fn pending(&self) -> usize {
        self.calls.len()
    }

    /// A connection is up. RFC 8166 §3.3.3: one credit until the first reply. Calls that were
    /// outstanding are sent again with the same XID and fresh registrations.
    #[must_use = "every action the engine returns must be performed"]
    pub fn on_connect(&mut self, params: Params, reg: &mut dyn Registrar) -> Vec<Action> {
        self.params = params;
        //= specs/rfc8166.txt#section-3.3.3
        //# A Responder MAY exceed this basic level of configuration, but a Requester MUST NOT
        //# assume more than one credit is available and MUST receive a valid reply from the
        //# Responder carrying the actual number of available credits, prior to sending its next
        //# request.
        self.granted = 1;
        self.connected = true;
        if let Some((peer, memory)) = &self.memory {
            // cel-05 §8.2: a server that refused version 2 before is not probed again.
            self.peer_v1_only = memory.lock().is_v1_only(peer.ip(), peer.port());
        }
        self.remembered = false;
        self.version = RequesterVersion::new(self.cfg.version_policy, self.peer_v1_only);
        self.in_flight = 0;
        self.abandoned.clear();
        let mut resend: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, o)| o.sent)
            .map(|(x, _)| *x)
            .collect();
        resend.sort_unstable();
        for xid in resend.into_iter().rev() {
            if let Some(o) = self.calls.get_mut(&xid) {
                o.sent = false;
            }
            self.queue.push_front(xid);
        }
        self.pump(reg)
    }

    /// The connection is gone: every registration is invalidated (fenced), calls wait for
    /// the next connection.
    #[must_use = "every action the engine returns must be performed"]
    pub fn on_disconnect(&mut self, reg: &mut dyn Registrar) -> Vec<Action> {
        self.connected = false;
        self.in_flight = 0;
        self.abandoned.clear();
        let mut out = Vec::new();
        for o in self.calls.values_mut() {
            for r in o.regions.drain(..) {
                if reg.invalidate(r.id, false).is_err() {
                    out.push(Action::Close);
                }
            }
            o.writes.clear();
            o.reply_chunk = None;
        }
        out
    }

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
            },
        );
        self.queue.push_back(xid);
        self.pump(reg)
    }

    fn pump(&mut self, reg: &mut dyn Registrar) -> Vec<Action> {
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
        let o = self
            .calls
            .get_mut(&xid)
            .ok_or_else(|| RpcError::Transport("unknown call".into()))?;
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
        if !o.call.no_reduction {
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
        let reply_hdr_room = 28 + 16 * writes.iter().map(|c| c.len() + 1).sum::<usize>();
        // RFC 8166 §3.3.2 / RFC 8797: the Responder sends at most its own send size inline,
        // which can be less than our receive buffers.
        //= specs/rfc8166.txt#section-4.3.3
        //# A Requester MUST provide a Reply chunk whenever the maximum possible size of the RPC
        //# Reply message's Transport and Payload streams is larger than the inline threshold for
        //# messages from Responder to Requester.
        let reply = if max_reply + reply_hdr_room > params.reply_inline {
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
        let payload = msg.to_bytes();
        let mut chunks = Chunks {
            reads: Vec::new(),
            writes,
            reply,
        };
        chunks.set_read_chunks(&read_chunks);
        let v2 = version == Version::V2;
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
        let (h, inline) = if short.encoded_len() + payload.len() <= send_limit {
            if read_chunks.is_empty() {
                self.stats.short += 1;
            } else {
                self.stats.chunked += 1;
            }
            (short, payload)
        } else {
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
            let r = reg.register_source(payload).map_err(reg_failed)?;
            let mut all = vec![ReadChunk {
                //= specs/rfc8166.txt#section-3.5.3
                //# Every RDMA read segment in this chunk MUST contain zero in its Position field.
                position: 0,
                segments: r.segments.clone(),
            }];
            o.regions.push(r);
            all.extend(read_chunks);
            chunks.reads = all
                .iter()
                .flat_map(|c| {
                    c.segments.iter().map(|s| ReadSegment {
                        position: c.position,
                        target: *s,
                    })
                })
                .collect();
            let handle = inv(&chunks);
            let h = CallHeader::new(v2, xid, cfg.credits, true, chunks, handle, Direction::Call);
            if h.encoded_len() > send_limit {
                return Err(RpcError::Transport(
                    "transport header exceeds inline threshold".into(),
                ));
            }
            (h, Bytes::new())
        };
        o.sent = true;
        let mut data = BytesMut::with_capacity(h.encoded_len() + inline.len());
        h.encode(&mut data);
        data.extend_from_slice(&inline);
        Ok(data.freeze())
    }

    /// Fence a call's memory, then complete it.
    fn finish(
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

    /// Abandon a call (timeout, or a caller that stopped waiting). The call leaves the
    /// pending table and every region it registered (Read chunks, Write chunks, Reply chunk,
    /// Position-Zero Read chunk) is invalidated through `reg` before this returns; the
    /// actions hold its `Complete` (with `err`) and a `Close` if some region could not be
    /// invalidated. If it was sent, it keeps its credit until a reply for it arrives (that
    /// reply is then discarded and counted in [`RequesterStats::late_replies`]) or the
    /// connection ends. Unknown or already completed XIDs: nothing happens.
    #[must_use = "every action the engine returns must be performed"]
    pub fn cancel(&mut self, xid: u32, err: RpcError, reg: &mut dyn Registrar) -> Vec<Action> {
        let Some(o) = self.calls.get(&xid) else {
            return Vec::new();
        };
        // RFC 8166 §4.4.1: segments of canceled RPCs are fenced too, since "A Responder
        // cannot know that the Requester is no longer waiting for a reply".
        self.stats.cancelled += 1;
        if o.sent && self.connected {
            self.abandoned.insert(xid);
        } else {
            self.queue.retain(|x| *x != xid);
        }
        self.finish(xid, Err(err), None, reg)
    }

    /// Fail every call whose deadline passed.
    #[must_use = "every action the engine returns must be performed"]
    pub fn poll_timeouts(&mut self, now: Instant, reg: &mut dyn Registrar) -> Vec<Action> {
        let expired: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, o)| o.call.deadline.is_some_and(|d| d <= now))
            .map(|(x, _)| *x)
            .collect();
        let mut out = Vec::new();
        for xid in expired {
            out.extend(self.cancel(xid, RpcError::Timeout, reg));
        }
        out
    }

    /// Earliest deadline among pending calls.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.calls.values().filter_map(|o| o.call.deadline).min()
    }

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

    fn receive(
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
            body @ (Body2::Msg(_) | Body2::NoMsg(_)) => {
                let nomsg = matches!(body, Body2::NoMsg(_));
                let (Body2::Msg(l) | Body2::NoMsg(l)) = body else {
                    return Vec::new();
                };
                if self.calls.get(&xid).is_some_and(|o| o.sent) {
                    let settled_before = self.version.settled();
                    self.version.on_reply(Version::V2);
                    if settled_before.is_none() {
                        tracing::info!(
                            xid,
                            "RPC-over-RDMA version 2 negotiated: {}",
                            Reason::ServerAnsweredV2
                        );
                    }
                }
                let mut v1 = Header::new(
                    xid,
                    h.credits,
                    if nomsg {
                        Body::NoMsg(l.chunks)
                    } else {
                        Body::Msg(l.chunks)
                    },
                );
                v1.vers = RPCRDMA_VERSION_2;
                self.on_message(v1, inline, remote_invalidated, reg)
            }
            Body2::Error(e) => self.on_error_v2(xid, h.credits, e, reg),
            // Property messages and OPTIONAL ones: nothing a requester acts on yet. They carry
            // no credit of a call.
            _ => {
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
        // §7.2.4: BAD_XDR is version 1's ERR_CHUNK; the others end the transaction with what
        // the server said (SYSTEM: "MUST terminate"; the retries the draft allows for
        // READ_CHUNKS, WRITE_CHUNKS and the RESOURCE errors are not made: see CONFORMANCE).
        let err = match e {
            ErrorBody2::BadXdr => RpcError::RdmaErrChunk,
            other => RpcError::Transport(format!("RDMA2_ERROR {other:?}")),
        };
        out.extend(self.finish(xid, Err(err), None, reg));
        out.extend(self.pump(reg));
        out
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

    fn reply_result(
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
        let written: Vec<usize> = chunks
            .writes
            .iter()
            .map(|c| chunk_len(c) as usize)
            .collect();
        if written.iter().all(|n| *n == 0) {
            return Ok(results);
        }
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
