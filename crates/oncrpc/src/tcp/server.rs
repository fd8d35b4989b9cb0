//! The TCP server: accept loop, per-connection reader, per-call tasks and a per-connection
//! writer that sends replies in completion order.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_record: DEFAULT_MAX_RECORD,
            max_in_flight: 128,
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
}

/// A running TCP server. Dropping it stops accepting and lets open connections finish in the
/// background; [`TcpServer::shutdown`] does the same and waits for them.
#[derive(Debug)]
pub struct TcpServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    /// Bumped by [`TcpServer::disconnect_all`].
    cut: watch::Sender<u64>,
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
        let task = tokio::spawn(accept_loop(listener, dispatcher, config, rx, cut_rx));
        Ok(TcpServer {
            local_addr,
            shutdown,
            cut,
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
    accept_loop(listener, dispatcher, ServerConfig::default(), rx, cut_rx).await;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    dispatcher: Arc<Dispatcher>,
    config: ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    cut: watch::Receiver<u64>,
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
                    conns.spawn(async move {
                        if let Err(e) = serve_conn(stream, d, &c, s, Some(k)).await {
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
    serve_conn(stream, dispatcher, config, shutdown, None).await
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
            spawn_call(record, &dispatcher, &context, &tx, permit);
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

type ReplyItem = (ReplyMessage, OwnedSemaphorePermit);

fn spawn_call(
    record: Bytes,
    dispatcher: &Arc<Dispatcher>,
    context: &Arc<CallContext>,
    tx: &mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
) {
    let d = dispatcher.clone();
    let ctx = context.clone();
    let tx = tx.clone();
    tokio::spawn(async move {
        // TCP carries every result inline: no Write chunks exist.
        if let Some(reply) = d.dispatch(record, ctx, DdpPolicy::Inline).await {
            // The permit travels with the reply and is released once it has been written,
            // so replies the peer is slow to read also count against the limit.
            let _ = tx.send((reply, permit));
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
    while let Some((reply, permit)) = rx.recv().await {
        parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
        permits.push(permit);
        // Coalesce replies that are already waiting into one vectored write.
        while permits.len() < BATCH {
            match rx.try_recv() {
                Ok((reply, permit)) => {
                    parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
                    permits.push(permit);
                }
                Err(_) => break,
            }
        }
        write_all_parts(&mut wr, &mut parts).await?;
        permits.clear();
    }
    wr.shutdown().await
}
