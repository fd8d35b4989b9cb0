//! Thin tokio drivers that run the engines over the `verbs` API: [`RdmaServer`] serves an
//! `oncrpc::Dispatcher`, [`RdmaClient`] implements `oncrpc::RpcTransport`.
//!
//! Each connection has a registered receive-buffer pool (the credit grant plus the backward
//! credits, 5666bis §7.2.2) and a registered send-buffer pool; one task reads the receive
//! completion queue, one routes send-queue completions to whoever waits for them.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{
    CallContext, CallHeader, CallRequest, Credential, Dispatcher, RpcError, RpcTransport,
};
use tokio::sync::oneshot;
use verbs::{
    Access, CompletionQueue, ConnParams, Connection, Device, MemoryRegion, Payload,
    ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, WcStatus,
};
use xdr::{DdpPolicy, Encoder};

use crate::engine::{Config, Params, RegError, Region, RegionId, Registrar};
use crate::header::Segment;
use crate::privdata::PrivateData;
use crate::requester::{self, OutCall, Requester};
use crate::responder::{self, Incoming, Responder};
use crate::ulb::UpperLayerBinding;

/// Errors of the drivers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error("verbs: {0}")]
    Verbs(#[from] verbs::VerbsError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad address {0}")]
    Address(String),
    #[error("unsupported URL scheme in {0} (use rdma://host:port or tcp://host:port)")]
    Scheme(String),
}

/// Settings for a client or server.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Protocol settings (credits, inline thresholds, chunk usage).
    pub rpc: Config,
    /// The RDMA device; soft-iWARP over TCP when `None`.
    pub device: Option<Device>,
    /// Default per-call timeout (client).
    pub call_timeout: Duration,
    /// Capture connections to pcap files in this directory.
    pub capture_dir: Option<std::path::PathBuf>,
    /// Client: how many times to try to reconnect after losing the connection.
    pub reconnect_attempts: u32,
    /// Server: the memory every connection's receive buffers and Read-chunk sinks are drawn
    /// from ([`oncrpc::MemoryBudget`]); `None`: a budget of a quarter of the machine's memory
    /// ([`oncrpc::MemoryBudget::machine_default`]). A connection whose receive buffers do not
    /// fit is refused; a call whose Read chunks do not fit waits (up to `rdma_timeout`) for
    /// memory to come back, then closes its connection.
    pub budget: Option<Arc<oncrpc::MemoryBudget>>,
    /// Server: how long the peer may take to answer an RDMA Read of its Read chunks before the
    /// connection is closed and its memory given back (default 30 s, the client's default call
    /// timeout: a requester that has not delivered a call's data by then has given up on it).
    pub rdma_timeout: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            rpc: Config::default(),
            device: None,
            call_timeout: Duration::from_secs(30),
            capture_dir: None,
            reconnect_attempts: 5,
            budget: None,
            rdma_timeout: Duration::from_secs(30),
        }
    }
}

impl TransportConfig {
    fn device(&self) -> Device {
        self.device.clone().unwrap_or_else(Device::default_device)
    }

    fn conn_params(&self) -> ConnParams {
        ConnParams {
            private_data: Bytes::copy_from_slice(&self.rpc.private_data().encode()),
            capture_dir: self.capture_dir.clone(),
            ..ConnParams::default()
        }
    }
}

/// Say which version a new connection uses when it is settled at once (configured, or the
/// server was remembered as version 1 only); a probe's outcome is logged by the Requester.
fn log_version(addr: SocketAddr, req: &Requester) {
    match req.version_reason() {
        Some(reason) => {
            tracing::info!(%addr, "RPC-over-RDMA version {} ({reason})", req.version().number())
        }
        None => tracing::info!(%addr, "RPC-over-RDMA: probing with version 2"),
    }
}

/// Servers found to speak RPC-over-RDMA version 1 only, for every client of this process
/// (cel-05 §8.2; bounded, oldest first out).
fn version_memory() -> &'static Mutex<crate::version::VersionMemory> {
    static MEMORY: std::sync::OnceLock<Mutex<crate::version::VersionMemory>> =
        std::sync::OnceLock::new();
    MEMORY.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Room a sink region keeps before the bytes the peer may write: enough for the inline results
/// that precede an NFS READ's data (NFSv3: 104 bytes; an NFSv4 COMPOUND's SEQUENCE, PUTFH and
/// READ results: about 150), so the reply can be put together around the data.
const SINK_HEAD: usize = 512;
/// Room after them: XDR round-up and whatever inline results follow the item.
const SINK_TAIL: usize = 64;
/// Sink buffers at least this large are reused once the caller drops what was read into them.
const SINK_POOL_MIN: usize = 256 << 10;
/// Idle sink buffers kept per connection (a client's readahead window of 1 MiB READs).
const SINK_POOL_KEEP: usize = 16;

/// Large sink buffers, reused ([`oncrpc::BufPool`]) instead of zeroed afresh for every NFS
/// READ. A reused buffer holds what an earlier reply put there; only the bytes the peer says it
/// wrote are ever handed out, as in Linux's xprtrdma, whose Write chunks target page-cache
/// pages that are not cleared first either.
struct SinkPool(Arc<oncrpc::BufPool>);

impl Default for SinkPool {
    fn default() -> Self {
        SinkPool(oncrpc::BufPool::new(SINK_POOL_KEEP))
    }
}

impl SinkPool {
    /// A buffer of at least `len` bytes (large ones rounded up to 4 KiB, so that calls whose
    /// inline parts differ by a few bytes share buffers).
    fn get(&self, len: usize) -> Vec<u8> {
        if len >= SINK_POOL_MIN {
            return self.0.get(len.next_multiple_of(4096));
        }
        vec![0; len]
    }

    /// `range` of `buf` as `Bytes`; a large buffer comes back here when the last of them goes.
    fn wrap(&self, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
        if buf.len() < SINK_POOL_MIN {
            return Bytes::from(buf).slice(range);
        }
        self.0.wrap(buf, range)
    }
}

/// Memory registration through a verbs protection domain. The provider picks random STags
/// (5666bis §10.1.2: handles are not predictable).
struct VerbsRegistrar {
    pd: ProtectionDomain,
    next: RegionId,
    /// Each region with the offset of its advertised part (non-zero for sinks).
    regions: HashMap<RegionId, (MemoryRegion, usize)>,
    sinks: SinkPool,
}

impl VerbsRegistrar {
    fn new(pd: ProtectionDomain) -> Self {
        VerbsRegistrar {
            pd,
            next: 0,
            regions: HashMap::new(),
            sinks: SinkPool::default(),
        }
    }

    /// Record a registration whose advertised part is `len` bytes at `head`.
    fn add(&mut self, mr: MemoryRegion, head: usize, len: usize) -> Region {
        self.next += 1;
        let seg = Segment {
            handle: mr.rkey(),
            length: len as u32,
            offset: mr.addr() + head as u64,
        };
        self.regions.insert(self.next, (mr, head));
        Region {
            id: self.next,
            segments: vec![seg],
        }
    }
}

impl Registrar for VerbsRegistrar {
    fn register_source(&mut self, data: Bytes) -> Result<Region, RegError> {
        // `Vec::from(Bytes)` takes the memory without a copy when nothing else holds it.
        let len = data.len();
        let mr = self
            .pd
            .register(data, Access::REMOTE_READ)
            .map_err(|e| RegError::Register(e.to_string()))?;
        Ok(self.add(mr, 0, len))
    }

    fn register_sink(&mut self, len: usize) -> Result<Region, RegError> {
        // The peer is told of `len` bytes at SINK_HEAD. The room around them is registered too
        // (one region), but nothing the peer could put there is ever read: the region is
        // fenced before its contents are taken, and the room is then overwritten.
        let buf = self.sinks.get(SINK_HEAD + len.max(1) + SINK_TAIL);
        let mr = self
            .pd
            .register(buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|e| RegError::Register(e.to_string()))?;
        Ok(self.add(mr, SINK_HEAD, len.max(1)))
    }

