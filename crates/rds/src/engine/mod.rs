//! The sans-IO RDS connection engine.
//!
//! One [`Engine`] serves one local IPv4 address. It owns the bound RDS ports (their receive
//! queues and congestion state) and one connection per peer address, each made of 1..=8 paths.
//! A path carries one transport connection at a time (one TCP socket for RDS/TCP).
//!
//! The engine does no I/O and reads no clock: every call takes `now`, and what the driver must
//! do comes back as [`Action`]s from [`Engine::poll_action`] and bytes from
//! [`Engine::poll_transmit`]. The driver reports transport events back:
//! [`Engine::connected`] / [`Engine::accept`], [`Engine::on_recv`], [`Engine::on_transport_acked`]
//! (TCP) and [`Engine::transport_down`].
//!
//! Delivery tracking depends on [`TransportKind`]:
//! - [`TransportKind::Tcp`]: like Linux's rds_tcp there are no RDS-level acks; a message is
//!   released when the transport reports that the peer acknowledged the stream position of its
//!   last byte (facts "RDS over TCP": the kernel uses `snd_una`).
//! - [`TransportKind::Acked`]: for message transports (RDMA, later): `h_ack` piggybacks the last
//!   received sequence number, `ACK_REQUIRED` asks for an ack, and at most one ack-only message is
//!   pending at any time (spec 3.1 "Sequence numbers and acknowledgements").

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::{Rng, SeedableRng, rngs::StdRng};
use verbs::mem::KeyedIds;

use crate::wire::{CONG_MAP_LEN, CongMap, Extension, Header, MAX_PATHS};

mod conn;
mod info;
mod ports;
mod recv;
mod send;
mod timers;

pub use info::{ConnInfo, EngineInfo, PathInfo, PortInfo};
use recv::RxAssembler;
pub use send::jhash_1word;

/// How the transport under the engine confirms delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportKind {
    /// A byte stream whose acknowledged position the driver reports (RDS over TCP).
    Tcp,
    /// A message transport with RDS-level acks (`h_ack`, `ACK_REQUIRED`, ack-only messages).
    Acked,
}

/// Default send buffer of a port (Linux: 212992 / 2).
pub const DEFAULT_SNDBUF: usize = 106_496;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The local address this engine serves.
    pub local: Ipv4Addr,
    /// Paths this side supports (1..=8); advertised in the probe's NPATHS.
    pub max_paths: u16,
    /// Delivery tracking of the transport.
    pub transport: TransportKind,
    /// Generation number (random per instance when `None`).
    pub gen_num: Option<u32>,
    /// Receive buffer per bound port, bytes.
    pub default_rcvbuf: usize,
    /// Hard limit of a port's receive queue: `rcvbuf_hard_factor × rcvbuf +
    /// rcvbuf_hard_slack` bytes. Past its receive buffer a port is congested, and messages
    /// still arrive from senders that had them in flight before they saw the congestion map
    /// (spec 3.1 "Congestion control": they must be accepted); the slack is room for one
    /// well-behaved sender's whole send buffer of them. What comes beyond the hard limit is
    /// from senders that ignore the map: dropped and counted ([`PortInfo::dropped`]), so a
    /// port's queue cannot grow without bound. Linux 6.1 has no such limit (rds_recv_incoming
    /// queues whatever arrives); this bound is ours, for memory.
    pub rcvbuf_hard_factor: usize,
    /// See [`EngineConfig::rcvbuf_hard_factor`].
    pub rcvbuf_hard_slack: usize,
    /// Send buffer per bound port, bytes: a port may queue a new message only while less than
    /// this is queued and unconfirmed (Linux `rds_sk_sndbuf`: half of SO_SNDBUF, whose default
    /// `net.core.wmem_default` is 212992).
    pub default_sndbuf: usize,
    /// Reconnect back-off cap (spec 3.1 "Connection re-establishment": once per second).
    pub backoff_max: Duration,
    /// Seed for the random generator (back-off, generation, hash seeds); `None` = from the OS.
    pub seed: Option<u64>,
    /// `Acked` transport: set ACK_REQUIRED on every n-th message (Linux IB: 8).
    pub ack_every: u64,
    /// Peers this engine keeps state for. A peer's address opens an entry (its paths, its
    /// generation number and an 8 KiB congestion map) when it connects or when we first send to
    /// it. At the bound, an entry of a peer that never carried a message is forgotten to make
    /// room; if there is none, the connection is refused and the send fails with
    /// [`SendError::TooManyPeers`](crate::SendError::TooManyPeers). Linux keeps every
    /// `rds_connection` until its namespace goes away; this bound is ours, for memory.
    pub max_peers: usize,
    /// Accepted transports waiting for their first header (which says what path they are for).
    /// More are refused.
    pub max_unbound: usize,
    /// How long an accepted transport may wait for its first header before it is closed. A peer
    /// that connects sends its congestion map at once (spec 3.1 "Congestion control").
    pub bind_timeout: Duration,
}

