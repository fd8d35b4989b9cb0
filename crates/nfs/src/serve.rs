//! The server entry point: NFSv3 and NFSv4.0/4.1/4.2 + MOUNT v3 + port mapper over TCP, for the
//! CLI.
//!
//! [`start`] binds the listeners, registers every service with its own port mapper, and
//! returns a [`Served`] handle. NFS and MOUNT are both served on the NFS port; MOUNT also gets
//! a listener of its own when [`ServeConfig::mount`] is set (RFC 8267 §5.1: MOUNT stays on TCP).
//!
//! ## The RPC-over-RDMA listener
//! With [`ServeConfig::rdma`] set, NFS is also served over RPC-over-RDMA by
//! `rpcrdma::RdmaServer`, with [`crate::ulb::NfsBinding`] as the program's Upper-Layer Binding,
//! conventionally on port [`crate::ulb::NFS_RDMA_PORT`] (RFC 8267 §4.2, §9), and registered in
//! the port mapper under netid "rdma"/"rdma6". Only the NFS program goes over RDMA: MOUNT and
//! the port mapper stay on TCP (RFC 8267 §5.1). Another transport can serve the same programs
//! through [`Served::nfs_dispatcher`] and record itself with [`Served::register_rdma`].

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use oncrpc::{Dispatcher, MemoryBudget, MessageHeader, ServerConfig, TcpServer, TransportKind};

use crate::control::ControlSocket;
use crate::drc::DrcConfig;
use crate::exports::Exports;
use crate::gate::ExportTable;
use crate::metrics::MetricsEndpoint;
use crate::nfs4::server::program::{NfsV3V4, VERSION4};
use crate::nfs4::server::{Nfs4Config, Nfs4Server};
use crate::portmap::{PortmapProgram, Portmapper, Registration};
use crate::register::{RpcbindAt, SystemRpcbind};
use crate::server::NfsServer;
use crate::stats::ServerStats;
use crate::status::{Status, StatusSource};
use crate::ulb::NfsBinding;
use crate::verifier::{self, VerifierFile};
use crate::{mount, nfs3};

/// What to serve and where.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The directory to export.
    pub export: PathBuf,
    /// The path clients pass to MNT (default "/", as the interop lab mounts `server:/`);
    /// the export's canonical path is always accepted too.
    pub export_name: Option<String>,
    /// Refuse modifications with NFS3ERR_ROFS.
    pub read_only: bool,
    /// NFS (and MOUNT) over TCP; `None` disables TCP (nothing to serve then but the port
    /// mapper). The conventional port is 2049.
    pub tcp: Option<SocketAddr>,
    /// A separate MOUNT listener (mountd); MOUNT is always served on the NFS port as well.
    pub mount: Option<SocketAddr>,
    /// The port mapper / rpcbind listener (conventionally port 111).
    pub portmap: Option<SocketAddr>,
    /// NFS over RPC-over-RDMA (conventionally port 20049).
    pub rdma: Option<SocketAddr>,
    /// RPC-over-RDMA settings (device, credits, inline sizes, capture); soft-iWARP over TCP
    /// with the defaults when `None`.
    pub rdma_config: Option<rpcrdma::TransportConfig>,
    /// The memory budget of the whole server: every listener, TCP and RPC-over-RDMA, draws
    /// from it. `None`: the one in `rdma_config` if it has one, else a quarter of this
    /// machine's memory ([`MemoryBudget::machine_default`]).
    pub budget: Option<Arc<MemoryBudget>>,
    /// How long a TCP client may take none of its replies before its connection is closed
    /// and its memory given back ([`ServerConfig::send_timeout`]); `None`: no limit.
    pub tcp_send_timeout: Option<Duration>,
    /// Exports read from an exports(5) file. When set, they are served instead of `export`
    /// (see [`crate::gate`]); when not, `export` is served to everybody who can reach the
    /// listeners ([`ExportTable::single`]).
    pub exports: Option<Exports>,
    /// Bounds of the duplicate request cache shared by NFS over every transport
    /// ([`crate::drc`]); `None` runs without one (a retransmitted non-idempotent call then
    /// executes again).
    pub drc: Option<DrcConfig>,
    /// NFSv4.0/4.1/4.2 on the same ports and exports as NFSv3 ([`crate::nfs4::server`]); `None`
    /// serves NFSv3 only.
    pub nfs4: Option<Nfs4Config>,
    /// Register NFS and MOUNT with the rpcbind found here ([`crate::register`]), and take the
    /// registrations back at shutdown; usually instead of `portmap`.
    pub rpcbind: Option<RpcbindAt>,
    /// The state file that keeps the write verifier across a clean restart
    /// ([`crate::verifier`]); `None`: a new verifier at every start.
    pub verifier_file: Option<PathBuf>,
    /// The control socket `oxrdma nfs status` reads ([`crate::control`]).
    pub control: Option<PathBuf>,
    /// The Prometheus endpoint ([`crate::metrics`]).
    pub metrics: Option<SocketAddr>,
}

