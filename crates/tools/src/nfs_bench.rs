//! `nfs bench`: a self-contained NFS benchmark. A fresh in-process server over a temporary
//! directory; for each transport (RPC-over-RDMA, TCP) and each NFS version (3, and 4.1 or 4.2
//! through a session: [`crate::nfs4_bench`]) a client that WRITEs then READs a file
//! sequentially at each I/O size, `depth` calls in flight (the WRITE pass ends with a COMMIT),
//! then GETATTRs one at a time; then the raw TCP ceiling of the same loopback (the best of
//! [`RAW_RUNS`] streams). Rows carry MB/s, ops/s and per-call p50/p99; the report also carries
//! the READ 1 MiB ratios RDMA ÷ raw TCP and RDMA ÷ NFS over TCP.
//!
//! In rounds ([`BenchConfig::rounds`]) all of that is split N ways: each round runs every
//! transport with its share, the order reversed every other round, then its share of one raw
//! TCP stream; rows add their rounds up (`bench_rows`) and the ratios come from the
//! median rounds.
//!
//! RFC 8267 §5.1: only NFS itself goes over RPC-over-RDMA; MOUNT stays on TCP (the server
//! answers MOUNT on its NFS TCP port).
//!
//! Progress is reported through [`Progress`]; the CLI draws it and prints the report.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nfs::client::{ClientError, Nfs3Client};
use nfs::serve::ServeConfig;

pub use crate::raw_tcp::RAW_RUNS;
use crate::raw_tcp::{bench_raw_tcp, raw_bytes};
use rpcrdma::TransportConfig;
use rpcrdma::rrc::ReplyMode;
use serde::Serialize;

pub use crate::bench_rows::Row;
pub(crate) use crate::bench_rows::{RttWindow, add_up_rounds, hist, row};
pub use crate::nfs_connect::{NFS_PORT, connect_client, connect_client_with, rdma_client_config};

/// Why a bench or a mount failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// An NFS or MOUNT call failed.
    #[error(transparent)]
    Nfs(#[from] ClientError),
    /// Local I/O (the export directory, the raw TCP stream) failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A bench task ended without an answer.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// Anything else, in words.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for BenchError {
    fn from(s: String) -> Self {
        BenchError::Failed(s)
    }
}

impl From<&str> for BenchError {
    fn from(s: &str) -> Self {
        BenchError::Failed(s.to_string())
    }
}

type BoxErr = BenchError;

/// Where the bench says how far it got (a progress bar, or nothing).
pub trait Progress: Send + Sync {
    /// What is being measured now.
    fn set_message(&self, msg: String);
    /// `bytes` more moved.
    fn inc(&self, bytes: u64);
}

/// No progress reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn set_message(&self, _: String) {}
    fn inc(&self, _: u64) {}
}

/// An NFS transport the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// RPC-over-RDMA (soft-iWARP).
    Rdma,
    /// TCP.
    Tcp,
}

impl Transport {
    /// Both, in the default order.
    pub const ALL: [Transport; 2] = [Transport::Rdma, Transport::Tcp];

    /// `rdma` or `tcp`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }
}

/// An NFS version the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NfsVersion {
    #[serde(rename = "3")]
    V3,
    #[serde(rename = "4.1")]
    V41,
    #[serde(rename = "4.2")]
    V42,
}

