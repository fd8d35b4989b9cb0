//! Devices (providers), queue pairs and the rdma_cm-like connection manager, with the tokio
//! driver that runs the sans-IO engine over a byte stream.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf, ReadHalf, WriteHalf,
};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::VerbsError;
use crate::cq::{CompletionQueue, RecvWr, SendWr};
use crate::engine::{Engine, EngineEvent, EngineParams, QpState};
use crate::handshake::{self, LocalSetup, Negotiated, SetupError};
use crate::mem::{MrInner, ProtectionDomain, StagTable, lock};
use crate::pcap::{Capture, Dir};
use crate::wire::ddp::TAGGED_HDR_LEN;
use crate::wire::ddp::{Terminate, term};
use crate::wire::mpa::{FpduDecoder, MpaFrame, fpdu_len, frame_parts, pad_len};

/// Largest FPDU we ever transmit: the 16-bit ULPDU length bounds it (multiple of 8).
pub const MAX_FPDU: usize = 65528;
/// FPDU size used by the in-memory loopback provider (the MSS of Linux loopback, rounded to 8).
pub const LOOPBACK_FPDU: usize = 65480;

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

/// An in-memory network for the loopback provider: listeners register addresses, connects
/// find them. No sockets; everything runs over in-process byte pipes.
#[derive(Clone, Default)]
pub struct LoopbackFabric {
    inner: Arc<FabricInner>,
}

#[derive(Default)]
struct FabricInner {
    listeners: Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<(DuplexStream, SocketAddr)>>>,
    next_port: AtomicU16,
}

impl fmt::Debug for LoopbackFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackFabric").finish_non_exhaustive()
    }
}

impl LoopbackFabric {
    /// A new, empty fabric.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Which provider a [`Device`] uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Provider {
    /// Soft-iWARP (MPA/DDP/RDMAP) over tokio TCP.
    SoftIwarp(SoftIwarpConfig),
    /// The same protocol stack over in-memory pipes of a [`LoopbackFabric`].
    Loopback(LoopbackFabric, SoftIwarpConfig),
    /// A real RDMA device (NIC, kernel siw or rxe) through rdma-core.
    #[cfg(feature = "rdma-core")]
    RdmaCore(crate::hw::RdmaCoreConfig),
}

static DEFAULT_DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();

/// An RDMA device: owns the STag table; creates PDs, CQs, QPs, listeners and connections.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    table: Arc<StagTable>,
    provider: Provider,
    next_qp: AtomicU32,
    /// The rdma-core device, or why it could not be opened.
    #[cfg(feature = "rdma-core")]
    hw: Option<Result<Arc<crate::hw::HwDevice>, VerbsError>>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("provider", &self.inner.provider)
            .finish()
    }
}

impl Device {
    /// Open a device on `provider`.
    pub fn open(provider: Provider) -> Self {
        #[cfg(feature = "rdma-core")]
        let hw = match &provider {
            Provider::RdmaCore(c) => Some(crate::hw::HwDevice::open(c.clone())),
            _ => None,
        };
        Self {
            inner: Arc::new(DeviceInner {
                table: StagTable::new(),
                provider,
                next_qp: AtomicU32::new(1),
                #[cfg(feature = "rdma-core")]
                hw,
            }),
        }
    }

    /// Open an rdma-core device (feature `rdma-core`): fails with [`VerbsError::NoDevice`]
    /// where rdma-core or the named device is missing.
    #[cfg(feature = "rdma-core")]
    pub fn rdma_core(config: crate::hw::RdmaCoreConfig) -> Result<Self, VerbsError> {
        let d = Self::open(Provider::RdmaCore(config));
        if let Some(Err(e)) = &d.inner.hw {
            return Err(e.clone());
        }
        Ok(d)
    }

    /// A device from a provider name, as the CLI's `--provider` takes it: `soft-iwarp`, or
    /// `rdma-core` / `rdma-core:DEVICE` (feature `rdma-core`).
    pub fn from_spec(spec: &str) -> Result<Self, VerbsError> {
        match spec {
            "soft-iwarp" | "siw" | "" => Ok(Self::soft_iwarp()),
            s if s == "rdma-core" || s.starts_with("rdma-core:") => {
                #[cfg(feature = "rdma-core")]
                {
                    let name = s.strip_prefix("rdma-core:").map(str::to_string);
                    Self::rdma_core(crate::hw::RdmaCoreConfig {
                        device: name,
                        ..Default::default()
                    })
                }
                #[cfg(not(feature = "rdma-core"))]
                Err(VerbsError::NoDevice(
                    "this build has no rdma-core provider (build with --features rdma-core)".into(),
                ))
            }
            _ => Err(VerbsError::InvalidArgument(
                "unknown provider (soft-iwarp, rdma-core or rdma-core:DEVICE)",
            )),
        }
    }

    /// True for an rdma-core device.
    pub fn is_rdma_core(&self) -> bool {
        #[cfg(feature = "rdma-core")]
        if self.inner.hw.is_some() {
            return true;
        }
        false
    }

    /// The rdma-core device behind this `Device`, if it is one.
    #[cfg(feature = "rdma-core")]
    pub fn rdma_core_info(&self) -> Option<crate::hw::RdmaCoreDevice> {
        match &self.inner.hw {
            Some(Ok(h)) => Some(crate::hw::RdmaCoreDevice {
                name: h.name.clone(),
                iwarp: h.iwarp,
            }),
            _ => None,
        }
    }

    /// Provider and device, for people: `soft-iwarp`, `loopback` or `rdma-core:NAME`.
    pub fn describe(&self) -> String {
        match &self.inner.provider {
            Provider::SoftIwarp(_) => "soft-iwarp".into(),
            Provider::Loopback(..) => "loopback".into(),
            #[cfg(feature = "rdma-core")]
            Provider::RdmaCore(_) => match &self.inner.hw {
                Some(Ok(h)) => format!(
                    "rdma-core:{} ({})",
                    h.name,
                    if h.iwarp { "iWARP" } else { "IB/RoCE" }
                ),
                _ => "rdma-core (unavailable)".into(),
            },
        }
    }

    #[cfg(feature = "rdma-core")]
    pub(crate) fn hw(&self) -> Option<Result<&Arc<crate::hw::HwDevice>, VerbsError>> {
        self.inner
            .hw
            .as_ref()
            .map(|r| r.as_ref().map_err(Clone::clone))
    }

    /// Soft-iWARP over TCP with default settings.
    pub fn soft_iwarp() -> Self {
        Self::open(Provider::SoftIwarp(SoftIwarpConfig::default()))
    }

    /// The process's default device: the one given to [`Device::set_default`] (the CLI's
    /// `--provider`), else a new soft-iWARP device. Upper layers use it when their
    /// configuration names no device.
    pub fn default_device() -> Self {
        DEFAULT_DEVICE
            .get()
            .cloned()
            .unwrap_or_else(Self::soft_iwarp)
    }

    /// Make `dev` the process's default device (once; later calls are refused with the
    /// device back).
    pub fn set_default(dev: Device) -> Result<(), Device> {
        DEFAULT_DEVICE.set(dev)
    }

