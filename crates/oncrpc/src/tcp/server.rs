//! The TCP server: accept loop, per-connection reader, per-call tasks and a per-connection
//! writer that sends replies in completion order.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use xdr::DdpPolicy;

use super::back::{TcpBack, TcpBackChannel};
use super::conn_memory::{ConnMemory, peer_gone};
use super::{READ_CHUNK, reserve_for_read};
use crate::backchannel::BackHandle;
use crate::budget::{MemoryBudget, Reservation};
use crate::record::{DEFAULT_MAX_RECORD, MAX_FRAGMENT_LEN, RecordDecoder, frame, write_all_parts};
use crate::service::{CallContext, CallHints, Dispatcher, ReplyMessage, TransportKind};

/// Server limits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Largest call record accepted; a larger one closes the connection.
    pub max_record: usize,
    /// Calls executing or waiting to be written, per connection. When reached, the connection's
    /// reader stops reading until a reply has been written (TCP flow control then pushes back
    /// on the client).
    pub max_in_flight: usize,
    /// Reply bytes waiting to be written, per connection, beyond which the connection's
    /// reader stops reading new calls until the peer has taken some of them. Calls still
    /// executing count as the largest reply the connection has produced so far, so once one
    /// reply was seen a client that never reads its replies cannot make the server hold much
    /// more than this (one reply over); before any reply, only `max_in_flight` bounds the
    /// first burst.
    pub max_queued_reply_bytes: usize,
    /// The server's memory budget, shared with its other transports; `None`: connections are
    /// bounded by the limits above only. With one, each connection takes a share
    /// ([`ConnBudget`]) and reserves from it before it holds what its peer sends or asks
    /// for: its receive buffer (64 KiB at least, and the whole of a larger record
    /// before its bytes are read), each call's record while the call runs, and each call's
    /// reply from before the call runs until its last byte is written. A connection that
    /// cannot get its receive buffer is refused; a reservation that must wait stops the
    /// connection's reader (TCP flow control then holds the peer).
    pub budget: Option<Arc<MemoryBudget>>,
    /// The largest reply a call can have, read from its record (a program's own bound, such
    /// as an NFS READ's count); when it has none, [`ServerConfig::reply_estimate`].
    pub reply_bound: Option<ReplyBound>,
    /// The reply size reserved for a call before it runs when `reply_bound` gives none (or
    /// the connection's largest reply so far, when bigger). A reply that turns out larger
    /// reserves the difference before it is queued.
    pub reply_estimate: usize,
    /// How long a peer may leave the server's replies untaken (no byte of them accepted by
    /// the socket) before its connection is closed and its memory given back; `None`: for as
    /// long as it likes.
    pub send_timeout: Option<Duration>,
}

/// A program-specific bound on a call's reply size, from the call's whole record (RPC header
/// included); `None` when it has none for this call.
#[derive(Clone)]
pub struct ReplyBound(pub Arc<ReplyBoundFn>);

/// The function behind a [`ReplyBound`].
pub type ReplyBoundFn = dyn Fn(&Bytes) -> Option<usize> + Send + Sync;

impl std::fmt::Debug for ReplyBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyBound(..)")
    }
}

/// Default of [`ServerConfig::max_queued_reply_bytes`]: eight 1 MiB NFS READ replies.
pub const DEFAULT_MAX_QUEUED_REPLY_BYTES: usize = 8 << 20;

/// Default of [`ServerConfig::reply_estimate`].
pub const DEFAULT_REPLY_ESTIMATE: usize = 64 << 10;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_record: DEFAULT_MAX_RECORD,
            max_in_flight: 128,
            max_queued_reply_bytes: DEFAULT_MAX_QUEUED_REPLY_BYTES,
            budget: None,
            reply_bound: None,
            reply_estimate: DEFAULT_REPLY_ESTIMATE,
            send_timeout: None,
        }
    }
}

impl ServerConfig {
    /// Set the maximum record size.
    pub fn with_max_record(mut self, n: usize) -> Self {
        self.max_record = n;
        self
    }

    /// Set the per-connection in-flight limit (at least 1).
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Set the per-connection bound on reply bytes waiting to be written (at least 1).
    pub fn with_max_queued_reply_bytes(mut self, n: usize) -> Self {
        self.max_queued_reply_bytes = n.max(1);
        self
    }