impl NfsVersion {
    /// `3`, `4.1` or `4.2`.
    pub fn name(self) -> &'static str {
        match self {
            NfsVersion::V3 => "3",
            NfsVersion::V41 => "4.1",
            NfsVersion::V42 => "4.2",
        }
    }

    /// The NFSv4 minor version (`None` for NFSv3).
    pub fn minor(self) -> Option<u32> {
        match self {
            NfsVersion::V3 => None,
            NfsVersion::V41 => Some(1),
            NfsVersion::V42 => Some(2),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Make the temporary export under this directory.
    pub dir: PathBuf,
    /// Bytes moved per READ/WRITE measurement, in MiB (4 KiB I/O moves at most 16 MiB).
    pub size_mb: u64,
    /// GETATTR calls per transport.
    pub getattrs: u64,
    /// READ/WRITE calls kept in flight (GETATTR stays at one).
    pub depth: u64,
    /// READ/WRITE I/O sizes, bytes.
    pub io: Vec<u32>,
    /// NFS transports, in this order (the raw TCP stream is always measured).
    pub transports: Vec<Transport>,
    /// NFS versions, in this order, over each transport.
    pub versions: Vec<NfsVersion>,
    /// The server's RPC-over-RDMA receive buffer size (its inline threshold), announced to
    /// version 1 clients in RFC 8797 private data and to version 2 clients as RBSIZ (cel-05
    /// §6.2.1); `None`: the default (`rpcrdma::engine::DEFAULT_INLINE_RECV`, 8192).
    pub inline: Option<u32>,
    /// How the RPC-over-RDMA client asks for large replies; the `rdma` transport is measured
    /// once per mode, in this order (rows `rdma`, `rdma-rc`, `rdma-so`). With a mode other
    /// than write-chunk the server announces responder-provided Read chunks.
    pub reply_modes: Vec<ReplyMode>,
    /// Rounds each measurement is split into (at least 1). Every round runs every transport
    /// with its share of the bytes and GETATTRs, in the given order on even rounds and the
    /// reverse on odd ones (A B B A …), then its share of one raw TCP stream; each row adds
    /// its rounds up and gives the median round's rate, from which the report's ratios are
    /// taken. A stall of the machine (a VM descheduled by its host for hundreds of
    /// milliseconds, see docs/performance.md) moves a sum by its whole length but a median by
    /// one round at most.
    pub rounds: u32,
}

/// The row name of the `rdma` transport measured in `mode`.
pub fn rdma_row_name(mode: ReplyMode) -> &'static str {
    match mode {
        ReplyMode::WriteChunk => "rdma",
        ReplyMode::ReadChunk => "rdma-rc",
        ReplyMode::SendOnly => "rdma-so",
    }
}

impl BenchConfig {
    fn rounds(&self) -> u64 {
        u64::from(self.rounds.max(1))
    }

    /// Bytes moved at I/O size `io` per pass of one round.
    pub(crate) fn pass_bytes(&self, io: u32) -> u64 {
        let t = if io == 4096 {
            (self.size_mb << 20).min(16 << 20)
        } else {
            self.size_mb << 20
        };
        (t / self.rounds()).max(1).div_ceil(u64::from(io)) * u64::from(io)
    }

    /// The raw TCP stream of one round, whole MiB: one stream's worth ([`raw_bytes`]) split
    /// over the rounds.
    fn raw_round_bytes(&self) -> u64 {
        (raw_bytes(self.size_mb << 20) / self.rounds()).div_ceil(1 << 20) << 20
    }

    /// Bytes of every raw TCP stream: the best of [`RAW_RUNS`], or one per round.
    fn raw_total(&self) -> u64 {
        if self.rounds() > 1 {
            self.rounds() * self.raw_round_bytes()
        } else {
            RAW_RUNS * raw_bytes(self.size_mb << 20)
        }
    }

    /// GETATTRs per transport in one round.
    pub(crate) fn round_getattrs(&self) -> u64 {
        (self.getattrs / self.rounds()).max(1)
    }

    /// Bytes the whole run moves through [`Progress::inc`].
    pub fn progress_total(&self) -> u64 {
        let per_nfs: u64 = self.io.iter().map(|&io| 2 * self.pass_bytes(io)).sum();
        let modes = self.reply_modes.len().max(1) as u64;
        let runs: u64 = self
            .transports
            .iter()
            .map(|t| if *t == Transport::Rdma { modes } else { 1 })
            .sum();
        // NFSv4 runs once per transport (with Write chunks), NFSv3 once per reply mode.
        let v3 = self.versions.iter().filter(|v| v.minor().is_none()).count() as u64;
        let v4 = self.versions.len() as u64 - v3;
        self.rounds() * (runs * v3 + self.transports.len() as u64 * v4) * per_nfs + self.raw_total()
    }
}

