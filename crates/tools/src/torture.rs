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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nfs::client::{ClientError, Nfs3Client};
use nfs::drc::{DrcConfig, DrcStats};
use nfs::nfs3::{CreateHow3, Fh3, Ftype3, Nfsstat3, Sattr3, SetattrArgs, StableHow};
use nfs::server::{ExportOptions, NfsServer};
use nfs::ulb::NfsBinding;
use oncrpc::service::BoxFuture;
use oncrpc::{Call, Dispatcher, Outcome, Program, RpcTransport, ServerConfig, TcpClient};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Before,
    After,
}

enum Cutter {
    Tcp(Arc<oncrpc::TcpServer>),
    Rdma(Arc<RdmaServer>),
}

impl Cutter {
    async fn cut(&self) {
        match self {
            Cutter::Tcp(s) => s.disconnect_all(),
            Cutter::Rdma(s) => {
                for c in s.connections() {
                    c.disconnect().await;
                }
            }
        }
    }
}

/// The NFS program with a server-side drop armed for the next call.
struct Fault {
    inner: Arc<dyn Program>,
    armed: Mutex<Option<Point>>,
    cutter: OnceLock<Cutter>,
}

impl Program for Fault {
    fn program(&self) -> u32 {
        self.inner.program()
    }
    fn versions(&self) -> (u32, u32) {
        self.inner.versions()
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            let point = self
                .armed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let cut = || async {
                if let Some(c) = self.cutter.get() {
                    c.cut().await;
                }
            };
            match point {
                None => self.inner.call(call).await,
                Some(Point::Before) => {
                    cut().await;
                    Outcome::NoReply
                }
                Some(Point::After) => {
                    // Executed (and, if cacheable, its reply in the cache), then the
                    // connection goes and the reply with it: answering nothing makes sure
                    // the reply cannot slip out before the cut takes effect.
                    let _executed = self.inner.call(call).await;
                    cut().await;
                    Outcome::NoReply
                }
            }
        })
    }
}

enum Client {
    Tcp(Arc<TcpClient>),
    Rdma(Arc<RdmaClient>),
}

impl Client {
    async fn disconnect(&self) {
        match self {
            Client::Tcp(c) => c.disconnect(),
            Client::Rdma(c) => c.disconnect().await,
        }
    }
}

/// A file's contents and handle.
struct Inode {
    data: Vec<u8>,
    fh: Fh3,
}

#[derive(Clone)]
enum Node {
    File(u64),
    Dir,
    Link(Vec<u8>),
}

#[derive(Default)]
struct Model {
    names: BTreeMap<String, Node>,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
}

impl Model {
    fn files(&self) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, n)| matches!(n, Node::File(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }
    fn file(&self, name: &str) -> Option<&Inode> {
        match self.names.get(name) {
            Some(Node::File(i)) => self.inodes.get(i),
            _ => None,
        }
    }
    fn unlink(&mut self, name: &str) {
        if let Some(Node::File(i)) = self.names.remove(name)
            && !self
                .names
                .values()
                .any(|n| matches!(n, Node::File(j) if *j == i))
        {
            self.inodes.remove(&i);
        }
    }
}

const NAMES: usize = 24;

fn name(rng: &mut StdRng) -> String {
    format!("n{:02}", rng.random_range(0..NAMES))
}

fn pattern(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

struct Run<'a> {
    c: Nfs3Client,
    root: Fh3,
    m: Model,
    rng: StdRng,
    max_file: usize,
    report: &'a mut TortureReport,
}

type Outcome3<T> = Result<(Nfsstat3, Option<T>), ClientError>;

fn status<T, F>(r: Result<nfs::nfs3::Res<T, F>, ClientError>) -> Outcome3<T> {
    r.map(|res| match res {
        nfs::nfs3::Res::Ok(t) => (Nfsstat3::Ok, Some(t)),
        nfs::nfs3::Res::Err(s, _) => (s, None),
    })
}

