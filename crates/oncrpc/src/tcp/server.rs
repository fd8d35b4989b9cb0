//! The TCP server: the accept loop and each connection's reader, which decodes records, bounds
//! what a peer may make the server hold, and hands each call on (`replies.rs` runs the
//! calls and writes their replies).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::back::{TcpBack, TcpBackChannel};
use super::conn_memory::{ConnMemory, peer_gone};
use super::replies::{ReplyQueue, spawn_call, writer_task};
use super::{READ_CHUNK, reserve_for_read};
use crate::backchannel::BackHandle;
use crate::budget::MemoryBudget;
use crate::record::{DEFAULT_MAX_RECORD, RecordDecoder};
use crate::service::{CallContext, CallHints, Dispatcher, TransportKind};

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
    /// ([`ConnBudget`](crate::budget::ConnBudget)) and reserves from it before it holds what its peer sends or asks
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
    pub(super) queued_reply_bytes: AtomicUsize,
    pub(super) peak_queued_reply_bytes: AtomicUsize,
    pub(super) read_pauses: AtomicU64,
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
    let queue = Arc::new(ReplyQueue::new(stats));
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
            let hints =
                CallHints::alone_if(buf.is_empty() && queue.executing.load(Ordering::Acquire) == 1);
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
