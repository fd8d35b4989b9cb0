//! `nfs torture`: a bounded fault-injection run of mixed NFSv3 operations against an
//! in-process server, with connection drops injected from either side, each operation's
//! outcome checked against a model of the file tree.
//!
//! One client makes one operation at a time (so the model knows the outcome of each), drawn
//! from a seeded RNG: CREATE (guarded), MKDIR, RMDIR, REMOVE, RENAME, LINK, SYMLINK, SETATTR
//! (size), WRITE, READ (whole file, compared bit for bit), GETATTR, LOOKUP and READDIRPLUS
//! (names compared). The names come from a small pool, so operations collide: a CREATE of a
//! name that exists must answer NFS3ERR_EXIST, a REMOVE of one that does not NFS3ERR_NOENT.
//!
//! Drops are spread over the run at random operations, each from one of three places:
//! - **client**: the client drops its connection at a random moment while the call is under
//!   way (`TcpClient::disconnect`, `RdmaClient::disconnect`);
//! - **server, before**: the server closes the connection when the call arrives, before
//!   executing it (`TcpServer::disconnect_all`, `rpcrdma::ServerConnection::disconnect`);
//! - **server, after**: the server executes the call, then closes the connection and sends
//!   no reply, so the reply is lost and only the duplicate request cache can answer the
//!   retransmission of a non-idempotent call correctly.
//!
//! Either way the client reconnects and retransmits under the same XID. An operation counts
//! as completed when its call returns; "exactly once" shows in the model check, since a
//! non-idempotent operation executed twice answers differently (EXIST, NOENT, another size).
//! At the end every file is read back over NFS and from the export directory and compared
//! with the model.
//!
//! Files: `fault` (the armed server-side drop and the connection cutters), `model` (the model
//! of the file tree), `ops` (the operations and the final check); this module runs the campaign.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nfs::client::Nfs3Client;
use nfs::drc::{DrcConfig, DrcStats};
use nfs::server::{ExportOptions, NfsServer};
use nfs::ulb::NfsBinding;
use oncrpc::{Dispatcher, RpcTransport, ServerConfig, TcpClient};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

mod fault;
mod model;
mod ops;

use fault::{Client, Cutter, Fault, Point};
use model::Model;
use ops::Run;

/// Which transport the run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// ONC RPC over TCP.
    Tcp,
    /// RPC-over-RDMA over soft-iWARP.
    Rdma,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TortureConfig {
    pub transport: Transport,
    /// Operations to make.
    pub ops: u64,
    /// Connection drops to inject (spread over the operations; at most one per operation).
    pub drops: u64,
    /// RNG seed (the same seed makes the same operations and drop points).
    pub seed: u64,
    /// Stop issuing operations after this long.
    pub time_limit: Duration,
    /// Largest file the run makes.
    pub max_file: usize,
    /// The server's duplicate request cache; `None` runs without one, to show what the
    /// campaign finds then.
    pub drc: Option<DrcConfig>,
}