/// The whole run, as `oxrdma nfs bench --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// MiB per READ/WRITE run.
    pub size_mb: u64,
    /// READ/WRITE calls in flight.
    pub depth: u64,
    /// GETATTRs per transport.
    pub getattrs: u64,
    /// Every measurement, in order.
    pub rows: Vec<Row>,
    /// READ 1 MiB over RDMA ÷ the raw TCP stream (the first NFS version measured).
    #[serde(
        rename = "ratio_read_1mib_rdma_over_raw_tcp",
        serialize_with = "crate::json::opt3"
    )]
    pub ratio_raw: Option<f64>,
    /// READ 1 MiB over RDMA ÷ READ 1 MiB over NFS/TCP (the first NFS version measured).
    #[serde(
        rename = "ratio_read_1mib_rdma_over_nfs_tcp",
        serialize_with = "crate::json::opt3"
    )]
    pub ratio_nfs: Option<f64>,
    /// READ 1 MiB over RDMA with responder-provided Read chunks ÷ with Write chunks (both
    /// measured in the same run).
    #[serde(
        rename = "ratio_read_1mib_read_chunk_over_write_chunk",
        serialize_with = "crate::json::opt3",
        skip_serializing_if = "Option::is_none"
    )]
    pub ratio_read_chunk: Option<f64>,
}

pub(crate) fn localhost(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// One measured sequential pass over a file: `total` bytes in calls of `io`, `depth` at a time.
pub(crate) struct Pass<'a> {
    pub(crate) transport: &'static str,
    pub(crate) version: NfsVersion,
    pub(crate) io: u32,
    pub(crate) total: u64,
    pub(crate) depth: u64,
    pub(crate) pb: &'a dyn Progress,
    /// The calls' transport, for their round-trip times.
    pub(crate) transport_rpc: &'a Arc<dyn oncrpc::RpcTransport>,
}

impl Pass<'_> {
    /// The same calls untimed over the first part of the file (see `WARM_PASS`), then the
    /// timed pass over all of it; `then` runs inside the timing (a WRITE pass's COMMIT).
    pub(crate) async fn run<F, Fut, T, TFut>(
        &self,
        op: &'static str,
        call: F,
        then: T,
    ) -> Result<Row, BoxErr>
    where
        F: Fn(u64) -> Fut + Copy,
        Fut: std::future::Future<Output = Result<(), BoxErr>> + Send + 'static,
        T: FnOnce() -> TFut,
        TFut: std::future::Future<Output = Result<(), BoxErr>>,
    {
        let (name, io, total) = (self.transport, self.io, self.total);
        let v = self.version.name();
        let warm = total.min(WARM_PASS).div_ceil(u64::from(io)) * u64::from(io);
        self.pb
            .set_message(format!("{name} v{v} warm-up {}", human(io)));
        windowed(warm, io, self.depth, &mut hist(), &NoProgress, call).await?;
        self.pb
            .set_message(format!("{name} v{v} {op} {}", human(io)));
        let mut h = hist();
        let t0 = std::time::Instant::now();
        let rtt = RttWindow::open(self.transport_rpc);
        windowed(total, io, self.depth, &mut h, self.pb, call).await?;
        // Before `then`: the round-trip times are the pass's calls only.
        let rtt = rtt.close();
        then().await?;
        let el = t0.elapsed();
        Ok(row(
            name,
            self.version,
            op,
            Some(io),
            Some(total),
            total / u64::from(io),
            el,
            &h,
        )
        .with_rtt(rtt.as_ref()))
    }
}