    /// Draw every connection's memory from `budget` ([`ServerConfig::budget`]).
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Bound each call's reply with `bound` before it runs ([`ServerConfig::reply_bound`]),
    /// `estimate` bytes when it gives none.
    pub fn with_reply_bound(
        mut self,
        bound: impl Fn(&Bytes) -> Option<usize> + Send + Sync + 'static,
        estimate: usize,
    ) -> Self {
        self.reply_bound = Some(ReplyBound(Arc::new(bound)));
        self.reply_estimate = estimate;
        self
    }

    /// Close connections whose peer takes none of its replies for `t`.
    pub fn with_send_timeout(mut self, t: Duration) -> Self {
        self.send_timeout = Some(t);
        self
    }
}

/// What a server's connections hold for their peers, over all connections.
#[derive(Debug, Default)]
pub struct TcpServerStats {
    queued_reply_bytes: AtomicUsize,
    peak_queued_reply_bytes: AtomicUsize,
    read_pauses: AtomicU64,
    /// The peers of the open connections, by connection number.
    peers: Mutex<BTreeMap<u64, SocketAddr>>,
    next_conn: AtomicU64,
}

impl TcpServerStats {
    /// Reply bytes produced and not yet written to their sockets, now.
    pub fn queued_reply_bytes(&self) -> usize {
        self.queued_reply_bytes.load(Ordering::Relaxed)
    }

    /// The most reply bytes ever waiting at once.
    pub fn peak_queued_reply_bytes(&self) -> usize {
        self.peak_queued_reply_bytes.load(Ordering::Relaxed)
    }

    /// Times a connection's reader stopped reading calls because its replies were not drained.
    pub fn read_pauses(&self) -> u64 {
        self.read_pauses.load(Ordering::Relaxed)
    }

    /// The peers of the connections open now, oldest first.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect()
    }

    /// Connections accepted since the server started.
    pub fn accepted(&self) -> u64 {
        self.next_conn.load(Ordering::Relaxed)
    }

    /// Count a connection from `peer` as open until the returned guard is dropped.
    fn open(self: &Arc<Self>, peer: SocketAddr) -> OpenConn {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, peer);
        OpenConn {
            stats: self.clone(),
            id,
        }
    }
}

/// An open connection in [`TcpServerStats::peers`].
struct OpenConn {
    stats: Arc<TcpServerStats>,
    id: u64,
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.stats
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// One connection's replies waiting to be written.
#[derive(Debug)]
struct ReplyQueue {
    bytes: AtomicUsize,
    /// Calls admitted whose reply is not queued yet.
    executing: AtomicUsize,
    /// The largest reply of this connection so far.
    largest: AtomicUsize,
    drained: Notify,
    server: Arc<TcpServerStats>,
}

impl ReplyQueue {
    /// A call's reply (of `n` bytes) is queued; `None`: the call has none.
    fn done(self: &Arc<Self>, n: Option<usize>) -> Option<Queued> {
        let q = n.map(|n| self.add(n));
        self.executing.fetch_sub(1, Ordering::AcqRel);
        if q.is_none() {
            self.drained.notify_waiters();
        }
        q
    }

    fn add(self: &Arc<Self>, n: usize) -> Queued {
        self.largest.fetch_max(n, Ordering::Relaxed);
        self.bytes.fetch_add(n, Ordering::AcqRel);
        let total = self
            .server
            .queued_reply_bytes
            .fetch_add(n, Ordering::AcqRel)
            + n;
        self.server
            .peak_queued_reply_bytes
            .fetch_max(total, Ordering::Relaxed);
        Queued {
            queue: self.clone(),
            bytes: n,
        }
    }

    /// Wait until the replies queued and those the executing calls will add (estimated at the
    /// largest so far) are under `limit`, then count one more executing call.
    async fn admit(&self, limit: usize) {
        let mut paused = false;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let executing = self.executing.load(Ordering::Acquire);
            let expected = self
                .bytes
                .load(Ordering::Acquire)
                .saturating_add(executing.saturating_mul(self.largest.load(Ordering::Relaxed)));
            if expected < limit || (executing == 0 && self.bytes.load(Ordering::Acquire) == 0) {
                self.executing.fetch_add(1, Ordering::AcqRel);
                return;
            }
            if !paused {
                paused = true;
                self.server.read_pauses.fetch_add(1, Ordering::Relaxed);
            }
            drained.await;
        }
    }
}