    fn sink_contents(&mut self, id: RegionId, len: usize) -> Result<Bytes, RegError> {
        let (mr, head) = self.regions.get(&id).ok_or(RegError::Unknown(id))?;
        // The contents are read once, as the RPC completes: fence the region and take its
        // memory instead of copying it (5666bis §5.4.1 wants it invalidated by now anyway).
        let v = mr
            .take_vec()
            .map_err(|e| RegError::Register(e.to_string()))?;
        let end = head
            .checked_add(len)
            .filter(|e| *e <= v.len())
            .ok_or_else(|| RegError::Register(format!("{len} bytes asked of a sink region")))?;
        Ok(self.sinks.wrap(v, *head..end))
    }

    fn sink_framed(
        &mut self,
        id: RegionId,
        len: usize,
        prefix: &[u8],
        suffix: &[u8],
    ) -> Result<Option<Bytes>, RegError> {
        let (mr, head) = self.regions.get(&id).ok_or(RegError::Unknown(id))?;
        let head = *head;
        let pad = xdr::pad_len(len);
        let end = head + len + pad + suffix.len();
        if prefix.len() > head || end > mr.len() {
            return Ok(None);
        }
        // Fenced first (take_vec invalidates): nothing the peer writes lands after this.
        let mut v = mr
            .take_vec()
            .map_err(|e| RegError::Register(e.to_string()))?;
        if end > v.len() {
            return Err(RegError::Register("sink region already taken".into()));
        }
        let start = head - prefix.len();
        v[start..head].copy_from_slice(prefix);
        v[head + len..head + len + pad].fill(0);
        v[head + len + pad..end].copy_from_slice(suffix);
        Ok(Some(self.sinks.wrap(v, start..end)))
    }

    fn invalidate(&mut self, id: RegionId, _remote: bool) -> Result<(), RegError> {
        let (mr, _) = self.regions.remove(&id).ok_or(RegError::Unknown(id))?;
        // 5666bis §5.4.1 / §10.1.3: the STag is dead before the RPC completes. A remote
        // invalidation already did it; invalidating again locally is harmless.
        mr.invalidate();
        Ok(())
    }
}

/// Send-queue completion routing shared by a connection's tasks.
#[derive(Default)]
struct Router {
    next: AtomicU64,
    waiters: Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    /// Told the XID of a reply whose unsignaled Send failed (it completes only then).
    on_reply_failed: Mutex<Option<ReplyFailed>>,
    /// A completion failed with an RDMA operational error (not a flush).
    op_error: std::sync::atomic::AtomicBool,
}

type ReplyFailed = Box<dyn Fn(u32) + Send + Sync>;

/// `wr_id` tag of a reply's unsignaled Send; the low 32 bits carry its XID.
const REPLY_WR: u64 = 1 << 63;

impl Router {
    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn wait(&self, id: u64) -> oneshot::Receiver<WcStatus> {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).insert(id, tx);
        rx
    }

    /// Record a send-queue completion's status: anything but success or a flush is an RDMA
    /// operational error.
    fn note_status(&self, status: WcStatus) {
        if !matches!(status, WcStatus::Success | WcStatus::WrFlushError) {
            self.op_error.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a reply whose Send completed with `status` is lost in the sense of 5666bis
    /// §5.5.3 (its retransmission answered with RDMA_ERR_CHUNK). That section is about RDMA
    /// operational errors, which a retransmission would run into again. A Send flushed because
    /// the connection broke with no such error (a peer or a network that went away) is not:
    /// its retransmission is executed again or, for a non-idempotent call, answered from the
    /// Upper Layer's duplicate request cache.
    fn reply_lost(&self, status: WcStatus) -> bool {
        status != WcStatus::Success
            && (status != WcStatus::WrFlushError || self.op_error.load(Ordering::Relaxed))
    }

    /// Route completions until the queue pair fails.
    async fn run(self: Arc<Self>, cq: CompletionQueue) {
        loop {
            let c = cq.next().await;
            self.note_status(c.status);
            if c.wr_id & REPLY_WR != 0 {
                if self.reply_lost(c.status)
                    && let Some(f) = &*lock(&self.on_reply_failed)
                {
                    f(c.wr_id as u32);
                }
            } else if let Some(tx) = lock(&self.waiters).remove(&c.wr_id) {
                let _ = tx.send(c.status);
            }
            if c.status != WcStatus::Success {
                tracing::debug!(status = ?c.status, opcode = ?c.opcode, "send queue completion in error");
                // Flushes: fail every waiter.
                lock(&self.waiters).clear();
            }
        }
    }
}

/// One connected queue pair with its buffer pools.
struct Link {
    qp: QueuePair,
    conn: Connection,
    recv_bufs: Vec<MemoryRegion>,
    router: Arc<Router>,
    router_task: tokio::task::JoinHandle<()>,
    /// Local sinks of RDMA Reads (Read chunks pulled by a server), reused.
    read_sinks: SinkPool,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.router_task.abort();
    }
}

impl Link {
    fn post_recv(&self, i: usize) -> Result<(), verbs::VerbsError> {
        let mr = &self.recv_bufs[i];
        self.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: vec![mr.sge(0, mr.len() as u32)],
        })
    }

    /// Post a Send of `data` (owned bytes, like inline data) and wait for its completion.
    ///
    /// Not from a pool of registered buffers reused once the Send completes: soft-iWARP's
    /// zero-copy transmit completes a Send when its FPDU is built, before the bytes are read
    /// out of the registered buffer onto the socket, so a reused buffer could put another
    /// message's bytes on the wire (seen as duplicated replies with the wrong invalidated
    /// STag; `tests/pipelined_null.rs`). Owned bytes are immutable and cost no extra copy.
    async fn send(&self, data: Bytes, invalidate: Option<u32>) -> Result<(), verbs::VerbsError> {
        let op = match invalidate {
            Some(h) => SendOp::SendWithInvalidate(h),
            None => SendOp::Send,
        };
        let id = self.router.id();
        let rx = self.router.wait(id);
        let wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(id, op, Vec::new())
        };
        if let Err(e) = self.qp.post_send(wr) {
            lock(&self.router.waiters).remove(&id);
            return Err(e);
        }
        if rx.await.unwrap_or(WcStatus::WrFlushError) == WcStatus::Success {
            Ok(())
        } else {
            Err(verbs::VerbsError::Disconnected)
        }
    }

    /// Post the Send of the reply to `xid`, unsignaled: a reply costs no completion to wait
    /// for. If it fails later (flushed by a connection that broke), the router hears of it and
    /// reports the XID (5666bis §5.5.3/§5.5.4).
    fn post_reply(
        &self,
        data: Bytes,
        invalidate: Option<u32>,
        xid: u32,
    ) -> Result<(), verbs::VerbsError> {
        let op = match invalidate {
            Some(h) => SendOp::SendWithInvalidate(h),
            None => SendOp::Send,
        };
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(REPLY_WR | u64::from(xid), op, Vec::new())
        };
        wr.signaled = false;
        self.qp.post_send(wr)
    }

    /// Post a Send of `data` without waiting for (or asking for) its completion; errors
    /// still complete, into the router, which nobody waits on for this WR.
    fn post_send_unsignaled(&self, data: Bytes) -> Result<(), verbs::VerbsError> {
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(self.router.id(), SendOp::Send, Vec::new())
        };
        wr.signaled = false;
        self.qp.post_send(wr)
    }

    /// RDMA Write (unsignaled: errors still complete, and QP ordering puts it before the Send).
    fn write(&self, seg: Segment, data: Bytes) -> Result<(), verbs::VerbsError> {
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(
                self.router.id(),
                SendOp::RdmaWrite {
                    remote_addr: seg.offset,
                    rkey: seg.handle,
                },
                Vec::new(),
            )
        };
        wr.signaled = false;
        self.qp.post_send(wr)
    }

    /// RDMA Read one chunk into a buffer between `pre` and (after the XDR round-up) `post`;
    /// returns that buffer, the whole call, and the chunk's length.
    async fn read_chunk_framed(
        &self,
        segs: &[Segment],
        pre: &[u8],
        post: &[u8],
        timeout: Duration,
    ) -> Result<(Bytes, usize), verbs::VerbsError> {
        let total: usize = segs.iter().map(|s| s.length as usize).sum();
        let pad = xdr::pad_len(total);
        let end = pre.len() + total + pad + post.len();
        let mr = self
            .qp
            .pd()
            .register(self.read_sinks.get(end.max(1)), Access::LOCAL_WRITE)?;
        let mut waits = Vec::with_capacity(segs.len());
        let mut at = pre.len() as u64;
        for s in segs {
            let id = self.router.id();
            let rx = self.router.wait(id);
            self.qp.post_send(SendWr::new(
                id,
                SendOp::RdmaRead {
                    remote_addr: s.offset,
                    rkey: s.handle,
                },
                vec![mr.sge(at, s.length)],
            ))?;
            at += u64::from(s.length);
            waits.push(rx);
        }
        // Every wait on the peer has a bound: a peer that never answers its Read Requests loses
        // the connection after `timeout`, and the sink with it.
        let deadline = tokio::time::Instant::now() + timeout;
        for rx in waits {
            let st = match tokio::time::timeout_at(deadline, rx).await {
                Ok(r) => r.unwrap_or(WcStatus::WrFlushError),
                Err(_) => {
                    tracing::info!(?timeout, "the peer did not answer an RDMA Read in time");
                    return Err(verbs::VerbsError::Timeout);
                }
            };
            if st != WcStatus::Success {
                tracing::debug!(status = ?st, "RDMA Read completed in error");
                return Err(verbs::VerbsError::Disconnected);
            }
        }
        // Every Read completed, so every byte of the chunk is in place; fence the region and
        // put the rest of the call around the chunk.
        let mut v = mr.take_vec()?;
        if v.len() < end {
            return Err(verbs::VerbsError::OutOfBounds);
        }
        let data_end = pre.len() + total;
        v[..pre.len()].copy_from_slice(pre);
        v[data_end..data_end + pad].fill(0);
        v[data_end + pad..end].copy_from_slice(post);
        Ok((self.read_sinks.wrap(v, 0..end), total))
    }

    /// RDMA Read one chunk into local memory: all its segments into one buffer, in order.
    async fn read_chunk(
        &self,
        segs: &[Segment],
        timeout: Duration,
    ) -> Result<Bytes, verbs::VerbsError> {
        let (b, n) = self.read_chunk_framed(segs, &[], &[], timeout).await?;
        // Without anything around it the buffer is the chunk and its round-up.
        Ok(b.slice(..n))
    }
}

