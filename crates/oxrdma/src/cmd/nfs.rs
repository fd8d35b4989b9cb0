//! `oxrdma nfs …`: an NFSv3 server over a local directory (TCP and RPC-over-RDMA), an NFSv3
//! client self-test against any server, and a self-contained NFS benchmark.
//!
//! RFC 8267 §5.1: only NFS itself goes over RPC-over-RDMA; MOUNT and the port mapper stay on
//! TCP. The server therefore answers MOUNT on its NFS TCP port (and on `--mount-port` when
//! given), and the client always mounts over TCP, on the same host as the NFS endpoint.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use nfs::serve::{ServeConfig, Served};
use tools::nfs_bench::{self, NFS_PORT};

use tokio::signal::unix::{Signal, SignalKind, signal};

use super::CmdResult;

/// The conventional NFS port (RFC 1813 / IANA).

#[derive(Debug, Subcommand)]
pub enum NfsCommand {
    /// Export DIR over NFSv3 (with MOUNT v3 and a port mapper) and NFSv4.0/4.1/4.2 until Ctrl-C
    /// or SIGTERM.
    ///
    /// By default NFS and MOUNT listen on TCP 127.0.0.1:2049, NFS over RPC-over-RDMA
    /// (soft-iWARP) on 127.0.0.1:20049. When the system's rpcbind runs, NFS and MOUNT are
    /// registered with it (and unregistered at shutdown); otherwise the server runs its own
    /// port mapper on 127.0.0.1:111, or, when 111 cannot be bound (not root), warns and goes
    /// on without one; clients then mount with explicit ports. SIGTERM stops it cleanly
    /// (calls in progress finish; with --state-dir the write verifier is kept for the next
    /// start). Once listening it prints one parseable line,
    /// `ADDRS nfs=tcp://A rdma=rdma://A mount=tcp://A portmap=tcp://A` ("-" for absent ones),
    /// then the mount commands a Linux client would use.
    Serve(Box<ServeArgs>),
    /// Show a running `nfs serve`: its exports, connected clients per transport, RPC-over-RDMA
    /// credits in use, calls per procedure and bytes moved (read from its control socket).
    Status(StatusArgs),
    /// Call an NFS server over --rdma or --tcp: NFSv3 (MOUNT over TCP first), or NFSv4.1/4.2
    /// with --nfs-version.
    Client(ClientArgs),
    /// Benchmark NFSv3 and NFSv4.1 over RPC-over-RDMA and over TCP against an in-process server on a
    /// temporary directory: sequential READ and WRITE MB/s at 4 KiB, 64 KiB and 1 MiB, GETATTR
    /// ops/s, p50/p99 latency, and the raw TCP ceiling (best of three loopback streams of at
    /// least 1 GiB) measured in the same run.
    ///
    /// Rows are `TRANSPORT NFS OP IO MB/s OPS/s P50_US P99_US`; the ratio lines compare READ
    /// at 1 MiB over RDMA with the raw TCP stream and with NFS over TCP (the first version).
    Bench(super::nfs_bench::BenchArgs),
    /// Fault-injection campaign: mixed NFS operations against an in-process server over
    /// RPC-over-RDMA and over TCP, with connection drops from either side, every outcome
    /// checked against a model of the file tree (exit status 1 on any problem). With --soak,
    /// many RPC-over-RDMA connections at full credits instead, sampled every --interval.
    Torture(super::torture::TortureArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The directory to export to everybody who can reach the listeners, read-write, without
    /// squashing (mounted as "/", as --export PATH, or under its own canonical path). Use
    /// --exports to restrict clients.
    #[arg(required_unless_present = "exports", conflicts_with = "exports")]
    dir: Option<PathBuf>,
    /// Serve the exports of an exports(5) file instead of DIR: several directories, each with
    /// its client list and options (ro/rw, root_squash/no_root_squash/all_squash,
    /// anonuid/anongid, secure/insecure, fsid, sec=sys), checked on every call.
    #[arg(long, value_name = "FILE")]
    exports: Option<PathBuf>,
    /// The address every default listener binds [default: 127.0.0.1, which only this machine
    /// can reach]. Give 0.0.0.0 (or ::) to serve a network; --tcp, --rdma and --portmap
    /// override it per listener.
    #[arg(long, value_name = "IP")]
    listen: Option<IpAddr>,
    /// NFS over RPC-over-RDMA (soft-iWARP over TCP) on ADDR [default: 127.0.0.1:20049].
    #[arg(long, value_name = "ADDR")]
    rdma: Option<SocketAddr>,
    /// Do not serve NFS over RPC-over-RDMA.
    #[arg(long, conflicts_with = "rdma")]
    no_rdma: bool,
    /// NFS and MOUNT over TCP on ADDR [default: 127.0.0.1:2049].
    #[arg(long, value_name = "ADDR")]
    tcp: Option<SocketAddr>,
    /// The port mapper (rpcbind) on ADDR [default: 127.0.0.1:111, skipped with a warning if
    /// it cannot be bound]. An explicit ADDR that cannot be bound is an error.
    #[arg(long, value_name = "ADDR", conflicts_with = "no_portmap")]
    portmap: Option<SocketAddr>,
    /// Do not run a port mapper.
    #[arg(long)]
    no_portmap: bool,
    /// Also answer MOUNT on this TCP port (same address as --tcp); MOUNT is always answered
    /// on the NFS TCP port too.
    #[arg(long, value_name = "N")]
    mount_port: Option<u16>,
    /// Refuse every modification with NFS3ERR_ROFS (NFS4ERR_ROFS).
    #[arg(long)]
    read_only: bool,
    /// Serve NFSv3 only (NFSv4.0/4.1/4.2 is served on the same ports by default).
    #[arg(long)]
    no_nfs4: bool,
    /// The NFSv4 grace period after the start, in seconds, during which only reclaims of
    /// state held before a restart are accepted (RFC 8881 §8.4.2) [default: the 90 s lease].
    /// 0 when no client can hold state from an earlier run.
    #[arg(long, value_name = "SECS", conflicts_with = "no_nfs4")]
    nfs4_grace: Option<u64>,
    /// The NFSv4 lease time in seconds (the `lease_time` attribute, RFC 8881 §8.3, RFC 7530
    /// §9.5): a client that renews nothing for this long loses its opens and locks
    /// [default: 90].
    #[arg(long, value_name = "SECS", conflicts_with = "no_nfs4", value_parser = clap::value_parser!(u64).range(1..=3600))]
    nfs4_lease: Option<u64>,
    /// The path clients mount [default: /].
    #[arg(long, value_name = "PATH", default_value = "/")]
    export: String,
    /// The most memory clients can make the server hold, over NFS on TCP and RPC-over-RDMA
    /// together: receive buffers, the Read chunks it pulls, calls and their replies until
    /// sent (bytes, or with a K, M or G suffix) [default: a quarter of this machine's
    /// memory]. Each connection may use an eighth of it (at least 4 MiB); a connection that
    /// does not fit is refused, calls that do not fit wait for memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<usize>,
    /// Offer RPC-over-RDMA version 2 clients responder-provided Read chunks
    /// (draft-cel-nfsv4-rpcrdma-reliable-reply-02, as an experimental transport property):
    /// replies too large for the inline threshold and the client's Reply chunk go back as a
    /// Read chunk the client pulls. Clients that do not announce them see no change.
    #[arg(long)]
    read_chunks: bool,
    /// How long an RPC-over-RDMA client may take to answer the server's RDMA Read of its
    /// Read chunks, and a TCP client to take any of its replies, before its connection is
    /// closed and its memory given back [default: 30].
    #[arg(long, value_name = "SECS")]
    rdma_timeout: Option<u64>,
    /// Print where the server's memory is every SECS seconds, on stderr: the budget's use and
    /// peak, the pooled READ buffers held idle, and the resident set.
    #[arg(long, value_name = "SECS")]
    memory_log: Option<u64>,
    /// Do not register with a running system rpcbind. By default, when one answers (on
    /// /run/rpcbind.sock or 127.0.0.1:111) and neither --portmap nor --no-portmap is given,
    /// NFS and MOUNT are registered there (and unregistered at shutdown) instead of starting
    /// a port mapper of our own.
    #[arg(long)]
    no_rpcbind: bool,
    /// The control socket `oxrdma nfs status` reads [default: /run/oxrdma-nfs.sock, skipped
    /// with a warning if it cannot be made].
    #[arg(long, value_name = "PATH", conflicts_with = "no_control")]
    control: Option<PathBuf>,
    /// No control socket.
    #[arg(long)]
    no_control: bool,
    /// Serve Prometheus metrics (text format) at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Keep state here between runs: the write verifier, kept across a clean shutdown so
    /// clients need not resend their unstable writes (created if missing).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// On SIGTERM or Ctrl-C, give calls in progress this long to finish [default: 10].
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    shutdown_grace: u64,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The server's control socket.
    #[arg(long, value_name = "PATH", default_value = nfs::control::DEFAULT_PATH)]
    control: PathBuf,
}

/// `1048576`, `512K`, `64M`, `2G` (powers of 1024).
fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?}: a size is a number with an optional K, M or G"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{s:?}: too large"))
}