/// Reply bytes counted in a [`ReplyQueue`] until written (or dropped with the connection).
#[derive(Debug)]
struct Queued {
    queue: Arc<ReplyQueue>,
    bytes: usize,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.queue
            .server
            .queued_reply_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        self.queue.drained.notify_waiters();
    }
}

/// A running TCP server. Dropping it stops accepting and lets open connections finish in the
/// background; [`TcpServer::shutdown`] does the same and waits for them.
#[derive(Debug)]
pub struct TcpServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    /// Bumped by [`TcpServer::disconnect_all`].
    cut: watch::Sender<u64>,
    stats: Arc<TcpServerStats>,
    task: JoinHandle<()>,
}

impl TcpServer {
    /// Bind `addr` and start serving `dispatcher` on the current tokio runtime.
    pub async fn bind(
        addr: impl ToSocketAddrs,
        dispatcher: Arc<Dispatcher>,
        config: ServerConfig,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Self::start(listener, dispatcher, config)
    }

    /// Start serving on an already bound listener (must be called within a tokio runtime).
    pub fn start(
        listener: TcpListener,
        dispatcher: Arc<Dispatcher>,
        config: ServerConfig,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let (cut, cut_rx) = watch::channel(0);
        let stats = Arc::new(TcpServerStats::default());
        let task = tokio::spawn(accept_loop(
            listener,
            dispatcher,
            config,
            rx,
            cut_rx,
            stats.clone(),
        ));
        Ok(TcpServer {
            local_addr,
            shutdown,
            cut,
            stats,
            task,
        })
    }

    /// Close every open connection at once, as a server that loses them would: replies not
    /// yet written are lost and calls still executing finish unanswered. Clients reconnect
    /// and retransmit; the listener keeps accepting. For fault injection.
    pub fn disconnect_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the connections hold for their peers (replies not yet written).
    pub fn stats(&self) -> &Arc<TcpServerStats> {
        &self.stats
    }