fn recv_pool(
    pd: &ProtectionDomain,
    nrecv: usize,
    recv_size: usize,
) -> Result<Vec<MemoryRegion>, verbs::VerbsError> {
    (0..nrecv)
        .map(|_| pd.register_len(recv_size, Access::LOCAL_WRITE))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Server
// ------------------------------------------------------------------------------------------

/// Counters over all connections of a server.
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub connections: AtomicU64,
    pub calls: AtomicU64,
    /// Highest number of calls in progress on one connection.
    pub max_in_progress: AtomicU32,
    /// Calls that arrived beyond the grant (must stay 0 with a well-behaved client).
    pub over_credit: AtomicU64,
}

struct ServerShared {
    dispatcher: Dispatcher,
    ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>,
    cfg: TransportConfig,
    /// XIDs whose replies were lost, per peer host (5666bis §5.5.3).
    lost: Mutex<HashMap<IpAddr, HashSet<u32>>>,
    counters: ServerCounters,
    conns: Mutex<HashMap<u64, Arc<ServerConn>>>,
    next_conn: AtomicU64,
    budget: Arc<oncrpc::MemoryBudget>,
}

/// Per-connection state shared by the receive handler, the call tasks and [`ServerConnection`].
struct ServerConn {
    link: Arc<Link>,
    resp: Arc<Mutex<Responder>>,
    peer: SocketAddr,
    /// This connection's share of the server's memory budget; `_recv` holds its receive
    /// buffers' part for as long as the connection lives.
    budget: Arc<oncrpc::ConnBudget>,
    _recv: oncrpc::Reservation,
    back_waiters: Mutex<HashMap<u32, oneshot::Sender<Bytes>>>,
    next_xid: AtomicU32,
}

/// A handle on one accepted connection, for backward-direction calls (RFC 8167).
#[derive(Clone)]
pub struct ServerConnection {
    conn: Arc<ServerConn>,
}

impl std::fmt::Debug for ServerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConnection")
            .field("peer", &self.conn.peer)
            .finish_non_exhaustive()
    }
}

impl ServerConnection {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.conn.peer
    }

    /// Close this connection (the client reconnects and retransmits).
    pub async fn disconnect(&self) {
        self.conn.link.conn.disconnect().await;
    }

    /// The Upper Layer learnt that the client handles backward calls (for NFSv4.1, a
    /// CREATE_SESSION or BIND_CONN_TO_SESSION asking for the back channel): 5666bis §7.3.1.
    pub fn enable_backchannel(&self) {
        lock(&self.conn.resp).enable_backchannel();
    }

    /// Make a backward-direction call and wait for its results. Fails with
    /// [`RpcError::Transport`] before [`ServerConnection::enable_backchannel`]. `timeout`
    /// bounds the whole call, sending included (a client that reads nothing never completes
    /// the Send), after which the call is forgotten.
    pub async fn back_call(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: impl FnOnce(&mut Encoder),
        timeout: Duration,
    ) -> Result<Bytes, RpcError> {
        let c = &self.conn;
        let xid = c.next_xid.fetch_add(1, Ordering::Relaxed);
        let mut e = Encoder::new();
        CallHeader {
            xid,
            prog,
            vers,
            proc_,
            cred: oncrpc::OpaqueAuth::none(),
            verf: oncrpc::OpaqueAuth::none(),
        }
        .encode(&mut e);
        args(&mut e);
        let (tx, rx) = oneshot::channel();
        lock(&c.back_waiters).insert(xid, tx);
        let sent = lock(&c.resp).back_call(xid, e.into_bytes());
        let actions = match sent {
            Ok(a) => a,
            Err(err) => {
                lock(&c.back_waiters).remove(&xid);
                return Err(RpcError::Transport(err.to_string()));
            }
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let sent = tokio::time::timeout_at(
            deadline,
            run_server_actions(actions, &c.link, &c.resp, None),
        );
        let msg = match sent.await {
            Ok(()) => tokio::time::timeout_at(deadline, rx).await,
            Err(elapsed) => Err(elapsed),
        };
        let msg = match msg {
            Ok(Ok(m)) => m,
            Ok(Err(_)) => return Err(RpcError::Closed),
            Err(_) => {
                lock(&c.back_waiters).remove(&xid);
                let a = lock(&c.resp).cancel_back(xid);
                // Queued backward calls that may go now are sent by a task of their own, so
                // this caller's wait ends at its deadline whatever the Sends do.
                if !a.is_empty() {
                    let c = c.clone();
                    tokio::spawn(
                        async move { run_server_actions(a, &c.link, &c.resp, None).await },
                    );
                }
                return Err(RpcError::Timeout);
            }
        };
        let (h, results) = oncrpc::MessageHeader::decode_message(&msg)
            .map_err(|e| RpcError::BadReply(e.to_string()))?;
        match h {
            oncrpc::MessageHeader::Reply(oncrpc::ReplyHeader::Accepted {
                stat: oncrpc::AcceptStat::Success,
                ..
            }) => Ok(results),
            oncrpc::MessageHeader::Reply(oncrpc::ReplyHeader::Accepted { stat, .. }) => {
                Err(RpcError::Accepted(stat))
            }
            oncrpc::MessageHeader::Reply(oncrpc::ReplyHeader::Denied { reason, .. }) => {
                Err(RpcError::Rejected(reason))
            }
            oncrpc::MessageHeader::Call(_) => Err(RpcError::BadReply("CALL as reply".into())),
        }
    }
}

