//! perftest-like bandwidth and latency measurements between a listener and a client in this
//! process (soft-iWARP over loopback TCP, or the in-memory provider), plus a raw-TCP ceiling on
//! the same path. The CLI (`oxrdma perf`) formats the returned rows.
//!
//! Definitions (MB/s = 10^6 bytes per second):
//! * Bandwidth: `iterations` messages of `bytes`, at most `window` outstanding. The clock stops
//!   when the data is known to be at the target: Write — a trailing zero-length Read completed
//!   (RDMAP orders it after the Writes); Read — the last Read completed; Send — the peer's last
//!   receive completed. Peak is the best rate over any `window` consecutive completions.
//! * Latency, one operation at a time: Write — until the target sees the last byte change;
//!   Read — until the Read completes; Send — until the peer's receive completes.
//! * Raw TCP: the same bytes through a TCP connection with the same socket options, until the
//!   reader has them all.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Access, ConnParams, Device, LoopbackFabric, Provider, RecvWr, SendOp, SendWr, SoftIwarpConfig,
    VerbsError, WcStatus,
};

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
    /// Messages per size for bandwidth.
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
    /// Latency minimum.
    pub t_min: Duration,
    /// Latency median ("typical").
    pub t_typical: Duration,
    /// Latency maximum.
    pub t_max: Duration,
    /// Latency 99th percentile.
    pub t_p99: Duration,
    /// Raw TCP bandwidth on the same path, MB/s (if measured).
    pub tcp_mbs: Option<f64>,
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

fn mbs(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6
}