    /// In-memory loopback provider on `fabric`.
    pub fn loopback(fabric: &LoopbackFabric) -> Self {
        Self::open(Provider::Loopback(
            fabric.clone(),
            SoftIwarpConfig::default(),
        ))
    }

    pub(crate) fn table(&self) -> Arc<StagTable> {
        self.inner.table.clone()
    }

    fn config(&self) -> &SoftIwarpConfig {
        match &self.inner.provider {
            Provider::SoftIwarp(c) | Provider::Loopback(_, c) => c,
            #[cfg(feature = "rdma-core")]
            Provider::RdmaCore(_) => {
                static DEFAULT: std::sync::LazyLock<SoftIwarpConfig> =
                    std::sync::LazyLock::new(SoftIwarpConfig::default);
                &DEFAULT
            }
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain::new(self.clone())
    }

    /// Create a completion queue.
    pub fn create_cq(&self) -> CompletionQueue {
        #[allow(unused_mut)]
        let mut cq = CompletionQueue::new();
        #[cfg(feature = "rdma-core")]
        if let Some(h) = self.hw() {
            cq.hw = Some(h.and_then(|d| crate::hw::HwCq::create(d, cq.inner.clone())));
        }
        cq
    }

    /// Create a reliable-connected QP in `pd`. Receives may be posted before connecting.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> QueuePair {
        let qp_num = self.inner.next_qp.fetch_add(1, Ordering::Relaxed);
        let engine = Engine::new(
            qp_num,
            pd.id,
            pd.table.clone(),
            send_cq.inner.clone(),
            recv_cq.inner.clone(),
        );
        #[cfg(feature = "rdma-core")]
        let hw = self.hw().map(|d| {
            d?;
            let pd_hw = pd.hw.clone().ok_or(VerbsError::InvalidArgument(
                "the PD belongs to another provider",
            ))??;
            let cq = |c: &CompletionQueue| -> Result<Arc<crate::hw::HwCq>, VerbsError> {
                match c.hw.as_ref() {
                    Some(Ok(h)) => Ok(h.clone()),
                    Some(Err(e)) => Err(e.clone()),
                    None => Err(VerbsError::InvalidArgument(
                        "the CQ belongs to another provider",
                    )),
                }
            };
            Ok(crate::hw::HwQueuePair::new(
                &pd_hw,
                &cq(send_cq)?,
                &cq(recv_cq)?,
                send_cq.inner.clone(),
                recv_cq.inner.clone(),
                qp_num,
            ))
        });
        QueuePair {
            shared: Arc::new(QpShared {
                #[cfg(feature = "rdma-core")]
                hw,
                engine: Mutex::new(engine),
                wake: Notify::new(),
                qp_num,
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                pd: pd.clone(),
                connected: Mutex::new(false),
                direct_tx: Mutex::new(None),
                direct_armed: std::sync::atomic::AtomicBool::new(true),
            }),
        }
    }

    /// Listen on `addr` (rdma_listen). Port 0 picks a free port.
    pub async fn listen(&self, addr: SocketAddr) -> Result<Listener, VerbsError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let dev = self.clone();
        match &self.inner.provider {
            #[cfg(feature = "rdma-core")]
            Provider::RdmaCore(_) => {
                let hw = self
                    .hw()
                    .ok_or(VerbsError::InvalidState("no rdma-core device"))??
                    .clone();
                let l = crate::hw::listen(&hw, addr)?;
                let local = l.local;
                let task = tokio::spawn(async move {
                    while let Ok(r) = l.next_request(&hw).await {
                        let (local, peer) = (r.local, r.peer);
                        let req = ConnectRequest {
                            dev: dev.clone(),
                            kind: ReqKind::Hw(r),
                            local,
                            peer,
                        };
                        if tx.send(req).is_err() {
                            break;
                        }
                    }
                });
                Ok(Listener {
                    rx,
                    local_addr: local,
                    task,
                    fabric: None,
                })
            }
            Provider::SoftIwarp(_) => {
                let l = TcpListener::bind(addr).await?;
                let local = l.local_addr()?;
                let task = tokio::spawn(async move {
                    while let Ok((s, peer)) = l.accept().await {
                        let dev = dev.clone();
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            if let Ok(t) = dev.tune_tcp(s) {
                                incoming(dev, Transport::Tcp(t), local, peer, tx).await;
                            }
                        });
                    }
                });
                Ok(Listener {
                    rx,
                    local_addr: local,
                    task,
                    fabric: None,
                })
            }
            Provider::Loopback(fabric, _) => {
                let mut local = addr;
                if local.port() == 0 {
                    local.set_port(fabric.ephemeral());
                }
                let (ltx, mut lrx) = mpsc::unbounded_channel();
                {
                    let mut m = lock(&fabric.inner.listeners);
                    if m.contains_key(&local) {
                        return Err(VerbsError::Io(
                            io::Error::from(io::ErrorKind::AddrInUse).to_string(),
                        ));
                    }
                    m.insert(local, ltx);
                }
                let task = tokio::spawn(async move {
                    while let Some((s, peer)) = lrx.recv().await {
                        let dev = dev.clone();
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            incoming(dev, Transport::Mem(s), local, peer, tx).await
                        });
                    }
                });
                Ok(Listener {
                    rx,
                    local_addr: local,
                    task,
                    fabric: Some(fabric.clone()),
                })
            }
        }
    }

    fn tune_tcp(&self, s: TcpStream) -> io::Result<TcpStream> {
        // siw: TCP_NODELAY on.
        s.set_nodelay(true)?;
        let buf = self.config().socket_buffer;
        if buf > 0 {
            let sr = socket2::SockRef::from(&s);
            let _ = sr.set_send_buffer_size(buf);
            let _ = sr.set_recv_buffer_size(buf);
        }
        Ok(s)
    }

    /// Connect `qp` to a listener (rdma_connect). Returns once established, or the peer's
    /// rejection as [`VerbsError::Rejected`].
    pub async fn connect(
        &self,
        qp: &QueuePair,
        addr: SocketAddr,
        params: ConnParams,
    ) -> Result<Connection, VerbsError> {
        params.validate()?;
        #[cfg(feature = "rdma-core")]
        if let Some(hw) = self.hw() {
            let hw = hw?;
            let qhw = qp.hw()?;
            return Connection::establish_hw(
                qp,
                crate::hw::connect(hw, qhw, addr, &params.private_data, params.ird, params.ord),
            )
            .await;
        }
        let (transport, local) = match &self.inner.provider {
            Provider::SoftIwarp(_) => {
                let s = self.tune_tcp(TcpStream::connect(addr).await?)?;
                let local = s.local_addr()?;
                (Transport::Tcp(s), local)
            }
            #[cfg(feature = "rdma-core")]
            Provider::RdmaCore(_) => return Err(VerbsError::InvalidState("no rdma-core device")),
            Provider::Loopback(fabric, _) => {
                let l = lock(&fabric.inner.listeners).get(&addr).cloned();
                let Some(l) = l else {
                    return Err(VerbsError::Io(
                        io::Error::from(io::ErrorKind::ConnectionRefused).to_string(),
                    ));
                };
                let local = SocketAddr::new(addr.ip(), fabric.ephemeral());
                let (a, b) = tokio::io::duplex(1 << 20);
                l.send((b, local))
                    .map_err(|_| VerbsError::Io("listener closed".into()))?;
                (Transport::Mem(a), local)
            }
        };
        let mut t = transport;
        let mut capture = self.capture_for(&params, local, addr, true);
        let setup = params.setup();
        let req = handshake::build_request(&setup)?;
        let req_bytes = req.encode()?;
        if let Some(c) = capture.as_mut() {
            let _ = c.record(Dir::Out, &req_bytes);
        }
        t.write_all(&req_bytes).await?;
        let mut buf = BytesMut::with_capacity(1024);
        let rep = tokio::time::timeout(handshake::INITIATOR_TIMEOUT, read_frame(&mut t, &mut buf))
            .await
            .map_err(|_| VerbsError::Timeout)??;
        if let Some(c) = capture.as_mut() {
            let _ = c.record(Dir::In, &rep.1);
        }
        let neg = match handshake::on_reply(&setup, &rep.0) {
            Ok(n) => n,
            Err(e) => {
                let _ = t.shutdown().await;
                return Err(e.into());
            }
        };
        if let Some(c) = capture.as_mut().filter(|_| !buf.is_empty()) {
            let _ = c.record(Dir::In, &buf);
        }
        let fpdu = (
            self.max_fpdu(&t),
            self.config().rx_chunk.max(64),
            self.fpdu_cap(),
        );
        start_connection(qp, t, buf, neg, fpdu, capture, local, addr).await
    }

    fn fpdu_cap(&self) -> usize {
        self.config().max_fpdu.min(MAX_FPDU)
    }

    fn max_fpdu(&self, t: &Transport) -> usize {
        match t {
            Transport::Tcp(s) => fpdu_for_mss(s, self.fpdu_cap()),
            Transport::Mem(_) => (LOOPBACK_FPDU.min(self.fpdu_cap()) & !7).max(64),
        }
    }

    fn capture_for(
        &self,
        p: &ConnParams,
        local: SocketAddr,
        peer: SocketAddr,
        initiator: bool,
    ) -> Option<Capture> {
        let dir = p
            .capture_dir
            .clone()
            .or_else(|| self.config().capture_dir.clone())
            .or_else(|| std::env::var_os("OXRDMA_PCAP_DIR").map(PathBuf::from))?;
        match Capture::create(&dir, local, peer, initiator) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!("cannot create capture in {}: {e}", dir.display());
                None
            }
        }
    }
}