/// An RPC-over-RDMA server.
pub struct RdmaServer {
    local: SocketAddr,
    shared: Arc<ServerShared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RdmaServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaServer")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RdmaServer {
    /// Listen on `addr` and serve `dispatcher`; `ulbs` are the Upper-Layer Bindings of the
    /// programs that may use chunks.
    pub async fn bind(
        addr: SocketAddr,
        dispatcher: Dispatcher,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
        config: TransportConfig,
    ) -> Result<Self, DriverError> {
        let dev = config.device();
        let mut listener = dev.listen(addr).await?;
        let local = listener.local_addr();
        let shared = Arc::new(ServerShared {
            dispatcher,
            ulbs: Arc::new(ulbs.into_iter().map(|u| (u.program(), u)).collect()),
            lost: Mutex::new(HashMap::new()),
            counters: ServerCounters::default(),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            budget: config
                .budget
                .clone()
                .unwrap_or_else(oncrpc::MemoryBudget::machine_default),
            cfg: config,
        });
        let sh = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok(req) = listener.accept().await {
                let sh = sh.clone();
                let dev = dev.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_connection(dev, req, sh).await {
                        tracing::debug!(error = %e, "RPC-over-RDMA connection ended");
                    }
                });
            }
        });
        Ok(RdmaServer {
            local,
            shared,
            task,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn counters(&self) -> &ServerCounters {
        &self.shared.counters
    }

    /// The memory budget the connections draw from.
    pub fn budget(&self) -> &Arc<oncrpc::MemoryBudget> {
        &self.shared.budget
    }

    /// The connections currently established.
    pub fn connections(&self) -> Vec<ServerConnection> {
        lock(&self.shared.conns)
            .values()
            .map(|c| ServerConnection { conn: c.clone() })
            .collect()
    }
}

async fn serve_connection(
    dev: Device,
    req: verbs::ConnectRequest,
    sh: Arc<ServerShared>,
) -> Result<(), DriverError> {
    let cfg = &sh.cfg.rpc;
    let peer_pd = PrivateData::decode(req.private_data());
    let params: Params = cfg.negotiate(peer_pd).into();
    let peer = req.peer_addr();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq();
    let rcq = dev.create_cq();
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let lost = lock(&sh.lost).remove(&peer.ip()).unwrap_or_default();
    let resp = Responder::new(cfg.clone(), params, sh.ulbs.clone(), lost);
    let nrecv = resp.receives_needed();
    // The receive buffers are the first thing a connection costs: refuse it when they do not
    // fit in the budget (backpressure on new connections; the ones already served go on).
    let budget = sh.budget.connection();
    let recv_reservation = match budget.try_reserve(nrecv * params.inline_recv) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "RPC-over-RDMA connection refused: memory budget");
            let _ = req.reject(&[]).await;
            return Ok(());
        }
    };
    let recv_bufs = recv_pool(&pd, nrecv, params.inline_recv)?;
    // Receives go up before the connection is accepted: the grant is backed by posted buffers.
    for (i, mr) in recv_bufs.iter().enumerate() {
        qp.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: vec![mr.sge(0, mr.len() as u32)],
        })?;
    }
    let conn = req.accept(&qp, sh.cfg.conn_params()).await?;
    sh.counters.connections.fetch_add(1, Ordering::Relaxed);
    let router = Arc::new(Router::default());
    let router_task = tokio::spawn(router.clone().run(scq.clone()));
    let link = Arc::new(Link {
        qp,
        conn,
        recv_bufs,
        router,
        router_task,
        read_sinks: SinkPool::default(),
    });
    let resp = Arc::new(Mutex::new(resp));
    {
        let (resp, sh) = (resp.clone(), sh.clone());
        *lock(&link.router.on_reply_failed) = Some(Box::new(move |xid| {
            // 5666bis §5.5.4: the connection is already gone (the Send was flushed); §5.5.3:
            // the retransmission on the next connection is answered with ERR_CHUNK.
            let _ = lock(&resp).reply_failed(xid);
            let lost = lock(&resp).take_lost();
            lock(&sh.lost).entry(peer.ip()).or_default().extend(lost);
        }));
    }
    let conn_id = sh.next_conn.fetch_add(1, Ordering::Relaxed);
    let sc = Arc::new(ServerConn {
        link: link.clone(),
        resp: resp.clone(),
        peer,
        budget,
        _recv: recv_reservation,
        back_waiters: Mutex::new(HashMap::new()),
        next_xid: AtomicU32::new(rand::random::<u32>()),
    });
    lock(&sh.conns).insert(conn_id, sc.clone());
    let ctx = Arc::new(CallContext {
        peer: Some(peer),
        local: Some(link.conn.local_addr()),
        transport: oncrpc::TransportKind::Rdma,
    });
    // Receives are handled in the provider's context (see `pump_receives`); this task waits
    // for the first failed one.
    let failed = Arc::new(tokio::sync::Notify::new());
    {
        let dead = std::sync::atomic::AtomicBool::new(false);
        let (f, weak_sc, rt) = (
            failed.clone(),
            Arc::downgrade(&sc),
            tokio::runtime::Handle::current(),
        );
        let (sh, ctx) = (sh.clone(), ctx.clone());
        let installed = rcq.set_handler(Box::new(move |c| {
            if dead.load(Ordering::Acquire) {
                return;
            }
            let Some(sc) = weak_sc.upgrade() else { return };
            if !on_server_receive(&sc, &sh, &ctx, &rt, &c) {
                dead.store(true, Ordering::Release);
                f.notify_one();
            }
        }));
        if installed {
            failed.notified().await;
        }
    }
    lock(&sh.conns).remove(&conn_id);
    lock(&sc.back_waiters).clear();
    let lost = lock(&resp).take_lost();
    if !lost.is_empty() {
        lock(&sh.lost).entry(peer.ip()).or_default().extend(lost);
    }
    link.conn.disconnect().await;
    link.router_task.abort();
    // Calls still waiting for an RDMA Read (a peer that never answered) end now, so their
    // sinks and memory go back at once rather than whenever the tasks are next polled.
    lock(&link.router.waiters).clear();
    // Replies flushed by the disconnect that the router did not get to (it may be cancelled
    // mid-way; what it did report is already recorded).
    while let Some(c) = scq.try_next() {
        link.router.note_status(c.status);
        if c.wr_id & REPLY_WR != 0
            && link.router.reply_lost(c.status)
            && let Some(f) = &*lock(&link.router.on_reply_failed)
        {
            f(c.wr_id as u32);
        }
    }
    Ok(())
}

/// One receive completion of a server connection; `false` if the connection failed.
fn on_server_receive(
    sc: &Arc<ServerConn>,
    sh: &Arc<ServerShared>,
    ctx: &Arc<CallContext>,
    rt: &tokio::runtime::Handle,
    c: &verbs::Completion,
) -> bool {
    if c.status != WcStatus::Success {
        return false;
    }
    let link = &sc.link;
    let i = c.wr_id as usize;
    let Some(mr) = link.recv_bufs.get(i) else {
        return false;
    };
    let Ok(msg) = mr.read(0, c.byte_len as usize) else {
        return false;
    };
    if link.post_recv(i).is_err() {
        return false;
    }
    // Replies lost on an earlier connection of this peer (5666bis §5.5.3).
    let lost = lock(&sh.lost).remove(&sc.peer.ip());
    let inc = {
        let mut r = lock(&sc.resp);
        if let Some(l) = lost {
            r.note_lost(l);
        }
        r.on_receive(msg)
    };
    let (sc, sh, ctx) = (sc.clone(), sh.clone(), ctx.clone());
    let mut fut = Box::pin(async move {
        handle_incoming(inc, &sc, &sh, ctx).await;
    });
    // A call that finishes at once (no RDMA Read to wait for, a service that answers without
    // waiting) is handled here, with no task to spawn and wake; the others continue in their
    // own task (polled again there, with its waker) so that calls proceed concurrently.
    // (rdma-core runs this on its completion thread: enter the runtime for what the service
    // calls, such as `spawn_blocking`.)
    let _rt = rt.enter();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        rt.spawn(fut);
    }
    true
}