/// Default [`EngineConfig::max_peers`].
pub const DEFAULT_MAX_PEERS: usize = 1024;

impl EngineConfig {
    /// Defaults for RDS over TCP on `local`.
    pub fn tcp(local: Ipv4Addr) -> Self {
        EngineConfig {
            local,
            max_paths: MAX_PATHS,
            transport: TransportKind::Tcp,
            gen_num: None,
            default_rcvbuf: 256 * 1024,
            rcvbuf_hard_factor: 2,
            rcvbuf_hard_slack: DEFAULT_SNDBUF,
            default_sndbuf: DEFAULT_SNDBUF,
            backoff_max: Duration::from_secs(1),
            seed: None,
            ack_every: 8,
            max_peers: DEFAULT_MAX_PEERS,
            max_unbound: 64,
            bind_timeout: Duration::from_secs(10),
        }
    }
}

/// How long a replaced transport may keep being read before it is closed.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Identifies a path: the peer address and the path index (0..8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId {
    /// Peer address.
    pub peer: Ipv4Addr,
    /// Path index.
    pub index: u8,
}

/// Identifies one transport connection (a TCP socket) attached to a path or pending binding.
pub type Token = u64;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Open a transport connection for this path, then call [`Engine::connected`] or
    /// [`Engine::connect_failed`].
    Connect(PathId),
    /// Close this transport connection (no [`Engine::transport_down`] call needed).
    Close(Token),
    /// The transport has bytes to send: call [`Engine::poll_transmit`].
    Transmit(Token),
    /// A datagram arrived for this bound port.
    Readable(u16),
    /// Senders that got a would-block error may retry (congestion cleared or handshake done).
    SendReady,
}

/// Answer to [`Engine::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptOutcome {
    /// Use the connection under this token; it is bound to a path when its first header arrives.
    Accept(Token),
    /// Reset the connection (we are the smaller address: we connect ourselves).
    Reject,
    /// Close the connection: a configured bound is reached ([`EngineConfig::max_peers`] or
    /// [`EngineConfig::max_unbound`]); counted in [`EngineInfo::limits`].
    Refuse,
}

/// Path state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    /// No transport.
    Down,
    /// A connect is under way (or scheduled).
    Connecting,
    /// A transport is attached.
    Up,
}

#[derive(Debug, Clone)]
enum Kind {
    /// A congestion map: the payload is taken from the current local map at transmit time.
    CongMap,
    /// An ack-only header (Acked transport).
    AckOnly,
    /// Anything with a sequence number: data, ping, pong, probe.
    Seq,
}

#[derive(Debug, Clone)]
struct OutMsg {
    kind: Kind,
    header: Header,
    payload: Bytes,
    /// Sequence number once first transmitted.
    seq: Option<u64>,
}

#[derive(Debug)]
struct InFlight {
    msg: OutMsg,
    /// Stream offset just past the message's last byte on the current transport.
    end: u64,
}

#[derive(Debug)]
struct Transport {
    token: Token,
    /// Bytes handed to the driver on this transport.
    written: u64,
    /// Bytes the peer acknowledged on this transport.
    acked: u64,
    /// Message being written: encoded header sent flag and the message.
    cur: Option<(OutMsg, bool)>,
}

#[derive(Debug)]
struct Path {
    index: u8,
    state: PathState,
    transport: Option<Transport>,
    next_tx_seq: u64,
    next_rx_seq: u64,
    /// Messages not yet started on the current transport (retransmits first).
    sendq: VecDeque<OutMsg>,
    /// Messages fully written on the current transport, awaiting release.
    inflight: VecDeque<InFlight>,
    rx: RxAssembler,
    /// Acked transport: last sequence number received, and whether the peer asked for an ack.
    last_rx_seq: u64,
    ack_pending: bool,
    sent_since_ack_req: u64,
    backoff: Duration,
    reconnect_at: Option<Instant>,
    connects: u64,
    resets: u64,
    retransmitted: u64,
    dup_dropped: u64,
    delivered: u64,
    ack_only_sent: u64,
    /// A replaced transport still being read to its end, and the time limit for that.
    draining: Option<(Token, Instant)>,
    /// Bytes of the new transport held until the replaced one is drained.
    held: BytesMut,
}