impl ServeConfig {
    /// Serve `export` on 0.0.0.0:2049 with a port mapper on 0.0.0.0:111.
    pub fn new(export: impl Into<PathBuf>) -> Self {
        ServeConfig {
            export: export.into(),
            export_name: None,
            read_only: false,
            tcp: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 2049)),
            mount: None,
            portmap: Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                crate::portmap::PORT,
            )),
            rdma: None,
            rdma_config: None,
            budget: None,
            tcp_send_timeout: Some(DEFAULT_TCP_SEND_TIMEOUT),
            exports: None,
            drc: Some(DrcConfig::default()),
            nfs4: Some(Nfs4Config::default()),
            rpcbind: None,
            verifier_file: None,
            control: None,
            metrics: None,
        }
    }
}

/// What a clean shutdown did over one transport ([`ShutdownReport::transports`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportShutdown {
    /// "tcp" or "rdma".
    pub transport: &'static str,
    /// Calls under way when the shutdown began: executing (over RPC-over-RDMA also those
    /// whose Read chunks were being pulled, or whose reply was being posted).
    pub at_start: u64,
    /// Of those, finished and answered before their connections closed (over
    /// RPC-over-RDMA: every work request of the reply completed on the send queue first).
    pub answered: u64,
    /// Calls that arrived during the shutdown and were dropped unanswered.
    pub dropped: u64,
}

/// What a clean shutdown achieved ([`Served::shutdown_within`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Every call under way when the shutdown began finished and was answered, over every
    /// transport (over RPC-over-RDMA, its reply's work requests completed before the close).
    pub drained: bool,
    /// Calls that arrived during the shutdown and were dropped unanswered (their clients
    /// resend them to the next instance), over every transport.
    pub dropped: u64,
    /// The same per transport served (TCP, then RPC-over-RDMA).
    pub transports: Vec<TransportShutdown>,
    /// What draining each RPC-over-RDMA connection achieved.
    pub rdma: Option<rpcrdma::QuiesceReport>,
    /// Every export was synced to stable storage.
    pub synced: bool,
    /// The verifier was recorded for the next start ([`crate::verifier`]): only when drained
    /// and synced.
    pub verifier_kept: bool,
    /// Registrations taken back from the system's rpcbind.
    pub unregistered: usize,
    /// What went wrong, if anything.
    pub problems: Vec<String>,
}