    /// Graceful shutdown: stop accepting, stop reading new calls, let calls already read finish
    /// and their replies be written, close every connection, and wait for all of it.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Serve `dispatcher` on `listener` until an unrecoverable error (runs forever otherwise).
/// For a server that can be stopped, use [`TcpServer`].
pub async fn serve_tcp(listener: TcpListener, dispatcher: Arc<Dispatcher>) -> io::Result<()> {
    let (_keep, rx) = watch::channel(false);
    let (_cut, cut_rx) = watch::channel(0);
    accept_loop(
        listener,
        dispatcher,
        ServerConfig::default(),
        rx,
        cut_rx,
        Arc::new(TcpServerStats::default()),
    )
    .await;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    dispatcher: Arc<Dispatcher>,
    config: ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    cut: watch::Receiver<u64>,
    stats: Arc<TcpServerStats>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            // A send of `true` or the sender going away both mean: stop.
            _ = shutdown.changed() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "RPC/TCP connection accepted");
                    let d = dispatcher.clone();
                    let c = config.clone();
                    let s = shutdown.clone();
                    let mut k = cut.clone();
                    k.mark_unchanged();
                    let st = stats.clone();
                    let open = stats.open(peer);
                    conns.spawn(async move {
                        let _open = open;
                        if let Err(e) = serve_conn(stream, d, &c, s, Some(k), st).await {
                            tracing::debug!(%peer, error = %e, "RPC/TCP connection ended");
                        }
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// Serve RPC calls on one accepted connection until the peer closes it, a framing error occurs,
/// or `shutdown` fires. Calls run concurrently (one task each, at most
/// [`ServerConfig::max_in_flight`]); replies are written in completion order.
pub async fn serve_connection(
    stream: TcpStream,
    dispatcher: Arc<Dispatcher>,
    config: &ServerConfig,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let stats = Arc::new(TcpServerStats::default());
    serve_conn(stream, dispatcher, config, shutdown, None, stats).await
}

/// Resolves when `cut` changes ([`TcpServer::disconnect_all`]); never without one.
async fn cut_fired(cut: &mut Option<watch::Receiver<u64>>) {
    if let Some(c) = cut
        && c.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Why the reader stopped waiting.
enum Stop {
    /// Graceful shutdown or the peer's end: let the calls read so far finish.
    Drain,
    /// [`TcpServer::disconnect_all`]: drop everything at once.
    Cut,
}

async fn serve_conn(
    stream: TcpStream,
    dispatcher: Arc<Dispatcher>,
    config: &ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    mut cut: Option<watch::Receiver<u64>>,
    stats: Arc<TcpServerStats>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    // Backward calls (NFSv4.1 callbacks) go out through the same writer as the replies.
    let (calls_tx, calls_rx) = mpsc::unbounded_channel();
    let back = TcpBack::new(calls_tx);
    let context = Arc::new(CallContext {
        peer: stream.peer_addr().ok(),
        local: stream.local_addr().ok(),
        transport: TransportKind::Tcp,
        back: Some(BackHandle(Arc::new(TcpBackChannel(back.clone())))),
    });
    // The receive buffer is the first thing a connection costs: refuse the connection when it
    // does not fit (backpressure on new connections; those already served go on).
    let mut memory = match &config.budget {
        None => None,
        Some(b) => {
            let share = b.connection();
            match share.try_reserve(READ_CHUNK) {
                Ok(recv) => Some(ConnMemory { share, recv }),
                Err(e) => {
                    tracing::warn!(peer = ?context.peer, error = %e,
                        "RPC/TCP connection refused: memory budget");
                    back.close();
                    return Ok(());
                }
            }
        }
    };
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let writer_gone = Arc::new(Notify::new());
    let writer = tokio::spawn(writer_task(
        wr,
        rx,
        calls_rx,
        config.send_timeout,
        writer_gone.clone(),
    ));
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let queue = Arc::new(ReplyQueue {
        bytes: AtomicUsize::new(0),
        executing: AtomicUsize::new(0),
        largest: AtomicUsize::new(0),
        drained: Notify::new(),
        server: stats,
    });
    let max_queued = config.max_queued_reply_bytes.max(1);
    let mut decoder = RecordDecoder::new(config.max_record);
    let mut buf = BytesMut::new();
    let mut result = Ok(());

    // Wait for `fut` unless the connection is told to stop first (shutdown, a cut, or the
    // writer gone: the peer no longer takes replies, so nothing more is worth reading).
    macro_rules! unless_stopped {
        ($fut:expr) => {
            tokio::select! {
                v = $fut => Ok(v),
                _ = shutdown.changed() => Err(Stop::Drain),
                _ = writer_gone.notified() => Err(Stop::Drain),
                _ = cut_fired(&mut cut) => Err(Stop::Cut),
            }
        };
    }

    // The same, for the waits on memory: the peer going away ends them too.
    macro_rules! unless_stopped_or_gone {
        ($fut:expr) => {
            tokio::select! {
                v = $fut => Ok(v),
                _ = shutdown.changed() => Err(Stop::Drain),
                _ = writer_gone.notified() => Err(Stop::Drain),
                _ = cut_fired(&mut cut) => Err(Stop::Cut),
                _ = peer_gone(&mut rd) => Err(Stop::Drain),
            }
        };
    }

    let stop = 'conn: loop {
        loop {
            let record = match decoder.decode(&mut buf) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(peer = ?context.peer, error = %e, "closing RPC/TCP connection");
                    result = Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    break 'conn Stop::Drain;
                }
            };
            // A reply from the client answers one of our backward calls: it is no call.
            if TcpBack::is_reply(&record) {
                back.on_reply(record);
                continue;
            }
            let permit = match unless_stopped!(in_flight.clone().acquire_owned()) {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => break 'conn Stop::Drain,
                Err(stop) => break 'conn stop,
            };
            // Backpressure on a peer that does not read its replies: no new call from it
            // while its replies are not drained (TCP flow control then holds the rest).
            if let Err(stop) = unless_stopped!(queue.admit(max_queued)) {
                break 'conn stop;
            }
            // With a budget, the call's record and its reply are reserved before it runs;
            // when they do not fit, the reader waits here for memory to come back.
            let held = match memory.as_mut() {
                None => None,
                Some(m) => {
                    let bound = config.reply_bound.as_ref().and_then(|b| (b.0)(&record));
                    let estimate = bound.unwrap_or_else(|| {
                        config
                            .reply_estimate
                            .max(queue.largest.load(Ordering::Relaxed))
                    });
                    match unless_stopped_or_gone!(m.for_call(record.len(), estimate)) {
                        Ok(Ok(r)) => Some(r),
                        Ok(Err(e)) => {
                            tracing::warn!(peer = ?context.peer, error = %e,
                                "closing RPC/TCP connection");
                            result = Err(io::Error::new(io::ErrorKind::OutOfMemory, e));
                            queue.done(None);
                            break 'conn Stop::Drain;
                        }
                        Err(stop) => {
                            queue.done(None);
                            break 'conn stop;
                        }
                    }
                }
            };
            // Alone: no other call of this connection is executing (admitted above, this one
            // is counted) and no byte of another has arrived yet.
            let hints = if buf.is_empty() && queue.executing.load(Ordering::Acquire) == 1 {
                CallHints::alone()
            } else {
                CallHints::default()
            };
            spawn_call(
                record,
                hints,
                &dispatcher,
                &context,
                &tx,
                permit,
                &queue,
                held,
            );
        }
        // A record whose length is known is reserved in full before its bytes are read.
        if let Some(m) = memory.as_mut() {
            match unless_stopped_or_gone!(m.cover_receive(&decoder)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(peer = ?context.peer, error = %e, "closing RPC/TCP connection");
                    result = Err(io::Error::new(io::ErrorKind::OutOfMemory, e));
                    break Stop::Drain;
                }
                Err(stop) => break stop,
            }
        }
        reserve_for_read(&mut buf, &decoder);
        match unless_stopped!(rd.read_buf(&mut buf)) {
            Ok(Ok(0)) => break Stop::Drain,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                result = Err(e);
                break Stop::Drain;
            }
            Err(stop) => break stop,
        }
    };
    // No backward call goes out from now on; those waiting end.
    back.close();
    if let Stop::Cut = stop {
        // Cut: the writer goes with its half of the socket, unwritten replies with it.
        writer.abort();
        return Ok(());
    }
    // The receive buffer goes now; calls already read still run, and the writer ends once
    // each has sent its reply (or none).
    drop((buf, decoder, memory));
    drop(tx);
    match writer.await {
        Ok(Err(e)) if result.is_ok() => Err(e),
        _ => result,
    }
}