impl Path {
    fn new(index: u8) -> Self {
        Path {
            index,
            state: PathState::Down,
            transport: None,
            next_tx_seq: 1,
            next_rx_seq: 0,
            sendq: VecDeque::new(),
            inflight: VecDeque::new(),
            rx: RxAssembler::default(),
            last_rx_seq: 0,
            ack_pending: false,
            sent_since_ack_req: 0,
            backoff: Duration::ZERO,
            reconnect_at: None,
            connects: 0,
            resets: 0,
            retransmitted: 0,
            dup_dropped: 0,
            delivered: 0,
            ack_only_sent: 0,
            draining: None,
            held: BytesMut::new(),
        }
    }

    fn token(&self) -> Option<Token> {
        self.transport.as_ref().map(|t| t.token)
    }

    fn has_tx(&self) -> bool {
        self.transport.as_ref().is_some_and(|t| t.cur.is_some())
            || !self.sendq.is_empty()
            || self.ack_pending
    }
}

#[derive(Debug)]
struct Conn {
    peer: Ipv4Addr,
    paths: Vec<Path>,
    /// Agreed path count; `None` until a probe or pong was seen.
    npaths: Option<u16>,
    peer_gen: u32,
    peer_cong: CongMap,
    /// Bumped on every generation reset (for tests and info).
    gen_resets: u64,
}

impl Conn {
    /// Whether forgetting this entry loses nothing: no path ever carried a transport (so no
    /// sequence number was sent or received, and the peer's generation is unknown) and nothing
    /// waits to be sent. A peer we exchanged messages with is never forgotten: starting its
    /// sequence numbers again at 1 would make it drop our next messages as duplicates.
    fn forgettable(&self) -> bool {
        self.paths.iter().all(|p| {
            p.state == PathState::Down
                && p.connects == 0
                && p.transport.is_none()
                && p.draining.is_none()
                && p.sendq.is_empty()
                && p.inflight.is_empty()
                && !p.ack_pending
        })
    }

    fn new(peer: Ipv4Addr) -> Self {
        Conn {
            peer,
            paths: (0..MAX_PATHS as u8).map(Path::new).collect(),
            npaths: None,
            peer_gen: 0,
            peer_cong: CongMap::new(),
            gen_resets: 0,
        }
    }
}

#[derive(Debug)]
struct Port {
    rcvbuf: usize,
    /// Send buffer, and the payload bytes of this port's messages queued or unconfirmed.
    sndbuf: usize,
    snd_bytes: usize,
    queue: VecDeque<(Bytes, SocketAddrV4, Vec<Extension>)>,
    queued: usize,
    congested: bool,
    /// Messages dropped because the queue was past its hard limit.
    dropped: u64,
    hash_seed: u32,
}

/// A received datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Payload.
    pub payload: Bytes,
    /// Sender (peer address, source RDS port).
    pub src: SocketAddrV4,
    /// RDMA / RDMA_DEST extensions the message carried (RDS over RDMA operations).
    pub ext: Vec<Extension>,
}

impl Datagram {
    /// The cookie of the buffer the sender advertised with RDMA_DEST, if it did.
    pub fn rdma_dest_cookie(&self) -> Option<u64> {
        self.ext.iter().find_map(|e| match e {
            Extension::RdmaDest { rkey, offset } => Some(crate::rdma::cookie(*rkey, *offset)),
            _ => None,
        })
    }
}

/// The engine's tables. Peers choose some of their keys (a peer's address opens a connection),
/// so the hash takes a secret key; it is one multiplication per word where SipHash took about
/// 45 hashings of a hundred-odd instructions each per request and answer (callgrind, stop 39).
type Table<K, V> = HashMap<K, V, KeyedIds>;