/// Sequential WRITE then READ of `total` bytes at each I/O size, then GETATTR, on one client.
async fn bench_nfs(
    name: &'static str,
    c: &Nfs3Client,
    root: &nfs::nfs3::Fh3,
    a: &BenchConfig,
    pb: &dyn Progress,
) -> Result<Vec<Row>, BoxErr> {
    use nfs::nfs3::{CreateHow3, Sattr3, StableHow};
    let mut rows = Vec::new();
    for io in a.io.iter().copied() {
        let total = a.pass_bytes(io);
        let fname = format!("bench.{name}.{io}");
        let fh = c
            .create(
                root,
                fname.as_bytes(),
                CreateHow3::Unchecked(Sattr3::default()),
            )
            .await?
            .into_result()?
            .obj
            .ok_or("CREATE returned no handle")?;
        let buf = bytes::Bytes::from(vec![0x5a_u8; io as usize]);
        let write = |off: u64| {
            let (c, fh, buf) = (c.clone(), fh.clone(), buf.clone());
            async move {
                let w = c
                    .write(&fh, off, buf, StableHow::Unstable)
                    .await?
                    .into_result()?;
                if w.count != io {
                    return Err(format!("WRITE at {off} wrote {} of {io} bytes", w.count).into());
                }
                Ok(())
            }
        };
        let read = |off: u64| {
            let (c, fh) = (c.clone(), fh.clone());
            async move {
                let r = c.read(&fh, off, io).await?.into_result()?;
                if r.data.0.len() != io as usize {
                    return Err(
                        format!("READ at {off} returned {} of {io} bytes", r.data.0.len()).into(),
                    );
                }
                Ok(())
            }
        };
        let pass = Pass {
            transport: name,
            version: NfsVersion::V3,
            io,
            total,
            depth: a.depth,
            pb,
            transport_rpc: c.transport(),
        };
        // The COMMIT is part of the WRITE pass's time.
        rows.push(
            pass.run("WRITE", write, || async {
                Ok(c.commit(&fh).await?.into_result().map(drop)?)
            })
            .await?,
        );
        rows.push(pass.run("READ", read, || async { Ok(()) }).await?);
        c.remove(root, fname.as_bytes()).await?.into_result()?;
    }
    pb.set_message(format!("{name} GETATTR"));
    rows.push(
        one_at_a_time(
            name,
            NfsVersion::V3,
            "GETATTR",
            a.round_getattrs(),
            c.transport(),
            || async {
                c.getattr(root).await?.into_result()?;
                Ok::<_, BoxErr>(())
            },
        )
        .await?,
    );
    Ok(rows)
}

/// `n` calls of `op`, one at a time (the next when the last is answered), timed each and as
/// a whole, with their round-trip times on `transport`.
pub(crate) async fn one_at_a_time<F, Fut, E>(
    name: &'static str,
    version: NfsVersion,
    op: &'static str,
    n: u64,
    transport: &Arc<dyn oncrpc::RpcTransport>,
    call: F,
) -> Result<Row, E>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    let mut h = hist();
    let t0 = std::time::Instant::now();
    let rtt = RttWindow::open(transport);
    for _ in 0..n {
        let t = std::time::Instant::now();
        call().await?;
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    let rtt = rtt.close();
    Ok(row(name, version, op, None, None, n, t0.elapsed(), &h).with_rtt(rtt.as_ref()))
}