impl LoopbackFabric {
    fn ephemeral(&self) -> u16 {
        let p = self.inner.next_port.fetch_add(1, Ordering::Relaxed);
        40000 + (p % 20000)
    }
}

async fn incoming(
    dev: Device,
    mut t: Transport,
    local: SocketAddr,
    peer: SocketAddr,
    tx: mpsc::UnboundedSender<ConnectRequest>,
) {
    let mut buf = BytesMut::with_capacity(1024);
    // siw: the responder waits 5 s for the MPA Request.
    let Ok(Ok((req, raw))) =
        tokio::time::timeout(handshake::RESPONDER_TIMEOUT, read_frame(&mut t, &mut buf)).await
    else {
        return;
    };
    if let Err((e, reply)) = handshake::screen_request(&req) {
        tracing::debug!("refusing MPA request from {peer}: {e}");
        if let Ok(b) = reply.encode() {
            let _ = t.write_all(&b).await;
        }
        let _ = t.shutdown().await;
        return;
    }
    let _ = tx.send(ConnectRequest {
        dev,
        kind: ReqKind::Soft {
            t,
            req,
            raw,
            leftover: buf,
        },
        local,
        peer,
    });
}

async fn read_frame(
    t: &mut Transport,
    buf: &mut BytesMut,
) -> Result<(MpaFrame, Bytes), VerbsError> {
    loop {
        if let Some((f, n)) = MpaFrame::decode(buf)? {
            let raw = buf.split_to(n).freeze();
            return Ok((f, raw));
        }
        if t.read_buf(buf).await? == 0 {
            return Err(VerbsError::Disconnected);
        }
        if buf.len() > 4096 {
            return Err(VerbsError::Protocol("MPA frame too long"));
        }
    }
}

/// Byte stream under a connection.
enum Transport {
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

/// Connection parameters (rdma_conn_param + MPA options).
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
    fn validate(&self) -> Result<(), VerbsError> {
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

    fn setup(&self) -> LocalSetup {
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
            lock(&f.inner.listeners).remove(&self.local_addr);
        }
    }
}

impl Listener {
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
    dev: Device,
    kind: ReqKind,
    local: SocketAddr,
    peer: SocketAddr,
}

enum ReqKind {
    /// A soft-iWARP MPA Request and the stream it came on.
    Soft {
        t: Transport,
        req: MpaFrame,
        raw: Bytes,
        leftover: BytesMut,
    },
    /// An rdma_cm connect request (rdma-core provider).
    #[cfg(feature = "rdma-core")]
    Hw(crate::hw::HwConnReq),
}

impl fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConnectRequest");
        d.field("peer", &self.peer);
        match &self.kind {
            ReqKind::Soft { req, .. } => d.field("request", req),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => d.field("request", r),
        };
        d.finish()
    }
}