fn show(a: Option<SocketAddr>, scheme: &str) -> String {
    a.map_or_else(|| "-".to_string(), |a| format!("{scheme}://{a}"))
}

/// The host part of a mount command for a listener bound to `a`.
fn mount_host(a: SocketAddr) -> String {
    match a.ip() {
        ip if ip.is_unspecified() => "SERVER".to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    }
}

async fn serve(a: ServeArgs) -> CmdResult {
    let mut cfg = match (&a.dir, &a.exports) {
        (_, Some(file)) => {
            let e = nfs::exports::Exports::load(file).map_err(|e| format!("{e}"))?;
            if e.entries.is_empty() {
                return Err(format!("{}: no exports", file.display()).into());
            }
            let mut c = ServeConfig::new("/");
            c.exports = Some(e);
            c
        }
        (Some(dir), None) => {
            let meta = std::fs::metadata(dir)
                .map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
            if !meta.is_dir() {
                return Err(format!("cannot export {}: not a directory", dir.display()).into());
            }
            ServeConfig::new(dir)
        }
        (None, None) => return Err("give a directory or --exports FILE".into()),
    };
    let ip = a.listen.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let localhost = |port| SocketAddr::new(ip, port);
    let tcp = a.tcp.unwrap_or(localhost(NFS_PORT));
    cfg.export_name = Some(a.export.clone());
    cfg.read_only = a.read_only;
    if a.no_nfs4 {
        cfg.nfs4 = None;
    } else if let Some(secs) = a.nfs4_grace
        && let Some(c) = cfg.nfs4.take()
    {
        // (Only with --nfs4-grace: taking the config out unconditionally served NFSv3 only.)
        cfg.nfs4 = Some(c.with_grace(std::time::Duration::from_secs(secs)));
    }
    if let Some(secs) = a.nfs4_lease
        && let Some(c) = cfg.nfs4.as_mut()
    {
        c.state.lease = std::time::Duration::from_secs(secs);
    }
    cfg.tcp = Some(tcp);
    cfg.rdma = if a.no_rdma {
        None
    } else {
        Some(a.rdma.unwrap_or(localhost(nfs::ulb::NFS_RDMA_PORT)))
    };
    cfg.mount = a.mount_port.map(|p| SocketAddr::new(tcp.ip(), p));
    // One budget for every listener of the process (TCP and RPC-over-RDMA).
    cfg.budget = a.max_memory.map(oncrpc::MemoryBudget::with_limit);
    if let Some(secs) = a.rdma_timeout {
        cfg.tcp_send_timeout = Some(Duration::from_secs(secs));
    }
    if a.max_memory.is_some() || a.rdma_timeout.is_some() || a.read_chunks {
        let mut d = rpcrdma::TransportConfig::default();
        d.rpc.rrc.enabled = a.read_chunks;
        cfg.rdma_config = Some(rpcrdma::TransportConfig {
            budget: cfg.budget.clone(),
            rdma_timeout: a.rdma_timeout.map_or(d.rdma_timeout, Duration::from_secs),
            ..d
        });
    }
    let mut pm_warning = None;
    let system_rpcbind = if a.no_portmap || a.portmap.is_some() || a.no_rpcbind {
        None
    } else {
        nfs::register::SystemRpcbind::find().await
    };
    cfg.portmap = if a.no_portmap {
        None
    } else if let Some(p) = a.portmap {
        Some(p)
    } else if let Some(r) = &system_rpcbind {
        cfg.rpcbind = Some(r.at().clone());
        None
    } else {
        // The default port mapper is best effort: port 111 needs root, and a system rpcbind
        // may already own it. Probe it before starting anything.
        let p = localhost(nfs::portmap::PORT);
        match std::net::TcpListener::bind(p) {
            Ok(l) => {
                drop(l);
                Some(p)
            }
            Err(e) => {
                pm_warning = Some(e);
                None
            }
        }
    };
    cfg.metrics = a.metrics;
    cfg.control = a.control.clone();
    if let Some(d) = &a.state_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        cfg.verifier_file = Some(d.join("write-verifier"));
    }
    drop(system_rpcbind);
    let signals = Signals::install().map_err(|e| format!("cannot catch signals: {e}"))?;
    let served = nfs::serve::start(cfg)
        .await
        .map_err(|e| format!("cannot start the NFS server: {e}"))?;
    // The default control socket is best effort, as the default port mapper.
    let _control = if a.no_control || a.control.is_some() {
        None
    } else {
        let p = std::path::Path::new(nfs::control::DEFAULT_PATH);
        match nfs::control::ControlSocket::bind(p, served.status_source()).await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "oxrdma: warning: no control socket ({e}); `oxrdma nfs status` will not reach this server"
                );
                None
            }
        }
    };
    if let Some(e) = pm_warning {
        let why = if e.kind() == io::ErrorKind::PermissionDenied {
            "permission denied: binding port 111 needs root or CAP_NET_BIND_SERVICE".to_string()
        } else {
            e.to_string()
        };
        eprintln!(
            "oxrdma: warning: no port mapper on {ip}:111 ({why}); continuing without it. \
             Clients must give the ports: mount -o port=...,mountport=...,mountproto=tcp \
             (see below), or use --portmap ADDR / --no-portmap."
        );
    }
    print_served(&served, &a);
    let watcher = tokio::spawn(watch_memory(
        served.budget().clone(),
        a.memory_log.map(Duration::from_secs),
    ));
    serve_until_signal(&served, a.exports.as_deref(), signals).await;
    watcher.abort();
    eprintln!(
        "oxrdma: shutting down: new calls dropped, calls in progress get {} s",
        a.shutdown_grace
    );
    drop(_control);
    let r = served
        .shutdown_within(Duration::from_secs(a.shutdown_grace))
        .await;
    eprintln!(
        "oxrdma: shutdown: in-progress calls {}, {} dropped for the next instance, exports {}, {} rpcbind registrations removed, write verifier {}",
        if r.drained {
            "finished"
        } else {
            "NOT finished"
        },
        r.dropped,
        if r.synced { "synced" } else { "NOT synced" },
        r.unregistered,
        if r.verifier_kept {
            "recorded: the next start keeps it"
        } else if a.state_dir.is_some() {
            "NOT recorded: the next start takes a new one"
        } else {
            "not kept (no --state-dir)"
        },
    );
    for t in &r.transports {
        eprintln!(
            "oxrdma: shutdown: {}: {} of {} calls in progress finished and answered, {} dropped for the next instance",
            t.transport, t.answered, t.at_start, t.dropped
        );
    }
    for p in &r.problems {
        eprintln!("oxrdma: shutdown: {p}");
    }
    Ok(())
}

