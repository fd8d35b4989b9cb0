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

use crate::error::{SendError, WireError};
use crate::wire::{
    self, CONG_MAP_LEN, CongMap, ExtList, Extension, HEADER_LEN, Header, HeaderView, MAX_MSG_LEN,
    MAX_PATHS, PROBE_PORT, flags,
};

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
}

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

#[derive(Debug, Default)]
struct RxAssembler {
    hdr: BytesMut,
    header: Option<Header>,
    payload: BytesMut,
}

impl RxAssembler {
    /// Feeds bytes; calls `f` for each complete message. Returns a protocol error on a bad header.
    fn feed(&mut self, mut data: &[u8], mut f: impl FnMut(Header, Bytes)) -> Result<(), WireError> {
        while !data.is_empty() {
            match &self.header {
                None => {
                    let take = (HEADER_LEN - self.hdr.len()).min(data.len());
                    self.hdr.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.hdr.len() == HEADER_LEN {
                        let h = Header::decode(&self.hdr)?;
                        self.hdr.clear();
                        if h.len == 0 {
                            f(h, Bytes::new());
                        } else {
                            self.payload.reserve((h.len as usize).min(64 * 1024));
                            self.header = Some(h);
                        }
                    }
                }
                Some(h) => {
                    let need = h.len as usize - self.payload.len();
                    let take = need.min(data.len());
                    self.payload.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.payload.len() == h.len as usize {
                        let h = self.header.take().unwrap_or_default();
                        f(h, self.payload.split().freeze());
                    }
                }
            }
        }
        Ok(())
    }
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

/// Snapshot of one path for `rds info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Path index.
    pub index: u8,
    /// State.
    pub state: PathState,
    /// Next sequence number to send.
    pub next_tx_seq: u64,
    /// Next sequence number expected.
    pub next_rx_seq: u64,
    /// Messages waiting to be sent.
    pub send_queue: usize,
    /// Messages sent and not yet confirmed delivered.
    pub unacked: usize,
    /// Transport connections made on this path.
    pub connects: u64,
    /// Transport resets seen.
    pub resets: u64,
    /// Messages retransmitted after resets.
    pub retransmitted: u64,
    /// Retransmitted duplicates dropped on receive.
    pub dup_dropped: u64,
    /// Messages delivered to local ports.
    pub delivered: u64,
    /// Ack-only messages sent (Acked transports).
    pub ack_only_sent: u64,
}

/// Snapshot of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Peer address.
    pub peer: Ipv4Addr,
    /// Whether we are the side that connects (the smaller address).
    pub initiator: bool,
    /// Agreed path count (`None` until the probe is answered).
    pub npaths: Option<u16>,
    /// Peer's generation number (0 = unknown).
    pub peer_gen: u32,
    /// Generation resets seen.
    pub gen_resets: u64,
    /// Ports the peer marked congested.
    pub peer_congested: Vec<u16>,
    /// Paths in use (index < npaths, or with traffic).
    pub paths: Vec<PathInfo>,
}

/// Snapshot of one bound port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// RDS port.
    pub port: u16,
    /// Receive buffer, bytes.
    pub rcvbuf: usize,
    /// Bytes queued for the application.
    pub queued: usize,
    /// Whether the port is marked congested.
    pub congested: bool,
    /// Messages dropped because the receive queue was past its hard limit
    /// ([`EngineConfig::rcvbuf_hard_factor`]): a sender that ignores the congestion map.
    pub dropped: u64,
    /// Send buffer, bytes.
    pub sndbuf: usize,
    /// Payload bytes of this port's messages queued or not yet confirmed.
    pub snd_bytes: usize,
}

/// Snapshot of the engine for `oxrdma rds info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Local address.
    pub local: Ipv4Addr,
    /// Our generation number.
    pub gen_num: u32,
    /// Connections.
    pub conns: Vec<ConnInfo>,
    /// Bound ports.
    pub ports: Vec<PortInfo>,
}

