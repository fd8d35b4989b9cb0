//! The TCP client: pipelined calls on one connection, replies matched by XID, reconnection with
//! retransmission of outstanding calls under their original XIDs. The same client runs over any
//! byte stream a caller connected itself ([`TcpClient::over_stream`]: an AF_LOCAL socket such
//! as rpcbind's, a TLS stream), with record marking (RFC 5531 §11) and without reconnection.
//!
//! One driver task owns the connection. A call encodes its message once, registers it in the
//! pending table under a fresh XID and hands the XID to the driver, which writes it. The driver's
//! reader completes pending calls as replies arrive, in any order. When the connection breaks,
//! the driver reconnects and writes every outstanding call again with the same XID and the same
//! bytes, so a server with a duplicate request cache can recognise it (RFC 5531 §9 on XIDs; the
//! retransmission rule is the one NFS clients follow over TCP, RFC 7530 §3.1.1 / RFC 1813 §4.4).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use xdr::{Encoded, Encoder};

use super::reserve_for_read;
use crate::client::{CallRequest, RpcError, RpcTransport};
use crate::message::{AcceptStat, MessageHeader, ReplyHeader};
use crate::record::{DEFAULT_MAX_RECORD, MAX_FRAGMENT_LEN, RecordDecoder, frame, write_all_parts};
use crate::service::{BoxFuture, CallContext, Dispatcher, TransportKind};

/// Client behaviour.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Timeout of a call whose [`CallRequest::timeout`] is `None`, covering any retransmissions.
    pub timeout: Duration,
    /// How many times one call may be retransmitted after connection losses before it fails
    /// with [`RpcError::Transport`].
    pub max_retransmits: u32,
    /// Consecutive failed connection attempts before the outstanding calls are failed.
    pub reconnect_attempts: u32,
    /// Delay before the second connection attempt; it doubles up to one second.
    pub reconnect_backoff: Duration,
    /// Timeout of one connection attempt.
    pub connect_timeout: Duration,
    /// Largest reply record accepted; a larger one breaks the connection.
    pub max_record: usize,
    /// Bind connections to this local address first (a source address of the client's
    /// choosing, or a port below 1024 for servers that insist on one, as Linux's `resvport`).
    pub local_addr: Option<SocketAddr>,
    /// Programs that answer the server's backward calls on this connection (NFSv4.1
    /// callbacks over TCP, RFC 8881 §2.10.3.1); `None`: calls from the server are dropped.
    /// At most [`MAX_BACK_CALLS`] run at once; more are dropped unanswered.
    pub backchannel: Option<Arc<Dispatcher>>,
}

/// Backward calls a client runs at once at most.
pub const MAX_BACK_CALLS: usize = 16;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timeout: Duration::from_secs(30),
            max_retransmits: 3,
            reconnect_attempts: 5,
            reconnect_backoff: Duration::from_millis(20),
            connect_timeout: Duration::from_secs(5),
            max_record: DEFAULT_MAX_RECORD,
            local_addr: None,
            backchannel: None,
        }
    }
}

impl ClientConfig {
    /// Set the default per-call timeout.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Set the per-call retransmission cap.
    pub fn with_max_retransmits(mut self, n: u32) -> Self {
        self.max_retransmits = n;
        self
    }

    /// Set the number of consecutive connection attempts.
    pub fn with_reconnect_attempts(mut self, n: u32) -> Self {
        self.reconnect_attempts = n.max(1);
        self
    }

    /// Bind connections to `addr` first ([`ClientConfig::local_addr`]).
    pub fn with_local_addr(mut self, addr: SocketAddr) -> Self {
        self.local_addr = Some(addr);
        self
    }

    /// Answer the server's backward calls with `programs` ([`ClientConfig::backchannel`]).
    pub fn with_backchannel(mut self, programs: Arc<Dispatcher>) -> Self {
        self.backchannel = Some(programs);
        self
    }