/// A running server.
#[derive(Debug)]
pub struct Served {
    server: Arc<NfsServer>,
    table: Arc<ExportTable>,
    portmapper: Arc<Portmapper>,
    nfs_dispatcher: Arc<Dispatcher>,
    /// Where NFS (and MOUNT) listen.
    pub nfs_addr: Option<SocketAddr>,
    /// Where the separate MOUNT listener is.
    pub mount_addr: Option<SocketAddr>,
    /// Where the port mapper listens.
    pub portmap_addr: Option<SocketAddr>,
    /// Where NFS over RPC-over-RDMA listens.
    pub rdma_addr: Option<SocketAddr>,
    listeners: Vec<TcpServer>,
    rdma: Option<Arc<rpcrdma::RdmaServer>>,
    budget: Arc<MemoryBudget>,
    nfs4: Option<Arc<Nfs4Server>>,
    lease_task: Option<tokio::task::JoinHandle<()>>,
    stats: Arc<ServerStats>,
    source: Arc<StatusSource>,
    rpcbind: Option<SystemRpcbind>,
    verifier: Option<(VerifierFile, verifier::Origin)>,
    control: Option<ControlSocket>,
    metrics: Option<MetricsEndpoint>,
}

impl Served {
    /// The server as it is now: exports, clients, credits, calls, bytes.
    pub fn status(&self) -> Status {
        self.source.status()
    }

    /// What status reports are built from (for another reporter).
    pub fn status_source(&self) -> Arc<StatusSource> {
        self.source.clone()
    }

    /// The counters of NFS and MOUNT calls.
    pub fn stats(&self) -> &Arc<ServerStats> {
        &self.stats
    }

    /// Where NFS and MOUNT were registered with the system's rpcbind, if they were.
    pub fn rpcbind(&self) -> Option<&RpcbindAt> {
        self.rpcbind.as_ref().map(SystemRpcbind::at)
    }

    /// Whether this start kept the verifier of a cleanly stopped predecessor (`None`: no
    /// verifier file).
    pub fn verifier_origin(&self) -> Option<verifier::Origin> {
        self.verifier.as_ref().map(|(_, o)| *o)
    }

    /// Where the control socket is.
    pub fn control_path(&self) -> Option<&std::path::Path> {
        self.control.as_ref().map(ControlSocket::path)
    }

