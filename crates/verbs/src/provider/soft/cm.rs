//! The soft-iWARP connection manager: listen, connect, accept and reject with the MPA
//! handshake ([`super::handshake`]) over a byte stream, then start the connection's driver
//! ([`super::reader`] and [`super::writer`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::engine::EngineParams;
use super::handshake::{self, Negotiated};
use super::reader::{In, reader_loop};
use super::tx::{TxPath, fpdu_for_mss};
use super::writer::{Out, mem_writer_loop, tcp_writer_loop};
use super::{EngineGuard, MAX_FPDU, SoftQp, SoftRequest, Transport};
use crate::VerbsError;
use crate::capture::{Capture, Dir, Tee, Teed};
use crate::conn::{CmEvent, ConnParams, ConnectRequest, Connection, Listener, ReqKind, StatsInner};
use crate::device::Device;
use crate::provider::loopback::LOOPBACK_FPDU;
use crate::qp::QueuePair;
use crate::wire::mpa::MpaFrame;

/// Listen on TCP `addr` (port 0 picks a free port).
pub(crate) async fn listen_tcp(dev: Device, addr: SocketAddr) -> Result<Listener, VerbsError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let l = TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((s, peer)) = l.accept().await {
            let dev = dev.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(t) = tune_tcp(&dev, s) {
                    incoming(dev, Transport::Tcp(t), local, peer, tx).await;
                }
            });
        }
    });
    Ok(Listener::new(rx, local, task, None))
}

fn tune_tcp(dev: &Device, s: TcpStream) -> std::io::Result<TcpStream> {
    // siw: TCP_NODELAY on.
    s.set_nodelay(true)?;
    let buf = dev.config().socket_buffer;
    if buf > 0 {
        let sr = socket2::SockRef::from(&s);
        let _ = sr.set_send_buffer_size(buf);
        let _ = sr.set_recv_buffer_size(buf);
    }
    Ok(s)
}

/// Open a TCP connection to `addr`: the stream and our address.
pub(crate) async fn connect_tcp(
    dev: &Device,
    addr: SocketAddr,
) -> Result<(Transport, SocketAddr), VerbsError> {
    let s = tune_tcp(dev, TcpStream::connect(addr).await?)?;
    let local = s.local_addr()?;
    Ok((Transport::Tcp(s), local))
}

/// The initiator's MPA exchange on `t`, then the connection's start.
pub(crate) async fn connect(
    dev: &Device,
    qp: &QueuePair,
    mut t: Transport,
    local: SocketAddr,
    addr: SocketAddr,
    params: ConnParams,
) -> Result<Connection, VerbsError> {
    let mut capture = capture_for(dev, &params, local, addr, true);
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
        max_fpdu(dev, &t),
        dev.config().rx_chunk.max(64),
        fpdu_cap(dev),
    );
    start_connection(qp, t, buf, neg, fpdu, capture, local, addr).await
}

fn fpdu_cap(dev: &Device) -> usize {
    dev.config().max_fpdu.min(MAX_FPDU)
}

fn max_fpdu(dev: &Device, t: &Transport) -> usize {
    match t {
        Transport::Tcp(s) => fpdu_for_mss(s, fpdu_cap(dev)),
        Transport::Mem(_) => (LOOPBACK_FPDU.min(fpdu_cap(dev)) & !7).max(64),
    }
}

fn capture_for(
    dev: &Device,
    p: &ConnParams,
    local: SocketAddr,
    peer: SocketAddr,
    initiator: bool,
) -> Option<Capture> {
    let dir = p
        .capture_dir
        .clone()
        .or_else(|| dev.config().capture_dir.clone())
        .or_else(|| std::env::var_os("OXRDMA_PCAP_DIR").map(PathBuf::from))?;
    match Capture::create(&dir, local, peer, initiator) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("cannot create capture in {}: {e}", dir.display());
            None
        }
    }
}

/// The capture of an accepted (or rejected) request, with the Request recorded.
fn request_capture(
    dev: &Device,
    s: &SoftRequest,
    p: &ConnParams,
    local: SocketAddr,
    peer: SocketAddr,
) -> Option<Capture> {
    let mut c = capture_for(dev, p, local, peer, false)?;
    let _ = c.record(Dir::In, &s.raw);
    Some(c)
}

pub(crate) async fn incoming(
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
        kind: ReqKind::Soft(SoftRequest {
            t,
            req,
            raw,
            leftover: buf,
        }),
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

/// Accept `s` on `qp` (rdma_accept): send the MPA Reply and start the connection.
pub(crate) async fn accept(
    dev: &Device,
    s: SoftRequest,
    qp: &QueuePair,
    params: ConnParams,
    local: SocketAddr,
    peer: SocketAddr,
) -> Result<Connection, VerbsError> {
    let mut capture = request_capture(dev, &s, &params, local, peer);
    let SoftRequest {
        mut t,
        req,
        leftover,
        ..
    } = s;
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
        max_fpdu(dev, &t),
        dev.config().rx_chunk.max(64),
        fpdu_cap(dev),
    );
    start_connection(qp, t, leftover, neg, fpdu, capture, local, peer).await
}