impl ConnectRequest {
    fn mpa(&self) -> Option<&MpaFrame> {
        match &self.kind {
            ReqKind::Soft { req, .. } => Some(req),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(_) => None,
        }
    }
    /// The initiator's ULP private data.
    pub fn private_data(&self) -> &Bytes {
        match &self.kind {
            ReqKind::Soft { req, .. } => &req.private_data,
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => &r.private_data,
        }
    }
    /// The initiator's IRD (None for MPA revision 1).
    pub fn ird(&self) -> Option<u16> {
        match &self.kind {
            ReqKind::Soft { req, .. } => req.enhanced.map(|w| w.ird),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => Some(u16::from(r.peer_ird)),
        }
    }
    /// The initiator's ORD (None for MPA revision 1).
    pub fn ord(&self) -> Option<u16> {
        match &self.kind {
            ReqKind::Soft { req, .. } => req.enhanced.map(|w| w.ord),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => Some(u16::from(r.peer_ord)),
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

    fn capture(&self, p: &ConnParams) -> Option<Capture> {
        #[cfg_attr(not(feature = "rdma-core"), allow(irrefutable_let_patterns))]
        let ReqKind::Soft { raw, .. } = &self.kind else {
            return None;
        };
        let mut c = self.dev.capture_for(p, self.local, self.peer, false)?;
        let _ = c.record(Dir::In, raw);
        Some(c)
    }

    /// Accept on `qp` (rdma_accept). With peer-to-peer the call returns after the RTR arrived.
    pub async fn accept(
        self,
        qp: &QueuePair,
        params: ConnParams,
    ) -> Result<Connection, VerbsError> {
        params.validate()?;
        let mut capture = self.capture(&params);
        let ConnectRequest {
            dev,
            kind,
            local,
            peer,
        } = self;
        let (mut t, req, leftover) = match kind {
            ReqKind::Soft {
                t, req, leftover, ..
            } => (t, req, leftover),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => {
                let qhw = qp.hw()?;
                return Connection::establish_hw(
                    qp,
                    r.accept(qhw, &params.private_data, params.ird, params.ord),
                )
                .await;
            }
        };
        let (reply, neg) = handshake::accept_request(&req, &params.setup())?;
        let b = reply.encode()?;
        if let Some(c) = capture.as_mut() {
            let _ = c.record(Dir::Out, &b);
            if !leftover.is_empty() {
                let _ = c.record(Dir::In, &leftover);
            }
        }
        t.write_all(&b).await?;
        let fpdu = (
            dev.max_fpdu(&t),
            dev.config().rx_chunk.max(64),
            dev.fpdu_cap(),
        );
        let conn =
            start_connection(qp, t, leftover, neg.clone(), fpdu, capture, local, peer).await?;
        Ok(conn)
    }

    /// Reject with private data (rdma_reject): the Reply carries R.
    pub async fn reject(self, private_data: &[u8]) -> Result<(), VerbsError> {
        if private_data.len() > crate::wire::mpa::MAX_ULP_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument(
                "private data longer than 256 bytes",
            ));
        }
        let mut capture = self.capture(&ConnParams::default());
        let (mut t, req) = match self.kind {
            ReqKind::Soft { t, req, .. } => (t, req),
            #[cfg(feature = "rdma-core")]
            ReqKind::Hw(r) => return r.reject(private_data),
        };
        let b = handshake::reject_reply(&req, Bytes::copy_from_slice(private_data)).encode()?;
        if let Some(c) = capture.as_mut() {
            let _ = c.record(Dir::Out, &b);
        }
        t.write_all(&b).await?;
        let _ = t.shutdown().await;
        Ok(())
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

pub(crate) struct QpShared {
    /// The rdma-core QP (or why it cannot exist); declared first so it is destroyed first.
    #[cfg(feature = "rdma-core")]
    pub(crate) hw: Option<Result<crate::hw::HwQueuePair, VerbsError>>,
    pub(crate) engine: Mutex<Engine>,
    pub(crate) wake: Notify,
    pub(crate) qp_num: u32,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    pub(crate) pd: ProtectionDomain,
    connected: Mutex<bool>,
    /// The transmit path of a connection over TCP, while it runs: lets `post_send` and the
    /// reader put segments on the wire from the caller's context (see [`transmit_now`]).
    direct_tx: Mutex<Option<Arc<TxPath>>>,
    /// Set when bytes arrive, taken by the first direct transmission after them.
    direct_armed: std::sync::atomic::AtomicBool,
}

/// A reliable-connected queue pair. Clones are handles to the same QP.
#[derive(Clone)]
pub struct QueuePair {
    pub(crate) shared: Arc<QpShared>,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.shared.qp_num)
            .field("state", &self.state())
            .finish()
    }
}

impl QueuePair {
    /// Mark the QP as having its connection (a QP carries one connection in its life).
    fn claim_connection(&self) -> Result<(), VerbsError> {
        let mut c = lock(&self.shared.connected);
        if *c {
            return Err(VerbsError::InvalidState("QP already connected"));
        }
        *c = true;
        Ok(())
    }

    /// The rdma-core QP behind this handle, if it is one.
    #[cfg(feature = "rdma-core")]
    fn hw(&self) -> Result<&crate::hw::HwQueuePair, VerbsError> {
        match &self.shared.hw {
            Some(Ok(h)) => Ok(h),
            Some(Err(e)) => Err(e.clone()),
            None => Err(VerbsError::InvalidArgument(
                "the QP belongs to another provider",
            )),
        }
    }

    /// QP number (local, unique per device; on rdma-core the device's number once connected).
    pub fn qp_num(&self) -> u32 {
        #[cfg(feature = "rdma-core")]
        if let Some(Ok(h)) = &self.shared.hw {
            return h.qp_num();
        }
        self.shared.qp_num
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        #[cfg(feature = "rdma-core")]
        if let Some(h) = &self.shared.hw {
            return h.as_ref().map_or(QpState::Error, |h| h.state());
        }
        lock_engine(&self.shared.engine).state
    }
    /// The PD the QP was created in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.shared.pd
    }
    /// Send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.shared.send_cq
    }
    /// Receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.shared.recv_cq
    }

    /// Post a send-queue WR (ibv_post_send). Fails only for malformed WRs or an unconnected QP;
    /// on an errored QP the WR completes with `WrFlushError`.
    pub fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        #[cfg(feature = "rdma-core")]
        if self.shared.hw.is_some() {
            return self.hw()?.post_send(wr);
        }
        lock_engine(&self.shared.engine).post_send(wr)?;
        transmit_now(&self.shared);
        Ok(())
    }

    /// Post several WRs in order.
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), VerbsError> {
        #[cfg(feature = "rdma-core")]
        if self.shared.hw.is_some() {
            let h = self.hw()?;
            for wr in wrs {
                h.post_send(wr)?;
            }
            return Ok(());
        }
        {
            let mut e = lock_engine(&self.shared.engine);
            for wr in wrs {
                e.post_send(wr)?;
            }
        }
        transmit_now(&self.shared);
        Ok(())
    }

    /// Post a receive WR (ibv_post_recv). Allowed before the connection is established.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        #[cfg(feature = "rdma-core")]
        if self.shared.hw.is_some() {
            return self.hw()?.post_recv(wr);
        }
        lock_engine(&self.shared.engine).post_recv(wr);
        Ok(())
    }
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

/// An established connection: the QP plus what the peer told us.
pub struct Connection {
    qp: QueuePair,
    neg: Negotiated,
    local: SocketAddr,
    peer: SocketAddr,
    events: tokio::sync::Mutex<mpsc::UnboundedReceiver<CmEvent>>,
    /// Established, consumed by setup, is handed out again as the first event.
    first: Mutex<Option<CmEvent>>,
    done: watch::Receiver<bool>,
    stats: Arc<StatsInner>,
    /// The rdma_cm side of an rdma-core connection.
    #[cfg(feature = "rdma-core")]
    hw: Option<crate::hw::HwConnGuard>,
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
        #[cfg(feature = "rdma-core")]
        if self.hw.is_some() {
            // HwConnGuard's own Drop disconnects.
            return;
        }
        if !*self.done.borrow() {
            lock_engine(&self.qp.shared.engine).on_disconnect();
            self.qp.shared.wake.notify_one();
        }
    }
}

impl Connection {
    /// Claim `qp`, run the rdma-core connect or accept, and give the QP back for another try
    /// if that fails.
    #[cfg(feature = "rdma-core")]
    async fn establish_hw(
        qp: &QueuePair,
        establish: impl std::future::Future<Output = Result<crate::hw::HwEstablished, VerbsError>>,
    ) -> Result<Connection, VerbsError> {
        qp.claim_connection()?;
        match establish.await {
            Ok(e) => Ok(Connection::from_hw(qp, e)),
            Err(e) => {
                *lock(&qp.shared.connected) = false;
                Err(e)
            }
        }
    }

