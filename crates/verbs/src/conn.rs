//! Connections and the connection manager's public types: [`ConnParams`], [`Listener`],
//! [`ConnectRequest`], [`Connection`], [`CmEvent`] and [`ConnStats`]. The work is the
//! provider's: [`crate::provider::soft::cm`] for soft-iWARP and loopback, the native
//! provider's own connection manager otherwise.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::VerbsError;
use crate::device::Device;
use crate::provider::loopback::{self, LoopbackFabric};
use crate::provider::soft::handshake::{self, LocalSetup, Negotiated};
use crate::provider::soft::{self, SoftRequest};
use crate::provider::{NativeConn, NativeConnReq};
use crate::qp::QueuePair;
use crate::wire::ddp::Terminate;

#[derive(Debug, Clone)]
pub struct ConnParams {
    /// ULP private data (≤ 256 bytes) for the MPA Request / Reply.
    pub private_data: Bytes,
    /// Inbound RDMA Read depth (responder_resources), ≤ 128.
    pub ird: u16,
    /// Outbound RDMA Read depth (initiator_depth), ≤ 128.
    pub ord: u16,
    /// Ask for MPA CRC-32C (used if either side asks).
    pub crc: bool,
    /// Peer-to-peer mode: exchange a zero-length RTR (RFC 6581).
    pub peer_to_peer: bool,
    /// RTR kinds offered by an initiator: [Write, Read, Send].
    pub rtr_kinds: [bool; 3],
    /// MPA revision to use as initiator (2 = enhanced setup; 1 for old peers).
    pub mpa_revision: u8,
    /// Ask for markers: only for testing that peers refuse them.
    pub markers: bool,
    /// Write a pcap of this connection into this directory.
    pub capture_dir: Option<PathBuf>,
}

impl Default for ConnParams {
    fn default() -> Self {
        Self {
            private_data: Bytes::new(),
            ird: 16,
            ord: 16,
            crc: false,
            peer_to_peer: false,
            rtr_kinds: [true, true, true],
            mpa_revision: 2,
            markers: false,
            capture_dir: None,
        }
    }
}

impl ConnParams {
    pub(crate) fn validate(&self) -> Result<(), VerbsError> {
        if self.private_data.len() > crate::wire::mpa::MAX_ULP_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument(
                "private data longer than 256 bytes",
            ));
        }
        if self.ird > handshake::MAX_IRD_ORD || self.ord > handshake::MAX_IRD_ORD {
            return Err(VerbsError::InvalidArgument("IRD/ORD above 128"));
        }
        if !(1..=2).contains(&self.mpa_revision) {
            return Err(VerbsError::InvalidArgument("MPA revision must be 1 or 2"));
        }
        Ok(())
    }

    pub(crate) fn setup(&self) -> LocalSetup {
        LocalSetup {
            crc: self.crc,
            markers: self.markers,
            revision: self.mpa_revision,
            ird: self.ird,
            ord: self.ord,
            peer_to_peer: self.peer_to_peer && self.mpa_revision == 2,
            rtr_kinds: self.rtr_kinds,
            private_data: self.private_data.clone(),
        }
    }
}

/// A listening endpoint (rdma_cm listen id).
#[derive(Debug)]
pub struct Listener {
    rx: mpsc::UnboundedReceiver<ConnectRequest>,
    local_addr: SocketAddr,
    task: JoinHandle<()>,
    fabric: Option<LoopbackFabric>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(f) = &self.fabric {
            loopback::unlisten(f, &self.local_addr);
        }
    }
}

impl Listener {
    /// A listener whose `task` sends the connection requests to `rx`; on a loopback
    /// `fabric`, dropping it frees the address.
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<ConnectRequest>,
        local_addr: SocketAddr,
        task: JoinHandle<()>,
        fabric: Option<LoopbackFabric>,
    ) -> Self {
        Self {
            rx,
            local_addr,
            task,
            fabric,
        }
    }

    /// Bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Wait for the next connection request (RDMA_CM_EVENT_CONNECT_REQUEST).
    pub async fn accept(&mut self) -> Result<ConnectRequest, VerbsError> {
        self.rx.recv().await.ok_or(VerbsError::Disconnected)
    }
}