async fn status(a: StatusArgs) -> CmdResult {
    let report = nfs::control::query(&a.control).await?;
    print!("{report}");
    Ok(())
}

/// Once a second: when connections have closed, ask the runtime to give the memory they held
/// back to the system ([`crate::memtrim`]); with `log`, print the budget, the idle pooled
/// buffers and the resident set every `log`.
async fn watch_memory(budget: Arc<oncrpc::MemoryBudget>, log: Option<Duration>) {
    let mut last_conns = budget.connections();
    let mut last_log = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let conns = budget.connections();
        if conns < last_conns {
            crate::memtrim::request();
        }
        last_conns = conns;
        if let Some(every) = log
            && last_log.elapsed() >= every
        {
            last_log = tokio::time::Instant::now();
            let rss = tools::hostile::proc_status_kib(std::process::id(), "VmRSS");
            eprintln!(
                "oxrdma: memory: budget used {} KiB, peak {} KiB of {} KiB; {} connections; \
                 pooled idle {} KiB; RSS {} KiB",
                budget.used() >> 10,
                budget.peak() >> 10,
                budget.limit() >> 10,
                conns,
                oncrpc::bufpool::idle_bytes() >> 10,
                rss.map_or_else(|| "?".to_string(), |k| k.to_string()),
            );
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from before the server says it is ready: a signal that
/// arrives right after the ADDRS line must not find the default action (termination, with no
/// clean shutdown) still in place.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Serve until SIGINT (Ctrl-C) or SIGTERM; on SIGHUP re-read the exports file, if there is
/// one, and serve what it says from then on, keeping every connection (a file that does not
/// parse changes nothing).
async fn serve_until_signal(served: &Served, file: Option<&std::path::Path>, mut sig: Signals) {
    loop {
        tokio::select! {
            _ = sig.int.recv() => return,
            _ = sig.term.recv() => return,
            _ = sig.hup.recv() => {
                let Some(file) = file else {
                    eprintln!("oxrdma: SIGHUP: no exports file to re-read (serving DIR)");
                    continue;
                };
                let result = nfs::exports::Exports::load(file)
                    .map_err(|e| e.to_string())
                    .and_then(|e| served.reload(&e).map_err(|e| e.to_string()));
                match result {
                    Ok(()) => {
                        eprintln!("oxrdma: SIGHUP: re-read {}", file.display());
                        for x in served.exports().iter() {
                            eprintln!("oxrdma:   exporting {}", x.entry.path.display());
                        }
                    }
                    Err(e) => {
                        eprintln!("oxrdma: SIGHUP: {e}; still serving the previous exports")
                    }
                }
            }
        }
    }
}

fn print_served(s: &Served, a: &ServeArgs) {
    if a.exports.is_some() {
        for x in s.exports().iter() {
            let clients: Vec<String> = x
                .entry
                .clients
                .iter()
                .map(|r| format!("{}({})", r.spec, r.options.describe()))
                .collect();
            println!(
                "exporting {} to {}",
                x.entry.path.display(),
                clients.join(" ")
            );
        }
    } else {
        let root = s.server().export().root_path().display().to_string();
        println!(
            "exporting {root} as {:?} ({})",
            a.export,
            if a.read_only {
                "read-only"
            } else {
                "read-write"
            }
        );
    }
    println!(
        "ADDRS nfs={} rdma={} mount={} portmap={}",
        show(s.nfs_addr, "tcp"),
        show(s.rdma_addr, "rdma"),
        show(s.mount_addr.or(s.nfs_addr), "tcp"),
        show(s.portmap_addr, "tcp"),
    );
    if let Some(at) = s.rpcbind() {
        println!("registered with the system's rpcbind at {at}");
    }
    if let Some(m) = s.metrics_addr() {
        println!("metrics at http://{m}/metrics");
    }
    if let Some(o) = s.verifier_origin() {
        println!(
            "write verifier {}",
            match o {
                nfs::verifier::Origin::Kept => "kept from the previous clean shutdown",
                nfs::verifier::Origin::New => "new (no clean shutdown recorded)",
            }
        );
    }
    let Some(nfs) = s.nfs_addr else { return };
    let mport = s.mount_addr.unwrap_or(nfs).port();
    let host = mount_host(nfs);
    let export = match s.exports().first() {
        Some(x) if a.exports.is_some() => x.entry.path.display().to_string(),
        _ => a.export.clone(),
    };
    println!("mount from a Linux client (as root; nolock: no NLM/statd here):");
    if let Some(r) = s.rdma_addr {
        println!(
            "  mount -t nfs -o vers=3,proto=rdma,port={},mountport={mport},mountproto=tcp,nolock {}:{export} /mnt",
            r.port(),
            mount_host(r)
        );
    }
    println!(
        "  mount -t nfs -o vers=3,proto=tcp,port={},mountport={mport},mountproto=tcp,nolock {host}:{export} /mnt",
        nfs.port()
    );
    if let (Some(pm), Some(r)) = (s.portmap_addr, s.rdma_addr)
        && pm.port() == nfs::portmap::PORT
    {
        println!(
            "  (with the port mapper on 111: mount -t nfs -o vers=3,proto=rdma,port={},nolock {host}:{export} /mnt)",
            r.port()
        );
    }
}

// ------------------------------------------------------------------------------------------
// client
// ------------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Call NFS with RPC-over-RDMA (soft-iWARP) at ADDR.
    #[arg(
        long,
        value_name = "ADDR",
        required_unless_present = "tcp",
        conflicts_with = "tcp"
    )]
    rdma: Option<SocketAddr>,
    /// Call NFS over TCP at ADDR.
    #[arg(long, value_name = "ADDR")]
    tcp: Option<SocketAddr>,
    /// MOUNT v3 is called over TCP on this port of the same host [default: the --tcp port,
    /// or 2049 with --rdma (where `oxrdma nfs serve` answers MOUNT); kernel mountd usually
    /// needs --mount-port 20048].
    #[arg(long, value_name = "N")]
    mount_port: Option<u16>,
    /// The export to mount.
    #[arg(long, value_name = "PATH", default_value = "/")]
    export: String,
    /// AUTH_SYS uid of the calls.
    #[arg(long, default_value_t = 0)]
    uid: u32,
    /// AUTH_SYS gid of the calls.
    #[arg(long, default_value_t = 0)]
    gid: u32,
    /// How RPC-over-RDMA asks for large replies: write-chunk (Write chunks and a Reply chunk,
    /// RFC 8166), read-chunk (none once the server announced responder-provided Read chunks:
    /// it returns large replies as Read chunks the client pulls; version 2), or send-only
    /// (none on any version 2 connection, announced or not).
    #[arg(long, value_name = "MODE", default_value = "write-chunk",
          value_parser = |s: &str| s.parse::<rpcrdma::rrc::ReplyMode>())]
    reply_mode: rpcrdma::rrc::ReplyMode,
    /// The NFS version: 3 (MOUNT, then NFSv3), or 4.1 / 4.2 (no MOUNT: a session, then
    /// COMPOUNDs from PUTROOTFH).
    #[arg(long = "nfs-version", value_name = "V", default_value_t = super::nfs_bench::NfsVersion::V3)]
    nfs_version: super::nfs_bench::NfsVersion,
    #[command(subcommand)]
    cmd: ClientCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Round trips in a fresh directory: files of 0 B..--max-mb MiB written, committed, read
    /// back and compared; READDIRPLUS, GETATTR, MKDIR, RENAME, SYMLINK/READLINK, REMOVE,
    /// RMDIR. Prints `OK step` per step, then PASS (exit 0) or `FAIL step: error` (exit 1).
    /// With --nfs-version 4.1 or 4.2: files of 0 B..--max-mb MiB through OPEN, WRITE, COMMIT,
    /// GETATTR, READ, CLOSE and REMOVE in the root, then DESTROY_SESSION/DESTROY_CLIENTID.
    Selftest {
        /// Largest file written, in MiB.
        #[arg(long, default_value_t = 64)]
        max_mb: usize,
    },
    /// List the export's root directory with READDIR calls of --count bytes; prints
    /// `ENTRIES n CALLS k`, then PASS (exit 0) or `FAIL readdir: error` (exit 1).
    Readdir {
        /// Bytes each READDIR reply may take (its `count`).
        #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
        count: u32,
    },
}