impl Default for TortureConfig {
    fn default() -> Self {
        TortureConfig {
            transport: Transport::Rdma,
            ops: 10_000,
            drops: 50,
            seed: 1,
            time_limit: Duration::from_secs(600),
            max_file: 256 << 10,
            drc: Some(DrcConfig::default()),
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct TortureReport {
    pub ops: u64,
    /// Operations whose call returned (an NFS status, success or not).
    pub completed: u64,
    /// Operations whose call failed at the RPC level (timeout, transport).
    pub failed: u64,
    /// Operations whose outcome differed from the model.
    pub mismatches: u64,
    /// The first few mismatches and failures, described.
    pub problems: Vec<String>,
    pub drops_client: u64,
    pub drops_server_before: u64,
    pub drops_server_after: u64,
    /// RDMA reconnections of the client (0 over TCP, which does not count them).
    pub reconnects: u64,
    /// Files compared at the end (over NFS and on disk), and their bytes.
    pub files_checked: u64,
    pub bytes_checked: u64,
    /// Files, links or directories of the final tree that differ from the model.
    pub final_mismatches: u64,
    pub drc: DrcStats,
    pub elapsed: Duration,
    /// Operations by kind.
    pub by_kind: BTreeMap<&'static str, u64>,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TortureError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("RPC-over-RDMA: {0}")]
    Rdma(#[from] rpcrdma::driver::DriverError),
}

/// Run a torture campaign on a fresh in-process server over a temporary directory.
pub async fn run(cfg: &TortureConfig) -> Result<TortureReport, TortureError> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_path_buf();
    let server = {
        let d = dir.clone();
        let drc = cfg.drc;
        tokio::task::spawn_blocking(move || {
            NfsServer::with_drc(
                &d,
                ExportOptions {
                    read_only: false,
                    name: "/".into(),
                },
                drc,
            )
        })
        .await
        .map_err(std::io::Error::other)??
    };
    let fault = Arc::new(Fault {
        inner: server.nfs_program(),
        armed: Mutex::new(None),
        cutter: OnceLock::new(),
    });
    let dispatcher = Dispatcher::new().with(fault.clone());
    let local: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let client = match cfg.transport {
        Transport::Tcp => {
            let s = oncrpc::TcpServer::bind(
                local,
                Arc::new(dispatcher),
                ServerConfig::default().with_max_record(4 << 20),
            )
            .await?;
            let addr = s.local_addr();
            let _ = fault.cutter.set(Cutter::Tcp(Arc::new(s)));
            let c = oncrpc::ClientConfig::default()
                .with_max_retransmits(8)
                .with_max_record(4 << 20);
            Client::Tcp(Arc::new(TcpClient::connect_with(addr, c).await?))
        }
        Transport::Rdma => {
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
            let s =
                RdmaServer::bind(local, dispatcher, vec![ulb], TransportConfig::default()).await?;
            let addr = s.local_addr();
            let _ = fault.cutter.set(Cutter::Rdma(Arc::new(s)));
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
            Client::Rdma(Arc::new(
                RdmaClient::connect(addr, TransportConfig::default(), vec![ulb]).await?,
            ))
        }
    };
    let transport: Arc<dyn RpcTransport> = match &client {
        Client::Tcp(c) => c.clone(),
        Client::Rdma(c) => c.clone(),
    };
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let nfs = Nfs3Client::new(transport).with_auth_sys(uid, gid, vec![]);
    let root = server
        .export()
        .root_handle()
        .map_err(|s| std::io::Error::other(format!("root handle: {s}")))?;

    let mut rng = StdRng::seed_from_u64(cfg.seed);
    // Drop points: distinct operations, never the first.
    let mut drop_at = BTreeSet::new();
    let drops = cfg.drops.min(cfg.ops.saturating_sub(1));
    while (drop_at.len() as u64) < drops {
        drop_at.insert(rng.random_range(1..cfg.ops));
    }
    let mut report = TortureReport {
        ops: 0,
        ..TortureReport::default()
    };
    let start = Instant::now();
    {
        let mut run = Run {
            c: nfs,
            root,
            m: Model::default(),
            rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed),
            max_file: cfg.max_file.max(64 << 10),
            report: &mut report,
        };
        for i in 0..cfg.ops {
            if start.elapsed() >= cfg.time_limit {
                break;
            }
            run.report.ops += 1;
            let r = if drop_at.contains(&i) {
                match rng.random_range(0..3u32) {
                    0 => {
                        run.report.drops_client += 1;
                        let delay = Duration::from_micros(rng.random_range(0..2000));
                        let client = &client;
                        let (r, ()) = tokio::join!(run.step(), async move {
                            // Injection timing, not synchronisation: a random moment of the
                            // call (or just after it).
                            tokio::time::sleep(delay).await;
                            client.disconnect().await;
                        });
                        r
                    }
                    side => {
                        let p = if side == 1 {
                            run.report.drops_server_before += 1;
                            Point::Before
                        } else {
                            run.report.drops_server_after += 1;
                            Point::After
                        };
                        *fault
                            .armed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(p);
                        let r = run.step().await;
                        // Disarm if the operation made no call.
                        fault
                            .armed
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .take();
                        r
                    }
                }
            } else {
                run.step().await
            };
            match r {
                Ok(()) => run.report.completed += 1,
                Err(e) => {
                    run.report.failed += 1;
                    run.problem(format!("operation {i} failed: {e}"));
                }
            }
        }
        run.verify(&dir).await;
    }
    report.elapsed = start.elapsed();
    if let Client::Rdma(c) = &client {
        report.reconnects = c.reconnects();
    }
    report.drc = server.drc_stats().unwrap_or_default();
    Ok(report)
}