    /// Set the maximum reply record size.
    pub fn with_max_record(mut self, n: usize) -> Self {
        self.max_record = n;
        self
    }
}

struct Pending {
    message: Encoded,
    /// The connection generation this call was last written on (0: never written).
    sent_gen: u64,
    transmissions: u32,
    /// (program, version, procedure), for the round-trip times.
    key: crate::rtt::ProcKey,
    /// When the last transmission was queued for writing.
    sent_at: Option<std::time::Instant>,
    done: oneshot::Sender<Result<Bytes, RpcError>>,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<HashMap<u32, Pending>>,
    /// Wakes the connection to drop it ([`TcpClient::disconnect`]).
    cut: tokio::sync::Notify,
    /// Round-trip times of answered calls ([`RpcTransport::rtt`]).
    rtt: Arc<crate::rtt::RttTable>,
}

impl Shared {
    fn complete(&self, xid: u32, result: Result<Bytes, RpcError>) {
        let Some(p) = self.pending.lock().remove(&xid) else {
            return;
        };
        if let (Ok(_), Some(t)) = (&result, p.sent_at) {
            self.rtt.record(p.key, t.elapsed());
        }
        let _ = p.done.send(result);
    }

    fn fail_all(&self, why: &str) {
        let drained: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
        for p in drained {
            let _ = p.done.send(Err(RpcError::Transport(why.to_owned())));
        }
    }
}

/// Removes a call's pending entry however the call ends (reply, timeout, or the caller
/// dropping the future).
struct PendingGuard<'a> {
    shared: &'a Shared,
    xid: u32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.pending.lock().remove(&self.xid);
    }
}

/// An ONC RPC client over one TCP connection (re-established when lost). Cheap to share:
/// wrap it in an `Arc` and call it from many tasks; calls are pipelined.
pub struct TcpClient {
    shared: Arc<Shared>,
    to_driver: mpsc::UnboundedSender<u32>,
    next_xid: AtomicU32,
    /// The TCP peer; `None` over a stream handed in by the caller.
    peer: Option<SocketAddr>,
    /// What [`RpcTransport::describe`] says.
    label: String,
    config: ClientConfig,
    driver: JoinHandle<()>,
}

