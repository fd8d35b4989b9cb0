//! The soft-iWARP provider: MPA (RFC 5044, with RFC 6581's enhanced setup), DDP (RFC 5041)
//! and RDMAP (RFC 5040) over a byte stream, after Linux `siw`.
//!
//! * [`engine`]: the sans-IO RDMAP/DDP state machine of one QP;
//! * [`handshake`]: the sans-IO MPA connection setup;
//! * [`cm`]: the connection manager (listen, connect, accept, reject) and the start of a
//!   connection's driver;
//! * [`reader`] and [`writer`]: the driver's receive and transmit tasks;
//! * [`tx`]: transmit scheduling (who puts the engine's segments on the wire, and when).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};

use crate::VerbsError;
use crate::conn::CmEvent;
use crate::cq::{Completion, CompletionQueue, CqInner, RecvWr, SendWr};
use crate::mem::ProtectionDomain;
use crate::wire::mpa::MpaFrame;
use engine::{CqSide, Engine, EngineEvent, QpState};
use handshake::SetupError;

pub(crate) mod cm;
mod direct;
pub mod engine;
pub mod handshake;
pub(crate) mod reader;
pub(crate) mod tx;
pub(crate) mod writer;

/// Largest FPDU we ever transmit: the 16-bit ULPDU length bounds it (multiple of 8).
pub const MAX_FPDU: usize = 65528;

/// Soft-iWARP provider settings.
#[derive(Debug, Clone)]
pub struct SoftIwarpConfig {
    /// Write a pcap of every connection into this directory. `None` falls back to the
    /// `OXRDMA_PCAP_DIR` environment variable.
    pub capture_dir: Option<PathBuf>,
    /// Cap on transmitted FPDU size (bytes); the TCP MSS rounded down to 8 applies too.
    pub max_fpdu: usize,
    /// SO_SNDBUF / SO_RCVBUF to request (0 = kernel default).
    pub socket_buffer: usize,
    /// Most bytes taken from the stream per read (large tagged payloads that did not arrive
    /// in one read are then read straight into their region).
    pub rx_chunk: usize,
    /// Who puts segments on the wire (over TCP): see [`TxSchedule`]. The environment variable
    /// `OXRDMA_SIW_TX` (`task`, `always` or `reply`), read when a [`crate::Device`] is opened,
    /// overrides it, for A/B measurements of programs that do not expose it.
    pub tx: TxSchedule,
    /// How long answers posted while the reader takes in one read's FPDUs (replies a server's
    /// handlers post, mostly) may be held to leave together: the first two of a batch go at
    /// once, later ones when this much has passed since the last went, the rest when the batch
    /// ends ([`tx::transmit_batch`]). Cheap calls then share a `writev`, and the answer to an
    /// expensive one does not wait for the calls read after it. The environment variable
    /// `OXRDMA_SIW_BATCH_HOLD_US` overrides it when a [`crate::Device`] is opened.
    pub batch_hold: std::time::Duration,
}

/// Transmit scheduling of soft-iWARP over TCP: whether what a post (or the reader) gives the
/// engine is written from that context, or left to the connection's writer task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TxSchedule {
    /// The first transmission after bytes arrived goes out from the posting (or receiving)
    /// context when the queue is idle, like siw's `siw_post_send`; bursts leave from the
    /// writer task, in few vectored writes (`OXRDMA_SIW_TX=reply`).
    #[default]
    FirstAfterReceive,
    /// Everything from the writer task, as before direct transmission (`OXRDMA_SIW_TX=task`).
    WriterTask,
    /// Every post directly when the queue is idle (`OXRDMA_SIW_TX=always`).
    Direct,
}

impl TxSchedule {
    /// The `OXRDMA_SIW_TX` override, if it is set to one of its values.
    fn from_env() -> Option<Self> {
        match std::env::var("OXRDMA_SIW_TX").as_deref() {
            Ok("task") => Some(Self::WriterTask),
            Ok("always") => Some(Self::Direct),
            Ok("reply") => Some(Self::FirstAfterReceive),
            _ => None,
        }
    }
}

/// The documented environment overrides, applied once when a device is opened.
pub(crate) fn apply_env_overrides(c: &mut SoftIwarpConfig) {
    if let Some(t) = TxSchedule::from_env() {
        c.tx = t;
    }
    if let Some(us) = std::env::var("OXRDMA_SIW_BATCH_HOLD_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        c.batch_hold = std::time::Duration::from_micros(us);
    }
}

impl Default for SoftIwarpConfig {
    fn default() -> Self {
        Self {
            capture_dir: None,
            max_fpdu: MAX_FPDU,
            socket_buffer: 4 << 20,
            rx_chunk: 256 * 1024,
            tx: TxSchedule::default(),
            batch_hold: DEFAULT_BATCH_HOLD,
        }
    }
}