    /// Where the metrics endpoint listens.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsEndpoint::local_addr)
    }

    /// Every export served, with its client list.
    pub fn exports(&self) -> Arc<Vec<Arc<crate::gate::Exported>>> {
        self.table.exports()
    }

    /// Serve these exports from now on, without dropping connections
    /// ([`ExportTable::reload`]; the CLI calls it on SIGHUP).
    pub fn reload(&self, exports: &Exports) -> io::Result<()> {
        self.table.reload(exports)
    }

    /// The NFS server state (export, write verifier).
    pub fn server(&self) -> &Arc<NfsServer> {
        &self.server
    }

    /// The NFSv4 server (state tables), when NFSv4 is served.
    pub fn nfs4(&self) -> Option<&Arc<Nfs4Server>> {
        self.nfs4.as_ref()
    }

    /// The memory budget every listener draws from.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// The registry behind the port mapper.
    pub fn portmapper(&self) -> &Arc<Portmapper> {
        &self.portmapper
    }

    /// The dispatcher with the NFS and MOUNT programs: what another transport (RPC-over-RDMA)
    /// serves.
    pub fn nfs_dispatcher(&self) -> Arc<Dispatcher> {
        self.nfs_dispatcher.clone()
    }

    /// Record an RPC-over-RDMA listener for NFSv3 in the port mapper (netid "rdma" or "rdma6",
    /// RFC 8267 §4.2 / RFC 5665).
    //= specs/rfc8267.txt#section-4.2
    //# The chosen port MAY be
    //# registered with the RPC portmapper under the netids assigned in
    //= specs/rfc8166.txt#section-9
    //# These netids MAY be used for any RDMA network that satisfies the requirements of Section
    //# 2.3.2 and that is able to identify service endpoints using IP port addressing, possibly
    //# through use of a translation service as described in Section 5.
    pub fn register_rdma(&self, addr: SocketAddr) {
        self.portmapper.set(Registration {
            prog: nfs3::PROGRAM,
            vers: nfs3::VERSION,
            netid: if addr.is_ipv6() { "rdma6" } else { "rdma" }.into(),
            addr,
            owner: "oxrdma".into(),
        });
    }

    /// Stop every listener and wait for open TCP connections to finish; see
    /// [`Served::shutdown_within`], here without a time limit.
    pub async fn shutdown(self) {
        let _ = self.shutdown_within(Duration::MAX).await;
    }

    /// A clean shutdown, as on SIGTERM: new calls are dropped unanswered (clients resend them
    /// to the next instance), calls already under way finish and are answered for up to
    /// `grace` (over TCP each reply is written before its connection closes; over
    /// RPC-over-RDMA each reply's work requests complete on the send queue before its
    /// connection closes, `rpcrdma::RdmaServer::quiesce`), the registrations with the system's
    /// rpcbind are taken back, every listener and connection closes, every export is synced to
    /// stable storage, and then — only if all of that succeeded — the write verifier is
    /// recorded so that the next instance keeps it and clients need not resend their UNSTABLE
    /// writes (RFC 1813 §3.3.7).
    pub async fn shutdown_within(mut self, grace: Duration) -> ShutdownReport {
        let mut report = ShutdownReport {
            drained: false,
            dropped: 0,
            transports: Vec::new(),
            rdma: None,
            synced: false,
            verifier_kept: false,
            unregistered: 0,
            problems: Vec::new(),
        };
        let tcp_at_start = self.stats.executing_on(TransportKind::Tcp);
        // RPC-over-RDMA drops new calls in its transport (and answers every call it accepted,
        // its Read chunks pulled or not); the others here.
        self.stats.drain_but_rdma();
        let deadline = tokio::time::Instant::now()
            .checked_add(grace)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400 * 365));
        let rdma = self.rdma.take();
        let quiesce = async {
            match &rdma {
                Some(r) => Some(r.quiesce(deadline.into_std()).await),
                None => None,
            }
        };
        let (idle, quiesced) = tokio::join!(
            tokio::time::timeout_at(deadline, self.stats.wait_idle()),
            quiesce
        );
        report.drained = idle.is_ok();
        if !report.drained {
            report.problems.push(format!(
                "{} calls still executing after {grace:?}",
                self.stats.executing()
            ));
        }
        // The RPC-over-RDMA connections are closed (each once drained, or at the deadline);
        // stop accepting for good.
        drop(rdma);
        if let Some(q) = &quiesced
            && !q.drained()
        {
            report.drained = false;
            let left: Vec<String> = q
                .connections
                .iter()
                .filter(|c| !c.drained)
                .map(|c| format!("{}: {:?}", c.peer, c))
                .collect();
            report.problems.push(format!(
                "RPC-over-RDMA connections not drained after {grace:?}: {}",
                left.join("; ")
            ));
        }
        if let Some(r) = self.rpcbind.take() {
            match r.unregister_all().await {
                Ok(n) => report.unregistered = n,
                Err(e) => report.problems.push(e.to_string()),
            }
        }
        self.control = None;
        self.metrics = None;
        if let Some(t) = &self.lease_task {
            t.abort();
        }
        let tcp_served = !self.listeners.is_empty();
        let listeners = std::mem::take(&mut self.listeners);
        let closing = async {
            for l in listeners {
                l.shutdown().await;
            }
        };
        if tokio::time::timeout_at(deadline, closing).await.is_err() {
            report
                .problems
                .push("TCP connections still open after the grace period".into());
            report.drained = false;
        }
        report.dropped = self.stats.dropped_draining();
        if tcp_served {
            // No TCP call has started since (new ones are dropped): those still executing
            // are what is left of the ones under way at the start.
            let still = self.stats.executing_on(TransportKind::Tcp);
            report.transports.push(TransportShutdown {
                transport: "tcp",
                at_start: tcp_at_start,
                answered: tcp_at_start.saturating_sub(still),
                dropped: self.stats.dropped_draining_on(TransportKind::Tcp),
            });
        }
        if let Some(q) = &quiesced {
            let nfs_dropped = self.stats.dropped_draining_on(TransportKind::Rdma);
            report.dropped += q.dropped();
            report.transports.push(TransportShutdown {
                transport: "rdma",
                at_start: q
                    .connections
                    .iter()
                    .map(|c| u64::from(c.calls_at_start))
                    .sum(),
                answered: q.answered(),
                dropped: q.dropped() + nfs_dropped,
            });
        }
        report.rdma = quiesced;
        let exports = self.table.exports();
        let synced = tokio::task::spawn_blocking(move || {
            exports
                .iter()
                .map(|x| {
                    // The root descriptor is O_PATH; syncfs wants one opened for reading.
                    rustix::fs::openat(
                        x.server.export().root_fd(),
                        ".",
                        rustix::fs::OFlags::RDONLY
                            | rustix::fs::OFlags::DIRECTORY
                            | rustix::fs::OFlags::CLOEXEC,
                        rustix::fs::Mode::empty(),
                    )
                    .and_then(|fd| rustix::fs::syncfs(&fd))
                    .map_err(|e| format!("syncing {}: {e}", x.entry.path.display()))
                })
                .filter_map(Result::err)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| vec![e.to_string()]);
        report.synced = synced.is_empty();
        report.problems.extend(synced);
        if let Some((file, _)) = &self.verifier
            && report.drained
            && report.synced
        {
            match file.clean_shutdown(&self.table.write_verifier()) {
                Ok(()) => report.verifier_kept = true,
                Err(e) => report
                    .problems
                    .push(format!("{}: {e}", file.path().display())),
            }
        }
        report
    }
}