impl std::fmt::Debug for TcpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpClient")
            .field("peer", &self.label)
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl TcpClient {
    /// Connect to `peer` with the default configuration.
    pub async fn connect(peer: SocketAddr) -> io::Result<Self> {
        Self::connect_with(peer, ClientConfig::default()).await
    }

    /// Connect to `peer`. The first connection must succeed; later losses are handled by
    /// reconnecting.
    pub async fn connect_with(peer: SocketAddr, config: ClientConfig) -> io::Result<Self> {
        let stream = connect_once(peer, &config).await?;
        let shared = Arc::new(Shared::default());
        let (to_driver, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(drive(peer, shared.clone(), rx, stream, config.clone()));
        Ok(TcpClient {
            shared,
            to_driver,
            // RFC 5531 §9: the XID only has to be unique among the client's outstanding calls;
            // a random start makes reuse across client restarts unlikely.
            next_xid: AtomicU32::new(rand::random()),
            peer: Some(peer),
            label: format!("tcp://{peer}"),
            config,
            driver,
        })
    }

    /// A client over `stream`, a connection the caller made (`label` names it in errors and
    /// [`RpcTransport::describe`]). Calls are pipelined and matched by XID as over TCP; when
    /// the stream ends or breaks, the outstanding calls and every later one fail with
    /// [`RpcError::Transport`] (there is no address to reconnect to).
    pub fn over_stream<S>(stream: S, label: impl Into<String>, config: ClientConfig) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let label = label.into();
        let shared = Arc::new(Shared::default());
        let (to_driver, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(drive_once(
            label.clone(),
            shared.clone(),
            rx,
            stream,
            config.clone(),
        ));
        TcpClient {
            shared,
            to_driver,
            next_xid: AtomicU32::new(rand::random()),
            peer: None,
            label,
            config,
            driver,
        }
    }

    /// The server's TCP address (`None` for a client over a caller's stream).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Drop the current connection, as a client that loses it would: the driver reconnects
    /// and retransmits every outstanding call under its XID. For fault injection.
    pub fn disconnect(&self) {
        self.shared.cut.notify_waiters();
    }

    /// Calls sent (or waiting to be sent) and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.shared.pending.lock().len()
    }

    async fn call_inner(&self, req: CallRequest) -> Result<Bytes, RpcError> {
        let (done, result) = oneshot::channel();
        let mut pending = Pending {
            message: Encoded::default(),
            sent_gen: 0,
            transmissions: 0,
            key: (req.prog, req.vers, req.proc_),
            sent_at: None,
            done,
        };
        // XIDs come from a counter; one still in use (only possible after 2^32 calls) is
        // skipped. fetch_add hands each value to one caller, so checking here and inserting
        // after encoding cannot race with another call.
        let xid = {
            let table = self.shared.pending.lock();
            let mut xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            while table.contains_key(&xid) {
                xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            }
            xid
        };
        let header = req.header(xid);
        // TCP carries everything inline (the encoder's default policy). The arguments are
        // encoded once: a retransmission resends the same bytes.
        let mut enc = Encoder::with_capacity(header.encoded_len() + 128);
        header.encode(&mut enc);
        (req.args)(&mut enc);
        pending.message = enc.finish();
        self.shared.pending.lock().insert(xid, pending);
        let _guard = PendingGuard {
            shared: &self.shared,
            xid,
        };
        if self.to_driver.send(xid).is_err() {
            return Err(RpcError::Closed);
        }
        let timeout = req.timeout.unwrap_or(self.config.timeout);
        match tokio::time::timeout(timeout, result).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(RpcError::Closed),
            Err(_) => Err(RpcError::Timeout),
        }
    }
}

impl RpcTransport for TcpClient {
    fn call(&self, req: CallRequest) -> BoxFuture<'_, Result<Bytes, RpcError>> {
        Box::pin(self.call_inner(req))
    }

    fn describe(&self) -> String {
        self.label.clone()
    }

    fn rtt(&self) -> Option<Arc<crate::rtt::RttTable>> {
        Some(self.shared.rtt.clone())
    }
}

async fn connect_once(peer: SocketAddr, config: &ClientConfig) -> io::Result<TcpStream> {
    let connect = async {
        match config.local_addr {
            None => TcpStream::connect(peer).await,
            Some(local) => {
                let sock = if local.is_ipv4() {
                    tokio::net::TcpSocket::new_v4()?
                } else {
                    tokio::net::TcpSocket::new_v6()?
                };
                sock.set_reuseaddr(true)?;
                sock.bind(local)?;
                sock.connect(peer).await
            }
        }
    };
    let stream = tokio::time::timeout(config.connect_timeout, connect)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

async fn reconnect(peer: SocketAddr, config: &ClientConfig) -> io::Result<TcpStream> {
    let mut delay = config.reconnect_backoff;
    let mut last = io::Error::other("no connection attempt made");
    for attempt in 0..config.reconnect_attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
        match connect_once(peer, config).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                tracing::debug!(%peer, attempt, error = %e, "RPC/TCP reconnect failed");
                last = e;
            }
        }
    }
    Err(last)
}

enum Exit {
    /// The client was dropped.
    Closed,
    /// The connection broke.
    Lost(io::Error),
}