    #[cfg(feature = "rdma-core")]
    fn from_hw(qp: &QueuePair, e: crate::hw::HwEstablished) -> Connection {
        Connection {
            qp: qp.clone(),
            neg: Negotiated {
                crc: false,
                ird: e.ird,
                ord: e.ord,
                send_rtr: None,
                await_rtr: false,
                peer_private_data: e.peer_private_data,
                peer_ird_ord: None,
            },
            local: e.local,
            peer: e.peer,
            events: tokio::sync::Mutex::new(e.events),
            first: Mutex::new(Some(CmEvent::Established)),
            done: e.done,
            stats: Arc::new(StatsInner::default()),
            hw: Some(e.guard),
        }
    }

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
            direct_tx_fpdus: g(&s.direct_tx_fpdus),
        }
    }

    /// Next connection event; `None` once the connection is gone and all events were read.
    pub async fn next_event(&self) -> Option<CmEvent> {
        if let Some(e) = lock(&self.first).take() {
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
        #[cfg(feature = "rdma-core")]
        if let Some(h) = &self.hw {
            h.abort();
            return;
        }
        lock_engine(&self.qp.shared.engine).on_disconnect();
        self.qp.shared.wake.notify_one();
    }
}

#[allow(clippy::too_many_arguments)]
async fn start_connection(
    qp: &QueuePair,
    t: Transport,
    leftover: BytesMut,
    neg: Negotiated,
    (max_fpdu, rx_chunk, fpdu_cap): (usize, usize, usize),
    capture: Option<Capture>,
    local: SocketAddr,
    peer: SocketAddr,
) -> Result<Connection, VerbsError> {
    qp.claim_connection()?;
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = watch::channel(false);
    // Writes straight from registered memory: TCP only, and only without CRC (the CRC would be
    // computed over bytes the application may still change).
    let zero_copy_tx = matches!(t, Transport::Tcp(_)) && !neg.crc;
    {
        let mut e = lock_engine(&qp.shared.engine);
        e.start(EngineParams {
            ird: u32::from(neg.ird),
            ord: u32::from(neg.ord),
            // ULPDU + 2-byte length + 4-byte CRC; max_fpdu is a multiple of 8 so no pad.
            max_ulpdu: max_fpdu - 6,
            send_rtr: neg.send_rtr,
            await_rtr: neg.await_rtr,
            zero_copy_tx,
        });
    }
    let capture = capture.map(|c| Arc::new(Mutex::new(c)));
    let stats = Arc::new(StatsInner::default());
    let ctx = Arc::new(DriverCtx {
        qp: qp.shared.clone(),
        ev: ev_tx,
        capture,
        crc: neg.crc,
        stats: stats.clone(),
        rx_chunk,
        fpdu_cap,
    });
    match t {
        Transport::Tcp(s) => {
            let (r, w) = s.into_split();
            spawn_driver(In::Tcp(r), Out::Tcp(w), leftover, ctx, done_tx);
        }
        Transport::Mem(s) => {
            let (r, w) = tokio::io::split(s);
            spawn_driver(In::Mem(r), Out::Mem(w), leftover, ctx, done_tx);
        }
    }
    qp.shared.wake.notify_one();
    let conn = Connection {
        qp: qp.clone(),
        neg,
        local,
        peer,
        events: tokio::sync::Mutex::new(ev_rx),
        first: Mutex::new(None),
        done: done_rx,
        stats,
        #[cfg(feature = "rdma-core")]
        hw: None,
    };
    // Wait for Established (immediately, or after the RTR for a peer-to-peer responder).
    // A peer-to-peer responder waits for the RTR; give up like the MPA timers do.
    let established = {
        let mut rx = conn.events.lock().await;
        match tokio::time::timeout(handshake::INITIATOR_TIMEOUT, rx.recv()).await {
            Ok(Some(CmEvent::Established)) => Ok(()),
            Ok(Some(other)) => Err(other),
            Ok(None) | Err(_) => Err(CmEvent::Disconnected),
        }
    };
    match established {
        Ok(()) => {
            *lock(&conn.first) = Some(CmEvent::Established);
            Ok(conn)
        }
        Err(ev) => {
            tracing::debug!("connection failed during setup: {ev:?}");
            Err(VerbsError::Protocol(
                "connection failed before it was established",
            ))
        }
    }
}

struct DriverCtx {
    qp: Arc<QpShared>,
    ev: mpsc::UnboundedSender<CmEvent>,
    capture: Option<Arc<Mutex<Capture>>>,
    crc: bool,
    stats: Arc<StatsInner>,
    rx_chunk: usize,
    /// The configured largest FPDU (the MSS may allow more).
    fpdu_cap: usize,
}

#[derive(Debug, Default)]
struct StatsInner {
    fpdus_tx: AtomicU64,
    fpdus_rx: AtomicU64,
    bytes_tx: AtomicU64,
    bytes_rx: AtomicU64,
    zero_copy_tx_bytes: AtomicU64,
    direct_rx_bytes: AtomicU64,
    direct_tx_fpdus: AtomicU64,
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
    /// FPDUs put on the wire from the posting (or receiving) context rather than by the writer
    /// task: the first transmission after each arrival of bytes, over TCP.
    pub direct_tx_fpdus: u64,
}

impl DriverCtx {
    fn drain(&self, e: &mut Engine) {
        for ev in e.events.drain(..) {
            let _ = self.ev.send(match ev {
                EngineEvent::Established => CmEvent::Established,
                EngineEvent::TerminateSent(t) => CmEvent::TerminateSent(t),
                EngineEvent::TerminateReceived(t) => CmEvent::TerminateReceived(t),
            });
        }
    }
}

/// Read half of a connection.
enum In {
    Tcp(OwnedReadHalf),
    Mem(ReadHalf<DuplexStream>),
}

/// Write half of a connection.
enum Out {
    Tcp(OwnedWriteHalf),
    Mem(WriteHalf<DuplexStream>),
}

/// A piece of the outgoing byte stream: owned bytes, or bytes still in a registered region.
enum Piece {
    B(Bytes),
    M(Arc<MrInner>, usize, usize),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::B(b) => b.len(),
            Piece::M(_, _, n) => *n,
        }
    }
    fn advance(&mut self, n: usize) {
        match self {
            Piece::B(b) => b.advance(n),
            Piece::M(_, off, len) => {
                *off += n;
                *len -= n;
            }
        }
    }
    fn to_bytes(&self) -> Bytes {
        match self {
            Piece::B(b) => b.clone(),
            Piece::M(m, off, len) => Bytes::copy_from_slice(&lock(&m.data)[*off..*off + *len]),
        }
    }
}