/// A reply on its way to the writer: the in-flight permit, its bytes in the connection's
/// [`ReplyQueue`] and, with a budget, its reservation, all given back once it is written.
type ReplyItem = (
    ReplyMessage,
    OwnedSemaphorePermit,
    Queued,
    Option<Reservation>,
);

/// Run one call. A call alone on its connection ([`CallHints::alone`]) is first polled here,
/// on the reader's task: if it finishes at once (a service that answers without waiting: the
/// NFS server's GETATTR, LOOKUP, a READ from the page cache) no task is spawned and no other
/// worker woken for it. A call that waits (a blocking thread, memory), and every call that
/// has neighbours, runs in a task of its own, so that the calls of one connection proceed
/// concurrently on the runtime's workers: run on the reader's task, they would take turns.
/// Measured with `nfs bench` (docs/performance.md): polling every call here cost NFS over
/// TCP up to a third of its rate at depths 4 and 16, while one call at a time gained.
#[allow(clippy::too_many_arguments)]
fn spawn_call(
    record: Bytes,
    hints: CallHints,
    dispatcher: &Arc<Dispatcher>,
    context: &Arc<CallContext>,
    tx: &mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
    queue: &Arc<ReplyQueue>,
    held: Option<Reservation>,
) {
    let fut = run_call(
        record,
        hints,
        dispatcher.clone(),
        context.clone(),
        tx.clone(),
        permit,
        queue.clone(),
        held,
    );
    if !hints.alone {
        tokio::spawn(fut);
        return;
    }
    let mut fut = Box::pin(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(fut);
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_call(
    record: Bytes,
    hints: CallHints,
    d: Arc<Dispatcher>,
    ctx: Arc<CallContext>,
    tx: mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
    queue: Arc<ReplyQueue>,
    mut held: Option<Reservation>,
) {
    {
        // TCP carries every result inline: no Write chunks exist.
        let reply = d
            .dispatch_hinted(record, ctx, DdpPolicy::Inline, hints)
            .await;
        // The call's record is gone: what it reserved now covers its reply, which stays
        // reserved until written. A reply larger than that gives it back and waits for the
        // whole (as RPC-over-RDMA does: a call never holds part of its memory while it waits
        // for the rest), unless the connection goes meanwhile.
        let len = reply.as_ref().map_or(0, |r| r.message.len());
        if let Some(h) = held.as_mut() {
            if len <= h.bytes() {
                h.shrink(len);
            } else {
                let share = h.connection().clone();
                held = None;
                tokio::select! {
                    r = share.reserve_queued(len) => match r {
                        Ok(r) => held = Some(r),
                        // Larger than the connection may ever hold: sent as it is.
                        Err(e) => tracing::debug!(error = %e, "reply larger than the budget allows"),
                    },
                    _ = tx.closed() => {
                        queue.done(None);
                        return;
                    }
                }
            }
        }
        // The permit travels with the reply and is released once it has been written, so
        // replies the peer is slow to read also count against the limit; their bytes count
        // until written (or dropped with the connection).
        if let Some(queued) = queue.done(reply.as_ref().map(|r| r.message.len()))
            && let Some(reply) = reply
        {
            let _ = tx.send((reply, permit, queued, held));
        }
    }
}

/// Write `parts`; with `idle`, fail with `TimedOut` when the peer takes none of them for that
/// long (the socket accepts no byte: its buffers are full and the peer does not read).
async fn write_parts(
    wr: &mut OwnedWriteHalf,
    parts: &mut VecDeque<Bytes>,
    idle: Option<Duration>,
) -> io::Result<()> {
    let Some(idle) = idle else {
        return write_all_parts(wr, parts).await;
    };
    let left = |p: &VecDeque<Bytes>| p.iter().map(Bytes::len).sum::<usize>();
    loop {
        let before = left(parts);
        // `write_all_parts` takes parts off as the socket accepts them, so what is left after
        // the timeout is exactly what was not written.
        match tokio::time::timeout(idle, write_all_parts(wr, parts)).await {
            Ok(r) => return r,
            Err(_) if left(parts) < before => {}
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer took none of its replies for {idle:?}"),
                ));
            }
        }
    }
}