async fn drive(
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<u32>,
    first: TcpStream,
    config: ClientConfig,
) {
    let mut stream = Some(first);
    let mut generation: u64 = 0;
    loop {
        let s = match stream.take() {
            Some(s) => s,
            None => {
                // Reconnect only when there is something to send. A queued XID needs no
                // handling here: every pending call is written after reconnecting.
                if shared.pending.lock().is_empty() && rx.recv().await.is_none() {
                    return;
                }
                match reconnect(peer, &config).await {
                    Ok(s) => s,
                    Err(e) => {
                        shared.fail_all(&format!("cannot reconnect to {peer}: {e}"));
                        continue;
                    }
                }
            }
        };
        generation += 1;
        let addrs = (s.peer_addr().ok(), s.local_addr().ok());
        match run_connection(s, addrs, generation, &shared, &mut rx, &config).await {
            Exit::Closed => return,
            Exit::Lost(e) => {
                tracing::debug!(%peer, error = %e, "RPC/TCP connection lost; reconnecting");
            }
        }
    }
}

/// The driver of a client over a caller's stream: one connection; once it is gone every call
/// fails.
async fn drive_once<S>(
    label: String,
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<u32>,
    stream: S,
    config: ClientConfig,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    // A caller's stream (a Unix socket, say) has no IP addresses to show a backward call.
    let why = match run_connection(stream, (None, None), 1, &shared, &mut rx, &config).await {
        Exit::Closed => return,
        Exit::Lost(e) => format!("connection to {label} lost: {e}"),
    };
    tracing::debug!(%label, %why, "RPC stream client stopped");
    shared.fail_all(&why);
    while rx.recv().await.is_some() {
        shared.fail_all(&why);
    }
}

/// Queue `xid` for writing on connection `generation` unless it was already written there.
/// Returns an error to deliver when the call has used up its retransmissions.
fn queue_call(
    pending: &mut Pending,
    generation: u64,
    config: &ClientConfig,
    parts: &mut VecDeque<Bytes>,
) -> Option<RpcError> {
    if pending.sent_gen == generation {
        return None;
    }
    if pending.transmissions > config.max_retransmits {
        return Some(RpcError::Transport(format!(
            "connection lost {} times; retransmission limit reached",
            pending.transmissions
        )));
    }
    pending.sent_gen = generation;
    pending.transmissions += 1;
    // Round-trip times run from the last transmission (as `mountstats` counts them).
    pending.sent_at = Some(std::time::Instant::now());
    parts.extend(frame(&pending.message, MAX_FRAGMENT_LEN));
    None
}

fn queue_all(shared: &Shared, generation: u64, config: &ClientConfig, parts: &mut VecDeque<Bytes>) {
    let mut failed = Vec::new();
    {
        let mut table = shared.pending.lock();
        for (xid, p) in table.iter_mut() {
            if let Some(e) = queue_call(p, generation, config, parts) {
                failed.push((*xid, e));
            }
        }
    }
    for (xid, e) in failed {
        shared.complete(xid, Err(e));
    }
}