async fn client(a: ClientArgs) -> CmdResult {
    if let Some(minor) = a.nfs_version.bench().minor() {
        let (c, desc) =
            tools::nfs4_bench::connect_client4(a.rdma, a.tcp, minor, a.uid, a.gid).await?;
        println!("CONNECTED {desc}");
        let ClientCommand::Selftest { max_mb } = a.cmd else {
            return Err("readdir: only with --nfs-version 3".into());
        };
        return match nfs::client::selftest4(c, max_mb, |l| println!("{l}")).await {
            Ok(()) => {
                println!("PASS");
                Ok(())
            }
            Err(e) => {
                println!("FAIL {}: {}", e.step, e.error);
                Err(e.into())
            }
        };
    }
    let (c, root, desc) = nfs_bench::connect_client_with(
        a.rdma,
        a.tcp,
        a.mount_port,
        &a.export,
        a.uid,
        a.gid,
        a.reply_mode,
    )
    .await?;
    println!("CONNECTED {desc}");
    match a.cmd {
        ClientCommand::Selftest { max_mb } => {
            match nfs::client::selftest(&c, &root, max_mb, |l| println!("{l}")).await {
                Ok(()) => {
                    println!("PASS");
                    Ok(())
                }
                Err(e) => {
                    println!("FAIL {}: {}", e.step, e.error);
                    Err(e.into())
                }
            }
        }
        ClientCommand::Readdir { count } => match c.readdir_all(&root, count).await {
            Ok((entries, calls)) => {
                println!("ENTRIES {} CALLS {calls}", entries.len());
                println!("PASS");
                Ok(())
            }
            Err(e) => {
                println!("FAIL readdir: {e}");
                Err(e.into())
            }
        },
    }
}

/// Run an `nfs` command.
pub async fn run(cmd: NfsCommand) -> CmdResult {
    match cmd {
        NfsCommand::Serve(a) => serve(*a).await,
        NfsCommand::Status(a) => status(a).await,
        NfsCommand::Client(a) => client(a).await,
        NfsCommand::Bench(a) => super::nfs_bench::bench(a).await,
        NfsCommand::Torture(a) => super::torture::torture(a).await,
    }
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size(&format!("{}G", usize::MAX)).is_err());
    }
}