/// Linux's `jhash_1word()` (Bob Jenkins' lookup3 final mix), used by `RDS_MPATH_HASH` on the
/// bound port in host order with a per-socket random seed (net/rds/rds.h, bind.c).
pub fn jhash_1word(a: u32, initval: u32) -> u32 {
    let iv = initval.wrapping_add(0xdead_beef).wrapping_add(1 << 2);
    let mut a = a.wrapping_add(iv);
    let mut b = iv;
    let mut c = iv;
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

/// The sans-IO engine for one local address.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    gen_num: u32,
    rng: StdRng,
    conns: HashMap<Ipv4Addr, Conn>,
    ports: HashMap<u16, Port>,
    local_cong: CongMap,
    actions: VecDeque<Action>,
    next_token: Token,
    /// Accepted transports not yet bound to a path: token → (peer, buffered bytes).
    pending: HashMap<Token, (Ipv4Addr, BytesMut)>,
    /// Bound transports: token → path.
    bound: HashMap<Token, PathId>,
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
        Engine {
            cfg: EngineConfig {
                max_paths: cfg
                    .max_paths
                    .clamp(1, MAX_PATHS)
                    .next_power_of_two()
                    .min(MAX_PATHS),
                ..cfg
            },
            gen_num,
            rng,
            conns: HashMap::new(),
            ports: HashMap::new(),
            local_cong: CongMap::new(),
            actions: VecDeque::new(),
            next_token: 1,
            pending: HashMap::new(),
            bound: HashMap::new(),
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

    fn is_initiator(&self, peer: Ipv4Addr) -> bool {
        // facts "RDS over TCP": the numerically smaller address connects.
        self.cfg.local < peer
    }

    // ---------------------------------------------------------------- ports

    /// Binds an RDS port. Port 0 (ping responder) cannot be bound.
    pub fn bind(&mut self, port: u16) -> Result<(), crate::error::RdsError> {
        if port == 0 || self.ports.contains_key(&port) {
            return Err(crate::error::RdsError::AddrInUse(port));
        }
        let hash_seed = self.rng.random();
        self.ports.insert(
            port,
            Port {
                rcvbuf: self.cfg.default_rcvbuf,
                sndbuf: self.cfg.default_sndbuf,
                snd_bytes: 0,
                queue: VecDeque::new(),
                queued: 0,
                congested: false,
                dropped: 0,
                hash_seed,
            },
        );
        Ok(())
    }

    /// Binds the first free port at or above 1024 (0 means "any" in the socket API).
    pub fn bind_any(&mut self) -> Option<u16> {
        let start: u16 = self.rng.random_range(1024..=u16::MAX);
        let p = (start..=u16::MAX)
            .chain(1024..start)
            .find(|p| !self.ports.contains_key(p))?;
        self.bind(p).ok()?;
        Some(p)
    }

    /// Unbinds a port; queued datagrams are dropped and its congestion cleared.
    pub fn unbind(&mut self, port: u16) {
        if let Some(p) = self.ports.remove(&port)
            && p.congested
        {
            self.set_local_cong(port, false);
        }
    }

    /// Sets a port's receive buffer size (SO_RCVBUF).
    pub fn set_rcvbuf(&mut self, port: u16, bytes: usize) {
        if let Some(p) = self.ports.get_mut(&port) {
            p.rcvbuf = bytes.max(1);
        }
        self.update_port_cong(port);
    }

    /// Sets a port's send buffer (Linux: half of SO_SNDBUF).
    pub fn set_sndbuf(&mut self, port: u16, bytes: usize) {
        if let Some(p) = self.ports.get_mut(&port) {
            let was_full = p.snd_bytes >= p.sndbuf;
            p.sndbuf = bytes.max(1);
            if was_full && p.snd_bytes < p.sndbuf {
                self.actions.push_back(Action::SendReady);
            }
        }
    }

    /// Takes the next datagram queued for `port`.
    pub fn recv(&mut self, port: u16) -> Option<Datagram> {
        let p = self.ports.get_mut(&port)?;
        let (payload, src, ext) = p.queue.pop_front()?;
        p.queued -= payload.len();
        self.update_port_cong(port);
        Some(Datagram { payload, src, ext })
    }

    fn update_port_cong(&mut self, port: u16) {
        let Some(p) = self.ports.get_mut(&port) else {
            return;
        };
        // facts "Congestion map": congested when queued bytes exceed the receive buffer,
        // uncongested below half of it.
        let change = if !p.congested && p.queued > p.rcvbuf {
            Some(true)
        } else if p.congested && p.queued < p.rcvbuf / 2 {
            Some(false)
        } else {
            None
        };
        if let Some(c) = change {
            p.congested = c;
            self.set_local_cong(port, c);
        }
    }

    fn set_local_cong(&mut self, port: u16, c: bool) {
        self.local_cong.set(port, c);
        // Spec 3.1 "Congestion control": send the update to every connected node.
        let peers: Vec<Ipv4Addr> = self.conns.keys().copied().collect();
        for peer in peers {
            self.queue_cong_map(peer);
        }
    }

    fn queue_cong_map(&mut self, peer: Ipv4Addr) {
        let Some(conn) = self.conns.get_mut(&peer) else {
            return;
        };
        // On path 0 (or the first path that is up). One queued map suffices: it is encoded from
        // the current map when it is transmitted.
        let idx = conn
            .paths
            .iter()
            .position(|p| p.state == PathState::Up)
            .unwrap_or(0);
        let path = &mut conn.paths[idx];
        if !path.sendq.iter().any(|m| matches!(m.kind, Kind::CongMap)) {
            path.sendq.push_back(OutMsg {
                kind: Kind::CongMap,
                header: CongMap::header(),
                payload: Bytes::new(),
                seq: None,
            });
        }
        if let Some(t) = path.token() {
            self.actions.push_back(Action::Transmit(t));
        }
    }

    /// The local congestion map.
    pub fn local_cong(&self) -> &CongMap {
        &self.local_cong
    }

    // ---------------------------------------------------------------- sending

    /// Queues a datagram from bound port `sport` to `dest`. `dest.port() == 0` sends a ping.
    ///
    /// Would-block errors ([`SendError::Congested`], [`SendError::HandshakePending`]) mean
    /// "retry after [`Action::SendReady`]".
    pub fn send(
        &mut self,
        now: Instant,
        sport: u16,
        dest: SocketAddrV4,
        payload: Bytes,
    ) -> Result<(), SendError> {
        self.send_with_ext(now, sport, dest, payload, Vec::new())
    }

    /// [`Engine::send`] with header extensions (RDMA / RDMA_DEST for RDS over RDMA operations).
    pub fn send_with_ext(
        &mut self,
        now: Instant,
        sport: u16,
        dest: SocketAddrV4,
        payload: Bytes,
        ext: Vec<Extension>,
    ) -> Result<(), SendError> {
        if payload.len() > MAX_MSG_LEN {
            return Err(SendError::TooLong(payload.len()));
        }
        let seed = self
            .ports
            .get(&sport)
            .ok_or(SendError::NotBound(sport))?
            .hash_seed;
        let peer = *dest.ip();
        self.ensure_conn(now, peer);
        let max_paths = self.cfg.max_paths;
        let conn = self.conns.get_mut(&peer).ok_or(SendError::Shutdown)?;
        // Spec 3.1 "Congestion control": do not send to a port the peer marked congested.
        if dest.port() != 0 && conn.peer_cong.get(dest.port()) {
            return Err(SendError::Congested);
        }
        // MPRDS: path = RDS_MPATH_HASH(bound port) & (npaths - 1). Until the probe is answered,
        // Linux waits when the 8-path hash is nonzero (send.c rds_send_mprds_hash).
        let h = jhash_1word(u32::from(sport), seed);
        let idx = match conn.npaths {
            Some(n) => (h & (u32::from(n) - 1)) as usize,
            None if max_paths > 1 && h & (u32::from(MAX_PATHS) - 1) != 0 => {
                return Err(SendError::HandshakePending);
            }
            None => 0,
        };
        // Linux send.c rds_send_queue_rm: a message is queued only while the socket has less
        // than its send buffer queued and unconfirmed (so the last one may go over); otherwise
        // EAGAIN, or a blocking send waits until confirmations free space.
        if let Some(p) = self.ports.get_mut(&sport) {
            if p.snd_bytes >= p.sndbuf {
                return Err(SendError::SendBufferFull);
            }
            p.snd_bytes += payload.len();
        }
        let mut header = Header {
            sport,
            dport: dest.port(),
            len: payload.len() as u32,
            ..Header::default()
        };
        header.ext.items = ext;
        self.enqueue(
            now,
            peer,
            idx,
            OutMsg {
                kind: Kind::Seq,
                header,
                payload,
                seq: None,
            },
        );
        Ok(())
    }

    /// Sends a ping (zero-length to port 0) from `sport`; the pong arrives on `sport` from port 0.
    pub fn ping(&mut self, now: Instant, sport: u16, peer: Ipv4Addr) -> Result<(), SendError> {
        self.send(now, sport, SocketAddrV4::new(peer, 0), Bytes::new())
    }

    /// Whether sending from `sport` to `dest` would currently block (congestion or handshake).
    pub fn would_block(&self, sport: u16, dest: SocketAddrV4) -> Option<SendError> {
        if self
            .ports
            .get(&sport)
            .is_some_and(|p| p.snd_bytes >= p.sndbuf)
        {
            return Some(SendError::SendBufferFull);
        }
        let conn = self.conns.get(dest.ip())?;
        if dest.port() != 0 && conn.peer_cong.get(dest.port()) {
            return Some(SendError::Congested);
        }
        None.or_else(|| {
            let seed = self.ports.get(&sport)?.hash_seed;
            (conn.npaths.is_none()
                && self.cfg.max_paths > 1
                && jhash_1word(u32::from(sport), seed) & 7 != 0)
                .then_some(SendError::HandshakePending)
        })
    }

    fn ensure_conn(&mut self, now: Instant, peer: Ipv4Addr) {
        if self.conns.contains_key(&peer) {
            return;
        }
        self.conns.insert(peer, Conn::new(peer));
        // Path 0 is needed at once; the larger side also dials so that the smaller notices
        // (its connect is dropped when it completes).
        self.want_connect(now, PathId { peer, index: 0 });
    }

    fn enqueue(&mut self, now: Instant, peer: Ipv4Addr, idx: usize, msg: OutMsg) {
        let Some(conn) = self.conns.get_mut(&peer) else {
            return;
        };
        let path = &mut conn.paths[idx];
        path.sendq.push_back(msg);
        match path.token() {
            Some(t) => self.actions.push_back(Action::Transmit(t)),
            None => self.want_connect(
                now,
                PathId {
                    peer,
                    index: idx as u8,
                },
            ),
        }
    }

    /// Asks for a connect on `id` if it is down and none is scheduled.
    fn want_connect(&mut self, now: Instant, id: PathId) {
        let initiator = self.is_initiator(id.peer);
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return;
        };
        // Only path 0 is dialled by the larger side (as a nudge).
        if !initiator && id.index != 0 {
            return;
        }
        let path = &mut conn.paths[usize::from(id.index)];
        if path.state != PathState::Down || path.reconnect_at.is_some() {
            return;
        }
        if path.backoff.is_zero() {
            // First try immediately.
            path.state = PathState::Connecting;
            self.actions.push_back(Action::Connect(id));
        } else {
            let d = self.rng.random_range(Duration::ZERO..path.backoff);
            path.reconnect_at = Some(now + d);
        }
    }

    /// The driver's connect for `id` failed.
    pub fn connect_failed(&mut self, now: Instant, id: PathId) {
        self.backoff_step(id);
        if let Some(p) = self.path_mut(id)
            && p.state == PathState::Connecting
        {
            p.state = PathState::Down;
        }
        self.want_connect(now, id);
    }

    fn backoff_step(&mut self, id: PathId) {
        let max = self.cfg.backoff_max;
        if let Some(p) = self.path_mut(id) {
            // facts "Reconnect": random delay in [0, current), current doubling up to 1 s.
            p.backoff = if p.backoff.is_zero() {
                Duration::from_millis(2).min(max)
            } else {
                (p.backoff * 2).min(max)
            };
        }
    }

    fn path_mut(&mut self, id: PathId) -> Option<&mut Path> {
        self.conns
            .get_mut(&id.peer)?
            .paths
            .get_mut(usize::from(id.index))
    }

    /// Earliest time [`Engine::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| c.paths.iter())
            .flat_map(|p| p.reconnect_at.into_iter().chain(p.draining.map(|d| d.1)))
            .min()
    }

    /// Runs due reconnects.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut drained = Vec::new();
        for c in self.conns.values() {
            for p in &c.paths {
                if let Some((old, t)) = p.draining
                    && t <= now
                {
                    drained.push((
                        PathId {
                            peer: c.peer,
                            index: p.index,
                        },
                        old,
                    ));
                }
            }
        }
        for (id, old) in drained {
            self.actions.push_back(Action::Close(old));
            self.finish_drain(now, id);
        }
        let mut due = Vec::new();
        for c in self.conns.values_mut() {
            for p in &mut c.paths {
                if p.reconnect_at.is_some_and(|t| t <= now) {
                    p.reconnect_at = None;
                    if p.state == PathState::Down {
                        p.state = PathState::Connecting;
                        due.push(PathId {
                            peer: c.peer,
                            index: p.index,
                        });
                    }
                }
            }
        }
        self.actions.extend(due.into_iter().map(Action::Connect));
    }

    // ---------------------------------------------------------------- transport events

    fn new_token(&mut self) -> Token {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Our outbound connect for `id` completed. Returns the token to use, or `None` when the
    /// connection must be closed (we are the larger address: facts "RDS over TCP").
    pub fn connected(&mut self, now: Instant, id: PathId) -> Option<Token> {
        if !self.is_initiator(id.peer) {
            if let Some(p) = self.path_mut(id)
                && p.state == PathState::Connecting
            {
                p.state = PathState::Down;
            }
            // Keep nudging with back-off until the smaller side connects to us.
            self.backoff_step(id);
            let pending = self
                .conns
                .get(&id.peer)
                .and_then(|c| c.paths.get(usize::from(id.index)))
                .is_some_and(|p| p.state == PathState::Down && p.has_tx());
            if pending {
                self.want_connect(now, id);
            }
            return None;
        }
        let t = self.new_token();
        self.attach(now, id, t);
        Some(t)
    }

    /// A transport connection arrived from `peer`.
    pub fn accept(&mut self, now: Instant, peer: Ipv4Addr) -> AcceptOutcome {
        if self.is_initiator(peer) {
            // We are the smaller address: reset it and connect ourselves.
            self.ensure_conn(now, peer);
            self.want_connect(now, PathId { peer, index: 0 });
            return AcceptOutcome::Reject;
        }
        self.conns.entry(peer).or_insert_with(|| Conn::new(peer));
        let t = self.new_token();
        self.pending.insert(t, (peer, BytesMut::new()));
        AcceptOutcome::Accept(t)
    }

    fn attach(&mut self, now: Instant, id: PathId, token: Token) {
        // The peer reconnected before we saw its old connection end. Bytes it sent on the old
        // one may still sit unread in our socket, and the peer counts them as delivered (TCP
        // acknowledged them), so the old transport is read to its end first ("draining") and
        // the new one's bytes are held until then. Its unconfirmed sends are resent on the new.
        let mut replacing = false;
        if let Some(old) = self.path_mut(id).and_then(|p| p.token()) {
            if let Some((d, _)) = self.path_mut(id).and_then(|p| p.draining.take()) {
                self.bound.remove(&d);
                self.actions.push_back(Action::Close(d));
            }
            let rx = self
                .path_mut(id)
                .map(|p| std::mem::take(&mut p.rx))
                .unwrap_or_default();
            self.detach(now, id, old, false);
            self.bound.insert(old, id);
            if let Some(p) = self.path_mut(id) {
                p.rx = rx;
                p.draining = Some((old, now + DRAIN_LIMIT));
            }
            replacing = true;
        }
        let max_paths = self.cfg.max_paths;
        let gen_num = self.gen_num;
        let Some(path) = self.path_mut(id) else {
            return;
        };
        path.state = PathState::Up;
        path.reconnect_at = None;
        path.backoff = Duration::ZERO;
        path.connects += 1;
        if !replacing {
            path.rx = RxAssembler::default();
        }
        path.transport = Some(Transport {
            token,
            written: 0,
            acked: 0,
            cur: None,
        });
        // Path 0 sends a probe (spec "MPRDS": before the first data packet), which also
        // carries our generation number.
        // It takes a new sequence number, so it goes after the retransmissions (which carry
        // older numbers): ahead of them it would make the receiver drop them as duplicates.
        if id.index == 0 {
            let at = path
                .sendq
                .iter()
                .position(|m| m.seq.is_none())
                .unwrap_or(path.sendq.len());
            path.sendq.insert(
                at,
                OutMsg {
                    kind: Kind::Seq,
                    header: wire::probe(0, max_paths, gen_num),
                    payload: Bytes::new(),
                    seq: None,
                },
            );
        }
        // facts "Congestion map": the map is the first message on every new path.
        path.sendq.retain(|m| !matches!(m.kind, Kind::CongMap));
        path.sendq.push_front(OutMsg {
            kind: Kind::CongMap,
            header: CongMap::header(),
            payload: Bytes::new(),
            seq: None,
        });
        self.bound.insert(token, id);
        self.actions.push_back(Action::Transmit(token));
    }

    fn detach(&mut self, now: Instant, id: PathId, token: Token, reconnect: bool) {
        self.bound.remove(&token);
        let Some(path) = self.path_mut(id) else {
            return;
        };
        if path.token() != Some(token) {
            return;
        }
        let Some(t) = path.transport.take() else {
            return;
        };
        path.state = PathState::Down;
        path.resets += 1;
        path.rx = RxAssembler::default();
        // Spec "Connection re-establishment" / facts: unconfirmed messages go out again ahead of
        // new ones, with their old sequence numbers and ACK_REQUIRED|RETRANSMITTED.
        let mut again: Vec<OutMsg> = path.inflight.drain(..).map(|f| f.msg).collect();
        if let Some((m, _)) = t.cur {
            again.push(m);
        }
        for m in again.into_iter().rev() {
            if let Kind::Seq = m.kind {
                let mut m = m;
                m.header.flags |= flags::ACK_REQUIRED | flags::RETRANSMITTED;
                path.retransmitted += 1;
                path.sendq.push_front(m);
            }
        }
        path.ack_pending = false;
        if reconnect {
            self.want_connect(now, id);
        }
    }

    /// The transport under `token` closed or failed. Unconfirmed messages will be resent.
    pub fn transport_down(&mut self, now: Instant, token: Token) {
        if self.pending.remove(&token).is_some() {
            return;
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return;
        };
        if self
            .path_mut(id)
            .is_some_and(|p| p.draining.is_some_and(|d| d.0 == token))
        {
            self.finish_drain(now, id);
            return;
        }
        let initiator = self.is_initiator(id.peer);
        self.detach(now, id, token, initiator);
        if !initiator {
            // The larger side nudges path 0 if it still has something to send.
            let has = self
                .conns
                .get(&id.peer)
                .is_some_and(|c| c.paths.iter().any(|p| p.has_tx()));
            if has && id.index == 0 {
                self.want_connect(now, id);
            }
        }
    }

    /// The replaced transport of `id` has ended: switch reception to the new one.
    fn finish_drain(&mut self, now: Instant, id: PathId) {
        let Some(p) = self.path_mut(id) else {
            return;
        };
        let Some((old, _)) = p.draining.take() else {
            return;
        };
        p.rx = RxAssembler::default();
        let held = p.held.split();
        let cur = p.token();
        self.bound.remove(&old);
        if let Some(cur) = cur
            && !held.is_empty()
            && self.on_recv(now, cur, &held).is_err()
        {
            self.actions.push_back(Action::Close(cur));
            self.transport_down(now, cur);
        }
    }

    /// TCP: the peer acknowledged `acked` bytes of this transport's stream (from its start).
    /// Messages whose last byte is covered are released.
    pub fn on_transport_acked(&mut self, token: Token, acked: u64) {
        if self.cfg.transport != TransportKind::Tcp {
            // Acked transports release on h_ack only.
            return;
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return;
        };
        let Some(path) = self
            .conns
            .get_mut(&id.peer)
            .and_then(|c| c.paths.get_mut(usize::from(id.index)))
        else {
            return;
        };
        let Some(t) = path.transport.as_mut().filter(|t| t.token == token) else {
            return;
        };
        t.acked = t.acked.max(acked.min(t.written));
        let a = t.acked;
        let mut freed = false;
        while path.inflight.front().is_some_and(|f| f.end <= a) {
            if let Some(f) = path.inflight.pop_front() {
                freed |= release(&mut self.ports, &f.msg);
            }
        }
        if freed {
            self.actions.push_back(Action::SendReady);
        }
    }

    /// Next bytes to write on `token` (`None`: nothing to send). The driver must write them in
    /// order; the engine counts them as written.
    pub fn poll_transmit(&mut self, token: Token) -> Option<Bytes> {
        let id = *self.bound.get(&token)?;
        let kind = self.cfg.transport;
        let ack_every = self.cfg.ack_every;
        let local_cong = &self.local_cong;
        let conn = self.conns.get_mut(&id.peer)?;
        let path = conn.paths.get_mut(usize::from(id.index))?;
        let t = path.transport.as_mut().filter(|t| t.token == token)?;
        if t.cur.is_none() {
            let mut m = match path.sendq.pop_front() {
                Some(m) => m,
                // Spec 3.1: an ack-only message only when no other message can carry the ack;
                // built when needed, so at most one is ever queued.
                None if kind == TransportKind::Acked && path.ack_pending => {
                    path.ack_only_sent += 1;
                    OutMsg {
                        kind: Kind::AckOnly,
                        header: wire::ack_only(path.last_rx_seq),
                        payload: Bytes::new(),
                        seq: None,
                    }
                }
                None => return None,
            };
            match m.kind {
                Kind::CongMap => {
                    m.header = CongMap::header();
                    // Tell an accepting oxrdma peer which path this transport is.
                    m.header.ext.items.push(Extension::SportIdx(id.index));
                    m.payload = local_cong.encode();
                }
                Kind::AckOnly => {}
                Kind::Seq => {
                    let seq = *m.seq.get_or_insert_with(|| {
                        let s = path.next_tx_seq;
                        path.next_tx_seq += 1;
                        s
                    });
                    m.header.seq = seq;
                    m.header.len = m.payload.len() as u32;
                    if kind == TransportKind::Acked {
                        path.sent_since_ack_req += 1;
                        // Ask for an ack every `ack_every` messages and when the queue drains, so
                        // that everything sent is eventually confirmed.
                        if path.sent_since_ack_req >= ack_every || path.sendq.is_empty() {
                            m.header.flags |= flags::ACK_REQUIRED;
                        }
                        if m.header.flags & flags::ACK_REQUIRED != 0 {
                            path.sent_since_ack_req = 0;
                        }
                    }
                }
            }
            if kind == TransportKind::Acked {
                // Spec 3.1: piggyback the latest received sequence number.
                m.header.ack = path.last_rx_seq;
                path.ack_pending = false;
            }
            let h = match m.header.encode() {
                Ok(h) => Bytes::copy_from_slice(&h),
                Err(_) => return None,
            };
            t.written += h.len() as u64;
            if m.payload.is_empty() {
                let end = t.written;
                finish(path, m, end, kind);
            } else {
                t.cur = Some((m, true));
            }
            return Some(h);
        }
        let (m, _) = t.cur.take()?;
        let p = m.payload.clone();
        t.written += p.len() as u64;
        let end = t.written;
        finish(path, m, end, kind);
        Some(p)
    }

    /// Bytes arrived on `token`. On `Err` the driver must close the transport (and call
    /// [`Engine::transport_down`]).
    pub fn on_recv(&mut self, now: Instant, token: Token, data: &[u8]) -> Result<(), WireError> {
        if let Some((peer, buf)) = self.pending.get_mut(&token) {
            buf.extend_from_slice(data);
            // Wait for a whole header before binding the transport to a path.
            let Ok(view) = HeaderView::new_checked(&buf[..]) else {
                return Ok(());
            };
            let peer = *peer;
            let h = Header::from_view(&view)?;
            // Bind the accepted transport to a path: the SPORT_IDX extension when present,
            // otherwise the first path without a transport (Linux 6.1 rds_tcp_accept_one_path).
            let idx = h
                .ext
                .items
                .iter()
                .find_map(|e| match e {
                    Extension::SportIdx(i) if u16::from(*i) < MAX_PATHS => Some(*i),
                    _ => None,
                })
                .or_else(|| {
                    self.conns
                        .get(&peer)?
                        .paths
                        .iter()
                        .position(|p| p.state != PathState::Up)
                        .map(|i| i as u8)
                });
            let buf = self
                .pending
                .remove(&token)
                .map(|(_, b)| b)
                .unwrap_or_default();
            let Some(idx) = idx else {
                self.actions.push_back(Action::Close(token));
                return Ok(());
            };
            let id = PathId { peer, index: idx };
            self.attach(now, id, token);
            return self.on_recv(now, token, &buf);
        }
        let Some(id) = self.bound.get(&token).copied() else {
            return Ok(());
        };
        let mut msgs = Vec::new();
        {
            let Some(path) = self.path_mut(id) else {
                return Ok(());
            };
            let draining = path.draining.map(|d| d.0);
            if draining != Some(token) {
                if path.token() != Some(token) {
                    return Ok(());
                }
                if draining.is_some() {
                    path.held.extend_from_slice(data);
                    return Ok(());
                }
            }
            path.rx.feed(data, |h, p| msgs.push((h, p)))?;
        }
        for (h, p) in msgs {
            self.on_message(now, id, token, h, p)?;
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        now: Instant,
        id: PathId,
        token: Token,
        h: Header,
        payload: Bytes,
    ) -> Result<(), WireError> {
        let kind = self.cfg.transport;
        let local = self.cfg.local;
        let max_paths = self.cfg.max_paths;
        let gen_num = self.gen_num;
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return Ok(());
        };
        let pidx = usize::from(id.index);
        if kind == TransportKind::Acked && h.ack != 0 {
            // Release everything the peer confirmed.
            let path = &mut conn.paths[pidx];
            let mut freed = false;
            while path
                .inflight
                .front()
                .is_some_and(|f| f.msg.seq.is_none_or(|s| s <= h.ack))
            {
                if let Some(f) = path.inflight.pop_front() {
                    freed |= release(&mut self.ports, &f.msg);
                }
            }
            if freed {
                self.actions.push_back(Action::SendReady);
            }
        }
        if h.is_cong_map() {
            // facts "Congestion map": seq 0, ports 0, 8192 bytes.
            conn.peer_cong = CongMap::decode(&payload)?;
            self.actions.push_back(Action::SendReady);
            return Ok(());
        }
        if h.is_ack_only() && h.seq == 0 {
            return Ok(());
        }
        {
            let path = &mut conn.paths[pidx];
            // facts: drop only if seq < next expected AND RETRANSMITTED is set.
            if h.seq < path.next_rx_seq && h.flags & flags::RETRANSMITTED != 0 {
                path.dup_dropped += 1;
                return Ok(());
            }
            path.next_rx_seq = h.seq + 1;
            if kind == TransportKind::Acked {
                path.last_rx_seq = h.seq;
                if h.flags & flags::ACK_REQUIRED != 0 {
                    path.ack_pending = true;
                    self.actions.push_back(Action::Transmit(token));
                }
            }
        }
        if h.dport == 0 {
            // Ping. Linux ignores pings from sport 0.
            if h.sport == 0 {
                return Ok(());
            }
            let probe = h.sport == PROBE_PORT;
            let ext = if probe {
                self.handshake(now, id, &h.ext);
                ExtList {
                    items: vec![Extension::Npaths(max_paths), Extension::GenNum(gen_num)],
                }
            } else {
                ExtList::new()
            };
            let pong = OutMsg {
                kind: Kind::Seq,
                header: wire::pong(0, h.sport, ext),
                payload: Bytes::new(),
                seq: None,
            };
            // The pong goes back on the path the ping came on.
            self.enqueue(now, id.peer, pidx, pong);
            return Ok(());
        }
        if h.sport == 0 && h.dport == PROBE_PORT {
            // Pong to our probe.
            self.handshake(now, id, &h.ext);
            return Ok(());
        }
        let src = SocketAddrV4::new(id.peer, h.sport);
        let Some(port) = self.ports.get_mut(&h.dport) else {
            // No socket bound: dropped, as Linux does.
            return Ok(());
        };
        // Spec 3.1: messages for a congested port must still be accepted — up to the hard
        // limit (see `EngineConfig::rcvbuf_hard_factor`); an empty queue takes any message.
        let hard = port
            .rcvbuf
            .saturating_mul(self.cfg.rcvbuf_hard_factor)
            .saturating_add(self.cfg.rcvbuf_hard_slack);
        if port.queued > 0 && port.queued.saturating_add(payload.len()) > hard {
            port.dropped += 1;
            if port.dropped.is_power_of_two() {
                tracing::warn!(port = h.dport, from = %src, queued = port.queued, hard,
                    dropped = port.dropped,
                    "RDS receive queue past its hard limit: message dropped (sender ignores congestion)");
            }
            return Ok(());
        }
        port.queued += payload.len();
        // RDMA / RDMA_DEST extensions go up with the datagram (RDS over RDMA operations).
        let ext = h
            .ext
            .items
            .iter()
            .filter(|e| matches!(e, Extension::Rdma { .. } | Extension::RdmaDest { .. }))
            .cloned()
            .collect();
        port.queue.push_back((payload, src, ext));
        if let Some(c) = self.conns.get_mut(&id.peer) {
            c.paths[pidx].delivered += 1;
        }
        self.actions.push_back(Action::Readable(h.dport));
        self.update_port_cong(h.dport);
        let _ = local;
        Ok(())
    }

    /// Processes NPATHS / GEN_NUM from a probe or its pong (Linux recv.c rds_recv_hs_exthdrs).
    fn handshake(&mut self, now: Instant, id: PathId, ext: &ExtList) {
        let max_paths = self.cfg.max_paths;
        let initiator = self.is_initiator(id.peer);
        let Some(conn) = self.conns.get_mut(&id.peer) else {
            return;
        };
        // npaths = min(ours, peer's), or 1 if the peer sent none.
        let n = ext.npaths().map_or(1, |n| n.clamp(1, max_paths));
        // Round down to a power of two so that `hash & (n - 1)` stays in range.
        let n = 1u16 << (15 - n.leading_zeros());
        let first = conn.npaths.is_none();
        conn.npaths = Some(n);
        if let Some(g) = ext.gen_num()
            && g != 0
        {
            if conn.peer_gen != 0 && conn.peer_gen != g {
                // Spec "RDS Generation Number": the peer restarted; reset every path.
                conn.gen_resets += 1;
                for p in &mut conn.paths {
                    p.next_tx_seq = 1;
                    p.next_rx_seq = 0;
                    // What the old peer never confirmed is dropped, as Linux does
                    // (rds_conn_path_reset drops the retransmit queue).
                    for f in p.inflight.drain(..) {
                        release(&mut self.ports, &f.msg);
                    }
                    let ports = &mut self.ports;
                    p.sendq.retain(|m| {
                        let keep = m.seq.is_none();
                        if !keep {
                            release(ports, m);
                        }
                        keep
                    });
                }
                self.actions.push_back(Action::SendReady);
                // The probe/pong being processed was accepted already.
                conn.paths[usize::from(id.index)].next_rx_seq = 0;
            }
            conn.peer_gen = g;
        }
        if first || initiator {
            self.actions.push_back(Action::SendReady);
        }
        if initiator {
            // The smaller address connects paths 1..n-1 (Linux rds_start_mprds).
            for i in 1..n {
                self.want_connect(
                    now,
                    PathId {
                        peer: id.peer,
                        index: i as u8,
                    },
                );
            }
        }
    }

    /// Whether some bound port's send buffer is full (its senders wait for confirmations).
    pub fn send_buffer_full(&self) -> bool {
        self.ports.values().any(|p| p.snd_bytes >= p.sndbuf)
    }

    /// Snapshot for `rds info`.
    pub fn info(&self) -> EngineInfo {
        let mut conns: Vec<ConnInfo> = self
            .conns
            .values()
            .map(|c| ConnInfo {
                peer: c.peer,
                initiator: self.is_initiator(c.peer),
                npaths: c.npaths,
                peer_gen: c.peer_gen,
                gen_resets: c.gen_resets,
                peer_congested: c.peer_cong.congested_ports().collect(),
                paths: c
                    .paths
                    .iter()
                    .filter(|p| {
                        u16::from(p.index) < c.npaths.unwrap_or(1)
                            || p.state != PathState::Down
                            || p.connects > 0
                    })
                    .map(|p| PathInfo {
                        index: p.index,
                        state: p.state,
                        next_tx_seq: p.next_tx_seq,
                        next_rx_seq: p.next_rx_seq,
                        send_queue: p.sendq.len(),
                        unacked: p.inflight.len()
                            + usize::from(p.transport.as_ref().is_some_and(|t| t.cur.is_some())),
                        connects: p.connects,
                        resets: p.resets,
                        retransmitted: p.retransmitted,
                        dup_dropped: p.dup_dropped,
                        delivered: p.delivered,
                        ack_only_sent: p.ack_only_sent,
                    })
                    .collect(),
            })
            .collect();
        conns.sort_by_key(|c| c.peer);
        let mut ports: Vec<PortInfo> = self
            .ports
            .iter()
            .map(|(k, p)| PortInfo {
                port: *k,
                rcvbuf: p.rcvbuf,
                queued: p.queued,
                congested: p.congested,
                dropped: p.dropped,
                sndbuf: p.sndbuf,
                snd_bytes: p.snd_bytes,
            })
            .collect();
        ports.sort_by_key(|p| p.port);
        EngineInfo {
            local: self.cfg.local,
            gen_num: self.gen_num,
            conns,
            ports,
        }
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
fn release(ports: &mut HashMap<u16, Port>, m: &OutMsg) -> bool {
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

fn finish(path: &mut Path, m: OutMsg, end: u64, kind: TransportKind) {
    match m.kind {
        Kind::Seq => path.inflight.push_back(InFlight { msg: m, end }),
        Kind::CongMap | Kind::AckOnly => {
            // Not retransmitted: a fresh map is sent on every new path; acks are regenerated.
            // They still occupy stream positions, which needs no tracking.
            let _ = kind;
        }
    }
}

const _: () = assert!(CONG_MAP_LEN == 8192);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Message;

    fn engine(ip: [u8; 4]) -> Engine {
        let mut c = EngineConfig::tcp(Ipv4Addr::from(ip));
        c.seed = Some(5);
        Engine::new(c)
    }

    #[test]
    fn reconnect_backoff_is_random_doubling_and_capped() {
        let mut e = engine([10, 0, 0, 1]);
        e.bind(1000).unwrap();
        let now = Instant::now();
        let peer = Ipv4Addr::new(10, 0, 0, 2);
        let _ = e.ping(now, 1000, peer);
        let id = PathId { peer, index: 0 };
        // First try immediately.
        assert_eq!(e.poll_action(), Some(Action::Connect(id)));
        let mut cap = Duration::from_millis(2);
        let mut t = now;
        for _ in 0..20 {
            e.connect_failed(t, id);
            let at = e.poll_timeout().expect("retry scheduled");
            let d = at - t;
            assert!(d < cap, "delay {d:?} not below {cap:?}");
            assert!(d < Duration::from_secs(1));
            // Nothing happens before the time; the connect is issued at it.
            e.handle_timeout(at - Duration::from_nanos(1).min(d));
            assert!(d.is_zero() || e.poll_action().is_none());
            e.handle_timeout(at);
            assert_eq!(e.poll_action(), Some(Action::Connect(id)));
            t = at;
            cap = (cap * 2).min(Duration::from_secs(1));
        }
        // A successful connect resets the back-off: the next failure retries quickly again.
        assert!(e.connected(t, id).is_some());
    }

    #[test]
    fn larger_address_drops_own_connect_and_smaller_resets_inbound() {
        let now = Instant::now();
        let mut hi = engine([10, 0, 0, 9]);
        let lo_ip = Ipv4Addr::new(10, 0, 0, 1);
        hi.bind(7).unwrap();
        let _ = hi.ping(now, 7, lo_ip);
        let id = PathId {
            peer: lo_ip,
            index: 0,
        };
        assert_eq!(hi.poll_action(), Some(Action::Connect(id)));
        assert_eq!(
            hi.connected(now, id),
            None,
            "the larger side drops its own connect"
        );
        let mut lo = engine([10, 0, 0, 1]);
        assert_eq!(
            lo.accept(now, Ipv4Addr::new(10, 0, 0, 9)),
            AcceptOutcome::Reject
        );
        assert_eq!(
            lo.poll_action(),
            Some(Action::Connect(PathId {
                peer: Ipv4Addr::new(10, 0, 0, 9),
                index: 0
            }))
        );
    }

    #[test]
    fn sport_zero_ping_is_ignored_and_ping_is_answered() {
        let now = Instant::now();
        let mut e = engine([10, 0, 0, 2]);
        let AcceptOutcome::Accept(tok) = e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) else {
            panic!("accept");
        };
        let mut stream = Vec::new();
        stream.extend_from_slice(&CongMap::header().encode().unwrap());
        stream.extend_from_slice(&CongMap::new().encode());
        stream.extend_from_slice(&wire::ping(1, 0).encode().unwrap());
        stream.extend_from_slice(&wire::ping(2, 4000).encode().unwrap());
        e.on_recv(now, tok, &stream).unwrap();
        let mut out = Vec::new();
        while let Some(b) = e.poll_transmit(tok) {
            out.extend_from_slice(&b);
        }
        // Our stream: cong map (48 + 8192), probe, then exactly one pong (to port 4000).
        let mut off = 0;
        let mut pongs = Vec::new();
        while off < out.len() {
            let (m, n) = Message::decode(&out[off..]).unwrap();
            off += n;
            if m.header.sport == 0 && m.header.dport != 0 && !m.header.is_cong_map() {
                pongs.push(m.header.dport);
            }
        }
        assert_eq!(pongs, vec![4000]);
    }

    /// A sender that ignores the congestion map: its messages are accepted past the receive
    /// buffer (spec 3.1), up to the hard limit, then dropped and counted; the queue never
    /// holds more than the limit plus nothing, and drains normally.
    #[test]
    fn a_sender_that_ignores_congestion_is_dropped_past_the_hard_limit() {
        let now = Instant::now();
        let mut c = EngineConfig::tcp(Ipv4Addr::new(10, 0, 0, 2));
        c.seed = Some(5);
        c.rcvbuf_hard_factor = 2;
        c.rcvbuf_hard_slack = 0;
        let mut e = Engine::new(c);
        e.bind(4000).unwrap();
        e.set_rcvbuf(4000, 10_000);
        let AcceptOutcome::Accept(tok) = e.accept(now, Ipv4Addr::new(10, 0, 0, 1)) else {
            panic!("accept");
        };
        let mut stream = Vec::new();
        stream.extend_from_slice(&CongMap::header().encode().unwrap());
        stream.extend_from_slice(&CongMap::new().encode());
        e.on_recv(now, tok, &stream).unwrap();
        // 100 messages of 1000 bytes, sent at once whatever the map says.
        let mut stream = Vec::new();
        for seq in 1..=100u64 {
            let m = Message {
                header: Header {
                    seq,
                    sport: 1234,
                    dport: 4000,
                    ..Header::default()
                },
                payload: Bytes::from(vec![seq as u8; 1000]),
            };
            stream.extend_from_slice(&m.encode().unwrap());
        }
        e.on_recv(now, tok, &stream).unwrap();
        let port = |e: &Engine| e.info().ports.into_iter().find(|p| p.port == 4000).unwrap();
        let p = port(&e);
        // Congested past 10,000 bytes, accepted up to 2 × 10,000, the other 80 dropped.
        assert!(p.congested);
        assert_eq!(p.queued, 20_000);
        assert_eq!(p.dropped, 80);
        // Our map went out with the port marked.
        assert!(e.local_cong.get(4000));
        // What was accepted is delivered in order; then the port takes messages again.
        for seq in 1..=20u8 {
            let d = e.recv(4000).expect("queued");
            assert_eq!(d.payload[0], seq);
        }
        assert!(e.recv(4000).is_none());
        let p = port(&e);
        assert!(!p.congested && p.queued == 0);
        let m = Message {
            header: Header {
                seq: 101,
                sport: 1234,
                dport: 4000,
                ..Header::default()
            },
            payload: Bytes::from_static(b"after"),
        };
        e.on_recv(now, tok, &m.encode().unwrap()).unwrap();
        assert_eq!(&e.recv(4000).expect("accepted again").payload[..], b"after");
        assert_eq!(port(&e).dropped, 80);
    }
}
