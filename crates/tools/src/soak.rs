//! `nfs torture --soak`: many RPC-over-RDMA connections kept at full credits for a while,
//! sampled as it runs: operations per second, the server's resident memory, the clients'
//! open memory registrations and credits in use.
//!
//! Against a server started separately (its RDMA and TCP addresses, and its PID so that its
//! RSS is read from `/proc/PID/status`), or against one started in this process (the RSS
//! sampled is then this process's, clients included). Each connection runs as many calls at
//! once as its credit grant allows: GETATTR, 4 KiB READ and WRITE of a file of its own, and
//! CREATE followed by REMOVE.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client};
use nfs::nfs3::{CreateHow3, Fh3, Sattr3, StableHow};
use nfs::ulb::NfsBinding;
use oncrpc::{RpcTransport, TcpClient};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rpcrdma::{RdmaClient, TransportConfig};

use crate::torture::TortureError;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The server: (RPC-over-RDMA address, TCP address for MOUNT, PID for its RSS). `None`:
    /// start one in this process on a temporary directory.
    pub server: Option<(SocketAddr, SocketAddr, Option<u32>)>,
    /// RPC-over-RDMA connections.
    pub connections: usize,
    /// Calls in flight per connection; the credit limit when `None`.
    pub depth: Option<usize>,
    pub duration: Duration,
    /// Time between samples.
    pub interval: Duration,
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig {
            server: None,
            connections: 8,
            depth: None,
            duration: Duration::from_secs(60),
            interval: Duration::from_secs(10),
        }
    }
}

/// One sample.
#[derive(Debug, Clone)]
pub struct SoakSample {
    pub elapsed: Duration,
    /// Operations completed since the start.
    pub ops: u64,
    /// Operations per second over the last interval.
    pub ops_per_sec: f64,
    /// Resident set size in KiB of the process named by [`SoakReport::rss_of`].
    pub rss_kib: Option<u64>,
    /// Memory registrations open on all client connections.
    pub registrations: usize,
    /// Calls sent and not answered, over all connections (credits in use).
    pub outstanding: u64,
    /// Calls that failed so far.
    pub errors: u64,
}

/// The end of a soak.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub samples: Vec<SoakSample>,
    /// Whose RSS was sampled.
    pub rss_of: String,
    pub connections: usize,
    pub depth: usize,
    pub ops: u64,
    pub errors: u64,
    /// Calls sent by the clients (each consumes a credit) and replies received (each returns
    /// one), summed over the connections, when every call has ended.
    pub credits_used: u64,
    pub credits_returned: u64,
    /// Calls still outstanding at the end (must be 0).
    pub outstanding: u64,
    /// Registrations still open at the end (must be 0).
    pub registrations: usize,
    pub reconnects: u64,
    /// RSS at the first sample at or after one minute, and the largest seen after it.
    pub rss_minute_one: Option<u64>,
    pub rss_max_after: Option<u64>,
}

fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let s = std::fs::read_to_string(path).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Totals {
    ops: AtomicU64,
    errors: AtomicU64,
}

