//! perftest-like bandwidth and latency measurements (the engine behind `oxrdma perf`), plus a
//! raw-TCP ceiling on the same path. Two ways to run:
//!
//! * [`run`]: both ends in this process (soft-iWARP over 127.0.0.1, or the in-memory provider);
//! * [`serve`] / [`run_client`]: the two ends in separate processes, like perftest's server and
//!   client. The client drives every measurement; the server only answers (see *Control
//!   exchange*).
//!
//! Definitions (MB/s = 10^6 bytes per second):
//! * Bandwidth: `iterations` messages of `bytes`, at most `window` outstanding. The clock stops
//!   when the data is known to be at the target: Write — a trailing zero-length Read completed
//!   (RDMAP orders it after the Writes); Read — the last Read completed; Send — the peer's last
//!   receive completed (in-process), or the peer's credit for it arrived (two processes). Peak is
//!   the best rate over spans of at least a tenth of the run, in messages (and at least
//!   `window` of them) and in time,
//!   measured between points where the data is known to be at the target: for Write, a
//!   zero-length Read posted after every span of Writes (their completions only say the data was
//!   handed to TCP).
//! * Latency, one operation at a time: Write — until the target sees the last byte change
//!   (in-process) or until a zero-length Read ordered after the Write completes (two processes:
//!   the client cannot watch the server's memory, so this is one extra round trip); Read — until
//!   the Read completes; Send — until the peer's receive completes (in-process) or its credit
//!   arrives (two processes).
//! * Raw TCP: the same bytes through a TCP connection with the same socket options, until the
//!   reader has them all (two processes: until the server's one-byte acknowledgement arrives).
//!
//! The control exchange of two-process runs (MPA private data both ways) is in [`control`];
//! the raw-TCP ceiling in [`tcp`].

pub mod control;
pub mod json;
pub mod tcp;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use verbs::{
    Access, CompletionQueue, ConnParams, Device, LoopbackFabric, MemoryRegion, Provider, QueuePair,
    RecvWr, SendOp, SendWr, SoftIwarpConfig, VerbsError, WcStatus,
};

pub use control::{ControlError, HELLO_LEN, Hello, OFFER_LEN, Offer};
pub use json::{PerfJson, PerfJsonRow};
use tcp::tcp_sink;
pub use tcp::{tcp_ceiling, tcp_ceiling_to};

/// Which operation to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfOp {
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// Send / Receive.
    Send,
}

impl PerfOp {
    /// perftest's name: `RDMA_Write`, `RDMA_Read`, `Send`.
    pub fn name(self) -> &'static str {
        match self {
            PerfOp::Write => "RDMA_Write",
            PerfOp::Read => "RDMA_Read",
            PerfOp::Send => "Send",
        }
    }

    /// The operation's code in the control exchange ([`Hello`]).
    pub fn code(self) -> u8 {
        match self {
            PerfOp::Write => 0,
            PerfOp::Read => 1,
            PerfOp::Send => 2,
        }
    }

    /// The operation a [`Hello`] code names.
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(PerfOp::Write),
            1 => Some(PerfOp::Read),
            2 => Some(PerfOp::Send),
            _ => None,
        }
    }
}

/// Which provider carries the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfTransport {
    /// Soft-iWARP over TCP on 127.0.0.1.
    Tcp,
    /// In-memory loopback provider.
    Loopback,
}

/// Test configuration.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    /// Operation.
    pub op: PerfOp,
    /// Message sizes to sweep.
    pub sizes: Vec<usize>,
    /// Messages per size for bandwidth (0 skips bandwidth and the raw-TCP ceiling).
    pub iterations: usize,
    /// Operations per size for latency (0 skips latency).
    pub latency_iterations: usize,
    /// Outstanding WRs during bandwidth tests (Reads are also bounded by ORD).
    pub window: usize,
    /// Provider.
    pub transport: PerfTransport,
    /// MPA CRC-32C on.
    pub crc: bool,
    /// Also measure raw TCP for each size.
    pub tcp_ceiling: bool,
    /// Provider settings (socket buffers, FPDU cap, read size, capture).
    pub soft: SoftIwarpConfig,
    /// Use this device instead of a soft-iWARP one made from `soft` (an rdma-core device,
    /// for example). With [`PerfTransport::Tcp`] only.
    pub device: Option<Device>,
    /// Address both ends use in [`run`] (an address of the RDMA device for rdma-core).
    pub self_ip: std::net::IpAddr,
}