fn spawn_driver(r: In, w: Out, leftover: BytesMut, ctx: Arc<DriverCtx>, done: watch::Sender<bool>) {
    let wctx = ctx.clone();
    let writer = tokio::spawn(async move {
        let res = match w {
            Out::Tcp(w) => {
                let tx = Arc::new(TxPath {
                    w,
                    pieces: Mutex::new(VecDeque::new()),
                    ctx: wctx.clone(),
                });
                *lock(&wctx.qp.direct_tx) = Some(tx.clone());
                let res = tcp_writer_loop(tx).await;
                // Breaks the QP -> TxPath -> DriverCtx -> QP cycle; nobody writes any more.
                lock(&wctx.qp.direct_tx).take();
                res
            }
            Out::Mem(w) => mem_writer_loop(w, &wctx).await,
        };
        if let Err(e) = res {
            tracing::debug!("writer ended: {e}");
            let _ = wctx.ev.send(CmEvent::Error(e.to_string()));
            let mut eng = lock_engine(&wctx.qp.engine);
            eng.on_disconnect();
            wctx.drain(&mut eng);
        }
    });
    tokio::spawn(async move {
        if let Err(e) = reader_loop(r, leftover, &ctx).await {
            tracing::debug!("reader ended: {e}");
            let _ = ctx.ev.send(CmEvent::Error(e.to_string()));
        }
        {
            let mut eng = lock_engine(&ctx.qp.engine);
            eng.on_disconnect();
            ctx.drain(&mut eng);
        }
        ctx.qp.wake.notify_one();
        // Let the writer send what is queued (e.g. a Terminate) and close its half.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
        if let Some(c) = &ctx.capture {
            let _ = lock(c).close();
        }
        let _ = ctx.ev.send(CmEvent::Disconnected);
        let _ = done.send(true);
    });
}

/// Below this payload size a tagged segment is not worth placing directly from the socket.
const DIRECT_MIN: usize = 8192;

async fn reader_loop(mut r: In, mut buf: BytesMut, ctx: &DriverCtx) -> io::Result<()> {
    let mut dec = FpduDecoder::new(ctx.crc);
    // Direct placement needs the raw socket, no CRC (the CRC must be checked before placing,
    // RFC 5044 §4.1) and no capture (which records the bytes it reads).
    let direct = matches!(r, In::Tcp(_)) && !ctx.crc && ctx.capture.is_none();
    let mut skip = 0usize;
    // The last FPDU taken was a large tagged segment with more of its message to come: the
    // next one is most likely another, so read only its header and place it directly.
    let mut bulk = false;
    loop {
        transmit_batch(&ctx.qp, || {
            loop {
                if direct && skip == 0 && buf.len() >= 3 {
                    let ulen = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                    // DDP control (RFC 5041 §4.2): T = 0x80 tagged, L = 0x40 last segment.
                    bulk = buf[2] & 0xc0 == 0x80 && ulen >= TAGGED_HDR_LEN + DIRECT_MIN;
                }
                // The engine lock is taken per FPDU, not per read: posters on other threads wait
                // for one placement at most, and completion handlers run between FPDUs.
                let decoded = dec.decode(&mut buf);
                let mut eng = lock_engine(&ctx.qp.engine);
                let more = !eng.closing
                    && match decoded {
                        Ok(Some(u)) => {
                            ctx.stats.fpdus_rx.fetch_add(1, Ordering::Relaxed);
                            eng.on_ulpdu(&u);
                            true
                        }
                        Ok(None) => false,
                        Err(_) => {
                            // RFC 5044 §8: a CRC error is fatal; report it with a Terminate.
                            eng.on_llp_error(term::MPA_CRC);
                            false
                        }
                    };
                if !more {
                    ctx.drain(&mut eng);
                    // Read Responses, Terminates and replies: out from this task when the queue
                    // is idle.
                    break (eng.has_tx() || eng.closing, ());
                }
            }
        });
        if let (true, In::Tcp(tcp)) = (direct, &r)
            && let Some(s) = place_direct(tcp.as_ref(), &mut buf, ctx).await?
        {
            skip = s;
            continue;
        }
        if buf.capacity() - buf.len() < ctx.rx_chunk {
            buf.reserve(ctx.rx_chunk);
        }
        let before = buf.len();
        let limit = if direct && bulk && buf.is_empty() && skip == 0 {
            (2 + TAGGED_HDR_LEN) as u64
        } else {
            ctx.rx_chunk as u64
        };
        let n = match &mut r {
            In::Tcp(t) => t.take(limit).read_buf(&mut buf).await?,
            In::Mem(m) => m.take(limit).read_buf(&mut buf).await?,
        };
        if n == 0 {
            return Ok(());
        }
        ctx.qp.direct_armed.store(true, Ordering::Release);
        ctx.stats.bytes_rx.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(c) = &ctx.capture {
            let _ = lock(c).record(Dir::In, &buf[before..]);
        }
        if skip > 0 {
            let k = skip.min(buf.len());
            buf.advance(k);
            skip -= k;
        }
        // After a Terminate nothing more is placed; keep reading until the peer closes.
        if lock_engine(&ctx.qp.engine).closing {
            buf.clear();
        }
    }
}