fn tcp_netid(addr: &SocketAddr) -> String {
    if addr.is_ipv6() { "tcp6" } else { "tcp" }.into()
}

/// Largest RPC record accepted: a 1 MiB WRITE plus headers, with room to spare.
const MAX_RECORD: usize = 4 << 20;

/// Default of [`ServeConfig::tcp_send_timeout`] (the RPC-over-RDMA transfer timeout's default).
pub const DEFAULT_TCP_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What a call of a program other than NFS is assumed to need for its reply before it runs
/// (MOUNT, the port mapper: small replies; a larger one reserves the rest once built).
const SMALL_REPLY: usize = 64 << 10;

/// What an NFS call without a bound of its own (an NFSv4 COMPOUND: its session's
/// `ca_maxresponsesize` is not known to the transport) reserves for its reply before it runs:
/// the largest READ and its headers.
pub const NFS_REPLY_ESTIMATE: usize = crate::fsops::MAX_IO as usize + 4096;

/// The largest reply a call on the NFS port can produce, from its record: the NFSv3 bounds
/// RPC-over-RDMA also uses (RFC 8267 §4.1: READ count, READDIR count, READDIRPLUS maxcount),
/// or `None` for an NFSv4 COMPOUND.
fn nfs_reply_bound(record: &bytes::Bytes) -> Option<usize> {
    let Ok((MessageHeader::Call(h), args)) = MessageHeader::decode_message(record) else {
        // Not a call the dispatcher will answer with more than an error.
        return Some(SMALL_REPLY);
    };
    match (h.prog, h.vers) {
        (nfs3::PROGRAM, nfs3::VERSION) => crate::ulb::nfs3_max_reply(h.proc_, &args),
        (nfs3::PROGRAM, VERSION4) if h.proc_ == 0 => Some(crate::ulb::RPC_REPLY_HEADER_MAX),
        (nfs3::PROGRAM, _) => None,
        _ => Some(SMALL_REPLY),
    }
}