/// An incoming connection request: the peer's MPA Request was received and is waiting for
/// [`ConnectRequest::accept`] or [`ConnectRequest::reject`].
pub struct ConnectRequest {
    pub(crate) dev: Device,
    pub(crate) kind: ReqKind,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

pub(crate) enum ReqKind {
    /// A soft-iWARP MPA Request and the stream it came on.
    Soft(SoftRequest),
    /// A native provider's connect request.
    Native(Box<dyn NativeConnReq>),
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConnectRequest");
        d.field("peer", &self.peer);
        match &self.kind {
            ReqKind::Soft(s) => d.field("request", &s.req),
            ReqKind::Native(r) => d.field("request", r),
        };
        d.finish()
    }
}

impl ConnectRequest {
    fn mpa(&self) -> Option<&crate::wire::mpa::MpaFrame> {
        match &self.kind {
            ReqKind::Soft(s) => Some(&s.req),
            ReqKind::Native(_) => None,
        }
    }
    /// The initiator's ULP private data.
    pub fn private_data(&self) -> &Bytes {
        match &self.kind {
            ReqKind::Soft(s) => &s.req.private_data,
            ReqKind::Native(r) => r.private_data(),
        }
    }
    /// The initiator's IRD (None for MPA revision 1).
    pub fn ird(&self) -> Option<u16> {
        match &self.kind {
            ReqKind::Soft(s) => s.req.enhanced.map(|w| w.ird),
            ReqKind::Native(r) => Some(r.ird()),
        }
    }
    /// The initiator's ORD (None for MPA revision 1).
    pub fn ord(&self) -> Option<u16> {
        match &self.kind {
            ReqKind::Soft(s) => s.req.enhanced.map(|w| w.ord),
            ReqKind::Native(r) => Some(r.ord()),
        }
    }
    /// The initiator asked for peer-to-peer mode (RTR). Always false on rdma-core, where the
    /// kernel driver handles it.
    pub fn peer_to_peer(&self) -> bool {
        self.mpa()
            .and_then(|r| r.enhanced)
            .is_some_and(|w| w.peer_to_peer)
    }
    /// The initiator asked for CRC (false on rdma-core: the kernel driver decides).
    pub fn crc(&self) -> bool {
        self.mpa().is_some_and(|r| r.crc)
    }
    /// MPA revision of the request (0 on rdma-core, where the kernel ran MPA).
    pub fn mpa_revision(&self) -> u8 {
        self.mpa().map_or(0, |r| r.revision)
    }
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    /// Our address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Accept on `qp` (rdma_accept). With peer-to-peer the call returns after the RTR arrived.
    pub async fn accept(
        self,
        qp: &QueuePair,
        params: ConnParams,
    ) -> Result<Connection, VerbsError> {
        params.validate()?;
        let ConnectRequest {
            dev,
            kind,
            local,
            peer,
        } = self;
        match kind {
            ReqKind::Soft(s) => soft::cm::accept(&dev, s, qp, params, local, peer).await,
            ReqKind::Native(r) => r.accept(qp, params).await,
        }
    }

    /// Reject with private data (rdma_reject): the Reply carries R.
    pub async fn reject(self, private_data: &[u8]) -> Result<(), VerbsError> {
        if private_data.len() > crate::wire::mpa::MAX_ULP_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument(
                "private data longer than 256 bytes",
            ));
        }
        match self.kind {
            ReqKind::Soft(s) => {
                soft::cm::reject(&self.dev, s, private_data, self.local, self.peer).await
            }
            ReqKind::Native(r) => r.reject(private_data),
        }
    }
}

/// Connection-manager events (rdma_cm events).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEvent {
    /// RDMA_CM_EVENT_ESTABLISHED.
    Established,
    /// We sent a Terminate (a protocol or protection error was detected locally).
    TerminateSent(Terminate),
    /// The peer sent a Terminate.
    TerminateReceived(Terminate),
    /// The stream failed (I/O error); a `Disconnected` follows.
    Error(String),
    /// RDMA_CM_EVENT_DISCONNECTED: the stream is closed and all WRs were flushed.
    Disconnected,
}

pub struct Connection {
    pub(crate) qp: QueuePair,
    pub(crate) neg: Negotiated,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(crate) events: tokio::sync::Mutex<mpsc::UnboundedReceiver<CmEvent>>,
    /// Established, consumed by setup, is handed out again as the first event.
    pub(crate) first: Mutex<Option<CmEvent>>,
    pub(crate) done: watch::Receiver<bool>,
    pub(crate) stats: Arc<StatsInner>,
    /// The native side of a native provider's connection.
    pub(crate) native: Option<Box<dyn NativeConn>>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("qp", &self.qp)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("crc", &self.neg.crc)
            .finish()
    }
}