/// Reserve the bytes of a reply's Sends and RDMA Writes in `budget` and tie the reservation to
/// those buffers, so it is given back when the transport has sent (and dropped) the last one.
/// `pre` is what the call reserved before its reply was built: shrunk to the reply when it
/// covers it, so that the reply never waits for memory while it is held outside the budget.
async fn hold_in_budget(
    actions: Vec<responder::Action>,
    budget: &Arc<oncrpc::ConnBudget>,
    wait: Duration,
    pre: Option<oncrpc::Reservation>,
) -> Result<Vec<responder::Action>, oncrpc::BudgetError> {
    use responder::Action;
    let total: usize = actions
        .iter()
        .map(|a| match a {
            Action::Write { data, .. } | Action::Send { data, .. } => data.len(),
            Action::Close => 0,
        })
        .sum();
    if total == 0 {
        return Ok(actions);
    }
    let held = match pre {
        Some(mut r) if r.bytes() >= total => {
            r.shrink(total);
            Arc::new(r)
        }
        other => {
            drop(other);
            Arc::new(budget.reserve(total, wait).await?)
        }
    };
    struct Held {
        data: Bytes,
        _reservation: Arc<oncrpc::Reservation>,
    }
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.data
        }
    }
    let hold = |data: Bytes| {
        Bytes::from_owner(Held {
            data,
            _reservation: held.clone(),
        })
    };
    Ok(actions
        .into_iter()
        .map(|a| match a {
            Action::Write { segment, data } => Action::Write {
                segment,
                data: hold(data),
            },
            Action::Send { data, invalidate } => Action::Send {
                data: hold(data),
                invalidate,
            },
            other => other,
        })
        .collect())
}

async fn handle_incoming(
    mut inc: Incoming,
    sc: &ServerConn,
    sh: &ServerShared,
    ctx: Arc<CallContext>,
) {
    let (link, resp) = (&*sc.link, &*sc.resp);
    let timeout = sh.cfg.rdma_timeout;
    // The reply a call may produce: one inline message and what the client offered for it,
    // reserved before the call runs, so that a client that never takes its replies cannot
    // make the server build more of them than its budget holds (capped at the connection's
    // share: a reply beyond it reserves again when it is built).
    let reply_estimate = |offered: usize| {
        (offered.saturating_add(sh.cfg.rpc.inline_send as usize)).min(sc.budget.limit())
    };
    // Memory this call holds (its Read-chunk sinks), given back when the call is done.
    let mut held = Vec::new();
    loop {
        match inc {
            Incoming::Nothing => return,
            Incoming::BackReply { xid, message } => {
                if let Some(tx) = lock(&sc.back_waiters).remove(&xid) {
                    let _ = tx.send(message);
                }
                // A backward credit came back: queued backward calls may go now.
                let a = lock(resp).poll_back();
                run_server_actions(a, link, resp, None).await;
                return;
            }
            Incoming::Respond(actions) => {
                run_server_actions(actions, link, resp, None).await;
                return;
            }
            Incoming::NeedReads(p) => {
                // The sinks are what a client's header makes the server allocate: take them
                // from the connection's budget first, waiting for memory other calls give back
                // (calls queue), and close the connection if none comes in time.
                // With them, the call's reply (one reservation: a call never holds part of
                // its memory while it waits for the rest).
                let want: usize = p
                    .reads
                    .iter()
                    .map(|c| c.segments.iter().map(|s| s.length as usize).sum::<usize>())
                    .sum::<usize>()
                    + p.frame()
                        .map_or(0, |(_, pre, post)| pre.len() + post.len() + 3)
                    + reply_estimate(p.reply_offered_len());
                match sc.budget.reserve(want, timeout).await {
                    Ok(r) => held.push(r),
                    Err(e) => {
                        tracing::warn!(peer = %sc.peer, error = %e,
                            "no memory for a call's Read chunks; closing the connection");
                        link.conn.disconnect().await;
                        return;
                    }
                }
                if let Some((_, pre, post)) = p.frame() {
                    // One chunk in the middle of the call (an NFS WRITE's data): pull it into
                    // a buffer that gets the rest of the call around it.
                    match link
                        .read_chunk_framed(&p.reads[0].segments, pre, post, timeout)
                        .await
                    {
                        Ok((message, n)) => {
                            inc = lock(resp).complete_reads_framed(p, message, n);
                            continue;
                        }
                        Err(e) => {
                            // 5666bis §5.5.3: RDMA operational errors are fatal to the
                            // connection.
                            tracing::info!(peer = %sc.peer, error = %e,
                                "RDMA Read of a Read chunk failed; closing the connection");
                            link.conn.disconnect().await;
                            return;
                        }
                    }
                }
                let mut data = Vec::with_capacity(p.reads.len());
                for c in &p.reads {
                    match link.read_chunk(&c.segments, timeout).await {
                        Ok(d) => data.push(d),
                        Err(e) => {
                            // 5666bis §5.5.3: RDMA operational errors are fatal to the
                            // connection.
                            tracing::info!(peer = %sc.peer, error = %e,
                                "RDMA Read of a Read chunk failed; closing the connection");
                            link.conn.disconnect().await;
                            return;
                        }
                    }
                }
                inc = lock(resp).complete_reads(p, data);
            }
            Incoming::Call(call) => {
                if held.is_empty() {
                    match sc
                        .budget
                        .reserve(reply_estimate(call.token.offered_len()), timeout)
                        .await
                    {
                        Ok(r) => held.push(r),
                        Err(e) => {
                            tracing::warn!(peer = %sc.peer, error = %e,
                                "no memory for a call's reply; closing the connection");
                            link.conn.disconnect().await;
                            return;
                        }
                    }
                }
                {
                    let r = lock(resp);
                    let s = r.stats();
                    sh.counters.calls.fetch_add(1, Ordering::Relaxed);
                    sh.counters
                        .max_in_progress
                        .fetch_max(s.max_in_progress, Ordering::Relaxed);
                    sh.counters
                        .over_credit
                        .store(s.over_credit, Ordering::Relaxed);
                }
                let reply = sh
                    .dispatcher
                    .dispatch(call.message, ctx.clone(), call.policy)
                    .await;
                let xid = call.token.xid;
                let actions = lock(resp).reply(call.token, reply);
                // The call's sinks are done with (what the reply still uses of them is counted
                // with the reply): what the call reserved shrinks to the reply.
                let pre = held.pop();
                held.clear();
                // A reply's buffers stay in the send queue until the peer takes them (one that
                // never reads keeps them there): they come out of the connection's budget, and
                // are given back when the transport drops the last of them.
                let actions = match hold_in_budget(actions, &sc.budget, timeout, pre).await {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(peer = %sc.peer, error = %e,
                            "no memory for a reply; closing the connection");
                        link.conn.disconnect().await;
                        return;
                    }
                };
                run_server_actions(actions, link, resp, Some(xid)).await;
                let lost = lock(resp).take_lost();
                if !lost.is_empty() {
                    lock(&sh.lost).entry(sc.peer.ip()).or_default().extend(lost);
                }
                return;
            }
        }
    }
}

