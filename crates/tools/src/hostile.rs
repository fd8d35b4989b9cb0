//! `nfs torture --hostile KIND`: hostile NFS clients, made hostile by a
//! [`crate::proxy::FaultProxy`] between them and the server, while a well-behaved client keeps
//! making calls on a connection of its own (issue 20).
//!
//! The kinds ([`HostileKind`]):
//! - **long-calls**: RPC-over-RDMA clients send NFS WRITEs whose data travels in Read chunks
//!   (Long Calls), then never answer the server's RDMA Read Requests (the proxy throws away
//!   everything they send once the server has spoken). The server waits `rdma_timeout`, then
//!   closes each connection and gives its memory back.
//! - **stalled**: many RPC-over-RDMA connections that connect and stall: some never send,
//!   some get half of a call through and no more; and plain TCP connections to the RDMA port
//!   that never send an MPA Request. Connections whose receive buffers do not fit in the
//!   server's budget are refused.
//! - **unread**: RPC-over-RDMA clients at full credits, sending 1 MiB NFS READs, whose
//!   replies (RDMA Writes and Sends) the proxy never reads.
//! - **unread-tcp**: the same over ONC RPC on TCP (NFSv3 over TCP).
//!
//! The pieces ([`Hostiles`], [`Polite`]) are what the tests in `crates/tools/tests/hostile.rs`
//! drive against an in-process server whose budget they watch; [`run`] puts them together
//! against a separate `oxrdma nfs serve` and samples its resident memory.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client};
use nfs::nfs3::{CreateHow3, Fh3, Sattr3, StableHow};
use nfs::ulb::NfsBinding;
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::proxy::{Direction, FaultProxy, Mode, ProxyConn};
use crate::torture::TortureError;

/// Which hostile clients to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostileKind {
    LongCalls,
    Stalled,
    Unread,
    UnreadTcp,
}

impl HostileKind {
    /// Every kind, in the order `all` runs them.
    pub const ALL: [HostileKind; 4] = [
        HostileKind::LongCalls,
        HostileKind::Stalled,
        HostileKind::Unread,
        HostileKind::UnreadTcp,
    ];

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            HostileKind::LongCalls => "long-calls",
            HostileKind::Stalled => "stalled",
            HostileKind::Unread => "unread",
            HostileKind::UnreadTcp => "unread-tcp",
        }
    }

    /// The kind named `s` (see [`HostileKind::name`]).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl std::fmt::Display for HostileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The server under test: where it listens, and the export's root.
#[derive(Debug, Clone)]
pub struct Target {
    /// NFS over RPC-over-RDMA.
    pub rdma: SocketAddr,
    /// NFS and MOUNT over TCP.
    pub tcp: SocketAddr,
    /// The export's root (MNT "/").
    pub root: Fh3,
    /// A file of the hostile clients' READs (at least one I/O size long).
    pub file: Fh3,
    /// Bytes per hostile WRITE and READ.
    pub io_size: usize,
}

fn nfs(t: Arc<dyn RpcTransport>) -> Nfs3Client {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    Nfs3Client::new(t).with_auth_sys(uid, gid, vec![])
}

fn other(what: impl std::fmt::Display) -> TortureError {
    std::io::Error::other(what.to_string()).into()
}

impl Target {
    /// MOUNT the server's "/" over TCP and make the file the hostile READs read (`name` in
    /// the root, `io_size` bytes).
    pub async fn mount(
        rdma: SocketAddr,
        tcp: SocketAddr,
        name: &str,
        io_size: usize,
    ) -> Result<Self, TortureError> {
        let t: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(tcp).await?);
        let root = MountClient::new(t.clone())
            .mnt("/")
            .await
            .map_err(|e| other(format!("MOUNT: {e}")))?;
        let c = nfs(t);
        let file = c
            .create(
                &root,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3::default()),
            )
            .await
            .map_err(|e| other(format!("CREATE {name}: {e}")))?
            .into_result()
            .map_err(|e| other(format!("CREATE {name}: {e}")))?
            .obj
            .ok_or_else(|| other("CREATE returned no file handle"))?;
        c.write_all(&file, &Bytes::from(vec![0x3c; io_size]), 1 << 20)
            .await
            .map_err(|e| other(format!("WRITE {name}: {e}")))?;
        Ok(Target {
            rdma,
            tcp,
            root,
            file,
            io_size,
        })
    }
}