async fn writer_task(
    wr: OwnedWriteHalf,
    rx: mpsc::UnboundedReceiver<ReplyItem>,
    calls: mpsc::UnboundedReceiver<Bytes>,
    idle: Option<Duration>,
    gone: Arc<Notify>,
) -> io::Result<()> {
    let r = write_replies(wr, rx, calls, idle).await;
    if let Err(e) = &r
        && e.kind() == io::ErrorKind::TimedOut
    {
        tracing::warn!(error = %e, "closing RPC/TCP connection: replies not taken");
    }
    // The reader stops at once: with no writer, its calls' replies have nowhere to go.
    gone.notify_one();
    r
}

async fn write_replies(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<ReplyItem>,
    mut calls: mpsc::UnboundedReceiver<Bytes>,
    idle: Option<Duration>,
) -> io::Result<()> {
    const BATCH: usize = 64;
    let mut parts = VecDeque::new();
    let mut held = Vec::with_capacity(BATCH);
    let mut calls_open = true;
    loop {
        let (reply, permit, queued, reserved) = tokio::select! {
            r = rx.recv() => match r {
                Some(item) => item,
                None => break,
            },
            c = calls.recv(), if calls_open => {
                match c {
                    // A backward call: written as it comes (they are few and small).
                    Some(call) => {
                        let mut msg = xdr::Encoded::default();
                        msg.prepend(call);
                        let mut p: VecDeque<Bytes> = frame(&msg, MAX_FRAGMENT_LEN).into();
                        write_parts(&mut wr, &mut p, idle).await?;
                    }
                    None => calls_open = false,
                }
                continue;
            }
        };
        parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
        held.push((permit, queued, reserved));
        // Coalesce replies that are already waiting into one vectored write.
        while held.len() < BATCH {
            match rx.try_recv() {
                Ok((reply, permit, queued, reserved)) => {
                    parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
                    held.push((permit, queued, reserved));
                }
                Err(_) => break,
            }
        }
        write_parts(&mut wr, &mut parts, idle).await?;
        held.clear();
    }
    wr.shutdown().await
}