async fn run_server_actions(
    actions: Vec<responder::Action>,
    link: &Link,
    resp: &Mutex<Responder>,
    xid: Option<u32>,
) {
    for a in actions {
        let closing = matches!(a, responder::Action::Close);
        let r = match a {
            responder::Action::Write { segment, data } => link.write(segment, data),
            // A reply posted to a QP already in error would only be flushed, after the
            // connection's receive handler has stopped listening for it: count it failed now.
            responder::Action::Send { .. } if link.qp.state() == verbs::QpState::Error => {
                Err(verbs::VerbsError::Disconnected)
            }
            responder::Action::Send { data, invalidate } => match xid {
                Some(x) => link.post_reply(data, invalidate, x),
                None => link.send(data, invalidate).await,
            },
            responder::Action::Close => Err(verbs::VerbsError::Disconnected),
        };
        if let Err(e) = r {
            tracing::info!(error = %e, xid = ?xid, "reply could not be sent; closing the connection");
            // 5666bis §5.5.4: a reply that cannot be sent closes the connection. §5.5.3: the
            // XID is answered with RDMA_ERR_CHUNK after a reconnect only when an RDMA
            // operational error broke the connection (see `Router::reply_lost`).
            if let Some(x) = xid
                && (closing || link.router.op_error.load(Ordering::Relaxed))
            {
                let _ = lock(resp).reply_failed(x);
            }
            link.conn.disconnect().await;
            return;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Client
// ------------------------------------------------------------------------------------------

struct ClientState {
    req: Requester,
    reg: VerbsRegistrar,
    /// The server's address, for the memory of version-1-only servers.
    peer: SocketAddr,
    waiters: crate::engine::XidMap<oneshot::Sender<Result<Bytes, RpcError>>>,
    closed: bool,
}

struct ClientInner {
    addr: SocketAddr,
    cfg: TransportConfig,
    state: Mutex<ClientState>,
    /// Calls whose callers found `state` locked; submitted by its holder (see `submit_call`).
    inbox: Mutex<Vec<Work>>,
    link: Mutex<Arc<Link>>,
    next_xid: AtomicU32,
    back: Option<Dispatcher>,
    reconnects: AtomicU64,
    /// Programs whose Upper-Layer Binding makes some item DDP-eligible: only their calls
    /// are encoded with reduction (5666bis §8.1). Calls of programs without a binding are
    /// refused by the Requester (5666bis §8).
    reducing: HashSet<u32>,
    /// The bindings by program, for the short Reply chunk retry policy (RFC 8267 §3.1).
    ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>>,
    /// Calls sent again with a larger Reply chunk after RDMA_ERR_CHUNK.
    short_reply_retries: AtomicU64,
    /// Where backward calls run: replies are handled in the provider's context, which may be
    /// a thread outside the runtime (rdma-core's completion thread).
    rt: tokio::runtime::Handle,
}

impl ClientInner {
    fn link(&self) -> Arc<Link> {
        lock(&self.link).clone()
    }
}

/// A connected queue pair for a client, with its receive buffers posted.
async fn open_client_link(
    addr: SocketAddr,
    config: &TransportConfig,
    nrecv: usize,
) -> Result<(Arc<Link>, CompletionQueue, Params, ProtectionDomain), DriverError> {
    let dev = config.device();
    let cfg = &config.rpc;
    let pd = dev.alloc_pd();
    let scq = dev.create_cq();
    let rcq = dev.create_cq();
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let recv_bufs = recv_pool(
        &pd,
        nrecv,
        // 5666bis §4.3.3: receivers support at least 1024-byte messages.
        cfg.inline_recv.max(crate::privdata::DEFAULT_INLINE) as usize,
    )?;
    // 5666bis §7.2.2.1: receives for replies and for backward calls go up before connecting.
    for (i, mr) in recv_bufs.iter().enumerate() {
        qp.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: vec![mr.sge(0, mr.len() as u32)],
        })?;
    }
    let conn = dev.connect(&qp, addr, config.conn_params()).await?;
    let params: Params = cfg
        .negotiate(PrivateData::decode(conn.peer_private_data()))
        .into();
    let router = Arc::new(Router::default());
    let router_task = tokio::spawn(router.clone().run(scq));
    let link = Arc::new(Link {
        qp,
        conn,
        recv_bufs,
        router,
        router_task,
        read_sinks: SinkPool::default(),
    });
    Ok((link, rcq, params, pd))
}

/// An RPC-over-RDMA client (one connection).
pub struct RdmaClient {
    inner: Arc<ClientInner>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RdmaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaClient")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for RdmaClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RdmaClient {
    /// Connect to an RPC-over-RDMA server. `ulbs` are the Upper-Layer Bindings of the
    /// programs this client calls: calls of any other program (or of a version its binding
    /// does not cover) fail with [`RpcError::NoBinding`] without being sent (5666bis §8).
    /// [`crate::ulb::InlineBinding`] serves programs with no DDP-eligible item.
    pub async fn connect(
        addr: SocketAddr,
        config: TransportConfig,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
    ) -> Result<Self, DriverError> {
        Self::connect_with(addr, config, ulbs, None).await
    }

    /// [`RdmaClient::connect`] with an optional backward-direction service (RFC 8167
    /// callbacks; backward-direction programs need no binding, 5666bis §7.4).
    pub async fn connect_with(
        addr: SocketAddr,
        config: TransportConfig,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
        backchannel: Option<Dispatcher>,
    ) -> Result<Self, DriverError> {
        let cfg = config.rpc.clone();
        let reducing: HashSet<u32> = ulbs
            .iter()
            .filter(|u| u.has_ddp_items())
            .map(|u| u.program())
            .collect();
        let ulbs: Arc<HashMap<u32, Arc<dyn UpperLayerBinding>>> =
            Arc::new(ulbs.into_iter().map(|u| (u.program(), u)).collect());
        let mut req = Requester::new(cfg.clone(), ulbs.clone());
        // cel-05 §8.2: a server that refused version 2 before is not probed again.
        req.set_peer_v1_only(lock(version_memory()).is_v1_only(addr.ip(), addr.port()));
        let (link, rcq, params, pd) =
            open_client_link(addr, &config, req.receives_needed()).await?;
        let mut state = ClientState {
            req,
            peer: addr,
            reg: VerbsRegistrar::new(pd),
            waiters: Default::default(),
            closed: false,
        };
        let first = {
            let ClientState { req, reg, .. } = &mut state;
            req.on_connect(params, reg)
        };
        log_version(addr, &state.req);
        debug_assert!(first.is_empty());
        let inner = Arc::new(ClientInner {
            addr,
            cfg: config,
            state: Mutex::new(state),
            inbox: Mutex::new(Vec::new()),
            link: Mutex::new(link),
            next_xid: AtomicU32::new(rand::random::<u32>() | 1),
            back: backchannel,
            reconnects: AtomicU64::new(0),
            reducing,
            ulbs,
            short_reply_retries: AtomicU64::new(0),
            rt: tokio::runtime::Handle::current(),
        });
        let task = tokio::spawn(client_recv_loop(inner.clone(), rcq));
        Ok(RdmaClient { inner, task })
    }

    /// Requester counters (credits, message forms).
    pub fn stats(&self) -> requester::RequesterStats {
        with_state(&self.inner, |st| st.req.stats().clone())
    }

    /// The RPC-over-RDMA version the connection speaks now (cel-05 §8: version 2 once the
    /// server answered the probe in version 2, version 1 after a fallback).
    pub fn rpcrdma_version(&self) -> crate::version::Version {
        with_state(&self.inner, |st| st.req.version())
    }

    /// Reconnections so far.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Drop the connection, as a client that loses it would: every registration is fenced,
    /// the client reconnects and retransmits its outstanding calls with their XIDs. For
    /// fault injection.
    pub async fn disconnect(&self) {
        let link = self.inner.link();
        link.conn.disconnect().await;
    }

    /// Registrations still alive (all fenced once calls complete).
    pub fn live_registrations(&self) -> usize {
        with_state(&self.inner, |st| st.reg.regions.len())
    }
}

/// A call waiting in [`ClientInner::inbox`] for whoever holds the state lock to submit it.
struct Submission {
    call: OutCall,
    done: oneshot::Sender<Result<Bytes, RpcError>>,
}

/// Work for the requester, queued in [`ClientInner::inbox`] in arrival order.
enum Work {
    Submit(Submission),
    Receive(Bytes, Option<u32>),
}

/// What the requester asked for, done once the state lock is released (in this order).
enum Post {
    Send(Bytes),
    Done(
        oneshot::Sender<Result<Bytes, RpcError>>,
        Result<Bytes, RpcError>,
    ),
    BackCall(u32, Bytes),
    Close,
}

fn absorb(st: &mut ClientState, actions: Vec<requester::Action>, posts: &mut Vec<Post>) {
    for a in actions {
        match a {
            requester::Action::Send { data, .. } => posts.push(Post::Send(data)),
            requester::Action::Complete { xid, result } => {
                if let Some(tx) = st.waiters.remove(&xid) {
                    posts.push(Post::Done(tx, result));
                }
            }
            requester::Action::BackCall { xid, message } => {
                posts.push(Post::BackCall(xid, message));
            }
            requester::Action::Close => posts.push(Post::Close),
        }
    }
}

fn work_locked(st: &mut ClientState, w: Work, posts: &mut Vec<Post>) {
    match w {
        Work::Submit(sub) => submit_locked(st, sub, posts),
        Work::Receive(msg, invalidated) => {
            let ClientState { req, reg, .. } = st;
            let actions = req.on_receive(msg, invalidated, reg);
            if req.learned_v1_only() {
                lock(version_memory()).remember_v1_only(st.peer.ip(), st.peer.port());
            }
            absorb(st, actions, posts);
        }
    }
}

fn submit_locked(st: &mut ClientState, sub: Submission, posts: &mut Vec<Post>) {
    if st.closed {
        posts.push(Post::Done(sub.done, Err(RpcError::Closed)));
        return;
    }
    let xid = sub.call.xid;
    st.waiters.insert(xid, sub.done);
    let ClientState { req, reg, .. } = st;
    let actions = req.submit(sub.call, reg);
    absorb(st, actions, posts);
}

/// Hand the requester a call to submit or a received message. Work goes through the inbox,
/// in order, and whoever holds the state lock does it: a caller or the receive handler that
/// finds the lock taken leaves its work to the holder instead of sleeping on the lock. With
/// many calls in flight, the thread handling a batch of replies submits the calls they
/// release and posts them from its own context.
fn enqueue(inner: &Arc<ClientInner>, w: Work) {
    lock(&inner.inbox).push(w);
    settle_inbox(inner);
}

/// Apply `actions` of the requester (made under `st`): submit what waits in the inbox, release
/// the lock, then post, complete and spawn what they ask for, in order.
fn apply_locked<'a>(
    inner: &'a Arc<ClientInner>,
    mut st: MutexGuard<'a, ClientState>,
    actions: Vec<requester::Action>,
) {
    let mut posts = Vec::new();
    absorb(&mut st, actions, &mut posts);
    release_state(inner, st, posts);
}