/// Settings of the hostile RPC-over-RDMA clients: no reconnection (a connection the server
/// closed stays closed), calls that give up after `call_timeout`.
fn hostile_rdma_config(call_timeout: Duration) -> TransportConfig {
    TransportConfig {
        reconnect_attempts: 0,
        call_timeout,
        ..TransportConfig::default()
    }
}

async fn rdma_client(
    addr: SocketAddr,
    cfg: TransportConfig,
) -> Result<RdmaClient, rpcrdma::driver::DriverError> {
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    RdmaClient::connect_with(addr, cfg, vec![ulb], None).await
}

/// A set of hostile connections, all through one proxy.
pub struct Hostiles {
    kind: HostileKind,
    proxy: FaultProxy,
    /// The proxied connections of the clients that connected.
    conns: Vec<ProxyConn>,
    /// Connections made through the proxy so far (its accept order).
    made: usize,
    refused: usize,
    rdma: Vec<Arc<RdmaClient>>,
    tcp: Vec<Arc<TcpClient>>,
    raw: Vec<TcpStream>,
    calls: JoinSet<bool>,
}

impl std::fmt::Debug for Hostiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hostiles")
            .field("kind", &self.kind)
            .field("connections", &self.conns.len())
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

/// How long a proxied connection may take to show up in the proxy once its client connected.
const ACCEPT_LIMIT: Duration = Duration::from_secs(30);

impl Hostiles {
    async fn new(kind: HostileKind, upstream: SocketAddr) -> Result<Self, TortureError> {
        let listen = SocketAddr::new(upstream.ip(), 0);
        Ok(Hostiles {
            kind,
            proxy: FaultProxy::start(listen, upstream).await?,
            conns: Vec::new(),
            made: 0,
            refused: 0,
            rdma: Vec::new(),
            tcp: Vec::new(),
            raw: Vec::new(),
            calls: JoinSet::new(),
        })
    }

    /// The proxied connection of the client that connected last (a TCP client is connected
    /// before the proxy has reached the server and listed the connection: wait for it).
    async fn last_conn(&mut self) -> Result<ProxyConn, TortureError> {
        let index = self.made;
        self.made += 1;
        self.proxy
            .connection(index, ACCEPT_LIMIT)
            .await
            .ok_or_else(|| other("proxied connection not seen"))
    }