impl Default for PerfConfig {
    fn default() -> Self {
        Self {
            op: PerfOp::Write,
            sizes: (1..=20).map(|s| 1usize << s).collect(),
            iterations: 1000,
            latency_iterations: 1000,
            window: 16,
            transport: PerfTransport::Tcp,
            crc: false,
            tcp_ceiling: true,
            soft: SoftIwarpConfig::default(),
            device: None,
            self_ip: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }
}

/// One result row (perftest columns).
#[derive(Debug, Clone, PartialEq)]
pub struct PerfRow {
    /// Message size.
    pub bytes: usize,
    /// Messages measured for bandwidth.
    pub iterations: usize,
    /// Peak bandwidth, MB/s.
    pub bw_peak_mbs: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg_mbs: f64,
    /// Message rate, millions of messages per second.
    pub msg_rate_mpps: f64,
    /// Operations measured for latency.
    pub lat_iterations: usize,
    /// Latency minimum.
    pub t_min: Duration,
    /// Latency median ("typical").
    pub t_typical: Duration,
    /// Latency mean.
    pub t_avg: Duration,
    /// Latency maximum.
    pub t_max: Duration,
    /// Latency 99th percentile.
    pub t_p99: Duration,
    /// Raw TCP bandwidth on the same path, MB/s (if measured).
    pub tcp_mbs: Option<f64>,
}

impl PerfRow {
    /// Average bandwidth ÷ the raw-TCP ceiling (NaN when the ceiling was not measured).
    pub fn ratio(&self) -> f64 {
        match self.tcp_mbs {
            Some(t) if t > 0.0 => self.bw_avg_mbs / t,
            _ => f64::NAN,
        }
    }
}

/// Microseconds of `d`.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct PerfReport {
    /// Operation measured.
    pub op: PerfOp,
    /// Provider used.
    pub transport: PerfTransport,
    /// One row per size.
    pub rows: Vec<PerfRow>,
}

pub(crate) fn mbs(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6
}

fn device(cfg: &PerfConfig) -> Device {
    cfg.device
        .clone()
        .unwrap_or_else(|| Device::open(Provider::SoftIwarp(cfg.soft.clone())))
}

fn validate(cfg: &PerfConfig) -> Result<usize, VerbsError> {
    if cfg.sizes.is_empty()
        || cfg.sizes.contains(&0)
        || cfg.sizes.iter().any(|s| *s > u32::MAX as usize)
    {
        return Err(VerbsError::InvalidArgument(
            "perf sizes must be 1 ..= 4 GiB",
        ));
    }
    Ok(cfg.sizes.iter().copied().max().unwrap_or(1))
}

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// How the measuring side learns that data arrived at the other end.
enum Peer<'a> {
    /// The other end is in this process: watch its memory and receive queue directly.
    Local {
        qps: &'a QueuePair,
        rcq_s: &'a CompletionQueue,
        rbuf: &'a MemoryRegion,
        remote: &'a MemoryRegion,
        nslots: usize,
    },
    /// The other end is a `serve` process: credits come back as zero-length Sends.
    Remote {
        qpc: &'a QueuePair,
        rcq_c: &'a CompletionQueue,
        credits: usize,
        tcp: SocketAddr,
    },
}

impl Peer<'_> {
    fn slots(&self) -> usize {
        match self {
            Peer::Local { nslots, .. } => *nslots,
            Peer::Remote { credits, .. } => *credits,
        }
    }

    /// Wait for the next receive at the target (or its credit) and repost.
    async fn next_recv(&self, max: usize) -> Result<(), VerbsError> {
        match self {
            Peer::Local {
                qps, rcq_s, rbuf, ..
            } => {
                let r = rcq_s.next().await;
                check(r.status)?;
                qps.post_recv(RecvWr::new(
                    r.wr_id,
                    rbuf.sge(r.wr_id * max as u64, max as u32),
                ))
            }
            Peer::Remote { qpc, rcq_c, .. } => {
                let r = rcq_c.next().await;
                check(r.status)?;
                qpc.post_recv(RecvWr {
                    wr_id: r.wr_id,
                    sgl: Default::default(),
                })
            }
        }
    }
}

