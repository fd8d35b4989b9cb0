//! The TCP server: accept loop, per-connection reader, per-call tasks and a per-connection
//! writer that sends replies in completion order.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use xdr::DdpPolicy;

use super::reserve_for_read;
use crate::record::{DEFAULT_MAX_RECORD, MAX_FRAGMENT_LEN, RecordDecoder, frame, write_all_parts};
use crate::service::{CallContext, Dispatcher, ReplyMessage, TransportKind};

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
}

/// Default of [`ServerConfig::max_queued_reply_bytes`]: eight 1 MiB NFS READ replies.
pub const DEFAULT_MAX_QUEUED_REPLY_BYTES: usize = 8 << 20;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_record: DEFAULT_MAX_RECORD,
            max_in_flight: 128,
            max_queued_reply_bytes: DEFAULT_MAX_QUEUED_REPLY_BYTES,
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
}

/// What a server's connections hold for their peers, over all connections.
#[derive(Debug, Default)]
pub struct TcpServerStats {
    queued_reply_bytes: AtomicUsize,
    peak_queued_reply_bytes: AtomicUsize,
    read_pauses: AtomicU64,
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
                    conns.spawn(async move {
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

async fn serve_conn(
    stream: TcpStream,
    dispatcher: Arc<Dispatcher>,
    config: &ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    mut cut: Option<watch::Receiver<u64>>,
    stats: Arc<TcpServerStats>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let context = Arc::new(CallContext {
        peer: stream.peer_addr().ok(),
        local: stream.local_addr().ok(),
        transport: TransportKind::Tcp,
    });
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer_task(wr, rx));
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

    'conn: loop {
        loop {
            let record = match decoder.decode(&mut buf) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(peer = ?context.peer, error = %e, "closing RPC/TCP connection");
                    result = Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    break 'conn;
                }
            };
            let permit = tokio::select! {
                p = in_flight.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break 'conn,
                },
                _ = shutdown.changed() => break 'conn,
                _ = cut_fired(&mut cut) => {
                    writer.abort();
                    return Ok(());
                }
            };
            // Backpressure on a peer that does not read its replies: no new call from it
            // while its replies are not drained (TCP flow control then holds the rest).
            tokio::select! {
                _ = queue.admit(max_queued) => {}
                _ = shutdown.changed() => break 'conn,
                _ = cut_fired(&mut cut) => {
                    writer.abort();
                    return Ok(());
                }
            }
            spawn_call(record, &dispatcher, &context, &tx, permit, &queue);
        }
        reserve_for_read(&mut buf, &decoder);
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            },
            _ = shutdown.changed() => break,
            // Cut: the writer goes with its half of the socket, unwritten replies with it.
            _ = cut_fired(&mut cut) => {
                writer.abort();
                return Ok(());
            }
        }
    }
    // Calls already read still run; the writer ends once each has sent its reply (or none).
    drop(tx);
    match writer.await {
        Ok(Err(e)) if result.is_ok() => Err(e),
        _ => result,
    }
}

type ReplyItem = (ReplyMessage, OwnedSemaphorePermit, Queued);

fn spawn_call(
    record: Bytes,
    dispatcher: &Arc<Dispatcher>,
    context: &Arc<CallContext>,
    tx: &mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
    queue: &Arc<ReplyQueue>,
) {
    let d = dispatcher.clone();
    let ctx = context.clone();
    let tx = tx.clone();
    let queue = queue.clone();
    tokio::spawn(async move {
        // TCP carries every result inline: no Write chunks exist.
        let reply = d.dispatch(record, ctx, DdpPolicy::Inline).await;
        // The permit travels with the reply and is released once it has been written, so
        // replies the peer is slow to read also count against the limit; their bytes count
        // until written (or dropped with the connection).
        if let Some(queued) = queue.done(reply.as_ref().map(|r| r.message.len()))
            && let Some(reply) = reply
        {
            let _ = tx.send((reply, permit, queued));
        }
    });
}

async fn writer_task(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<ReplyItem>,
) -> io::Result<()> {
    const BATCH: usize = 64;
    let mut parts = VecDeque::new();
    let mut permits = Vec::with_capacity(BATCH);
    while let Some((reply, permit, queued)) = rx.recv().await {
        parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
        permits.push((permit, queued));
        // Coalesce replies that are already waiting into one vectored write.
        while permits.len() < BATCH {
            match rx.try_recv() {
                Ok((reply, permit, queued)) => {
                    parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
                    permits.push((permit, queued));
                }
                Err(_) => break,
            }
        }
        write_all_parts(&mut wr, &mut parts).await?;
        permits.clear();
    }
    wr.shutdown().await
}