/// Default [`SoftIwarpConfig::batch_hold`]. Chosen with `nfs bench` (4 KiB and 64 KiB READs
/// and WRITEs at depths 4 and 16, against NFS over TCP) among 0, 5, 10, 20, 50 µs and holding
/// to the end of the batch: 20 µs was the only one at or near TCP in all four 4 KiB cells
/// (docs/performance.md, stop 41).
pub const DEFAULT_BATCH_HOLD: std::time::Duration = std::time::Duration::from_micros(20);

/// The soft-iWARP side of a queue pair: its engine and what the driver shares with posters.
pub(crate) struct SoftQp {
    pub(crate) engine: Mutex<Engine>,
    /// Wakes the writer task.
    pub(crate) wake: Notify,
    /// The transmit path of a connection over TCP, while it runs: lets `post_send` and the
    /// reader put segments on the wire from the caller's context (see [`tx::transmit_now`]).
    pub(crate) direct_tx: Mutex<Option<Arc<tx::TxPath>>>,
    /// Set when bytes arrive, taken by the first direct transmission after them.
    pub(crate) direct_armed: AtomicBool,
    /// Set while the reader takes in a batch of FPDUs: what is posted meanwhile (by the
    /// completion handlers it runs, mostly) leaves with the batch's output (see
    /// [`tx::transmit_batch`]).
    pub(crate) batching: AtomicBool,
    /// The batch being taken in holds all its output for its end (a capture is on: the bytes
    /// read are recorded before anything answers them).
    pub(crate) batch_hold_all: AtomicBool,
    /// Posts seen while the current batch is taken in.
    pub(crate) batch_posts: AtomicU32,
    /// When output last left in the current batch ([`tx::clock_ns`]).
    pub(crate) batch_mark: AtomicU64,
    /// [`SoftIwarpConfig::batch_hold`], in nanoseconds.
    pub(crate) batch_hold_ns: u64,
    /// The device's transmit scheduling.
    pub(crate) tx: TxSchedule,
    /// The in-memory writer holds pieces of the stream it has not written yet (over TCP the
    /// pieces are in [`tx::TxPath::pieces`]). Set while the engine is locked by the fill that
    /// took them, so [`SoftQp::send_queue_idle`] never sees a gap between the two.
    pub(crate) mem_unwritten: AtomicBool,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
}

impl SoftQp {
    pub(crate) fn new(
        qp_num: u32,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Arc<Self> {
        let engine = Engine::new(qp_num, pd.id, pd.table.clone());
        Arc::new(SoftQp {
            engine: Mutex::new(engine),
            wake: Notify::new(),
            direct_tx: Mutex::new(None),
            direct_armed: AtomicBool::new(true),
            batching: AtomicBool::new(false),
            batch_hold_all: AtomicBool::new(false),
            batch_posts: AtomicU32::new(0),
            batch_mark: AtomicU64::new(0),
            batch_hold_ns: u64::try_from(pd.device().config().batch_hold.as_nanos())
                .unwrap_or(u64::MAX),
            tx: pd.device().config().tx,
            mem_unwritten: AtomicBool::new(false),
            send_cq: send_cq.inner.clone(),
            recv_cq: recv_cq.inner.clone(),
        })
    }

    /// Lock the engine; what it completes meanwhile is delivered on release (its events wait
    /// for the driver's next lock).
    pub(crate) fn engine(&self) -> EngineGuard<'_> {
        EngineGuard::new(self, None)
    }

    pub(crate) fn state(&self) -> QpState {
        self.engine().state
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) {
        self.engine().post_recv(wr);
    }

    /// Every send WR posted so far has left the engine (completed, if signaled: the engine
    /// completes a Send or RDMA Write once it is handed to the LLP, as siw does, here the
    /// connection's transmit queue) and every byte of the transmit queue was written to the
    /// socket (or the stream failed). The engine is asked first and released before the
    /// transmit queue is looked at: a writer locks them the other way round, and whatever left
    /// the engine was in the queue (under its lock) by the time the engine was free.
    pub(crate) fn send_queue_idle(&self) -> bool {
        if !self.engine.lock().send_queue_idle() {
            return false;
        }
        if self
            .mem_unwritten
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return false;
        }
        let tx = self.direct_tx.lock().clone();
        // A transmit queue whose lock is held is being filled or written: not idle. (Never
        // waiting for it also keeps this safe to call from a completion handler, which runs
        // while a writer holds that lock.)
        tx.is_none_or(|t| t.pieces.try_lock().is_some_and(|p| p.is_empty()))
    }
}

/// Post send WRs in order, then put them on the wire (or wake the writer).
pub(crate) fn post_send(
    qp: &SoftQp,
    wrs: impl IntoIterator<Item = SendWr>,
) -> Result<(), VerbsError> {
    {
        let mut e = qp.engine();
        for wr in wrs {
            e.post_send(wr)?;
        }
    }
    tx::transmit_now(qp);
    Ok(())
}