/// Run the sweep with both ends in this process.
pub async fn run(cfg: &PerfConfig) -> Result<PerfReport, VerbsError> {
    let max = validate(cfg)?;
    let (dc, ds) = match cfg.transport {
        PerfTransport::Tcp => (device(cfg), device(cfg)),
        PerfTransport::Loopback => {
            let f = LoopbackFabric::new();
            let d = || Device::open(Provider::Loopback(f.clone(), cfg.soft.clone()));
            (d(), d())
        }
    };
    let window = cfg.window.clamp(1, 128);
    let (pdc, pds) = (dc.alloc_pd(), ds.alloc_pd());
    let (scq_c, rcq_c, scq_s, rcq_s) = (
        dc.create_cq(),
        dc.create_cq(),
        ds.create_cq(),
        ds.create_cq(),
    );
    let qpc = dc.create_qp(&pdc, &scq_c, &rcq_c);
    let qps = ds.create_qp(&pds, &scq_s, &rcq_s);
    let local = pdc.register(vec![0xA5u8; max], ALL)?;
    let remote = pds.register_len(max, ALL)?;
    // Receive buffers: one slot per outstanding Send.
    let nslots = if cfg.op == PerfOp::Send {
        window * 2
    } else {
        1
    };
    let rbuf = pds.register_len(max * nslots, Access::LOCAL_WRITE)?;
    for i in 0..nslots {
        qps.post_recv(RecvWr::new(
            i as u64,
            rbuf.sge((i * max) as u64, max as u32),
        ))?;
    }

    let mut l = ds.listen(SocketAddr::new(cfg.self_ip, 0)).await?;
    let addr = l.local_addr();
    let p = ConnParams {
        crc: cfg.crc,
        ird: 128,
        ord: 128,
        ..Default::default()
    };
    let ps = p.clone();
    let qps2 = qps.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await?;
        req.accept(&qps2, ps).await
    });
    let conn = dc.connect(&qpc, addr, p).await?;
    let sconn = server.await.map_err(|_| VerbsError::Disconnected)??;
    let peer = Peer::Local {
        qps: &qps,
        rcq_s: &rcq_s,
        rbuf: &rbuf,
        remote: &remote,
        nslots,
    };
    let rows = sweep(
        cfg,
        &qpc,
        &scq_c,
        &local,
        remote.rkey(),
        remote.addr(),
        &peer,
    )
    .await?;
    conn.disconnect().await;
    sconn.closed().await;
    Ok(PerfReport {
        op: cfg.op,
        transport: cfg.transport,
        rows,
    })
}

/// Run the sweep against a [`serve`] process at `addr` (soft-iWARP).
pub async fn run_client(cfg: &PerfConfig, addr: SocketAddr) -> Result<PerfReport, VerbsError> {
    let max = validate(cfg)?;
    let window = cfg.window.clamp(1, 128);
    let dev = device(cfg);
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(), dev.create_cq());
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let local = pd.register(vec![0xA5u8; max], ALL)?;
    let hello = Hello {
        op: cfg.op,
        window: window as u16,
        max_size: max as u32,
    };
    // Credit receives first: the server may Send credits as soon as the connection is up.
    let credit_slots = window * 2;
    for i in 0..credit_slots {
        qp.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: Default::default(),
        })?;
    }
    let p = ConnParams {
        crc: cfg.crc,
        ird: 128,
        ord: 128,
        private_data: bytes::Bytes::copy_from_slice(&hello.encode()),
        ..Default::default()
    };
    let conn = dev.connect(&qp, addr, p).await?;
    let offer = Offer::decode(conn.peer_private_data())
        .map_err(|_| VerbsError::Protocol("perf: malformed control message from the server"))?;
    if offer.len < max as u64 {
        return Err(VerbsError::Protocol("perf: server's region is too small"));
    }
    let peer = Peer::Remote {
        qpc: &qp,
        rcq_c: &rcq,
        credits: (offer.credits as usize).min(credit_slots),
        tcp: SocketAddr::new(addr.ip(), offer.tcp_port),
    };
    let rows = sweep(cfg, &qp, &scq, &local, offer.rkey, offer.addr, &peer).await?;
    conn.disconnect().await;
    Ok(PerfReport {
        op: cfg.op,
        transport: PerfTransport::Tcp,
        rows,
    })
}