fn release_state<'a>(
    inner: &'a Arc<ClientInner>,
    mut st: MutexGuard<'a, ClientState>,
    mut posts: Vec<Post>,
) {
    loop {
        let waiting = std::mem::take(&mut *lock(&inner.inbox));
        for w in waiting {
            work_locked(&mut st, w, &mut posts);
        }
        drop(st);
        perform(inner, std::mem::take(&mut posts));
        // A submission pushed after the drain above, by a caller that found the lock still
        // held: it is this thread's to submit unless someone else holds the lock now (who will
        // then do it when they release it).
        if lock(&inner.inbox).is_empty() {
            return;
        }
        st = match inner.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
    }
}

/// Run `f` on the requester state, then settle the inbox: work queued while `f` held the lock
/// is done here (or by whoever holds the lock next). Every use of the state lock ends with
/// `release_state` or goes through this, so nothing is left in the inbox.
fn with_state<R>(inner: &Arc<ClientInner>, f: impl FnOnce(&mut ClientState) -> R) -> R {
    let r = f(&mut lock(&inner.state));
    settle_inbox(inner);
    r
}

/// Submit what waits in the inbox if the state lock is free.
fn settle_inbox(inner: &Arc<ClientInner>) {
    if lock(&inner.inbox).is_empty() {
        return;
    }
    let st = match inner.state.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    release_state(inner, st, Vec::new());
}

fn perform(inner: &Arc<ClientInner>, posts: Vec<Post>) {
    for p in posts {
        match p {
            Post::Send(data) => {
                // Posted here, in order, from the caller's (or the receive handler's) context:
                // no task hop before the call is on the wire. Unsignaled: nothing waits for
                // the completion, since a Send that fails means the connection is gone, which
                // the receive handler sees (the flush of its posted Receives) and answers by
                // reconnecting.
                let _ = inner.link().post_send_unsignaled(data);
            }
            Post::Done(tx, result) => {
                let _ = tx.send(result);
            }
            Post::BackCall(xid, message) => {
                let inner2 = inner.clone();
                inner.rt.spawn(async move {
                    let Some(d) = &inner2.back else { return };
                    let ctx = Arc::new(CallContext {
                        peer: Some(inner2.addr),
                        local: Some(inner2.link().conn.local_addr()),
                        transport: oncrpc::TransportKind::Rdma,
                    });
                    // RFC 8167 §5: nothing is reduced in the backward direction.
                    if let Some(r) = d.dispatch(message, ctx, DdpPolicy::Inline).await {
                        let mut st = lock(&inner2.state);
                        let a = st.req.back_reply(xid, r.message.to_bytes());
                        apply_locked(&inner2, st, a.into_iter().collect());
                    }
                });
            }
            Post::Close => {
                // 5666bis §5.5.4: memory that could not be invalidated is fenced by closing the
                // connection, before the RPC completes: the QP is in the error state when
                // `abort` returns, and the completion that follows this action comes after.
                inner.link().conn.abort();
                fail_all(inner, "memory could not be fenced");
            }
        }
    }
}

fn fail_all(inner: &Arc<ClientInner>, why: &str) {
    // Calls still in the inbox are failed as closed when `with_state` settles it.
    let waiters = with_state(inner, |st| {
        st.closed = true;
        let ClientState { req, reg, .. } = &mut *st;
        let _ = req.on_disconnect(reg);
        std::mem::take(&mut st.waiters)
    });
    for (_, tx) in waiters {
        let _ = tx.send(Err(RpcError::Transport(why.to_string())));
    }
}

async fn client_recv_loop(inner: Arc<ClientInner>, mut rcq: CompletionQueue) {
    loop {
        pump_receives(&inner, &rcq).await;
        // The connection is gone: fence every registration, then reconnect and retransmit
        // the outstanding calls with their XIDs (5666bis §7.2.2.1: fresh receive buffers).
        let old = inner.link();
        with_state(&inner, |st| {
            let ClientState { req, reg, .. } = st;
            let _ = req.on_disconnect(reg);
        });
        old.conn.disconnect().await;
        drop(old);
        let mut next = None;
        for attempt in 0..inner.cfg.reconnect_attempts {
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(6))).await;
            let nrecv = with_state(&inner, |st| st.req.receives_needed());
            if let Ok(x) = open_client_link(inner.addr, &inner.cfg, nrecv).await {
                next = Some(x);
                break;
            }
        }
        let Some((link, cq, params, pd)) = next else {
            fail_all(&inner, "connection lost");
            return;
        };
        inner.reconnects.fetch_add(1, Ordering::Relaxed);
        *lock(&inner.link) = link;
        rcq = cq;
        let mut st = lock(&inner.state);
        st.reg = VerbsRegistrar::new(pd);
        let v1_only = lock(version_memory()).is_v1_only(inner.addr.ip(), inner.addr.port());
        let ClientState { req, reg, .. } = &mut *st;
        req.set_peer_v1_only(v1_only);
        let actions = req.on_connect(params, reg);
        log_version(inner.addr, req);
        apply_locked(&inner, st, actions);
    }
}

/// Handle receive completions until the connection fails.
///
/// They are handled in the provider's context ([`CompletionQueue::set_handler`]): a batch of
/// replies read from the connection completes its calls with no task to wake in between, as
/// Linux's reply handler runs from the receive completion. This task only waits for the
/// first failed completion (a flush: the connection is gone).
async fn pump_receives(inner: &Arc<ClientInner>, rcq: &CompletionQueue) {
    let failed = Arc::new(tokio::sync::Notify::new());
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (weak_inner, weak_link) = (Arc::downgrade(inner), Arc::downgrade(&inner.link()));
    let (f, d) = (failed.clone(), dead.clone());
    let installed = rcq.set_handler(Box::new(move |c| {
        if d.load(Ordering::Acquire) {
            return;
        }
        // A link being dropped (replaced after a reconnect) flushes into a handler that has
        // nothing left to do.
        let (Some(inner), Some(link)) = (weak_inner.upgrade(), weak_link.upgrade()) else {
            return;
        };
        if !on_client_receive(&inner, &link, &c) {
            d.store(true, Ordering::Release);
            f.notify_one();
        }
    }));
    if installed {
        failed.notified().await;
    }
}