/// Calls `op(offset)` for every `io`-sized step of `total` bytes, at most `depth` at once,
/// recording each call's latency.
async fn windowed<F, Fut>(
    total: u64,
    io: u32,
    depth: u64,
    h: &mut hdrhistogram::Histogram<u64>,
    pb: &dyn Progress,
    op: F,
) -> Result<(), BoxErr>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxErr>> + Send + 'static,
{
    // One at a time, each call runs on this task. A task spawned per call and joined here adds
    // two task hops to every call, and with NFS over TCP's own hop to its connection task the
    // chain outran tokio's LIFO slot (at most 3 polls in a row), so every call woke the other
    // worker thread: 45 µs per 4 KiB READ against 12 µs over RDMA (stop 41).
    if depth <= 1 {
        let mut next = 0u64;
        while next < total {
            let t = std::time::Instant::now();
            op(next).await?;
            let _ = h.record(t.elapsed().as_nanos() as u64);
            pb.inc(u64::from(io));
            next += u64::from(io);
        }
        return Ok(());
    }
    let mut set = tokio::task::JoinSet::new();
    let mut next = 0u64;
    loop {
        while next < total && (set.len() as u64) < depth {
            let f = op(next);
            set.spawn(async move {
                let t = std::time::Instant::now();
                f.await.map(|()| t.elapsed())
            });
            next += u64::from(io);
        }
        let Some(done) = set.join_next().await else {
            return Ok(());
        };
        let el = done.map_err(|e| format!("bench task: {e}"))??;
        let _ = h.record(el.as_nanos() as u64);
        pb.inc(u64::from(io));
    }
}

/// Bytes of untimed calls before each timed WRITE or READ pass, on the same connection and file:
/// a connection's first bulk transfer still uses FPDUs of half the MSS it grows to (loopback),
/// and the first calls of a size fill the buffer pools (client sinks, server READ buffers) with
/// fresh memory, whose page faults (transparent huge pages zeroed) were all of the 9 % of samples
/// in `clear_page_erms` in the first 50 ms of a 250 ms READ 1 MiB phase (perf, depth 4). A
/// server that has run a while has neither cost; both transports get the same warm-up.
const WARM_PASS: u64 = 16 << 20;

/// Write and remove one file of the run's size before measuring, so that whichever transport
/// goes first does not pay alone for the page cache's first use of fresh memory (measured on
/// this project's VM: the first 1 MiB WRITE run after boot or a long pause was 3-4x slower than
/// the same run repeated, whichever transport it was).
fn warm_up(dir: &std::path::Path, total: u64, pb: &dyn Progress) -> Result<(), BoxErr> {
    use std::io::Write;
    pb.set_message("warm-up".to_string());
    let path = dir.join("bench.warm-up");
    let mut f = std::fs::File::create(&path)?;
    let buf = vec![0xa5_u8; 1 << 20];
    for _ in 0..total.div_ceil(1 << 20) {
        f.write_all(&buf)?;
    }
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(())
}

fn human(io: u32) -> String {
    if io >= 1 << 20 {
        format!("{}MiB", io >> 20)
    } else {
        format!("{}KiB", io >> 10)
    }
}

/// The MB/s of one row: of its median round when it was measured in rounds.
fn find(rows: &[Row], t: &str, v: Option<NfsVersion>, op: &str, io: Option<u32>) -> Option<f64> {
    rows.iter()
        .find(|r| r.transport == t && r.nfs == v && r.op == op && r.io == io)
        .and_then(|r| {
            let median = r.ops_median_round.zip(r.io);
            median.map(|(o, io)| o * f64::from(io) / 1e6).or(r.mbs)
        })
}

/// Every measurement of transport `tr` in one round: once per reply mode (RDMA), and per NFS
/// version, each on a connection of its own.
async fn bench_transport(
    tr: Transport,
    modes: &[ReplyMode],
    rdma: SocketAddr,
    tcp: SocketAddr,
    a: &BenchConfig,
    pb: &dyn Progress,
) -> Result<Vec<Row>, BoxErr> {
    let mut rows = Vec::new();
    let runs: Vec<(
        Option<SocketAddr>,
        Option<SocketAddr>,
        &'static str,
        ReplyMode,
    )> = match tr {
        Transport::Rdma => modes
            .iter()
            .map(|m| (Some(rdma), None, rdma_row_name(*m), *m))
            .collect(),
        Transport::Tcp => vec![(None, Some(tcp), tr.name(), ReplyMode::WriteChunk)],
    };
    for (r, t, name, mode) in runs {
        for &v in &a.versions {
            match v.minor() {
                None => {
                    let (c, root, _) =
                        connect_client_with(r, t, Some(tcp.port()), "/", 0, 0, mode).await?;
                    rows.extend(bench_nfs(name, &c, &root, a, pb).await?);
                }
                // The NFSv4 client asks for large replies with Write chunks only.
                Some(_) if mode != ReplyMode::WriteChunk => {}
                Some(minor) => {
                    let (c, _) = crate::nfs4_bench::connect_client4(r, t, minor, 0, 0).await?;
                    let c = Arc::new(c);
                    rows.extend(crate::nfs4_bench::bench_nfs4(name, v, c.clone(), a, pb).await?);
                    if let Ok(c) = Arc::try_unwrap(c) {
                        c.destroy().await.map_err(|e| e.to_string())?;
                    }
                }
            }
        }
    }
    Ok(rows)
}