/// Move the QP to the error state (flushing its WRs) and let the writer close the stream.
pub(crate) fn disconnect(qp: &SoftQp) {
    qp.engine().on_disconnect();
    qp.wake.notify_one();
}

/// The lock of a queue pair's engine ([`SoftQp::engine`], or [`cm::DriverCtx::engine`] for
/// the connection's driver). When it is released, what the engine put in its [`Outbox`] is
/// delivered, outside the lock: completions go to their queues, then (driver locks only)
/// events to the connection, then the queues' handlers run — they may post work requests,
/// which take the lock again. Other locks leave events queued for the driver's next one, so
/// they reach the connection in order and from the driver's context.
pub(crate) struct EngineGuard<'a> {
    // Fields drop in declaration order: the mutex first, then the delivery.
    g: MutexGuard<'a, Engine>,
    out: Delivery<'a>,
}

/// What a released [`EngineGuard`] delivers.
struct Delivery<'a> {
    qp: &'a SoftQp,
    /// The connection's event channel, for the driver's locks.
    events_tx: Option<&'a mpsc::UnboundedSender<CmEvent>>,
    /// On the stack for the usual one or two: the engine's own queue keeps its capacity, so
    /// neither side allocates per message (stop 38).
    completions: SmallVec<[(CqSide, Completion); 4]>,
    /// Connection events, rare: none at all on the per-message path.
    events: Option<VecDeque<EngineEvent>>,
}

impl<'a> EngineGuard<'a> {
    fn new(qp: &'a SoftQp, events_tx: Option<&'a mpsc::UnboundedSender<CmEvent>>) -> Self {
        EngineGuard {
            g: qp.engine.lock(),
            out: Delivery {
                qp,
                events_tx,
                completions: SmallVec::new(),
                events: None,
            },
        }
    }
}

impl Drop for EngineGuard<'_> {
    /// Takes the outbox while the engine is still locked; [`Delivery`] hands it out after.
    fn drop(&mut self) {
        let outbox = &mut self.g.outbox;
        if !outbox.completions.is_empty() {
            self.out.completions.extend(outbox.completions.drain(..));
        }
        if self.out.events_tx.is_some() && !outbox.events.is_empty() {
            self.out.events = Some(std::mem::take(&mut outbox.events));
        }
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        if self.completions.is_empty() && self.events.is_none() {
            return;
        }
        let qp = self.qp;
        // Completions first, in the order the engine made them: a waiter woken by an event
        // finds the completions made before it (and with it) already queued.
        let mut handlers: [Option<&Arc<CqInner>>; 2] = [None, None];
        for (side, c) in self.completions.drain(..) {
            let cq = match side {
                CqSide::Send => &qp.send_cq,
                CqSide::Recv => &qp.recv_cq,
            };
            if cq.enqueue(c) {
                match &mut handlers {
                    [Some(a), _] | [_, Some(a)] if Arc::ptr_eq(a, cq) => {}
                    [slot @ None, _] | [_, slot @ None] => *slot = Some(cq),
                    _ => {}
                }
            }
        }
        if let (Some(tx), Some(events)) = (self.events_tx, self.events.take()) {
            for e in events {
                let _ = tx.send(cm_event(e));
            }
        }
        // Then the handlers; the queue that got its first completion last runs first, as
        // queue handlers always have.
        for cq in handlers.into_iter().rev().flatten() {
            cq.run_handler();
        }
    }
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.g
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.g
    }
}

/// The connection event for an engine event.
fn cm_event(e: EngineEvent) -> CmEvent {
    match e {
        EngineEvent::Established => CmEvent::Established,
        EngineEvent::TerminateSent(t) => CmEvent::TerminateSent(t),
        EngineEvent::TerminateReceived(t) => CmEvent::TerminateReceived(t),
    }
}

/// An MPA Request received by a listener, and the stream it came on.
pub(crate) struct SoftRequest {
    pub(crate) t: Transport,
    pub(crate) req: MpaFrame,
    /// The Request's bytes, for the capture.
    pub(crate) raw: Bytes,
    /// Bytes that followed the Request.
    pub(crate) leftover: BytesMut,
}

/// Byte stream under a connection.
pub(crate) enum Transport {
    Tcp(TcpStream),
    Mem(DuplexStream),
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Mem(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Mem(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_write_vectored(cx, b),
            Transport::Mem(s) => Pin::new(s).poll_write_vectored(cx, b),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_flush(cx),
            Transport::Mem(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Mem(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl From<SetupError> for VerbsError {
    fn from(e: SetupError) -> Self {
        match e {
            SetupError::Rejected(pd) => VerbsError::Rejected(pd),
            SetupError::PrivateDataTooLong => {
                VerbsError::InvalidArgument("private data longer than 256 bytes")
            }
            SetupError::Invalid(s) => VerbsError::Protocol(s),
        }
    }
}