/// The sans-IO engine for one local address.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    gen_num: u32,
    rng: StdRng,
    conns: Table<Ipv4Addr, Conn>,
    ports: Table<u16, Port>,
    local_cong: CongMap,
    actions: VecDeque<Action>,
    next_token: Token,
    /// Accepted transports not yet bound to a path.
    pending: Table<Token, Unbound>,
    /// Bound transports: token → path.
    bound: Table<Token, PathId>,
    /// What the bounds of [`EngineConfig`] turned away.
    limits: LimitCounts,
    /// Never later than the earliest deadline ([`Engine::poll_timeout`]).
    next_timer: Option<Instant>,
}

/// An accepted transport whose first header has not arrived.
#[derive(Debug)]
struct Unbound {
    peer: Ipv4Addr,
    /// Bytes received so far: less than a header, plus the rest of the read that completed it.
    buf: BytesMut,
    /// When it is closed if still unbound ([`EngineConfig::bind_timeout`]).
    deadline: Instant,
}

/// Counts of what the engine's bounds turned away, for `rds info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounts {
    /// Connections refused, and sends failed, because [`EngineConfig::max_peers`] entries were
    /// all in use.
    pub peers_refused: u64,
    /// Entries of peers that never carried a message, forgotten to make room for another.
    pub peers_forgotten: u64,
    /// Connections refused because [`EngineConfig::max_unbound`] were waiting for a header.
    pub unbound_refused: u64,
    /// Accepted transports closed because no header came within [`EngineConfig::bind_timeout`].
    pub unbound_expired: u64,
}

impl Engine {
    /// A new engine.
    pub fn new(cfg: EngineConfig) -> Self {
        let mut rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let gen_num = cfg
            .gen_num
            .unwrap_or_else(|| rng.random_range(1..=u32::MAX));
        // A seeded engine hashes (and so iterates its tables) alike on every run, without
        // drawing from the generator that the back-off and generation numbers come from.
        let keys = cfg.seed.map_or_else(KeyedIds::default, |s| {
            KeyedIds::new(s.rotate_left(17) ^ 0x5244_535f_7461_626c)
        });
        Engine {
            cfg: EngineConfig {
                max_paths: cfg
                    .max_paths
                    .clamp(1, MAX_PATHS)
                    .next_power_of_two()
                    .min(MAX_PATHS),
                max_peers: cfg.max_peers.max(1),
                max_unbound: cfg.max_unbound.max(1),
                ..cfg
            },
            gen_num,
            rng,
            conns: Table::with_hasher(keys),
            ports: Table::with_hasher(keys),
            local_cong: CongMap::new(),
            actions: VecDeque::new(),
            next_token: 1,
            pending: Table::with_hasher(keys),
            bound: Table::with_hasher(keys),
            limits: LimitCounts::default(),
            next_timer: None,
        }
    }

    /// Local address.
    pub fn local(&self) -> Ipv4Addr {
        self.cfg.local
    }

    /// Our generation number.
    pub fn gen_num(&self) -> u32 {
        self.gen_num
    }

    /// Next action for the driver.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Tokens of all attached transports to `peer` (for tests and the driver).
    pub fn tokens(&self, peer: Ipv4Addr) -> Vec<Token> {
        self.conns
            .get(&peer)
            .map(|c| c.paths.iter().filter_map(Path::token).collect())
            .unwrap_or_default()
    }

    /// Whether every message queued to `peer` has been confirmed delivered.
    pub fn idle_to(&self, peer: Ipv4Addr) -> bool {
        self.conns.get(&peer).is_none_or(|c| {
            c.paths.iter().all(|p| {
                p.inflight.is_empty()
                    && p.transport.as_ref().is_none_or(|t| t.cur.is_none())
                    && p.sendq.iter().all(|m| !matches!(m.kind, Kind::Seq))
            })
        })
    }
}

/// A message has left our custody (confirmed, or dropped by a generation reset): its bytes no
/// longer count against its port's send buffer. Returns whether that port could not send
/// before and can now.
fn release(ports: &mut Table<u16, Port>, m: &OutMsg) -> bool {
    if !matches!(m.kind, Kind::Seq) {
        return false;
    }
    let Some(p) = ports.get_mut(&m.header.sport) else {
        return false;
    };
    let was_full = p.snd_bytes >= p.sndbuf;
    p.snd_bytes = p.snd_bytes.saturating_sub(m.payload.len());
    was_full && p.snd_bytes < p.sndbuf
}

const _: () = assert!(CONG_MAP_LEN == 8192);

#[cfg(test)]
mod tests;