/// Reject `s` with private data (rdma_reject): the Reply carries R.
pub(crate) async fn reject(
    dev: &Device,
    s: SoftRequest,
    private_data: &[u8],
    local: SocketAddr,
    peer: SocketAddr,
) -> Result<(), VerbsError> {
    let mut capture = request_capture(dev, &s, &ConnParams::default(), local, peer);
    let SoftRequest { mut t, req, .. } = s;
    let b = handshake::reject_reply(&req, Bytes::copy_from_slice(private_data)).encode()?;
    if let Some(c) = capture.as_mut() {
        let _ = c.record(Dir::Out, &b);
    }
    t.write_all(&b).await?;
    let _ = t.shutdown().await;
    Ok(())
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
    let soft = qp
        .soft_qp()
        .ok_or(VerbsError::InvalidArgument(
            "the QP belongs to another provider",
        ))?
        .clone();
    qp.claim_connection()?;
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = watch::channel(false);
    // Writes straight from registered memory: TCP only, and only without CRC (the CRC would be
    // computed over bytes the application may still change).
    let zero_copy_tx = matches!(t, Transport::Tcp(_)) && !neg.crc;
    {
        let mut e = soft.engine();
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
    let stats = Arc::new(StatsInner::default());
    let ctx = Arc::new(DriverCtx {
        qp: soft.clone(),
        ev: ev_tx,
        tee: Tee::new(capture),
        crc: neg.crc,
        stats: stats.clone(),
        rx_chunk,
        fpdu_cap,
    });
    // Writes go through the tee; the reader records what it reads itself (`reader_loop`).
    let tee = ctx.tee.clone();
    match t {
        Transport::Tcp(s) => {
            let (r, w) = s.into_split();
            let (r, w) = (In::Tcp(r), Teed::new(w, tee));
            spawn_driver(r, Out::Tcp(w), leftover, ctx, done_tx);
        }
        Transport::Mem(s) => {
            let (r, w) = tokio::io::split(s);
            let (r, w) = (In::Mem(r), Teed::new(w, tee));
            spawn_driver(r, Out::Mem(w), leftover, ctx, done_tx);
        }
    }
    soft.wake.notify_one();
    let conn = Connection {
        qp: qp.clone(),
        neg,
        local,
        peer,
        events: tokio::sync::Mutex::new(ev_rx),
        first: Mutex::new(None),
        done: done_rx,
        stats,
        native: None,
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
            *conn.first.lock() = Some(CmEvent::Established);
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

/// What a connection's reader, writer and direct transmissions share.
pub(crate) struct DriverCtx {
    pub(crate) qp: Arc<SoftQp>,
    pub(crate) ev: mpsc::UnboundedSender<CmEvent>,
    /// The tee on the stream: records it where a capture is on.
    pub(crate) tee: Tee,
    pub(crate) crc: bool,
    pub(crate) stats: Arc<StatsInner>,
    pub(crate) rx_chunk: usize,
    /// The configured largest FPDU (the MSS may allow more).
    pub(crate) fpdu_cap: usize,
}

impl DriverCtx {
    /// Lock the engine as the connection's driver: on release, its events go to the
    /// connection too (after its completions, before the queue handlers run).
    pub(crate) fn engine(&self) -> EngineGuard<'_> {
        EngineGuard::new(&self.qp, Some(&self.ev))
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
                *wctx.qp.direct_tx.lock() = Some(tx.clone());
                let res = tcp_writer_loop(tx).await;
                // Breaks the QP -> TxPath -> DriverCtx -> QP cycle; nobody writes any more.
                wctx.qp.direct_tx.lock().take();
                res
            }
            Out::Mem(w) => mem_writer_loop(w, &wctx).await,
        };
        if let Err(e) = res {
            tracing::debug!("writer ended: {e}");
            let _ = wctx.ev.send(CmEvent::Error(e.to_string()));
            wctx.engine().on_disconnect();
        }
    });
    tokio::spawn(async move {
        if let Err(e) = reader_loop(r, leftover, &ctx).await {
            tracing::debug!("reader ended: {e}");
            let _ = ctx.ev.send(CmEvent::Error(e.to_string()));
        }
        ctx.engine().on_disconnect();
        ctx.qp.wake.notify_one();
        // Let the writer send what is queued (e.g. a Terminate) and close its half.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
        ctx.tee.close();
        let _ = ctx.ev.send(CmEvent::Disconnected);
        let _ = done.send(true);
    });
}