/// The TCP server settings of the NFS port: records up to a 1 MiB WRITE with room to spare,
/// and with `budget`, every call's reply reserved before it runs at the bound its arguments
/// give (`nfs_reply_bound`), or [`NFS_REPLY_ESTIMATE`].
pub fn nfs_tcp_config(
    budget: Option<Arc<MemoryBudget>>,
    send_timeout: Option<Duration>,
) -> ServerConfig {
    let mut c = ServerConfig::default()
        .with_max_record(MAX_RECORD)
        .with_reply_bound(nfs_reply_bound, NFS_REPLY_ESTIMATE);
    c.budget = budget;
    c.send_timeout = send_timeout;
    c
}

/// The TCP server settings of the MOUNT and port mapper listeners.
fn small_tcp_config(budget: &Arc<MemoryBudget>, send_timeout: Option<Duration>) -> ServerConfig {
    let mut c = ServerConfig::default()
        .with_budget(budget.clone())
        .with_reply_bound(|_| Some(SMALL_REPLY), SMALL_REPLY);
    c.send_timeout = send_timeout;
    c
}

/// Bind and start everything; see the module documentation.
pub async fn start(config: ServeConfig) -> io::Result<Served> {
    let export = config.export.clone();
    let name = config.export_name.clone();
    let read_only = config.read_only;
    let exports = config.exports.clone();
    let drc = config.drc;
    let started_wall = std::time::SystemTime::now();
    let started = std::time::Instant::now();
    let verifier_file = config.verifier_file.clone().map(VerifierFile::new);
    let (table, verifier) = tokio::task::spawn_blocking(move || {
        let (verf, origin) = match &verifier_file {
            Some(f) => {
                let (v, o) = f.start().map_err(|e| {
                    io::Error::new(e.kind(), format!("{}: {e}", f.path().display()))
                })?;
                (v, Some(o))
            }
            None => (verifier::fresh(), None),
        };
        let t = match exports {
            Some(e) => ExportTable::open_with_verifier(&e, drc, verf),
            None => ExportTable::single_with_verifier(&export, name, read_only, drc, verf),
        }?;
        Ok::<_, io::Error>((Arc::new(t), verifier_file.zip(origin)))
    })
    .await
    .map_err(io::Error::other)??;
    let stats = ServerStats::new();
    let server = table.exports()[0].server.clone();
    let portmapper = Portmapper::new();
    let nfs4 = config
        .nfs4
        .clone()
        .map(|c| Nfs4Server::new(table.clone(), c));
    let nfs_program = || {
        stats.counted(match &nfs4 {
            Some(v4) => NfsV3V4::program(table.nfs_program(), v4.clone()),
            None => table.nfs_program(),
        })
    };
    let mount_program = || stats.counted(table.mount_program());
    let lease_task = nfs4.clone().map(|v4| tokio::spawn(expire_leases(v4)));
    let nfs_dispatcher = Arc::new(
        Dispatcher::new()
            .with(nfs_program())
            .with(mount_program())
            .with(Arc::new(PortmapProgram(portmapper.clone()))),
    );
    // One budget for the whole process: the TCP listeners and the RPC-over-RDMA one.
    let budget = config
        .budget
        .clone()
        .or_else(|| config.rdma_config.as_ref().and_then(|c| c.budget.clone()))
        .unwrap_or_else(MemoryBudget::machine_default);
    let send_timeout = config.tcp_send_timeout;
    let scfg = nfs_tcp_config(Some(budget.clone()), send_timeout);
    let mut listeners = Vec::new();
    let mut nfs_addr = None;
    let mut mount_addr = None;
    let mut portmap_addr = None;
    if let Some(addr) = config.tcp {
        // NFS (version 3 and 4.x) is served over TCP and RPC-over-RDMA only, never UDP.
        //= specs/rfc8267.txt#section-6.7.1
        //# Where an NFSv4 implementation supports operation over the IP
        //# network protocol, the supported transport layer between NFS and IP
        //# MUST be an IETF standardized transport protocol that is specified
        //# to avoid network congestion; such transports include TCP and the
        //# Stream Control Transmission Protocol (SCTP).
        //= specs/rfc8267.txt#section-6.7.1
        //# As a consequence, UDP by itself MUST NOT be used as an
        //# NFSv4.1 transport.
        let l = TcpServer::bind(addr, nfs_dispatcher.clone(), scfg.clone()).await?;
        let a = l.local_addr();
        nfs_addr = Some(a);
        listeners.push(l);
        let v4 = nfs4.as_ref().map(|_| (nfs3::PROGRAM, VERSION4));
        for (prog, vers) in [
            (nfs3::PROGRAM, nfs3::VERSION),
            (mount::PROGRAM, mount::VERSION),
        ]
        .into_iter()
        .chain(v4)
        {
            portmapper.set(Registration {
                prog,
                vers,
                netid: tcp_netid(&a),
                addr: a,
                owner: "oxrdma".into(),
            });
        }
    }
    if let Some(addr) = config.mount {
        let d = Arc::new(Dispatcher::new().with(mount_program()));
        let l = TcpServer::bind(addr, d, small_tcp_config(&budget, send_timeout)).await?;
        let a = l.local_addr();
        mount_addr = Some(a);
        listeners.push(l);
        portmapper.set(Registration {
            prog: mount::PROGRAM,
            vers: mount::VERSION,
            netid: tcp_netid(&a),
            addr: a,
            owner: "oxrdma".into(),
        });
    }
    if let Some(addr) = config.portmap {
        let d = Arc::new(Dispatcher::new().with(Arc::new(PortmapProgram(portmapper.clone()))));
        let l = TcpServer::bind(addr, d, small_tcp_config(&budget, send_timeout)).await?;
        let a = l.local_addr();
        portmap_addr = Some(a);
        listeners.push(l);
        portmapper.register_self(a);
    }
    let mut rdma = None;
    let mut rdma_addr = None;
    let mut rdma_credits = 0;
    if let Some(addr) = config.rdma {
        // RFC 8267 §5.1: only NFS itself is offered over RPC-over-RDMA.
        let d = Dispatcher::new().with(nfs_program());
        let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
        let rcfg = rpcrdma::TransportConfig {
            budget: Some(budget.clone()),
            ..config.rdma_config.clone().unwrap_or_default()
        };
        rdma_credits = rcfg.rpc.credits;
        let r = rpcrdma::RdmaServer::bind(addr, d, vec![ulb], rcfg)
            .await
            .map_err(io::Error::other)?;
        rdma_addr = Some(r.local_addr());
        rdma = Some(Arc::new(r));
    }
    let mut shown = Vec::new();
    for (what, a) in [
        ("nfs/tcp", nfs_addr),
        ("nfs/rdma", rdma_addr),
        ("mount", mount_addr),
        ("portmap", portmap_addr),
    ] {
        if let Some(a) = a {
            shown.push((what, a));
        }
    }
    let source = Arc::new(StatusSource {
        started_wall,
        started,
        table: table.clone(),
        stats: stats.clone(),
        tcp: listeners
            .iter()
            .filter(|l| Some(l.local_addr()) != portmap_addr)
            .map(|l| l.stats().clone())
            .collect(),
        rdma: rdma.as_ref().map(Arc::downgrade),
        rdma_credit_limit: rdma_addr.map(|_| rdma_credits),
        budget: budget.clone(),
        listeners: shown,
    });
    let control = match &config.control {
        Some(p) => Some(
            ControlSocket::bind(p, source.clone())
                .await
                .map_err(io::Error::other)?,
        ),
        None => None,
    };
    let metrics = match config.metrics {
        Some(a) => Some(
            MetricsEndpoint::bind(a, source.clone())
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("metrics on {a}: {e}")))?,
        ),
        None => None,
    };
    let mut served = Served {
        server,
        table: table.clone(),
        portmapper,
        nfs_dispatcher,
        nfs_addr,
        mount_addr,
        portmap_addr,
        rdma_addr,
        listeners,
        rdma,
        budget,
        nfs4,
        lease_task,
        stats,
        source,
        rpcbind: None,
        verifier,
        control,
        metrics,
    };
    if let Some(a) = rdma_addr {
        served.register_rdma(a);
    }
    if let Some(at) = config.rpcbind.clone() {
        let r = SystemRpcbind::connect(at).await.map_err(io::Error::other)?;
        // Everything but the port mapper's own entries (the system's rpcbind has those).
        let regs: Vec<Registration> = served
            .portmapper
            .list()
            .into_iter()
            .filter(|r| r.prog != crate::portmap::PROGRAM)
            .collect();
        if let Err(e) = r.register(&regs).await {
            let _ = r.unregister_all().await;
            return Err(io::Error::other(e));
        }
        served.rpcbind = Some(r);
    }
    tracing::info!(
        export = %served.server.export().root_path().display(),
        nfs = ?nfs_addr,
        mount = ?mount_addr,
        portmap = ?portmap_addr,
        rdma = ?rdma_addr,
        nfsv4 = served.nfs4.is_some(),
        "NFS server started"
    );
    Ok(served)
}