impl Run<'_> {
    fn problem(&mut self, what: String) {
        if self.report.problems.len() < 20 {
            self.report.problems.push(what);
        }
    }

    fn expect(&mut self, op: &str, want: Nfsstat3, got: Nfsstat3) -> bool {
        if want != got {
            self.report.mismatches += 1;
            self.problem(format!("{op}: expected {want}, got {got}"));
            false
        } else {
            true
        }
    }

    /// One random operation. `Err` when the call failed at the RPC level.
    async fn step(&mut self) -> Result<(), ClientError> {
        let kind = self.rng.random_range(0..100u32);
        let (label, res) = match kind {
            0..=11 => ("CREATE", self.create().await),
            12..=16 => ("MKDIR", self.mkdir().await),
            17..=20 => ("RMDIR", self.rmdir().await),
            21..=30 => ("REMOVE", self.remove().await),
            31..=37 => ("RENAME", self.rename().await),
            38..=41 => ("LINK", self.link().await),
            42..=45 => ("SYMLINK", self.symlink().await),
            46..=50 => ("SETATTR", self.truncate().await),
            51..=70 => ("WRITE", self.write().await),
            71..=82 => ("READ", self.read().await),
            83..=88 => ("GETATTR", self.getattr().await),
            89..=96 => ("LOOKUP", self.lookup().await),
            _ => ("READDIRPLUS", self.readdir().await),
        };
        *self.report.by_kind.entry(label).or_default() += 1;
        res
    }

    async fn create(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let how = CreateHow3::Guarded(Sattr3 {
            mode: Some(0o644),
            ..Sattr3::default()
        });
        let (s, ok) = status(self.c.create(&self.root, n.as_bytes(), how).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("CREATE {n}"), want, s) && s == Nfsstat3::Ok {
            match ok.and_then(|o| o.obj) {
                Some(fh) => {
                    let ino = self.m.next_ino;
                    self.m.next_ino += 1;
                    self.m.inodes.insert(
                        ino,
                        Inode {
                            data: Vec::new(),
                            fh,
                        },
                    );
                    self.m.names.insert(n, Node::File(ino));
                }
                None => {
                    self.report.mismatches += 1;
                    self.problem(format!("CREATE {n}: no handle"));
                }
            }
        }
        Ok(())
    }

    async fn mkdir(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let (s, _) = status(self.c.mkdir(&self.root, n.as_bytes(), 0o755).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("MKDIR {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::Dir);
        }
        Ok(())
    }

    /// A name that is not a directory (or absent), for REMOVE, RENAME and friends.
    fn non_dir(&mut self) -> String {
        for _ in 0..8 {
            let n = name(&mut self.rng);
            if !matches!(self.m.names.get(&n), Some(Node::Dir)) {
                return n;
            }
        }
        // Every try hit a directory: a name outside the pool, absent.
        "absent".to_string()
    }

    async fn rmdir(&mut self) -> Result<(), ClientError> {
        // A directory or an absent name.
        let mut n = name(&mut self.rng);
        for _ in 0..8 {
            if matches!(self.m.names.get(&n), None | Some(Node::Dir)) {
                break;
            }
            n = name(&mut self.rng);
        }
        if !matches!(self.m.names.get(&n), None | Some(Node::Dir)) {
            n = "absent".into();
        }
        let (s, _) = status(self.c.rmdir(&self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("RMDIR {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.remove(&n);
        }
        Ok(())
    }

    async fn remove(&mut self) -> Result<(), ClientError> {
        let n = self.non_dir();
        let (s, _) = status(self.c.remove(&self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("REMOVE {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.unlink(&n);
        }
        Ok(())
    }

    async fn rename(&mut self) -> Result<(), ClientError> {
        let a = self.non_dir();
        let b = self.non_dir();
        let (s, _) = status(
            self.c
                .rename(&self.root, a.as_bytes(), &self.root, b.as_bytes())
                .await,
        )?;
        let want = if self.m.names.contains_key(&a) {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("RENAME {a} {b}"), want, s) && s == Nfsstat3::Ok && a != b {
            // RFC 1813 §3.3.14: renaming one hard link of a file over another is a no-op.
            let same = matches!(
                (self.m.names.get(&a), self.m.names.get(&b)),
                (Some(Node::File(x)), Some(Node::File(y))) if x == y
            );
            if !same {
                let node = self.m.names.remove(&a);
                self.m.unlink(&b);
                if let Some(node) = node {
                    self.m.names.insert(b, node);
                }
            }
        }
        Ok(())
    }

    async fn link(&mut self) -> Result<(), ClientError> {
        let files = self.m.files();
        if files.is_empty() {
            return self.create().await;
        }
        let src = files[self.rng.random_range(0..files.len())].clone();
        let n = name(&mut self.rng);
        let Some(Node::File(ino)) = self.m.names.get(&src).cloned() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, _) = status(self.c.link(&fh, &self.root, n.as_bytes()).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("LINK {src} {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::File(ino));
        }
        Ok(())
    }

    async fn symlink(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let target = format!("target-{}", self.rng.random_range(0..1000u32)).into_bytes();
        let (s, _) = status(self.c.symlink(&self.root, n.as_bytes(), &target).await)?;
        let want = if self.m.names.contains_key(&n) {
            Nfsstat3::Exist
        } else {
            Nfsstat3::Ok
        };
        if self.expect(&format!("SYMLINK {n}"), want, s) && s == Nfsstat3::Ok {
            self.m.names.insert(n, Node::Link(target));
        }
        Ok(())
    }

    fn pick_file(&mut self) -> Option<(String, u64)> {
        let files = self.m.files();
        if files.is_empty() {
            return None;
        }
        let n = files[self.rng.random_range(0..files.len())].clone();
        match self.m.names.get(&n) {
            Some(Node::File(i)) => Some((n, *i)),
            _ => None,
        }
    }

    async fn truncate(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let size = self.rng.random_range(0..=self.max_file as u64 / 2);
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, _) = status(
            self.c
                .setattr(SetattrArgs {
                    object: fh,
                    new_attributes: Sattr3 {
                        size: Some(size),
                        ..Sattr3::default()
                    },
                    guard: None,
                })
                .await,
        )?;
        if self.expect(&format!("SETATTR {n} size {size}"), Nfsstat3::Ok, s)
            && let Some(i) = self.m.inodes.get_mut(&ino)
        {
            i.data.resize(size as usize, 0);
        }
        Ok(())
    }

    async fn write(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let len = self.rng.random_range(1..=64usize << 10);
        let off = self.rng.random_range(0..=self.max_file - len);
        let data = pattern(&mut self.rng, len);
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, ok) = status(
            self.c
                .write(
                    &fh,
                    off as u64,
                    Bytes::from(data.clone()),
                    StableHow::FileSync,
                )
                .await,
        )?;
        if self.expect(&format!("WRITE {n} {off}+{len}"), Nfsstat3::Ok, s) {
            let count = ok.map_or(0, |o| o.count as usize);
            if count != len {
                self.report.mismatches += 1;
                self.problem(format!("WRITE {n}: {count} of {len} bytes written"));
            }
            if let Some(i) = self.m.inodes.get_mut(&ino) {
                if i.data.len() < off + len {
                    i.data.resize(off + len, 0);
                }
                i.data[off..off + len].copy_from_slice(&data);
            }
        }
        Ok(())
    }

    async fn read(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let want = self.m.inodes[&ino].data.clone();
        let (s, ok) = status(self.c.read(&fh, 0, (want.len() + 1) as u32).await)?;
        if self.expect(&format!("READ {n}"), Nfsstat3::Ok, s) {
            let got = ok.map(|o| (o.data.0, o.eof));
            match got {
                Some((d, true)) if d[..] == want[..] => {}
                Some((d, eof)) => {
                    self.report.mismatches += 1;
                    self.problem(format!(
                        "READ {n}: {} bytes (eof {eof}), model has {}",
                        d.len(),
                        want.len()
                    ));
                }
                None => {}
            }
        }
        Ok(())
    }

    async fn getattr(&mut self) -> Result<(), ClientError> {
        let Some((n, ino)) = self.pick_file() else {
            return self.create().await;
        };
        let fh = self.m.inodes[&ino].fh.clone();
        let (s, ok) = status(self.c.getattr(&fh).await)?;
        if self.expect(&format!("GETATTR {n}"), Nfsstat3::Ok, s)
            && let Some(o) = ok
        {
            let a = o.obj_attributes;
            let want = self.m.inodes[&ino].data.len() as u64;
            if a.ftype != Ftype3::Reg || a.size != want {
                self.report.mismatches += 1;
                self.problem(format!(
                    "GETATTR {n}: {:?} size {}, model {want}",
                    a.ftype, a.size
                ));
            }
        }
        Ok(())
    }

    async fn lookup(&mut self) -> Result<(), ClientError> {
        let n = name(&mut self.rng);
        let (s, ok) = status(self.c.lookup(&self.root, n.as_bytes()).await)?;
        let want = self.m.names.get(&n).cloned();
        let want_s = if want.is_some() {
            Nfsstat3::Ok
        } else {
            Nfsstat3::NoEnt
        };
        if self.expect(&format!("LOOKUP {n}"), want_s, s)
            && let (Some(o), Some(node)) = (ok, want)
        {
            let t = o.obj_attributes.map(|a| a.ftype);
            let want_t = match node {
                Node::File(_) => Ftype3::Reg,
                Node::Dir => Ftype3::Dir,
                Node::Link(_) => Ftype3::Lnk,
            };
            if t != Some(want_t) {
                self.report.mismatches += 1;
                self.problem(format!("LOOKUP {n}: {t:?}, model {want_t:?}"));
            }
        }
        Ok(())
    }

    async fn readdir(&mut self) -> Result<(), ClientError> {
        let entries = self.c.readdirplus_all(&self.root).await?;
        let got: BTreeSet<String> = entries
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name.0).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        let want: BTreeSet<String> = self.m.names.keys().cloned().collect();
        if got != want {
            self.report.mismatches += 1;
            self.problem(format!("READDIRPLUS: {got:?}, model {want:?}"));
        }
        Ok(())
    }

    /// Compare the final tree, over NFS and on disk, with the model.
    async fn verify(&mut self, dir: &Path) {
        let names: Vec<(String, Node)> = self
            .m
            .names
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (n, node) in names {
            let path = dir.join(&n);
            let ok = match &node {
                Node::File(_) => {
                    let Some(i) = self.m.file(&n) else { continue };
                    let want = i.data.clone();
                    let fh = i.fh.clone();
                    let over_nfs = self.c.read_all(&fh, 1 << 20).await.ok();
                    let on_disk = std::fs::read(&path).ok();
                    self.report.files_checked += 1;
                    self.report.bytes_checked += want.len() as u64;
                    over_nfs.as_deref() == Some(&want[..]) && on_disk.as_deref() == Some(&want[..])
                }
                Node::Dir => path.is_dir(),
                Node::Link(t) => std::fs::read_link(&path)
                    .is_ok_and(|p| p.as_os_str().as_encoded_bytes() == &t[..]),
            };
            if !ok {
                self.report.final_mismatches += 1;
                self.problem(format!("final tree: {n} differs from the model"));
            }
        }
        let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
            .map(|it| {
                it.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let want: BTreeSet<String> = self.m.names.keys().cloned().collect();
        if on_disk != want {
            self.report.final_mismatches += 1;
            self.problem(format!("final tree: names {on_disk:?}, model {want:?}"));
        }
    }
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
