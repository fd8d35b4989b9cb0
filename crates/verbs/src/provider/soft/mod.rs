//! The soft-iWARP provider: MPA (RFC 5044, with RFC 6581's enhanced setup), DDP (RFC 5041)
//! and RDMAP (RFC 5040) over a byte stream, after Linux `siw`.
//!
//! * [`engine`]: the sans-IO RDMAP/DDP state machine of one QP;
//! * [`handshake`]: the sans-IO MPA connection setup;
//! * [`cm`]: the connection manager (listen, connect, accept, reject) and the start of a
//!   connection's driver;
//! * [`reader`] and [`writer`]: the driver's receive and transmit tasks;
//! * [`tx`]: transmit scheduling (who puts the engine's segments on the wire, and when).

use std::io::{self, IoSlice};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::VerbsError;
use crate::cq::{CompletionQueue, RecvWr, SendWr};
use crate::mem::{ProtectionDomain, lock};
use crate::wire::mpa::MpaFrame;
use engine::{Engine, QpState};
use handshake::SetupError;

pub(crate) mod cm;
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
}

impl Default for SoftIwarpConfig {
    fn default() -> Self {
        Self {
            capture_dir: None,
            max_fpdu: MAX_FPDU,
            socket_buffer: 4 << 20,
            rx_chunk: 256 * 1024,
        }
    }
}

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
}

impl SoftQp {
    pub(crate) fn new(
        qp_num: u32,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Arc<Self> {
        let engine = Engine::new(
            qp_num,
            pd.id,
            pd.table.clone(),
            send_cq.inner.clone(),
            recv_cq.inner.clone(),
        );
        Arc::new(SoftQp {
            engine: Mutex::new(engine),
            wake: Notify::new(),
            direct_tx: Mutex::new(None),
            direct_armed: AtomicBool::new(true),
        })
    }

    pub(crate) fn state(&self) -> QpState {
        lock_engine(&self.engine).state
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) {
        lock_engine(&self.engine).post_recv(wr);
    }
}

/// Post send WRs in order, then put them on the wire (or wake the writer).
pub(crate) fn post_send(
    qp: &SoftQp,
    wrs: impl IntoIterator<Item = SendWr>,
) -> Result<(), VerbsError> {
    {
        let mut e = lock_engine(&qp.engine);
        for wr in wrs {
            e.post_send(wr)?;
        }
    }
    tx::transmit_now(qp);
    Ok(())
}

/// Move the QP to the error state (flushing its WRs) and let the writer close the stream.
pub(crate) fn disconnect(qp: &SoftQp) {
    lock_engine(&qp.engine).on_disconnect();
    qp.wake.notify_one();
}

/// The lock of a queue pair's engine. Completion queue handlers
/// ([`CompletionQueue::set_handler`]) that completions made under it call for run when the
/// last such lock this thread holds is released, since they may post work requests.
pub(crate) struct EngineGuard<'a> {
    // Fields drop in declaration order: the mutex first, then the mark (whose drop may run
    // handlers).
    g: MutexGuard<'a, Engine>,
    _held: crate::cq::HeldMark,
}

pub(crate) fn lock_engine(m: &Mutex<Engine>) -> EngineGuard<'_> {
    let held = crate::cq::HeldMark::new();
    EngineGuard {
        g: lock(m),
        _held: held,
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