/// Serve one [`run_client`] on `addr` (soft-iWARP), returning when it disconnects. `ready` is
/// called with the bound address once the listener is up.
pub async fn serve(
    soft: SoftIwarpConfig,
    addr: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), VerbsError> {
    serve_on(Device::open(Provider::SoftIwarp(soft)), addr, ready).await
}

/// [`serve`] on a given device (soft-iWARP or rdma-core).
pub async fn serve_on(
    dev: Device,
    addr: SocketAddr,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), VerbsError> {
    let mut l = dev.listen(addr).await?;
    let sink = tokio::net::TcpListener::bind(SocketAddr::new(l.local_addr().ip(), 0)).await?;
    let tcp_port = sink.local_addr()?.port();
    ready(l.local_addr());
    let req = l.accept().await?;
    let hello = match Hello::decode(req.private_data()) {
        Ok(h) => h,
        Err(e) => {
            let _ = req.reject(b"oxrdma perf: bad control message").await;
            tracing::warn!("perf: {e}");
            return Err(VerbsError::Protocol("perf: malformed control message"));
        }
    };
    let max = (hello.max_size as usize).max(1);
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(), dev.create_cq());
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let target = pd.register_len(max, ALL)?;
    let credits = if hello.op == PerfOp::Send {
        usize::from(hello.window.clamp(1, 128)) * 2
    } else {
        0
    };
    // All receives share one buffer: the payload is not looked at.
    let rbuf = pd.register_len(max, Access::LOCAL_WRITE)?;
    for i in 0..credits {
        qp.post_recv(RecvWr::new(i as u64, rbuf.sge(0, max as u32)))?;
    }
    let offer = Offer {
        tcp_port,
        rkey: target.rkey(),
        credits: credits as u32,
        addr: target.addr(),
        len: max as u64,
    };
    let p = ConnParams {
        crc: req.crc(),
        ird: 128,
        ord: 128,
        private_data: bytes::Bytes::copy_from_slice(&offer.encode()),
        ..Default::default()
    };
    let conn = req.accept(&qp, p).await?;
    let mut sinks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = conn.closed() => break,
            r = rcq.next() => {
                if r.status != WcStatus::Success {
                    break;
                }
                qp.post_recv(RecvWr::new(r.wr_id, rbuf.sge(0, max as u32)))?;
                qp.post_send(SendWr::new(r.wr_id, SendOp::Send, vec![]))?;
            }
            c = scq.next() => {
                if c.status != WcStatus::Success {
                    break;
                }
            }
            a = sink.accept() => {
                let (s, _) = a?;
                sinks.spawn(tcp_sink(s));
            }
        }
    }
    sinks.abort_all();
    Ok(())
}