/// Expire NFSv4 leases (RFC 8881 §8.3) at the state's next deadline, checking at least once a
/// second.
async fn expire_leases(v4: Arc<Nfs4Server>) {
    loop {
        let next = v4.expire(std::time::Instant::now());
        let now = std::time::Instant::now();
        let wait = next
            .map_or(std::time::Duration::from_secs(1), |t| {
                t.saturating_duration_since(now)
            })
            .clamp(
                std::time::Duration::from_millis(10),
                std::time::Duration::from_secs(1),
            );
        tokio::time::sleep(wait).await;
    }
}

/// Start and serve until Ctrl-C, then shut down gracefully.
pub async fn serve(config: ServeConfig) -> io::Result<()> {
    let served = start(config).await?;
    tokio::signal::ctrl_c().await?;
    served.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncrpc::{CallHeader, OpaqueAuth};

    fn call(prog: u32, vers: u32, proc_: u32, args: &[u8]) -> bytes::Bytes {
        let h = CallHeader {
            xid: 7,
            prog,
            vers,
            proc_,
            cred: OpaqueAuth::none(),
            verf: OpaqueAuth::none(),
        };
        let mut e = xdr::Encoder::new();
        h.encode(&mut e);
        let mut v = e.into_bytes().to_vec();
        v.extend_from_slice(args);
        v.into()
    }

    #[test]
    fn an_nfs3_read_reserves_its_count_and_others_a_bound() {
        let read = nfs3::ReadArgs {
            file: nfs3::Fh3(vec![1; 32].into()),
            offset: 0,
            count: 1 << 20,
        };
        let args = xdr::to_bytes(&read);
        let bound = nfs_reply_bound(&call(nfs3::PROGRAM, 3, nfs3::proc_::READ, &args))
            .expect("READ has a bound");
        assert!((1 << 20) < bound && bound < (1 << 20) + 4096, "{bound}");
        let getattr = nfs_reply_bound(&call(nfs3::PROGRAM, 3, nfs3::proc_::GETATTR, &[]));
        assert!(getattr.is_some_and(|b| b < 4096));
        // An NFSv4 COMPOUND has none the transport can read: the estimate applies.
        assert_eq!(nfs_reply_bound(&call(nfs3::PROGRAM, 4, 1, &[])), None);
        assert_eq!(
            nfs_reply_bound(&call(mount::PROGRAM, 3, 1, &[])),
            Some(SMALL_REPLY)
        );
        assert_eq!(
            nfs_reply_bound(&bytes::Bytes::from_static(b"junk")),
            Some(SMALL_REPLY)
        );
    }
}