/// Run the sweep.
pub async fn run(cfg: &PerfConfig) -> Result<PerfReport, VerbsError> {
    let (dc, ds) = match cfg.transport {
        PerfTransport::Tcp => {
            let d = || Device::open(Provider::SoftIwarp(cfg.soft.clone()));
            (d(), d())
        }
        PerfTransport::Loopback => {
            let f = LoopbackFabric::new();
            let d = || Device::open(Provider::Loopback(f.clone(), cfg.soft.clone()));
            (d(), d())
        }
    };
    if cfg.sizes.contains(&0) || cfg.sizes.iter().any(|s| *s > u32::MAX as usize) {
        return Err(VerbsError::InvalidArgument(
            "perf sizes must be 1 ..= 4 GiB",
        ));
    }
    let max = cfg.sizes.iter().copied().max().unwrap_or(1);
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
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let local = pdc.register(vec![0xA5u8; max], all)?;
    let remote = pds.register_len(max, all)?;
    // Receive buffers: one slot per outstanding Send.
    let nslots = if cfg.op == PerfOp::Send {
        window * 2
    } else {
        1
    };
    let rbuf = pds.register_len(max * nslots, Access::LOCAL_WRITE)?;
    for i in 0..nslots {
        qps.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: vec![rbuf.sge((i * max) as u64, max as u32)],
        })?;
    }

    let mut l = ds
        .listen(
            "127.0.0.1:0"
                .parse()
                .map_err(|_| VerbsError::InvalidArgument("addr"))?,
        )
        .await?;
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

    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let size32 = size as u32;
        let mk = |id: u64| match cfg.op {
            PerfOp::Write => SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: remote.rkey(),
                },
                vec![local.sge(0, size32)],
            ),
            PerfOp::Read => SendWr::new(
                id,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: remote.rkey(),
                },
                vec![local.sge(0, size32)],
            ),
            PerfOp::Send => SendWr::new(id, SendOp::Send, vec![local.sge(0, size32)]),
        };
        // Bandwidth.
        let iters = cfg.iterations.max(1);
        let mut done_times = Vec::with_capacity(iters);
        let start = Instant::now();
        let (mut posted, mut completed) = (0usize, 0usize);
        let mut recvd = 0usize;
        while completed < iters || (cfg.op == PerfOp::Send && recvd < iters) {
            // Sends also wait for receive credits: iWARP has no RNR retry.
            while posted < iters
                && posted - completed < window
                && (cfg.op != PerfOp::Send || posted - recvd < nslots)
            {
                qpc.post_send(mk(posted as u64))?;
                posted += 1;
            }
            if cfg.op == PerfOp::Send {
                // Drain receives and repost them; the clock follows the receiver.
                tokio::select! {
                    c = scq_c.next(), if completed < iters => {
                        check(c.status)?;
                        completed += 1;
                    }
                    r = rcq_s.next() => {
                        check(r.status)?;
                        recvd += 1;
                        done_times.push(Instant::now());
                        qps.post_recv(RecvWr { wr_id: r.wr_id, sgl: vec![rbuf.sge(r.wr_id * max as u64, max as u32)] })?;
                    }
                }
            } else {
                let c = scq_c.next().await;
                check(c.status)?;
                completed += 1;
                done_times.push(Instant::now());
            }
        }
        if cfg.op == PerfOp::Write {
            // The zero-length Read fences the Writes: they are all placed when it completes.
            qpc.post_send(SendWr::new(
                u64::MAX,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: remote.rkey(),
                },
                vec![],
            ))?;
            check(scq_c.next().await.status)?;
            if let Some(l) = done_times.last_mut() {
                *l = Instant::now();
            }
        }
        let total = start.elapsed();
        let mut peak = 0f64;
        // Peak over spans of a tenth of the run (at least `window` messages): completions come
        // in bursts, shorter spans would measure the burst, not the link.
        let w = window
            .max(iters / 10)
            .min(done_times.len().saturating_sub(1))
            .max(1);
        for i in w..done_times.len() {
            let d = done_times[i] - done_times[i - w];
            peak = peak.max(mbs((w * size) as u64, d));
        }
        let avg = mbs((iters * size) as u64, total);
        // Latency.
        let mut lat = Vec::with_capacity(cfg.latency_iterations);
        for i in 0..cfg.latency_iterations {
            let t0 = Instant::now();
            match cfg.op {
                PerfOp::Write => {
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
                }
                PerfOp::Read => {
                    qpc.post_send(mk(i as u64))?;
                    check(scq_c.next().await.status)?;
                }
                PerfOp::Send => {
                    qpc.post_send(mk(i as u64))?;
                    let r = rcq_s.next().await;
                    check(r.status)?;
                    qps.post_recv(RecvWr {
                        wr_id: r.wr_id,
                        sgl: vec![rbuf.sge(r.wr_id * max as u64, max as u32)],
                    })?;
                    check(scq_c.next().await.status)?;
                }
            }
            lat.push(t0.elapsed());
            if cfg.op == PerfOp::Write {
                // Reset the target byte so the next iteration sees a change.
                remote.write(size - 1, &[0])?;
            }
        }
        lat.sort();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        let tcp_mbs = if cfg.tcp_ceiling && cfg.transport == PerfTransport::Tcp {
            Some(tcp_ceiling(size, iters).await?)
        } else {
            None
        };
        rows.push(PerfRow {
            bytes: size,
            iterations: iters,
            bw_peak_mbs: peak.max(avg),
            bw_avg_mbs: avg,
            msg_rate_mpps: iters as f64 / total.as_secs_f64().max(1e-9) / 1e6,
            t_min: lat.first().copied().unwrap_or_default(),
            t_typical: pick(0.5),
            t_max: lat.last().copied().unwrap_or_default(),
            t_p99: pick(0.99),
            tcp_mbs,
        });
    }
    conn.disconnect().await;
    sconn.closed().await;
    Ok(PerfReport {
        op: cfg.op,
        transport: cfg.transport,
        rows,
    })
}

fn check(s: WcStatus) -> Result<(), VerbsError> {
    if s == WcStatus::Success {
        Ok(())
    } else {
        Err(VerbsError::Protocol("perf: work request failed"))
    }
}

/// Raw TCP bandwidth on 127.0.0.1 (TCP_NODELAY, 4 MiB socket buffers, like the soft-iWARP
/// provider): `iterations` writes of `size` bytes, timed until the reader has them all.
pub async fn tcp_ceiling(size: usize, iterations: usize) -> Result<f64, VerbsError> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = l.local_addr()?;
    let total = size * iterations;
    let reader = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        tune(&s);
        // Read into a message-sized buffer, as the soft-iWARP side reads into the region.
        let mut buf = vec![0u8; size.clamp(64 * 1024, 4 << 20)];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(Instant::now())
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    tune(&s);
    let data = vec![0x5au8; size];
    let start = Instant::now();
    for _ in 0..iterations {
        s.write_all(&data).await?;
    }
    let end = reader.await.map_err(|_| VerbsError::Disconnected)??;
    Ok(mbs(total as u64, end - start))
}

fn tune(s: &tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let r = socket2::SockRef::from(s);
    let _ = r.set_send_buffer_size(4 << 20);
    let _ = r.set_recv_buffer_size(4 << 20);
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
                    soft: SoftIwarpConfig::default(),
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
                    );
                    assert_eq!(row.tcp_mbs.is_some(), transport == PerfTransport::Tcp);
                }
            }
        }
    }
}