/// The measurements of every size, driven from the client's QP.
async fn sweep(
    cfg: &PerfConfig,
    qpc: &QueuePair,
    scq_c: &CompletionQueue,
    local: &MemoryRegion,
    rkey: u32,
    raddr: u64,
    peer: &Peer<'_>,
) -> Result<Vec<PerfRow>, VerbsError> {
    let max = validate(cfg)?;
    let window = cfg.window.clamp(1, 128);
    let nslots = peer.slots();
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let size32 = size as u32;
        let mk = |id: u64| match cfg.op {
            PerfOp::Write => SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: raddr,
                    rkey,
                },
                vec![local.sge(0, size32)],
            ),
            PerfOp::Read => SendWr::new(
                id,
                SendOp::RdmaRead {
                    remote_addr: raddr,
                    rkey,
                },
                vec![local.sge(0, size32)],
            ),
            PerfOp::Send => SendWr::new(id, SendOp::Send, vec![local.sge(0, size32)]),
        };
        let fence = |id: u64| {
            SendWr::new(
                id,
                SendOp::RdmaRead {
                    remote_addr: raddr,
                    rkey,
                },
                vec![],
            )
        };
        // Bandwidth. `marks` are (messages known to be at the target, when).
        let iters = cfg.iterations;
        // Peak over spans of a tenth of the run (at least `window` messages): completions come
        // in bursts, shorter spans would measure the burst, not the link.
        let span = window.max(iters / 10).max(1);
        let mut marks: Vec<(usize, Instant)> = Vec::with_capacity(iters + 1);
        let start = Instant::now();
        marks.push((0, start));
        let (mut posted, mut completed) = (0usize, 0usize);
        let mut recvd = 0usize;
        // Write completions only say the data was handed to the transport; a zero-length Read
        // after every `span` Writes (RDMAP orders it after them) says they were placed.
        let mut fences_out = 0usize;
        let is_fence = |id: u64| id >= FENCE_BASE;
        while completed < iters || (cfg.op == PerfOp::Send && recvd < iters) || fences_out > 0 {
            // Sends also wait for receive credits: iWARP has no RNR retry.
            while posted < iters
                && posted - completed < window
                && (cfg.op != PerfOp::Send || posted - recvd < nslots)
            {
                qpc.post_send(mk(posted as u64))?;
                posted += 1;
                if cfg.op == PerfOp::Write && (posted % span == 0 || posted == iters) {
                    qpc.post_send(fence(FENCE_BASE + posted as u64))?;
                    fences_out += 1;
                }
            }
            if cfg.op == PerfOp::Send {
                // The clock follows the receiver.
                tokio::select! {
                    c = scq_c.next(), if completed < iters => {
                        check(c.status)?;
                        completed += 1;
                    }
                    r = peer.next_recv(max) => {
                        r?;
                        recvd += 1;
                        marks.push((recvd, Instant::now()));
                    }
                }
            } else {
                let c = scq_c.next().await;
                check(c.status)?;
                if is_fence(c.wr_id) {
                    fences_out -= 1;
                    marks.push(((c.wr_id - FENCE_BASE) as usize, Instant::now()));
                } else {
                    completed += 1;
                    if cfg.op == PerfOp::Read {
                        marks.push((completed, Instant::now()));
                    }
                }
            }
        }
        let total = start.elapsed();
        let mut peak = 0f64;
        let mut i = 0;
        // Completions are stamped when this task takes them, so several can share a stamp: a
        // span must also last a tenth of the run, or one late batch would look infinitely fast.
        let min_dt = total / 10;
        let far = |j: usize, i: usize| {
            marks[j].0 - marks[i].0 >= span.min(iters) && marks[j].1 - marks[i].1 >= min_dt
        };
        for j in 1..marks.len() {
            // The latest earlier mark at least `span` messages and a tenth of the run back.
            while i + 1 < j && far(j, i + 1) {
                i += 1;
            }
            let n = marks[j].0 - marks[i].0;
            if far(j, i) && n > 0 {
                peak = peak.max(mbs((n * size) as u64, marks[j].1 - marks[i].1));
            }
        }
        let (avg, rate) = if iters > 0 {
            (
                mbs((iters * size) as u64, total),
                iters as f64 / total.as_secs_f64().max(1e-9) / 1e6,
            )
        } else {
            (0.0, 0.0)
        };
        // Latency.
        let mut lat = Vec::with_capacity(cfg.latency_iterations);
        for i in 0..cfg.latency_iterations {
            let t0 = Instant::now();
            match (cfg.op, peer) {
                (PerfOp::Write, Peer::Local { remote, .. }) => {
                    let mark = (i as u8).wrapping_add(1) | 1;
                    local.write(size - 1, &[mark])?;
                    qpc.post_send(mk(i as u64))?;
                    loop {
                        if remote.read(size - 1, 1)?[0] == mark {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    check(scq_c.next().await.status)?;
                    local.write(size - 1, &[0])?;
                    // Reset the target byte so the next iteration sees a change.
                    remote.write(size - 1, &[0])?;
                    lat.push(t0.elapsed());
                    continue;
                }
                (PerfOp::Write, Peer::Remote { .. }) => {
                    qpc.post_send_list([mk(i as u64), fence(FENCE_BASE)])?;
                    check(scq_c.next().await.status)?;
                    check(scq_c.next().await.status)?;
                }
                (PerfOp::Read, _) => {
                    qpc.post_send(mk(i as u64))?;
                    check(scq_c.next().await.status)?;
                }
                (PerfOp::Send, _) => {
                    qpc.post_send(mk(i as u64))?;
                    peer.next_recv(max).await?;
                    check(scq_c.next().await.status)?;
                }
            }
            lat.push(t0.elapsed());
        }
        lat.sort();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let t_avg = if lat.is_empty() {
            Duration::ZERO
        } else {
            lat.iter().sum::<Duration>() / lat.len() as u32
        };
        let tcp_mbs = if cfg.tcp_ceiling && cfg.transport == PerfTransport::Tcp && iters > 0 {
            Some(match peer {
                Peer::Local { .. } => tcp_ceiling(size, iters).await?,
                Peer::Remote { tcp, .. } => tcp_ceiling_to(*tcp, size, iters).await?,
            })
        } else {
            None
        };
        rows.push(PerfRow {
            bytes: size,
            iterations: iters,
            bw_peak_mbs: if iters > 0 { peak.max(avg) } else { 0.0 },
            bw_avg_mbs: avg,
            msg_rate_mpps: rate,
            lat_iterations: lat.len(),
            t_min: lat.first().copied().unwrap_or_default(),
            t_typical: pick(0.5),
            t_avg,
            t_max: lat.last().copied().unwrap_or_default(),
            t_p99: pick(0.99),
            tcp_mbs,
        });
    }
    Ok(rows)
}