/// One receive completion of the client's connection; `false` if the connection failed.
fn on_client_receive(inner: &Arc<ClientInner>, link: &Link, c: &verbs::Completion) -> bool {
    if c.status != WcStatus::Success {
        return false;
    }
    let i = c.wr_id as usize;
    let Some(mr) = link.recv_bufs.get(i) else {
        return false;
    };
    let Ok(msg) = mr.read(0, c.byte_len as usize) else {
        return false;
    };
    if link.post_recv(i).is_err() {
        return false;
    }
    enqueue(inner, Work::Receive(msg, c.invalidated_rkey));
    true
}

/// Cancels a call whose future is dropped before it completes (the caller's own timeout, a
/// `select!` that took another branch, an aborted task).
///
/// 5666bis §5.4.1 (RFC 8166 §4.3.1): the memory of a canceled RPC must be fenced from the
/// responder, which "cannot know that the requester is no longer waiting for a reply, and
/// might proceed to read or even update memory". [`Requester::cancel`] takes the XID out of
/// the pending table (a late reply is discarded and counted in `late_replies`) and
/// invalidates every region of the call through the [`VerbsRegistrar`] before `drop`
/// returns.
struct CallGuard<'a> {
    inner: &'a Arc<ClientInner>,
    xid: u32,
    armed: bool,
}

impl CallGuard<'_> {
    fn cancel(&mut self, err: RpcError) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        // Not submitted yet (still in the inbox): nothing of it is registered.
        {
            let mut inbox = lock(&self.inner.inbox);
            let before = inbox.len();
            inbox.retain(|w| !matches!(w, Work::Submit(s) if s.call.xid == self.xid));
            if inbox.len() != before {
                return;
            }
        }
        let mut st = lock(&self.inner.state);
        let ClientState { req, reg, .. } = &mut *st;
        let actions = req.cancel(self.xid, err, reg);
        // Only `Complete` (whose waiter, if any, is dropped or about to be) and `Close` (an
        // invalidation failed: 5666bis §5.5.4, fence by closing) come back from a cancel, with
        // whatever waited in the inbox; none of it needs to run in a task, so this is safe in
        // `drop`.
        apply_locked(self.inner, st, actions);
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.cancel(RpcError::Transport("call dropped before its reply".into()));
    }
}

impl RpcTransport for RdmaClient {
    fn call(&self, req: CallRequest) -> BoxFuture<'_, Result<Bytes, RpcError>> {
        Box::pin(async move {
            let mut req = req;
            let mut tries = 0;
            loop {
                let r = self.call_once(&req).await;
                let Err(RpcError::RdmaErrChunk) = r else {
                    return r;
                };
                // RFC 8267 §3.1: a reply that did not fit may be asked for again, as a new
                // transaction (a new XID, so that no cached reply holding the error answers
                // it) with a larger Reply chunk, for the operations the binding allows, and
                // not indefinitely (ERR_CHUNK has other causes).
                tries += 1;
                let Some(larger) = self.short_reply_retry_size(&req, tries) else {
                    return r;
                };
                self.inner
                    .short_reply_retries
                    .fetch_add(1, Ordering::Relaxed);
                req.reply.max_len = Some(larger);
            }
        })
    }

    fn describe(&self) -> String {
        format!("rdma://{}", self.inner.addr)
    }
}

impl RdmaClient {
    /// Calls sent again with a larger Reply chunk after RDMA_ERR_CHUNK (RFC 8267 §3.1).
    pub fn short_reply_retries(&self) -> u64 {
        self.inner.short_reply_retries.load(Ordering::Relaxed)
    }

    /// The reply size to announce on short Reply chunk retry number `attempt` of `req`, or
    /// `None` when its binding allows no (more) retries (RFC 8267 §3.1).
    fn short_reply_retry_size(&self, req: &CallRequest, attempt: u32) -> Option<usize> {
        let ulb = self.inner.ulbs.get(&req.prog)?;
        let mut enc = Encoder::new();
        (req.args)(&mut enc);
        let args = enc.finish().to_bytes();
        let previous = req
            .reply
            .max_len
            .or_else(|| ulb.max_reply_size(req.vers, req.proc_, &args))
            .unwrap_or(self.inner.cfg.rpc.default_reply_chunk);
        ulb.short_reply_retry(req.vers, req.proc_, &args, attempt, previous)
            .filter(|&n| n > previous)
    }

    /// One transmission of a call (a short Reply chunk retry makes another, with a new XID).
    async fn call_once(&self, req: &CallRequest) -> Result<Bytes, RpcError> {
        let inner = &self.inner;
        let xid = inner.next_xid.fetch_add(1, Ordering::Relaxed);
        // Nothing is reduced under RPCSEC_GSS integrity or privacy (5666bis §10.2.2.3), nor
        // for a program whose binding makes nothing DDP-eligible (5666bis §8.1: only items
        // a binding marks DDP-eligible may be reduced). Long messages still use chunks.
        // Calls of programs without a binding are refused by `Requester::submit`.
        let no_reduction = Credential::parse(&req.cred).is_ok_and(|c| c.forbids_reduction())
            || !inner.reducing.contains(&req.prog);
        let cfg = &inner.cfg.rpc;
        let policy = if no_reduction {
            DdpPolicy::Inline
        } else {
            DdpPolicy::Reduce {
                min_len: cfg.ddp_min,
                max_items: cfg.max_read_chunks,
            }
        };
        let head = req.header(xid);
        let mut enc = Encoder::new().with_policy(policy);
        head.encode(&mut enc);
        (req.args)(&mut enc);
        let timeout = req.timeout.unwrap_or(inner.cfg.call_timeout);
        let call = OutCall {
            xid,
            prog: req.prog,
            vers: req.vers,
            proc_: req.proc_,
            message: enc.finish(),
            reply: req.reply.clone(),
            no_reduction,
            deadline: Some(Instant::now() + timeout),
        };
        let (tx, rx) = oneshot::channel();
        // From here on the call may hold registered memory: if this future is dropped
        // before the call completes, the guard cancels it.
        let mut guard = CallGuard {
            inner,
            xid,
            armed: true,
        };
        enqueue(inner, Work::Submit(Submission { call, done: tx }));
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => {
                // The engine completed it, after fencing its memory.
                guard.armed = false;
                r
            }
            Ok(Err(_)) => {
                // The waiter went away without a result: make sure nothing stays registered.
                guard.cancel(RpcError::Closed);
                Err(RpcError::Closed)
            }
            Err(_) => {
                // 5666bis §5.4.1: fence the call's memory before reporting the timeout.
                guard.cancel(RpcError::Timeout);
                Err(RpcError::Timeout)
            }
        }
    }
}

/// Connect to `rdma://host:port` (RPC-over-RDMA over soft-iWARP, or the device in `config`;
/// `ulbs` as in [`RdmaClient::connect`]) or `tcp://host:port` (ONC RPC over TCP with record
/// marking, `oncrpc::TcpClient`; `config` and `ulbs` are not used).
pub async fn connect(
    url: &str,
    config: TransportConfig,
    ulbs: Vec<Arc<dyn UpperLayerBinding>>,
) -> Result<Arc<dyn RpcTransport>, DriverError> {
    let (tcp, rest) = if let Some(r) = url.strip_prefix("rdma://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("tcp://") {
        (true, r)
    } else {
        return Err(DriverError::Scheme(url.to_string()));
    };
    let addr = tokio::net::lookup_host(rest)
        .await
        .map_err(|e| DriverError::Address(e.to_string()))?
        .next()
        .ok_or_else(|| DriverError::Address(rest.to_string()))?;
    if tcp {
        let c = oncrpc::TcpClient::connect(addr).await?;
        return Ok(Arc::new(c));
    }
    Ok(Arc::new(RdmaClient::connect(addr, config, ulbs).await?))
}
