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
//!
//! This module keeps the Requester's types, state and version memory; its jobs are split by
//! file: `calls` (call building and chunk planning), `reply` (reply handling and backward
//! calls), `timers` (deadlines and cancellation).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use oncrpc::{ReplyExpectation, RpcError};
use xdr::Encoded;

use crate::call_policy::CallPolicy;
use crate::engine::{Config, Params, Region, Registrar, XidMap};
use crate::props::BackwardSupport;
use crate::ulb::Bindings;
use crate::version::{Reason, RequesterVersion, SharedVersionMemory, V2Properties, Version};

mod calls;
mod pull;
mod reply;
mod timers;

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
    /// RDMA Read the responder-provided Read chunk of `xid`'s reply: `segments` in order into
    /// one buffer of `len` bytes, at most `RrcConfig::ord` Reads outstanding at once; then
    /// hand the bytes (or the failure) to [`Requester::pull_done`] with `pull`.
    Pull {
        xid: u32,
        pull: u64,
        segments: Vec<crate::header::Segment>,
        len: usize,
    },
    /// Post the pull-completion notification `data` (no credit, no reply), by Send With
    /// Invalidate of `invalidate` when given.
    Notify {
        data: Bytes,
        invalidate: Option<u32>,
    },
}

struct Outstanding {
    call: OutCall,
    regions: Vec<Region>,
    /// Write chunks offered (region index in `regions`) in order.
    writes: Vec<usize>,
    reply_chunk: Option<usize>,
    sent: bool,
    /// The last transmission carried the Payload stream in a Position-Zero Read chunk.
    long_call: bool,
    /// Resent once already after a version 2 error that asks for another form (cel-05
    /// §7.2.4: READ_CHUNKS, WRITE_CHUNKS); a second such error ends the call.
    reshaped: bool,
    /// The pull of its reply's responder-provided Read chunk under way.
    pull: Option<u64>,
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
    /// Calls resent under their XID in another form after RDMA2_ERR_READ_CHUNKS or
    /// RDMA2_ERR_WRITE_CHUNKS (cel-05 §7.2.4).
    pub reshaped: u64,
    /// Calls sent inline whole although their encoder reduced DDP-eligible arguments,
    /// because the whole call fit what the server receives (version 1: its inline receive
    /// threshold, RFC 8797; version 2: its RBSIZ, cel-05 §6.2.1).
    pub inline_unreduced: u64,
    /// Version 2 property messages received (RDMA2_CONNPROP, UPDPROP, REQPROP, RESPROP).
    pub properties_received: u64,
    /// Regions the server invalidated with Send With Invalidate (RFC 8797, cel-05 §7.2.3):
    /// only their local release remained.
    pub remote_invalidated: u64,
    /// Calls sent with neither Write chunks nor a Reply chunk (read-chunk reply mode).
    pub rrc_calls: u64,
    /// Responder-provided Read chunks pulled (RDMA Reads started) and their bytes delivered.
    pub rrc_pulls: u64,
    pub rrc_pulled_bytes: u64,
    /// Pulls whose RDMA Reads failed (or brought the wrong length).
    pub rrc_pull_failed: u64,
    /// Chunks refused without a pull (shape, size or segment count beyond the bounds).
    pub rrc_refused: u64,
    /// Read-chunk replies for an XID no call waits for.
    pub rrc_unknown_xid: u64,
    /// Read-chunk replies on a connection that did not agree to them.
    pub rrc_unsupported: u64,
    /// Pull-completion notifications sent, and of those by Send With Invalidate.
    pub rrc_notifications: u64,
    pub rrc_notified_by_invalidate: u64,
}

/// One connection's Requester.
pub struct Requester {
    cfg: Config,
    params: Params,
    ulbs: Arc<Bindings>,
    granted: u32,
    connected: bool,
    calls: XidMap<Outstanding>,
    queue: VecDeque<u32>,
    /// Calls that were sent, then abandoned: each still holds a credit until its reply
    /// arrives or the connection ends.
    abandoned: crate::engine::IdSet<u32>,
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
    /// Version 2 transport properties: ours (RBSIZ = our receive buffers) and the server's
    /// (cel-05 §6).
    props: V2Properties,
    /// Our RDMA2_CONNPROP went out on this connection.
    connprop_sent: bool,
    /// What is decided about a call before it is encoded and after RDMA_ERR_CHUNK.
    policy: Arc<CallPolicy>,
    /// Pulls of responder-provided Read chunks under way, by id.
    pulls: HashMap<u64, pull::Pull>,
    next_pull: u64,
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

impl Requester {
    /// A Requester; connect it with [`Requester::on_connect`].
    pub fn new(cfg: Config, ulbs: Arc<Bindings>) -> Self {
        Requester {
            params: Params::default(),
            granted: 1,
            connected: false,
            calls: XidMap::default(),
            queue: VecDeque::new(),
            abandoned: Default::default(),
            in_flight: 0,
            stats: RequesterStats::default(),
            version: RequesterVersion::new(cfg.version_policy, false),
            peer_v1_only: false,
            memory: None,
            remembered: false,
            props: V2Properties::new(cfg.recv_buffer_size(true), BackwardSupport::Inline)
                .with_rrc(cfg.rrc.enabled),
            connprop_sent: false,
            policy: Arc::new(CallPolicy::new(&cfg, ulbs.clone())),
            pulls: HashMap::new(),
            next_pull: 0,
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
            // cel-05 §6.2.1: the server's RBSIZ, once announced, is the largest message it
            // can receive (bounded here by the largest call we build at all).
            Version::V2 if self.props.peer_announced => {
                (self.props.send_limit() as usize).min(self.cfg.max_call_size)
            }
            Version::V2 => self
                .params
                .inline_send
                .max(crate::props::DEFAULT_RBSIZ as usize),
        }
    }

    /// Our version 2 transport properties and the server's, as announced.
    pub fn v2_properties(&self) -> &V2Properties {
        &self.props
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
        // Gap 4 of cel-05 (see CONFORMANCE): property messages carry no credit, so a
        // Requester that may speak version 2 keeps one more receive for the server's
        // RDMA2_CONNPROP.
        let props = usize::from(self.cfg.version_policy != crate::version::VersionPolicy::V1);
        self.cfg.credits as usize + self.cfg.back_credits as usize + props
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
        self.props = V2Properties::new(self.cfg.recv_buffer_size(true), BackwardSupport::Inline)
            .with_rrc(self.cfg.rrc.enabled);
        self.connprop_sent = false;
        self.forget_pulls();
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
        // Pulls under way end with the connection (their responder invalidates the chunks).
        self.forget_pulls();
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
}