/// Work request ids from here on are fences (zero-length Reads) of the Write tests.
const FENCE_BASE: u64 = 1 << 63;

fn check(s: WcStatus) -> Result<(), VerbsError> {
    if s == WcStatus::Success {
        Ok(())
    } else {
        tracing::warn!(?s, "perf: a work request completed with an error");
        Err(VerbsError::Protocol("perf: work request failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn perf_runs_each_op_briefly() {
        for op in [PerfOp::Write, PerfOp::Read, PerfOp::Send] {
            for transport in [PerfTransport::Tcp, PerfTransport::Loopback] {
                let cfg = PerfConfig {
                    op,
                    sizes: vec![1, 4096, 100_000],
                    iterations: 20,
                    latency_iterations: 5,
                    window: 4,
                    transport,
                    crc: false,
                    tcp_ceiling: true,
                    ..Default::default()
                };
                let r = tokio::time::timeout(Duration::from_secs(20), run(&cfg))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(r.rows.len(), 3);
                for row in &r.rows {
                    assert!(
                        row.bw_avg_mbs > 0.0
                            && row.t_min <= row.t_max
                            && row.t_typical <= row.t_p99
                            && row.t_min <= row.t_avg
                            && row.t_avg <= row.t_max
                    );
                    assert_eq!(row.lat_iterations, 5);
                    assert_eq!(row.tcp_mbs.is_some(), transport == PerfTransport::Tcp);
                }
            }
        }
    }

    #[tokio::test]
    async fn client_against_server_each_op() {
        for op in [PerfOp::Write, PerfOp::Read, PerfOp::Send] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let server = tokio::spawn(serve(
                SoftIwarpConfig::default(),
                "127.0.0.1:0".parse().unwrap(),
                move |a| {
                    let _ = tx.send(a);
                },
            ));
            let addr = rx.await.unwrap();
            let cfg = PerfConfig {
                op,
                sizes: vec![2, 65536],
                iterations: 20,
                latency_iterations: 5,
                window: 4,
                ..Default::default()
            };
            let r = tokio::time::timeout(Duration::from_secs(20), run_client(&cfg, addr))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(r.rows.len(), 2);
            for row in &r.rows {
                assert!(row.bw_avg_mbs > 0.0 && row.t_min > Duration::ZERO);
                assert!(row.tcp_mbs.is_some_and(|t| t > 0.0));
            }
            tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
    }
}