/// Run the bench: a fresh server over a temporary directory under `a.dir`, every transport of
/// `a`, then the raw TCP ceiling.
pub async fn run(a: &BenchConfig, pb: &dyn Progress) -> Result<BenchReport, BenchError> {
    let base = a.dir.clone();
    let tmp = tempfile::Builder::new()
        .prefix("oxrdma-nfs-bench.")
        .tempdir_in(&base)
        .map_err(|e| format!("cannot make a directory under {}: {e}", base.display()))?;
    let mut cfg = ServeConfig::new(tmp.path());
    cfg.tcp = Some(localhost(0));
    cfg.rdma = Some(localhost(0));
    cfg.portmap = None;
    // A fresh server over an empty directory: no client can hold state to reclaim, so no
    // grace period (RFC 8881 §8.4.2) holds the NFSv4 OPENs back.
    cfg.nfs4 = Some(nfs::nfs4::server::Nfs4Config::default().with_grace(Duration::ZERO));
    let rrc = a.reply_modes.iter().any(|m| *m != ReplyMode::WriteChunk);
    if a.inline.is_some() || rrc {
        let mut t = TransportConfig::default();
        if let Some(n) = a.inline {
            t.rpc.inline_recv = n;
        }
        // The server announces responder-provided Read chunks only when a mode needs them.
        t.rpc.rrc.enabled = rrc;
        cfg.rdma_config = Some(t);
    }
    let served = nfs::serve::start(cfg)
        .await
        .map_err(|e| format!("cannot start the NFS server: {e}"))?;
    let (tcp, rdma) = match (served.nfs_addr, served.rdma_addr) {
        (Some(t), Some(r)) => (t, r),
        _ => return Err("the server did not bind both listeners".into()),
    };
    let result = async {
        let mut rows = Vec::new();
        warm_up(tmp.path(), a.size_mb << 20, pb)?;
        let modes = if a.reply_modes.is_empty() {
            vec![ReplyMode::WriteChunk]
        } else {
            a.reply_modes.clone()
        };
        let mut measured = Vec::new();
        for round in 0..a.rounds() {
            let mut order = a.transports.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            if a.rounds() > 1 {
                pb.set_message(format!("round {} of {}", round + 1, a.rounds()));
            }
            for &tr in &order {
                measured.extend(bench_transport(tr, &modes, rdma, tcp, a, pb).await?);
            }
            if a.rounds() > 1 {
                // The ceiling in the same rounds, one stream's share each.
                measured.push(crate::raw_tcp::raw_tcp_round(a.raw_round_bytes(), pb).await?);
            }
        }
        rows.extend(add_up_rounds(measured));
        if a.rounds() == 1 {
            rows.push(bench_raw_tcp(raw_bytes(a.size_mb << 20), pb).await?);
        }
        Ok::<_, BoxErr>(rows)
    }
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), served.shutdown()).await;
    let rows = result?;
    let io1m = Some(1 << 20);
    let first = a.versions.first().copied();
    let rd = find(&rows, "rdma", first, "READ", io1m);
    let ratio_raw = rd
        .zip(find(&rows, "raw-tcp", None, "STREAM", io1m))
        .map(|(a, b)| a / b);
    let ratio_nfs = rd
        .zip(find(&rows, "tcp", first, "READ", io1m))
        .map(|(a, b)| a / b);
    let ratio_read_chunk = find(&rows, "rdma-rc", first, "READ", io1m)
        .zip(rd)
        .map(|(a, b)| a / b);
    Ok(BenchReport {
        size_mb: a.size_mb,
        depth: a.depth,
        getattrs: a.getattrs,
        rows,
        ratio_raw,
        ratio_nfs,
        ratio_read_chunk,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_the_cli_s() {
        let r = BenchReport {
            size_mb: 4,
            depth: 2,
            getattrs: 10,
            rows: vec![
                Row {
                    transport: "rdma",
                    nfs: Some(NfsVersion::V3),
                    op: "READ",
                    io: Some(1 << 20),
                    mbs: Some(1234.56789),
                    ops: 1177.3456,
                    p50_us: Some(800.0),
                    p99_us: Some(f64::NAN),
                    rtt_p50_us: Some(790.04),
                    rtt_p99_us: None,
                    ops_median_round: None,
                    sample: None,
                },
                Row {
                    transport: "tcp",
                    nfs: Some(NfsVersion::V41),
                    op: "GETATTR",
                    io: None,
                    mbs: None,
                    ops: 20000.0,
                    p50_us: Some(49.9996),
                    p99_us: Some(61.0),
                    rtt_p50_us: None,
                    rtt_p99_us: None,
                    ops_median_round: None,
                    sample: None,
                },
            ],
            ratio_raw: Some(0.81234),
            ratio_nfs: None,
            ratio_read_chunk: None,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            concat!(
                r#"{"size_mb":4,"depth":2,"getattrs":10,"rows":["#,
                r#"{"transport":"rdma","nfs":"3","op":"READ","io":1048576,"mb_per_s":1234.568,"#,
                r#""ops_per_s":1177.346,"p50_us":800.0,"p99_us":null,"#,
                r#""rtt_p50_us":790.04,"rtt_p99_us":null},"#,
                r#"{"transport":"tcp","nfs":"4.1","op":"GETATTR","io":null,"mb_per_s":null,"#,
                r#""ops_per_s":20000.0,"p50_us":50.0,"p99_us":61.0,"#,
                r#""rtt_p50_us":null,"rtt_p99_us":null}],"#,
                r#""ratio_read_1mib_rdma_over_raw_tcp":0.812,"#,
                r#""ratio_read_1mib_rdma_over_nfs_tcp":null}"#
            )
        );
    }

    #[test]
    fn progress_total_counts_both_passes_and_the_raw_streams() {
        let c = BenchConfig {
            dir: std::env::temp_dir(),
            size_mb: 64,
            getattrs: 1,
            depth: 1,
            io: vec![4096, 1 << 20],
            transports: Transport::ALL.to_vec(),
            versions: vec![NfsVersion::V3, NfsVersion::V41],
            inline: None,
            reply_modes: vec![ReplyMode::WriteChunk],
            rounds: 1,
        };
        // 4 KiB moves at most 16 MiB; each transport and version WRITEs and READs.
        let per_nfs = 2 * (16 << 20) + 2 * (64 << 20);
        assert_eq!(c.progress_total(), 4 * per_nfs + RAW_RUNS * (1 << 30));
        // In rounds: the same bytes, split.
        let c4 = BenchConfig { rounds: 4, ..c };
        assert_eq!(c4.pass_bytes(1 << 20), 16 << 20);
        assert_eq!(c4.pass_bytes(4096), 4 << 20);
        // … and one raw stream's worth over the rounds instead of the best of three.
        assert_eq!(c4.progress_total(), 4 * per_nfs + (1 << 30));
        let c3 = BenchConfig {
            rounds: 3,
            ..c4.clone()
        };
        assert_eq!(c3.raw_round_bytes(), 342 << 20);
        assert_eq!(BenchConfig { getattrs: 10, ..c4 }.round_getattrs(), 2);
    }
}