    /// Connect one RPC-over-RDMA client through the proxy and settle its version with a NULL
    /// call; `None` if the server refused the connection.
    async fn connect_rdma(
        &mut self,
        call_timeout: Duration,
    ) -> Result<Option<(Arc<RdmaClient>, ProxyConn)>, TortureError> {
        let cfg = hostile_rdma_config(call_timeout);
        let c = match rdma_client(self.proxy.local_addr(), cfg).await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::info!(error = %e, "hostile connection refused");
                // It went through the proxy all the same.
                self.made += 1;
                self.refused += 1;
                return Ok(None);
            }
        };
        let pc = self.last_conn().await?;
        let t: Arc<dyn RpcTransport> = c.clone();
        if nfs(t).null().await.is_err() {
            // Accepted, then closed by the server (its budget had no room for the call).
            self.refused += 1;
            return Ok(None);
        }
        self.rdma.push(c.clone());
        self.conns.push(pc.clone());
        Ok(Some((c, pc)))
    }

    /// `n` RPC-over-RDMA clients that send `credits` NFS WRITEs of `io_size` each (Long Calls:
    /// the data in Read chunks) and never answer the server's RDMA Reads.
    pub async fn long_calls(target: &Target, n: usize) -> Result<Self, TortureError> {
        let mut h = Self::new(HostileKind::LongCalls, target.rdma).await?;
        let data = Bytes::from(vec![0x4c; target.io_size]);
        for i in 0..n {
            let Some((c, pc)) = h.connect_rdma(Duration::from_secs(600)).await? else {
                continue;
            };
            // The server's next bytes are its first RDMA Read Request: from then on nothing
            // this client sends reaches it.
            pc.set(Direction::ClientToServer, Mode::StallOnReply);
            let t: Arc<dyn RpcTransport> = c.clone();
            let client = nfs(t);
            let credits = TransportConfig::default().rpc.credits as usize;
            for k in 0..credits {
                let (client, fh, data) = (client.clone(), target.file.clone(), data.clone());
                let off = ((i * credits + k) * data.len()) as u64;
                h.calls.spawn(async move {
                    client
                        .write(&fh, off, data, StableHow::Unstable)
                        .await
                        .is_ok()
                });
            }
        }
        Ok(h)
    }

    /// `n` RPC-over-RDMA connections that stall: every other one never sends a call, the
    /// others get 40 bytes of one through (half of the first frame) and no more; then `n`
    /// plain TCP connections to the RDMA port that never send an MPA Request.
    pub async fn stalled(target: &Target, n: usize) -> Result<Self, TortureError> {
        let mut h = Self::new(HostileKind::Stalled, target.rdma).await?;
        for i in 0..n {
            let Some((c, pc)) = h.connect_rdma(Duration::from_secs(600)).await? else {
                continue;
            };
            if i % 2 == 0 {
                pc.stall(Direction::ClientToServer);
                pc.stall(Direction::ServerToClient);
            } else {
                pc.set(Direction::ClientToServer, Mode::StallAfter(40));
                let t: Arc<dyn RpcTransport> = c;
                let client = nfs(t);
                let root = target.root.clone();
                h.calls
                    .spawn(async move { client.getattr(&root).await.is_ok() });
            }
        }
        for _ in 0..n {
            h.raw.push(TcpStream::connect(h.proxy.local_addr()).await?);
        }
        Ok(h)
    }

    /// `n` RPC-over-RDMA clients at full credits, sending NFS READs of `io_size` whose
    /// replies they never read.
    pub async fn unread(target: &Target, n: usize) -> Result<Self, TortureError> {
        let mut h = Self::new(HostileKind::Unread, target.rdma).await?;
        for _ in 0..n {
            let Some((c, pc)) = h.connect_rdma(Duration::from_secs(600)).await? else {
                continue;
            };
            pc.stop_reading(Direction::ServerToClient);
            let t: Arc<dyn RpcTransport> = c;
            h.spawn_reads(
                nfs(t),
                target,
                TransportConfig::default().rpc.credits as usize,
            );
        }
        Ok(h)
    }

    /// `n` NFS-over-TCP clients with `depth` READs of `io_size` in flight each, whose replies
    /// they never read.
    pub async fn unread_tcp(target: &Target, n: usize, depth: usize) -> Result<Self, TortureError> {
        let mut h = Self::new(HostileKind::UnreadTcp, target.tcp).await?;
        for _ in 0..n {
            let c = Arc::new(TcpClient::connect(h.proxy.local_addr()).await?);
            let pc = h.last_conn().await?;
            let t: Arc<dyn RpcTransport> = c.clone();
            let client = nfs(t);
            client
                .null()
                .await
                .map_err(|e| other(format!("NULL over TCP: {e}")))?;
            pc.stop_reading(Direction::ServerToClient);
            h.spawn_reads(client, target, depth);
            h.tcp.push(c);
            h.conns.push(pc);
        }
        Ok(h)
    }

    fn spawn_reads(&mut self, client: Nfs3Client, target: &Target, depth: usize) {
        let count = u32::try_from(target.io_size).unwrap_or(u32::MAX);
        for _ in 0..depth {
            let (client, fh) = (client.clone(), target.file.clone());
            self.calls
                .spawn(async move { client.read(&fh, 0, count).await.is_ok() });
        }
    }

    /// The kind of these clients.
    pub fn kind(&self) -> HostileKind {
        self.kind
    }

    /// Hostile connections the server accepted.
    pub fn connected(&self) -> usize {
        self.conns.len()
    }

    /// Hostile connections the server refused (or closed before a first call completed).
    pub fn refused(&self) -> usize {
        self.refused
    }

    /// The proxied connections of the clients that connected.
    pub fn connections(&self) -> &[ProxyConn] {
        &self.conns
    }

    /// Hostile connections that have ended (closed by the server: the clients never close
    /// them themselves).
    pub fn closed(&self) -> usize {
        self.conns.iter().filter(|c| c.ended()).count()
    }

    /// Wait up to `limit` for every hostile connection to be closed by the server; the
    /// number closed.
    pub async fn wait_closed(&self, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        for c in &self.conns {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            c.wait_ended(left).await;
        }
        self.closed()
    }

    /// Drop every hostile connection and client; the hostile calls that completed
    /// successfully (none should).
    pub async fn release(mut self) -> usize {
        self.calls.abort_all();
        let mut ok = 0;
        while let Some(r) = self.calls.join_next().await {
            if matches!(r, Ok(true)) {
                ok += 1;
            }
        }
        for c in &self.conns {
            c.drop_connection();
        }
        for c in self.proxy.connections() {
            c.drop_connection();
            c.wait_ended(ACCEPT_LIMIT).await;
        }
        ok
    }
}