impl Drop for Connection {
    /// Dropping the connection disconnects it (like destroying an rdma_cm id): the QP goes to
    /// the error state, outstanding WRs are flushed, and the stream is closed.
    fn drop(&mut self) {
        if self.native.is_some() {
            // The native side's own Drop disconnects.
            return;
        }
        if !*self.done.borrow()
            && let Some(s) = self.qp.soft_qp()
        {
            soft::disconnect(s);
        }
    }
}

impl Connection {
    /// The connected QP.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }
    /// The peer's private data (from its Request or Reply).
    pub fn peer_private_data(&self) -> &Bytes {
        &self.neg.peer_private_data
    }
    /// Effective inbound Read depth.
    pub fn ird(&self) -> u16 {
        self.neg.ird
    }
    /// Effective outbound Read depth.
    pub fn ord(&self) -> u16 {
        self.neg.ord
    }
    /// The peer's advertised (IRD, ORD), if it used enhanced setup.
    pub fn peer_ird_ord(&self) -> Option<(u16, u16)> {
        self.neg.peer_ird_ord.map(|w| (w.ird, w.ord))
    }
    /// CRC-32C in use.
    pub fn crc(&self) -> bool {
        self.neg.crc
    }
    /// Local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
    /// Peer address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Driver counters.
    pub fn stats(&self) -> ConnStats {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConnStats {
            fpdus_tx: g(&s.fpdus_tx),
            fpdus_rx: g(&s.fpdus_rx),
            bytes_tx: g(&s.bytes_tx),
            bytes_rx: g(&s.bytes_rx),
            zero_copy_tx_bytes: g(&s.zero_copy_tx_bytes),
            direct_rx_bytes: g(&s.direct_rx_bytes),
            read_ahead_rx_bytes: g(&s.read_ahead_rx_bytes),
            direct_tx_fpdus: g(&s.direct_tx_fpdus),
        }
    }

    /// Next connection event; `None` once the connection is gone and all events were read.
    pub async fn next_event(&self) -> Option<CmEvent> {
        if let Some(e) = self.first.lock().take() {
            return Some(e);
        }
        self.events.lock().await.recv().await
    }

    /// Wait until the connection is closed (Disconnected was emitted).
    pub async fn closed(&self) {
        let mut d = self.done.clone();
        let _ = d.wait_for(|v| *v).await;
    }

    /// rdma_disconnect: move the QP to error (flushing WRs), close the stream, and wait
    /// (at most 5 s) for the peer to close its side.
    pub async fn disconnect(&self) {
        self.abort();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.closed()).await;
    }

    /// The first half of [`Connection::disconnect`], without waiting: when this returns the QP
    /// is in the error state, so no further remote access to any of its regions is placed and
    /// every outstanding WR is flushed; the stream is closed by the driver in the background.
    pub fn abort(&self) {
        if let Some(h) = &self.native {
            h.abort();
        } else if let Some(s) = self.qp.soft_qp() {
            soft::disconnect(s);
        }
    }
}

/// The driver's counters behind [`ConnStats`].
#[derive(Debug, Default)]
pub(crate) struct StatsInner {
    pub(crate) fpdus_tx: AtomicU64,
    pub(crate) fpdus_rx: AtomicU64,
    pub(crate) bytes_tx: AtomicU64,
    pub(crate) bytes_rx: AtomicU64,
    pub(crate) zero_copy_tx_bytes: AtomicU64,
    pub(crate) direct_rx_bytes: AtomicU64,
    pub(crate) read_ahead_rx_bytes: AtomicU64,
    pub(crate) direct_tx_fpdus: AtomicU64,
}

/// Counters of one connection's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnStats {
    /// FPDUs sent.
    pub fpdus_tx: u64,
    /// FPDUs received (including directly placed ones).
    pub fpdus_rx: u64,
    /// Stream bytes written (after the MPA Reply).
    pub bytes_tx: u64,
    /// Stream bytes read (after the MPA Reply).
    pub bytes_rx: u64,
    /// Payload bytes written straight from registered memory.
    pub zero_copy_tx_bytes: u64,
    /// Payload bytes read from the socket straight into registered memory.
    pub direct_rx_bytes: u64,
    /// Of those, the bytes of RDMA Read Response segments read ahead into the Read's sink in
    /// the same system call as an earlier segment, before their own header had been checked
    /// (and counted once it had, and was the one guessed).
    pub read_ahead_rx_bytes: u64,
    /// FPDUs put on the wire from the posting (or receiving) context rather than by the writer
    /// task: the first transmission after each arrival of bytes, over TCP.
    pub direct_tx_fpdus: u64,
}