/// If `buf` starts with the header of a large tagged segment whose payload has not fully arrived,
/// read that payload from the socket straight into the target region, and with it (one
/// `readv`) the segment's trailer and the next FPDU's header, which is left in `buf`: in a
/// stream of RDMA Write or Read Response segments every one after the first is then placed
/// directly, one system call each. Returns the number of trailer bytes (pad + CRC) still to
/// be skipped, or `None` if the normal path applies.
async fn place_direct(
    s: &TcpStream,
    buf: &mut BytesMut,
    ctx: &DriverCtx,
) -> io::Result<Option<usize>> {
    const H: usize = 2 + TAGGED_HDR_LEN;
    if buf.len() < H || buf[2] & 0x80 == 0 {
        return Ok(None);
    }
    let ulen = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
    if ulen < TAGGED_HDR_LEN + DIRECT_MIN || buf.len() >= fpdu_len(ulen) {
        return Ok(None);
    }
    let plen = ulen - TAGGED_HDR_LEN;
    let have = (buf.len() - H).min(plen);
    let hdr: [u8; TAGGED_HDR_LEN] = match buf[2..H].try_into() {
        Ok(h) => h,
        Err(_) => return Ok(None),
    };
    let Some((mr, off)) = lock_engine(&ctx.qp.engine).direct_target(&hdr, plen) else {
        return Ok(None);
    };
    lock(&mr.data)[off..off + have].copy_from_slice(&buf[H..H + have]);
    let trailer_have = buf.len() - H - have;
    buf.clear();
    // What follows the payload: the rest of the trailer (required), then up to one FPDU header
    // of look-ahead (taken if it has arrived, never waited for).
    let trailer = pad_len(ulen) + 4 - trailer_have;
    let mut tail = [0u8; 8 + H];
    let (mut at, mut left, mut tail_got) = (off + have, plen - have, 0usize);
    while left > 0 || tail_got < trailer {
        s.readable().await?;
        loop {
            let r = {
                let mut d = lock(&mr.data);
                let mut iov = [
                    io::IoSliceMut::new(&mut d[at..at + left]),
                    io::IoSliceMut::new(&mut tail[tail_got..trailer + H]),
                ];
                let first = usize::from(left == 0);
                s.try_read_vectored(&mut iov[first..])
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => {
                    let p = k.min(left);
                    at += p;
                    left -= p;
                    tail_got += k - p;
                    ctx.stats
                        .direct_rx_bytes
                        .fetch_add(p as u64, Ordering::Relaxed);
                    ctx.stats.bytes_rx.fetch_add(k as u64, Ordering::Relaxed);
                    if left == 0 && tail_got >= trailer {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
    ctx.stats.fpdus_rx.fetch_add(1, Ordering::Relaxed);
    ctx.qp.direct_armed.store(true, Ordering::Release);
    let send = {
        let mut eng = lock_engine(&ctx.qp.engine);
        eng.on_placed(&hdr, plen);
        ctx.drain(&mut eng);
        eng.has_tx()
    };
    if send {
        transmit_now(&ctx.qp);
    }
    buf.extend_from_slice(&tail[trailer..tail_got]);
    Ok(Some(0))
}

/// Payloads up to this size are copied into their FPDU's single buffer by [`fill`].
const SMALL_FPDU_PAYLOAD: usize = 1024;

/// What [`fill`] left behind.
struct Filled {
    /// The engine is closing (a Terminate or a disconnect): shut the stream after the pieces.
    closing: bool,
    /// The engine has more to send than one fill takes (~2 MiB): fill again after writing.
    more: bool,
    /// This fill took a bulk transfer's worth (256 KiB or more): time to look at the MSS again.
    bulk: bool,
}

/// Moves what the engine has to send into `pieces` (at most ~2 MiB at a time) and records it in
/// the capture.
fn fill(eng: &mut Engine, pieces: &mut VecDeque<Piece>, ctx: &DriverCtx) -> Filled {
    let first_new = pieces.len();
    let mut bytes = 0usize;
    while pieces.len() < 1000 && bytes < (2 << 20) {
        let Some(s) = eng.poll_transmit() else { break };
        let (prefix, trailer) = match &s.mr_payload {
            // Zero-copy segments are only produced without CRC: the CRC field is zero.
            Some(_) => {
                let l = s.len();
                ((l as u16).to_be_bytes(), ([0u8; 8], pad_len(l) + 4))
            }
            None => frame_parts(&[&s.hdr, &s.payload], ctx.crc),
        };
        let (trailer, tl) = trailer;
        bytes += s.len() + 2 + tl;
        ctx.stats.fpdus_tx.fetch_add(1, Ordering::Relaxed);
        ctx.stats
            .bytes_tx
            .fetch_add((s.len() + 2 + tl) as u64, Ordering::Relaxed);
        if let Some((_, _, n)) = &s.mr_payload {
            ctx.stats
                .zero_copy_tx_bytes
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        if s.mr_payload.is_none() && s.payload.len() <= SMALL_FPDU_PAYLOAD {
            // A small FPDU (an RPC call or reply, an ack) is one piece: one allocation and one
            // iovec instead of three.
            let mut whole = BytesMut::with_capacity(2 + s.hdr.len() + s.payload.len() + tl);
            whole.extend_from_slice(&prefix);
            whole.extend_from_slice(&s.hdr);
            whole.extend_from_slice(&s.payload);
            whole.extend_from_slice(&trailer[..tl]);
            pieces.push_back(Piece::B(whole.freeze()));
            continue;
        }
        let mut head = BytesMut::with_capacity(2 + s.hdr.len());
        head.extend_from_slice(&prefix);
        head.extend_from_slice(&s.hdr);
        pieces.push_back(Piece::B(head.freeze()));
        if let Some((m, off, n)) = s.mr_payload {
            pieces.push_back(Piece::M(m, off, n));
        } else if !s.payload.is_empty() {
            pieces.push_back(Piece::B(s.payload));
        }
        // Without CRC the trailer (pad and CRC field) is all zeros: no allocation for it.
        let trailer = if trailer[..tl].iter().all(|&b| b == 0) {
            Bytes::from_static(&[0u8; 8][..tl])
        } else {
            Bytes::copy_from_slice(&trailer[..tl])
        };
        pieces.push_back(Piece::B(trailer));
    }
    if let Some(c) = &ctx.capture
        && pieces.len() > first_new
    {
        // Recorded in stream order: `pieces` is only filled under its lock.
        let owned: Vec<Bytes> = pieces.iter().skip(first_new).map(Piece::to_bytes).collect();
        let parts: Vec<&[u8]> = owned.iter().map(|b| &b[..]).collect();
        let _ = lock(c).record_parts(Dir::Out, &parts);
    }
    ctx.drain(eng);
    Filled {
        closing: eng.closing,
        more: eng.has_tx(),
        bulk: bytes >= BULK_FILL,
    }
}

/// A fill of at least this many bytes is a bulk transfer (see [`Filled::bulk`]).
const BULK_FILL: usize = 256 << 10;

/// The largest FPDU for the connection's current MSS, rounded down to a multiple of 8, as siw
/// sizes its FPDUs (RFC 5044 §5: an FPDU should fit the TCP segment; MULPDU follows the EMSS).
fn fpdu_for_mss(s: &TcpStream, cap: usize) -> usize {
    let mss = socket2::SockRef::from(s)
        .tcp_mss()
        .map_or(1460, |m| m as usize);
    (mss.min(cap) & !7).max(64)
}

/// Follow the MSS, as siw does before each work request (`siw_update_tcpseg`): on loopback it
/// starts at half its final size (32,741 against 65,483 once the window has opened), and an
/// FPDU size fixed at connection time kept bulk transfers at twice the FPDUs they need. Asked
/// only after bulk fills: a system call per small message would cost more than it saves.
fn refresh_fpdu(s: &TcpStream, ctx: &DriverCtx) {
    let fpdu = fpdu_for_mss(s, ctx.fpdu_cap);
    // ULPDU + 2-byte length + 4-byte CRC; a multiple of 8, so no pad.
    lock_engine(&ctx.qp.engine).set_max_ulpdu(fpdu - 6);
}

/// The transmit side of a connection over TCP. Whoever holds `pieces` owns the stream's write
/// order: the writer task, or a thread that posted a WR (or the reader, for Read Responses and
/// Terminates) and found the queue idle.
pub(crate) struct TxPath {
    w: OwnedWriteHalf,
    pieces: Mutex<VecDeque<Piece>>,
    ctx: Arc<DriverCtx>,
}

/// Puts what the engine has to send on the wire from the caller's context when the transmit
/// queue is idle, like Linux siw, which sends from `siw_post_send` when the SQ is not already
/// being processed (`siw_sq_start` otherwise). A round trip then costs no task wake-ups for
/// sending. Whatever cannot be written at once (the socket is full) is left queued in order for
/// the writer task, which is woken for it; so is everything when another thread is writing.
///
/// Only the first transmission after bytes arrived goes directly: request/response traffic
/// (one message answers another) then never waits for the writer task, while a burst of posts
/// (pipelined calls, replies to a batch of calls read at once, bulk writes) still leaves through
/// the writer task, which sends it with few vectored writes instead of one system call per
/// message. Measured with `oxrdma rpc bench --self`: direct for every post doubled NULL calls/s
/// at depth 1 but lost a fifth at depth 64; this rule keeps the first and not the second.
/// Posts that completion handlers make on the receive task itself are different again: they
/// wait for the end of the batch of FPDUs being taken in and leave together, directly
/// ([`transmit_batch`]; `rpc bench` depth 64, RDMA ÷ TCP went from 0.96-1.06 to 1.04-1.24).
fn transmit_now(qp: &QpShared) {
    if READER_BATCH.with(Cell::get) == qp as *const QpShared as usize {
        // Posted by a completion handler while this thread's reader takes in a batch: the
        // reader sends it with the rest of the batch's output (`transmit_batch`).
        return;
    }
    let armed = qp.direct_armed.swap(false, Ordering::AcqRel) || tx_mode() == TxMode::Always;
    transmit(qp, armed);
}

thread_local! {
    /// The queue pair (its address) whose reader is taking in a batch of FPDUs on this thread,
    /// or 0: what completion handlers post for it meanwhile waits for the end of the batch.
    static READER_BATCH: Cell<usize> = const { Cell::new(0) };
}

/// Run `take` (the reader's pass over what one read brought) with posts for `qp` held back,
/// then send everything it produced (replies that handlers posted, Read Responses, Terminates)
/// from this thread in one vectored write. A server that read 64 calls at once answers them
/// with one `writev` and no writer-task wake-up. `take` returns whether the engine has output.
fn transmit_batch<R>(qp: &QpShared, take: impl FnOnce() -> (bool, R)) -> R {
    let prev = READER_BATCH.with(|b| b.replace(qp as *const QpShared as usize));
    let (send, r) = take();
    READER_BATCH.with(|b| b.set(prev));
    if send || lock_engine(&qp.engine).has_tx() {
        transmit(qp, true);
    }
    r
}

/// Transmit from this thread if `direct` and the queue is idle; otherwise wake the writer.
fn transmit(qp: &QpShared, direct: bool) {
    let tx = if direct && tx_mode() != TxMode::Task {
        lock(&qp.direct_tx).clone()
    } else {
        None
    };
    let Some(tx) = tx else {
        qp.wake.notify_one();
        return;
    };
    let Ok(mut pieces) = tx.pieces.try_lock() else {
        qp.wake.notify_one();
        return;
    };
    if !pieces.is_empty() {
        // The writer task is waiting for the socket to drain; it will pick this up.
        qp.wake.notify_one();
        return;
    }
    let before = tx.ctx.stats.fpdus_tx.load(Ordering::Relaxed);
    let f = fill(&mut lock_engine(&qp.engine), &mut pieces, &tx.ctx);
    let n = tx.ctx.stats.fpdus_tx.load(Ordering::Relaxed) - before;
    tx.ctx.stats.direct_tx_fpdus.fetch_add(n, Ordering::Relaxed);
    // On an error the writer task meets the same error on its next write and tears down.
    let done = try_write_pieces(tx.w.as_ref(), &mut pieces).unwrap_or_default();
    if f.bulk {
        refresh_fpdu(tx.w.as_ref(), &tx.ctx);
    }
    // The rest of a large post (beyond one fill), a full socket, or the close: the writer
    // task's job, not the poster's.
    if !done || f.more || f.closing {
        qp.wake.notify_one();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxMode {
    Task,
    Reply,
    Always,
}

/// `OXRDMA_SIW_TX=task` sends everything from the writer task (the behaviour before direct
/// transmission) and `always` every post directly, for comparing them; the default sends the
/// first transmission after each receive directly.
fn tx_mode() -> TxMode {
    static MODE: std::sync::OnceLock<TxMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("OXRDMA_SIW_TX").as_deref() {
        Ok("task") => TxMode::Task,
        Ok("always") => TxMode::Always,
        _ => TxMode::Reply,
    })
}

/// Writes as much of `pieces` as the socket takes without waiting. `Ok(true)` when all went.
fn try_write_pieces(s: &TcpStream, pieces: &mut VecDeque<Piece>) -> io::Result<bool> {
    while !pieces.is_empty() {
        let res = {
            let region = pieces.iter().take(512).find_map(|p| match p {
                Piece::M(m, ..) => Some(m.clone()),
                Piece::B(_) => None,
            });
            let guard = region.as_ref().map(|m| lock(&m.data));
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(64);
            for p in pieces.iter().take(512) {
                match p {
                    Piece::B(b) => slices.push(IoSlice::new(b)),
                    Piece::M(m, off, len) => match (&region, &guard) {
                        (Some(r), Some(g)) if Arc::ptr_eq(r, m) => {
                            slices.push(IoSlice::new(&g[*off..*off + *len]))
                        }
                        _ => break,
                    },
                }
            }
            s.try_write_vectored(&slices)
        };
        match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance_pieces(pieces, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The writer task of a TCP connection: sends what nobody could send directly, and waits for
/// the socket to drain when it is full. Vectored writes go straight from registered memory; a
/// region's lock is held only for one `try_write_vectored`, never across an await.
async fn tcp_writer_loop(tx: Arc<TxPath>) -> io::Result<()> {
    let ctx = &tx.ctx;
    let s: &TcpStream = tx.w.as_ref();
    loop {
        let notified = ctx.qp.wake.notified();
        let (f, empty) = {
            let mut pieces = lock(&tx.pieces);
            let f = fill(&mut lock_engine(&ctx.qp.engine), &mut pieces, ctx);
            let empty = try_write_pieces(s, &mut pieces)?;
            (f, empty)
        };
        if f.bulk {
            refresh_fpdu(s, ctx);
        }
        if !empty {
            s.writable().await?;
        } else if f.more {
            // One fill's worth went out; there is more: fill again at once.
            tokio::task::yield_now().await;
        } else if f.closing {
            // Half-close the stream, as dropping the write half would.
            return s_shutdown(&tx.w);
        } else {
            notified.await;
            // Let the tasks that are ready to run post first (a batch of replies just woke
            // their callers): what they post then leaves in one vectored write instead of one
            // system call per message, like TCP's autocorking. Woken from a worker thread,
            // this task would otherwise run next, before any of them.
            tokio::task::yield_now().await;
        }
    }
}

fn s_shutdown(w: &OwnedWriteHalf) -> io::Result<()> {
    let sock = socket2::SockRef::from(w.as_ref());
    match sock.shutdown(std::net::Shutdown::Write) {
        Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
        _ => Ok(()),
    }
}

/// The writer task of an in-memory (loopback provider) connection.
async fn mem_writer_loop(mut w: WriteHalf<DuplexStream>, ctx: &DriverCtx) -> io::Result<()> {
    let mut pieces: VecDeque<Piece> = VecDeque::new();
    loop {
        let notified = ctx.qp.wake.notified();
        let closing = fill(&mut lock_engine(&ctx.qp.engine), &mut pieces, ctx).closing;
        if pieces.is_empty() {
            if closing {
                w.shutdown().await?;
                return Ok(());
            }
            notified.await;
            continue;
        }
        let mut chunks: VecDeque<Bytes> = pieces.drain(..).map(|p| p.to_bytes()).collect();
        write_chunks(&mut w, &mut chunks).await?;
    }
}

fn advance_pieces(pieces: &mut VecDeque<Piece>, mut n: usize) {
    while n > 0 {
        let Some(f) = pieces.front_mut() else { break };
        if n >= f.len() {
            n -= f.len();
            pieces.pop_front();
        } else {
            f.advance(n);
            n = 0;
        }
    }
}

async fn write_chunks<W: AsyncWrite + Unpin>(
    w: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !chunks.is_empty() {
        let slices: Vec<IoSlice<'_>> = chunks.iter().take(512).map(|c| IoSlice::new(c)).collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(f) = chunks.front_mut() else { break };
            if n >= f.len() {
                n -= f.len();
                chunks.pop_front();
            } else {
                f.advance(n);
                n = 0;
            }
        }
    }
    w.flush().await
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