async fn run_connection<S>(
    stream: S,
    addrs: (Option<SocketAddr>, Option<SocketAddr>),
    generation: u64,
    shared: &Shared,
    rx: &mut mpsc::UnboundedReceiver<u32>,
    config: &ClientConfig,
) -> Exit
where
    S: AsyncRead + AsyncWrite + Send,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    // Replies to the server's backward calls, from their tasks to the writer.
    let (back_tx, mut back_rx) = mpsc::channel::<Bytes>(MAX_BACK_CALLS);
    let back_ctx = Arc::new(CallContext {
        peer: addrs.0,
        local: addrs.1,
        transport: TransportKind::Tcp,
        back: None,
    });
    let back_slots = Arc::new(tokio::sync::Semaphore::new(MAX_BACK_CALLS));

    let writer = async {
        let mut parts = VecDeque::new();
        // Everything outstanding: calls made while disconnected, and retransmissions of calls
        // written on a previous connection (same XID, same bytes).
        queue_all(shared, generation, config, &mut parts);
        write_all_parts(&mut wr, &mut parts).await?;
        loop {
            let first = tokio::select! {
                x = rx.recv() => match x {
                    Some(x) => x,
                    None => return Ok(()),
                },
                Some(reply) = back_rx.recv() => {
                    let mut msg = Encoded::default();
                    msg.prepend(reply);
                    parts.extend(frame(&msg, MAX_FRAGMENT_LEN));
                    write_all_parts(&mut wr, &mut parts).await?;
                    continue;
                }
            };
            let mut batch = vec![first];
            while batch.len() < 64 {
                match rx.try_recv() {
                    Ok(x) => batch.push(x),
                    Err(_) => break,
                }
            }
            let mut failed = Vec::new();
            {
                let mut table = shared.pending.lock();
                for xid in batch {
                    // Absent: already answered, timed out, or cancelled.
                    if let Some(p) = table.get_mut(&xid)
                        && let Some(e) = queue_call(p, generation, config, &mut parts)
                    {
                        failed.push((xid, e));
                    }
                }
            }
            for (xid, e) in failed {
                shared.complete(xid, Err(e));
            }
            write_all_parts(&mut wr, &mut parts).await?;
        }
    };

    let reader = async {
        let mut decoder = RecordDecoder::new(config.max_record);
        let mut buf = BytesMut::new();
        loop {
            while let Some(record) = decoder
                .decode(&mut buf)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            {
                if record.get(4..8) == Some(&0u32.to_be_bytes()[..]) {
                    back_call(config, &back_ctx, &back_slots, &back_tx, record);
                } else {
                    deliver(shared, record);
                }
            }
            reserve_for_read(&mut buf, &decoder);
            if rd.read_buf(&mut buf).await? == 0 {
                return Err::<(), io::Error>(io::ErrorKind::UnexpectedEof.into());
            }
        }
    };

    tokio::select! {
        r = writer => match r {
            Ok(()) => Exit::Closed,
            Err(e) => Exit::Lost(e),
        },
        r = reader => match r {
            Ok(()) => Exit::Lost(io::ErrorKind::UnexpectedEof.into()),
            Err(e) => Exit::Lost(e),
        },
        () = shared.cut.notified() => Exit::Lost(io::ErrorKind::ConnectionAborted.into()),
    }
}

/// A call from the server (message type CALL, RFC 5531 §9): run it on the backward-direction
/// programs, if any, and send its reply on the same connection.
fn back_call(
    config: &ClientConfig,
    ctx: &Arc<CallContext>,
    slots: &Arc<tokio::sync::Semaphore>,
    out: &mpsc::Sender<Bytes>,
    record: Bytes,
) {
    let Some(d) = config.backchannel.clone() else {
        tracing::debug!("ignoring RPC CALL received by a client without backchannel programs");
        return;
    };
    let Ok(permit) = slots.clone().try_acquire_owned() else {
        tracing::debug!("backward call dropped: {MAX_BACK_CALLS} already running");
        return;
    };
    let (ctx, out) = (ctx.clone(), out.clone());
    tokio::spawn(async move {
        let _permit = permit;
        if let Some(r) = d.dispatch(record, ctx, xdr::DdpPolicy::Inline).await {
            let _ = out.send(r.message.to_bytes()).await;
        }
    });
}

/// Match a reply record to its call and complete it.
fn deliver(shared: &Shared, record: Bytes) {
    let Some(xid) = record
        .get(..4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    else {
        tracing::debug!("discarding RPC reply shorter than an XID");
        return;
    };
    let result = match MessageHeader::decode_message(&record) {
        Ok((MessageHeader::Reply(ReplyHeader::Accepted { stat, .. }), body)) => match stat {
            AcceptStat::Success => Ok(body),
            other => Err(RpcError::Accepted(other)),
        },
        Ok((MessageHeader::Reply(ReplyHeader::Denied { reason, .. }), _)) => {
            Err(RpcError::Rejected(reason))
        }
        Ok((MessageHeader::Call(_), _)) => {
            // Calls are told apart before this: only a malformed one gets here.
            tracing::debug!(xid, "ignoring RPC CALL received by a client");
            return;
        }
        Err(e) => Err(RpcError::BadReply(e.to_string())),
    };
    shared.complete(xid, result);
}
