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
use nfs::client::{MountClient, Nfs3Client};
use nfs::serve::{ServeConfig, Served};
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};

use super::{CmdResult, wait_for_signal};

/// The conventional NFS port (RFC 1813 / IANA).
const NFS_PORT: u16 = 2049;

#[derive(Debug, Subcommand)]
pub enum NfsCommand {
    /// Export DIR over NFSv3 (with MOUNT v3 and a port mapper) until Ctrl-C or SIGTERM.
    ///
    /// By default NFS and MOUNT listen on TCP 127.0.0.1:2049, NFS over RPC-over-RDMA
    /// (soft-iWARP) on 127.0.0.1:20049 and the port mapper on 127.0.0.1:111. When 111 cannot
    /// be bound (not root, or rpcbind already runs) the server warns and goes on without it;
    /// clients then mount with explicit ports. Once listening it prints one parseable line,
    /// `ADDRS nfs=tcp://A rdma=rdma://A mount=tcp://A portmap=tcp://A` ("-" for absent ones),
    /// then the mount commands a Linux client would use.
    Serve(ServeArgs),
    /// Call an NFSv3 server: MOUNT over TCP, then NFS over --rdma or --tcp.
    Client(ClientArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The directory to export (as "/", and under its own canonical path).
    dir: PathBuf,
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
    /// Refuse every modification with NFS3ERR_ROFS.
    #[arg(long)]
    read_only: bool,
    /// The path clients mount [default: /].
    #[arg(long, value_name = "PATH", default_value = "/")]
    export: String,
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
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
    let meta =
        std::fs::metadata(&a.dir).map_err(|e| format!("cannot export {}: {e}", a.dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("cannot export {}: not a directory", a.dir.display()).into());
    }
    let tcp = a.tcp.unwrap_or(localhost(NFS_PORT));
    let mut cfg = ServeConfig::new(&a.dir);
    cfg.export_name = Some(a.export.clone());
    cfg.read_only = a.read_only;
    cfg.tcp = Some(tcp);
    cfg.rdma = if a.no_rdma {
        None
    } else {
        Some(a.rdma.unwrap_or(localhost(nfs::ulb::NFS_RDMA_PORT)))
    };
    cfg.mount = a.mount_port.map(|p| SocketAddr::new(tcp.ip(), p));
    let mut pm_warning = None;
    cfg.portmap = if a.no_portmap {
        None
    } else if let Some(p) = a.portmap {
        Some(p)
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
    let served = nfs::serve::start(cfg)
        .await
        .map_err(|e| format!("cannot start the NFS server: {e}"))?;
    if let Some(e) = pm_warning {
        let why = if e.kind() == io::ErrorKind::PermissionDenied {
            "permission denied: binding port 111 needs root or CAP_NET_BIND_SERVICE".to_string()
        } else {
            e.to_string()
        };
        eprintln!(
            "oxrdma: warning: no port mapper on 127.0.0.1:111 ({why}); continuing without it. \
             Clients must give the ports: mount -o port=...,mountport=...,mountproto=tcp \
             (see below), or use --portmap ADDR / --no-portmap."
        );
    }
    print_served(&served, &a);
    wait_for_signal().await;
    eprintln!("oxrdma: shutting down");
    // Open TCP connections (a kernel client keeps one) are given a moment to finish.
    let _ = tokio::time::timeout(Duration::from_secs(5), served.shutdown()).await;
    Ok(())
}

fn print_served(s: &Served, a: &ServeArgs) {
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
    println!(
        "ADDRS nfs={} rdma={} mount={} portmap={}",
        show(s.nfs_addr, "tcp"),
        show(s.rdma_addr, "rdma"),
        show(s.mount_addr.or(s.nfs_addr), "tcp"),
        show(s.portmap_addr, "tcp"),
    );
    let Some(nfs) = s.nfs_addr else { return };
    let mport = s.mount_addr.unwrap_or(nfs).port();
    let host = mount_host(nfs);
    let export = &a.export;
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
    #[command(subcommand)]
    cmd: ClientCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Round trips in a fresh directory: files of 0 B..--max-mb MiB written, committed, read
    /// back and compared; READDIRPLUS, GETATTR, MKDIR, RENAME, SYMLINK/READLINK, REMOVE,
    /// RMDIR. Prints `OK step` per step, then PASS (exit 0) or `FAIL step: error` (exit 1).
    Selftest {
        /// Largest file written, in MiB.
        #[arg(long, default_value_t = 64)]
        max_mb: usize,
    },
}

/// Connect an NFS client (AUTH_SYS) and MNT `export`; also returns the mount handle client.
async fn connect_client(
    rdma: Option<SocketAddr>,
    tcp: Option<SocketAddr>,
    mount_port: Option<u16>,
    export: &str,
    uid: u32,
    gid: u32,
) -> Result<(Nfs3Client, nfs::nfs3::Fh3, String), Box<dyn std::error::Error + Send + Sync>> {
    let (nfs_addr, transport): (SocketAddr, Arc<dyn RpcTransport>) = match (rdma, tcp) {
        (Some(a), _) => {
            // RFC 8267: the NFS binding makes READ/WRITE/READLINK data DDP-eligible.
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> =
                Arc::new(nfs::ulb::NfsBinding::new());
            let c = RdmaClient::connect_with(a, TransportConfig::default(), vec![ulb], None)
                .await
                .map_err(|e| format!("cannot connect to rdma://{a}: {e}"))?;
            (a, Arc::new(c))
        }
        (None, Some(a)) => {
            let c = TcpClient::connect(a)
                .await
                .map_err(|e| format!("cannot connect to tcp://{a}: {e}"))?;
            (a, Arc::new(c))
        }
        (None, None) => return Err("give --rdma ADDR or --tcp ADDR".into()),
    };
    let mport = mount_port.unwrap_or(match tcp {
        Some(t) if rdma.is_none() => t.port(),
        _ => NFS_PORT,
    });
    let maddr = SocketAddr::new(nfs_addr.ip(), mport);
    let mrpc = TcpClient::connect(maddr)
        .await
        .map_err(|e| format!("cannot connect to MOUNT at tcp://{maddr}: {e}"))?;
    let root = MountClient::new(Arc::new(mrpc))
        .mnt(export)
        .await
        .map_err(|e| format!("MNT {export} at tcp://{maddr}: {e}"))?;
    let scheme = if rdma.is_some() { "rdma" } else { "tcp" };
    let desc = format!("{scheme}://{nfs_addr} (MOUNT tcp://{maddr}, export {export})");
    Ok((
        Nfs3Client::new(transport).with_auth_sys(uid, gid, vec![gid]),
        root,
        desc,
    ))
}

async fn client(a: ClientArgs) -> CmdResult {
    let (c, root, desc) =
        connect_client(a.rdma, a.tcp, a.mount_port, &a.export, a.uid, a.gid).await?;
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
    }
}

/// Run an `nfs` command.
pub async fn run(cmd: NfsCommand) -> CmdResult {
    match cmd {
        NfsCommand::Serve(a) => serve(a).await,
        NfsCommand::Client(a) => client(a).await,
    }
}