/// A well-behaved client: one RPC-over-RDMA connection of its own, GETATTR, 4 KiB WRITE and
/// READ of a file of its own, one at a time.
pub struct Polite {
    client: Arc<RdmaClient>,
    nfs: Nfs3Client,
    root: Fh3,
    file: Fh3,
    ops: u64,
}

impl std::fmt::Debug for Polite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Polite")
            .field("ops", &self.ops)
            .finish_non_exhaustive()
    }
}

impl Polite {
    /// Connect directly to the server (no proxy) and create `name` in the root.
    pub async fn connect(target: &Target, name: &str) -> Result<Self, TortureError> {
        let client = Arc::new(rdma_client(target.rdma, TransportConfig::default()).await?);
        let t: Arc<dyn RpcTransport> = client.clone();
        let nfs = nfs(t);
        let file = nfs
            .create(
                &target.root,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3::default()),
            )
            .await
            .map_err(|e| other(format!("CREATE {name}: {e}")))?
            .into_result()
            .map_err(|e| other(format!("CREATE {name}: {e}")))?
            .obj
            .ok_or_else(|| other("CREATE returned no file handle"))?;
        Ok(Polite {
            client,
            nfs,
            root: target.root.clone(),
            file,
            ops: 0,
        })
    }

    /// Make `n` rounds of GETATTR, WRITE and READ; (operations that succeeded, that failed).
    /// A READ must return what the WRITE before it wrote.
    pub async fn rounds(&mut self, n: u64) -> (u64, u64) {
        let (mut ok, mut failed) = (0, 0);
        for _ in 0..n {
            let off = (self.ops % 64) * 4096;
            let block = Bytes::from(vec![(self.ops % 251) as u8; 4096]);
            self.ops += 1;
            let got = self.nfs.getattr(&self.root).await;
            tally(got.map(|r| r.into_result().is_ok()), &mut ok, &mut failed);
            let w = self
                .nfs
                .write(&self.file, off, block.clone(), StableHow::Unstable)
                .await;
            tally(w.map(|r| r.into_result().is_ok()), &mut ok, &mut failed);
            let r = self.nfs.read(&self.file, off, 4096).await;
            let same = r.map(|r| r.into_result().is_ok_and(|o| o.data.0 == block));
            tally(same, &mut ok, &mut failed);
        }
        (ok, failed)
    }

    /// Write `n` MiB to the file, 1 MiB per WRITE (Read chunks over RPC-over-RDMA).
    pub async fn write_mib(&self, n: u64) -> Result<(), TortureError> {
        let data = bytes::Bytes::from(vec![0x77; 1 << 20]);
        for i in 0..n {
            self.nfs
                .write(&self.file, i << 20, data.clone(), StableHow::Unstable)
                .await
                .map_err(|e| other(format!("WRITE: {e}")))?
                .into_result()
                .map_err(|e| other(format!("WRITE: {e}")))?;
        }
        Ok(())
    }

    /// The client's connection (for its reconnection count).
    pub fn client(&self) -> &Arc<RdmaClient> {
        &self.client
    }
}

fn tally<E>(r: Result<bool, E>, ok: &mut u64, failed: &mut u64) {
    match r {
        Ok(true) => *ok += 1,
        _ => *failed += 1,
    }
}

/// What `nfs torture --hostile` runs.
#[derive(Debug, Clone)]
pub struct HostileConfig {
    pub kinds: Vec<HostileKind>,
    /// The server's RPC-over-RDMA and TCP addresses.
    pub rdma: SocketAddr,
    pub tcp: SocketAddr,
    /// The server's PID, for its memory (`/proc/PID/status`).
    pub pid: Option<u32>,
    /// Hostile connections of the long-calls, unread and unread-tcp kinds.
    pub connections: usize,
    /// Hostile connections of the stalled kind (each costs the server only its receive
    /// buffers, so many more are needed to reach the budget).
    pub stalled_connections: usize,
    /// Bytes per hostile WRITE and READ.
    pub io_size: usize,
    /// READs in flight per hostile TCP connection.
    pub tcp_depth: usize,
    /// How long the stalled and unread clients hold their connections; the long-calls
    /// clients are held until the server closes them, at most this long.
    pub hold: Duration,
    /// Rounds of the well-behaved client per kind (3 calls each).
    pub polite_rounds: u64,
}