async fn worker(
    c: Nfs3Client,
    root: Fh3,
    tag: String,
    seed: u64,
    deadline: tokio::time::Instant,
    totals: Arc<Totals>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let file = match c
        .create(
            &root,
            tag.as_bytes(),
            CreateHow3::Unchecked(Sattr3::default()),
        )
        .await
        .map(|r| r.ok().and_then(|o| o.obj))
    {
        Ok(Some(fh)) => fh,
        _ => {
            totals.errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let block = Bytes::from(vec![0x5au8; 4096]);
    let scratch = format!("{tag}.t");
    while tokio::time::Instant::now() < deadline {
        let off = rng.random_range(0..256u64) * 4096;
        let ok = match rng.random_range(0..4u32) {
            0 => c.getattr(&root).await.is_ok(),
            1 => c.read(&file, off, 4096).await.is_ok(),
            2 => c
                .write(&file, off, block.clone(), StableHow::Unstable)
                .await
                .is_ok(),
            _ => {
                c.create(
                    &root,
                    scratch.as_bytes(),
                    CreateHow3::Unchecked(Sattr3::default()),
                )
                .await
                .is_ok()
                    && c.remove(&root, scratch.as_bytes()).await.is_ok()
            }
        };
        if ok {
            totals.ops.fetch_add(1, Ordering::Relaxed);
        } else {
            totals.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    let _ = c.remove(&root, tag.as_bytes()).await;
}

/// Calls sent and not answered: `RequesterStats::outstanding` is the count at the last send,
/// not updated by replies, so it is worked out from the totals.
fn in_flight(c: &RdmaClient) -> u64 {
    let st = c.stats();
    st.sent.saturating_sub(st.completed)
}

/// Run a soak; `on_sample` sees every sample as it is taken.
pub async fn run(
    cfg: &SoakConfig,
    mut on_sample: impl FnMut(&SoakSample),
) -> Result<SoakReport, TortureError> {
    let mut _tmp = None;
    let mut _served = None;
    let (rdma, tcp, pid, rss_of) = match cfg.server {
        Some((r, t, pid)) => (
            r,
            t,
            pid,
            pid.map_or_else(
                || "none (no --server-pid)".to_string(),
                |p| format!("server pid {p}"),
            ),
        ),
        None => {
            let tmp = tempfile::tempdir()?;
            let mut sc = nfs::serve::ServeConfig::new(tmp.path());
            let local = SocketAddr::from(([127, 0, 0, 1], 0));
            sc.tcp = Some(local);
            sc.rdma = Some(local);
            sc.portmap = None;
            let s = nfs::serve::start(sc).await?;
            let (Some(r), Some(t)) = (s.rdma_addr, s.nfs_addr) else {
                return Err(std::io::Error::other("server did not start").into());
            };
            _tmp = Some(tmp);
            _served = Some(s);
            (
                r,
                t,
                Some(std::process::id()),
                "this process (server and clients in-process)".to_string(),
            )
        }
    };
    let mount: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(tcp).await?);
    let root = MountClient::new(mount)
        .mnt("/")
        .await
        .map_err(|e| std::io::Error::other(format!("MOUNT: {e}")))?;
    let tc = TransportConfig::default();
    let depth = cfg.depth.unwrap_or(tc.rpc.credits as usize).max(1);
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let mut clients = Vec::new();
    for _ in 0..cfg.connections.max(1) {
        let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
        clients.push(Arc::new(
            RdmaClient::connect(rdma, tc.clone(), vec![ulb]).await?,
        ));
    }
    let totals = Arc::new(Totals {
        ops: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + cfg.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (ci, cl) in clients.iter().enumerate() {
        let t: Arc<dyn RpcTransport> = cl.clone();
        let nfs = Nfs3Client::new(t).with_auth_sys(uid, gid, vec![]);
        for w in 0..depth {
            tasks.spawn(worker(
                nfs.clone(),
                root.clone(),
                format!("soak-{}-{ci}-{w}", std::process::id()),
                (ci * 10_000 + w) as u64,
                deadline,
                totals.clone(),
            ));
        }
    }
    let mut report = SoakReport {
        rss_of,
        connections: clients.len(),
        depth,
        ..SoakReport::default()
    };
    let mut last_ops = 0;
    let mut last_t = Duration::ZERO;
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + cfg.interval,
        cfg.interval.max(Duration::from_millis(100)),
    );
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = tasks.join_next() => {
                if r.is_none() { break; }
                continue;
            }
        }
        let elapsed = start.elapsed();
        let ops = totals.ops.load(Ordering::Relaxed);
        let dt = (elapsed - last_t).as_secs_f64().max(1e-9);
        let s = SoakSample {
            elapsed,
            ops,
            ops_per_sec: (ops - last_ops) as f64 / dt,
            rss_kib: rss_kib(pid),
            registrations: clients.iter().map(|c| c.live_registrations()).sum(),
            outstanding: clients.iter().map(|c| in_flight(c)).sum(),
            errors: totals.errors.load(Ordering::Relaxed),
        };
        last_ops = ops;
        last_t = elapsed;
        if let Some(r) = s.rss_kib
            && elapsed >= Duration::from_secs(60)
        {
            match report.rss_minute_one {
                None => report.rss_minute_one = Some(r),
                Some(_) => {
                    report.rss_max_after = Some(report.rss_max_after.unwrap_or(0).max(r));
                }
            }
        }
        on_sample(&s);
        report.samples.push(s);
    }
    report.ops = totals.ops.load(Ordering::Relaxed);
    report.errors = totals.errors.load(Ordering::Relaxed);
    for c in &clients {
        let st = c.stats();
        report.credits_used += st.sent;
        report.credits_returned += st.completed;
        report.outstanding += in_flight(c);
        report.registrations += c.live_registrations();
        report.reconnects += c.reconnects();
    }
    Ok(report)
}