impl Default for HostileConfig {
    fn default() -> Self {
        HostileConfig {
            kinds: HostileKind::ALL.to_vec(),
            rdma: SocketAddr::from(([127, 0, 0, 1], nfs::ulb::NFS_RDMA_PORT)),
            tcp: SocketAddr::from(([127, 0, 0, 1], 2049)),
            pid: None,
            connections: 8,
            stalled_connections: 100,
            io_size: 1 << 20,
            tcp_depth: 64,
            hold: Duration::from_secs(40),
            polite_rounds: 50,
        }
    }
}

/// What one kind did.
#[derive(Debug, Clone)]
pub struct KindReport {
    pub kind: HostileKind,
    pub connected: usize,
    pub refused: usize,
    /// Hostile connections the server closed while they were held.
    pub closed_by_server: usize,
    /// Hostile calls that completed (the proxy keeps most from completing).
    pub hostile_calls_ok: usize,
    pub polite_ok: u64,
    pub polite_failed: u64,
    /// The server's VmRSS, KiB: before the kind started, and the most seen while it ran.
    pub rss_before_kib: Option<u64>,
    pub rss_max_kib: Option<u64>,
    pub elapsed: Duration,
}

/// The end of a run.
#[derive(Debug, Clone, Default)]
pub struct HostileReport {
    pub kinds: Vec<KindReport>,
    /// The server's peak resident memory (VmHWM) at the end, KiB.
    pub hwm_kib: Option<u64>,
    /// The server's resident memory at the end, KiB.
    pub rss_end_kib: Option<u64>,
}

/// A field of `/proc/PID/status` in KiB ("VmRSS", "VmHWM").
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Run the kinds one after the other against a server started separately, with a
/// well-behaved client on a connection of its own; `on_kind` sees each kind's report.
pub async fn run(
    cfg: &HostileConfig,
    mut on_kind: impl FnMut(&KindReport),
) -> Result<HostileReport, TortureError> {
    let tag = format!("hostile-{}", std::process::id());
    let target = Target::mount(cfg.rdma, cfg.tcp, &format!("{tag}.data"), cfg.io_size).await?;
    let mut polite = Polite::connect(&target, &format!("{tag}.polite")).await?;
    let mut report = HostileReport::default();
    for &kind in &cfg.kinds {
        let start = Instant::now();
        let rss = |f| cfg.pid.and_then(|p| proc_status_kib(p, f));
        let rss_before_kib = rss("VmRSS");
        // Sample the server's memory while the kind runs.
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let pid = cfg.pid;
        let sampler = tokio::spawn(async move {
            let mut max = None;
            loop {
                if let Some(r) = pid.and_then(|p| proc_status_kib(p, "VmRSS")) {
                    max = Some(max.unwrap_or(0).max(r));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stopped.changed() => return max,
                }
            }
        });
        let n = cfg.connections;
        let h = match kind {
            HostileKind::LongCalls => Hostiles::long_calls(&target, n).await?,
            HostileKind::Stalled => Hostiles::stalled(&target, cfg.stalled_connections).await?,
            HostileKind::Unread => Hostiles::unread(&target, n).await?,
            HostileKind::UnreadTcp => Hostiles::unread_tcp(&target, n, cfg.tcp_depth).await?,
        };
        let (polite_ok, polite_failed) = polite.rounds(cfg.polite_rounds).await;
        let closed_by_server = match kind {
            HostileKind::LongCalls => h.wait_closed(cfg.hold).await,
            _ => {
                let left = cfg.hold.saturating_sub(start.elapsed());
                tokio::time::sleep(left).await;
                h.closed()
            }
        };
        let (connected, refused) = (h.connected(), h.refused());
        let hostile_calls_ok = h.release().await;
        let _ = stop.send(true);
        let rss_max_kib = sampler.await.ok().flatten();
        let k = KindReport {
            kind,
            connected,
            refused,
            closed_by_server,
            hostile_calls_ok,
            polite_ok,
            polite_failed,
            rss_before_kib,
            rss_max_kib,
            elapsed: start.elapsed(),
        };
        on_kind(&k);
        report.kinds.push(k);
    }
    if let Some(p) = cfg.pid {
        report.hwm_kib = proc_status_kib(p, "VmHWM");
        report.rss_end_kib = proc_status_kib(p, "VmRSS");
    }
    Ok(report)
}
