//! The duplicate request cache end to end: every cached NFSv3 procedure, over TCP and over
//! RPC-over-RDMA (soft-iWARP on loopback), loses its reply to a connection cut right after it
//! executed; the client reconnects and retransmits under the same XID, and must get the
//! results of the first execution, byte for byte. Without the cache the retransmission runs
//! again and gets other results (REMOVE: NOENT, CREATE: EXIST, ...).
//!
//! The connection is cut by a forwarding proxy between client and server (both ends see the
//! connection die). A wrapper program around the NFS program executes the armed call, keeps
//! its results, cuts, and only then hands the outcome back for a reply that can no longer
//! arrive.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{Nfs3Client, diropargs};
use nfs::drc::DrcConfig;
use nfs::nfs3::*;
use nfs::server::{ExportOptions, NfsServer};
use nfs::ulb::NfsBinding;
use oncrpc::service::BoxFuture;
use oncrpc::{
    AuthSys, Call, CallRequest, Dispatcher, OpaqueAuth, Outcome, Program, RpcTransport,
    ServerConfig, TcpClient, TcpServer,
};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use xdr::{Encoder, XdrEncode};

/// Forwards connections to `target`; [`Proxy::cut`] kills every forwarded connection.
struct Proxy {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Arc<Proxy> {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let c2 = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                let h = tokio::spawn(async move {
                    let Ok(mut b) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = a.set_nodelay(true);
                    let _ = b.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                });
                c2.lock().unwrap().push(h);
            }
        });
        Arc::new(Proxy {
            addr,
            conns,
            accept,
        })
    }

    /// Kill every forwarded connection; returns once their sockets are closed.
    async fn cut(&self) {
        let hs: Vec<_> = std::mem::take(&mut *self.conns.lock().unwrap());
        for h in hs {
            h.abort();
            let _ = h.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The NFS program, with one armed procedure whose first execution loses its reply.
struct CutAfter {
    inner: Arc<dyn Program>,
    armed: Mutex<Option<u32>>,
    /// XID and results of the armed call's execution.
    first: Mutex<Option<(u32, Bytes)>>,
    proxy: OnceLock<Arc<Proxy>>,
}

impl Program for CutAfter {
    fn program(&self) -> u32 {
        self.inner.program()
    }
    fn versions(&self) -> (u32, u32) {
        self.inner.versions()
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(async move {
            let xid = call.header.xid;
            let hit = {
                let mut a = self.armed.lock().unwrap();
                let hit = *a == Some(call.header.proc_);
                if hit {
                    *a = None;
                }
                hit
            };
            let out = self.inner.call(call).await;
            if hit {
                let Outcome::Success(e) = &out else {
                    panic!("armed call failed at the RPC level")
                };
                *self.first.lock().unwrap() = Some((xid, e.unreduced()));
                self.proxy.get().expect("proxy").cut().await;
            }
            out
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Tcp,
    Rdma,
}

struct Rig {
    _tmp: tempfile::TempDir,
    server: Arc<NfsServer>,
    wrap: Arc<CutAfter>,
    _proxy: Arc<Proxy>,
    _tcp: Option<TcpServer>,
    _rdma: Option<RdmaServer>,
    transport: Arc<dyn RpcTransport>,
    client: Nfs3Client,
    root: Fh3,
    cred: OpaqueAuth,
}

fn cred() -> OpaqueAuth {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    OpaqueAuth::sys(&AuthSys {
        stamp: 0,
        machinename: Bytes::from_static(b"drc-test"),
        uid,
        gid,
        gids: vec![],
    })
}

async fn rig(kind: Kind, drc: Option<DrcConfig>) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    let server = NfsServer::with_drc(
        tmp.path(),
        ExportOptions {
            read_only: false,
            name: "/".into(),
        },
        drc,
    )
    .unwrap();
    let wrap = Arc::new(CutAfter {
        inner: server.nfs_program(),
        armed: Mutex::new(None),
        first: Mutex::new(None),
        proxy: OnceLock::new(),
    });
    let d = Dispatcher::new().with(wrap.clone());
    let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (tcp, rdma, target) = match kind {
        Kind::Tcp => {
            let s = TcpServer::bind(local, Arc::new(d), ServerConfig::default())
                .await
                .unwrap();
            let a = s.local_addr();
            (Some(s), None, a)
        }
        Kind::Rdma => {
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
            let s = RdmaServer::bind(local, d, vec![ulb], TransportConfig::default())
                .await
                .unwrap();
            let a = s.local_addr();
            (None, Some(s), a)
        }
    };
    let proxy = Proxy::start(target).await;
    let _ = wrap.proxy.set(proxy.clone());
    let transport: Arc<dyn RpcTransport> = match kind {
        Kind::Tcp => Arc::new(TcpClient::connect(proxy.addr).await.unwrap()),
        Kind::Rdma => {
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
            Arc::new(
                RdmaClient::connect(proxy.addr, TransportConfig::default(), vec![ulb])
                    .await
                    .unwrap(),
            )
        }
    };
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let client = Nfs3Client::new(transport.clone()).with_auth_sys(uid, gid, vec![]);
    let root = server.export().root_handle().unwrap();
    Rig {
        _tmp: tmp,
        server,
        wrap,
        _proxy: proxy,
        _tcp: tcp,
        _rdma: rdma,
        transport,
        client,
        root,
        cred: cred(),
    }
}

impl Rig {
    async fn file(&self, name: &str) -> Fh3 {
        self.client
            .create(
                &self.root,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3 {
                    mode: Some(0o644),
                    ..Sattr3::default()
                }),
            )
            .await
            .unwrap()
            .into_result()
            .unwrap()
            .obj
            .unwrap()
    }

    /// Make `proc_` with `args`, cut the connection after it executed, and return (the
    /// results of the first execution, the results the client got after retransmitting).
    async fn cut_call<A: XdrEncode + Send + Sync + 'static>(
        &self,
        proc_: u32,
        args: A,
    ) -> (Bytes, Bytes) {
        *self.wrap.armed.lock().unwrap() = Some(proc_);
        let req = CallRequest::new(PROGRAM, VERSION, proc_, move |e: &mut Encoder| {
            args.encode(e)
        })
        .with_cred(self.cred.clone())
        .with_timeout(Duration::from_secs(20));
        let got = self.transport.call(req).await.expect("call completes");
        let (_, first) = self
            .wrap
            .first
            .lock()
            .unwrap()
            .take()
            .expect("armed call ran");
        (first, got)
    }
}

fn status(results: &[u8]) -> u32 {
    u32::from_be_bytes(results[..4].try_into().unwrap())
}

/// One case per cached procedure: arguments prepared on `rig`.
async fn each_case(rig: &Rig, mut check: impl FnMut(&str, Bytes, Bytes)) {
    let root = rig.root.clone();
    // SETATTR with a guard, truncating a file that has data.
    let f = rig.file("setattr").await;
    rig.client
        .write(
            &f,
            0,
            Bytes::from_static(b"0123456789"),
            StableHow::FileSync,
        )
        .await
        .unwrap();
    let ctime = rig
        .client
        .getattr(&f)
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj_attributes
        .ctime;
    let (a, b) = rig
        .cut_call(
            proc_::SETATTR,
            SetattrArgs {
                object: f,
                new_attributes: Sattr3 {
                    size: Some(0),
                    ..Sattr3::default()
                },
                guard: Some(ctime),
            },
        )
        .await;
    check("SETATTR", a, b);
    // WRITE extending an empty file.
    let f = rig.file("write").await;
    let (a, b) = rig
        .cut_call(
            proc_::WRITE,
            WriteArgs {
                file: f,
                offset: 0,
                count: 5,
                stable: StableHow::FileSync,
                data: Data(Bytes::from_static(b"hello")),
            },
        )
        .await;
    check("WRITE", a, b);
    // Guarded CREATE.
    let (a, b) = rig
        .cut_call(
            proc_::CREATE,
            CreateArgs {
                where_: diropargs(&root, b"created"),
                how: CreateHow3::Guarded(Sattr3::default()),
            },
        )
        .await;
    check("CREATE", a, b);
    let (a, b) = rig
        .cut_call(
            proc_::MKDIR,
            MkdirArgs {
                where_: diropargs(&root, b"dir"),
                attributes: Sattr3 {
                    mode: Some(0o755),
                    ..Sattr3::default()
                },
            },
        )
        .await;
    check("MKDIR", a, b);
    let (a, b) = rig
        .cut_call(
            proc_::SYMLINK,
            SymlinkArgs {
                where_: diropargs(&root, b"ln"),
                symlink_attributes: Sattr3::default(),
                symlink_data: NfsPath(Bytes::from_static(b"created")),
            },
        )
        .await;
    check("SYMLINK", a, b);
    let (a, b) = rig
        .cut_call(
            proc_::MKNOD,
            MknodArgs {
                where_: diropargs(&root, b"fifo"),
                what: MknodData3::Fifo(Sattr3 {
                    mode: Some(0o644),
                    ..Sattr3::default()
                }),
            },
        )
        .await;
    check("MKNOD", a, b);
    let target = rig.file("target").await;
    let (a, b) = rig
        .cut_call(
            proc_::LINK,
            LinkArgs {
                file: target,
                link: diropargs(&root, b"hard"),
            },
        )
        .await;
    check("LINK", a, b);
    let _ = rig.file("from").await;
    let (a, b) = rig
        .cut_call(
            proc_::RENAME,
            RenameArgs {
                from: diropargs(&root, b"from"),
                to: diropargs(&root, b"to"),
            },
        )
        .await;
    check("RENAME", a, b);
    let _ = rig.file("doomed").await;
    let (a, b) = rig
        .cut_call(
            proc_::REMOVE,
            RemoveArgs {
                object: diropargs(&root, b"doomed"),
            },
        )
        .await;
    check("REMOVE", a, b);
    let (a, b) = rig
        .cut_call(
            proc_::RMDIR,
            RemoveArgs {
                object: diropargs(&root, b"dir"),
            },
        )
        .await;
    check("RMDIR", a, b);
}

async fn replayed(kind: Kind) {
    let rig = rig(kind, Some(DrcConfig::default())).await;
    let mut n = 0;
    each_case(&rig, |name, first, got| {
        assert_eq!(
            status(&first),
            0,
            "{kind:?} {name}: first execution succeeded"
        );
        assert_eq!(
            got, first,
            "{kind:?} {name}: the retransmission gets the original results"
        );
        n += 1;
    })
    .await;
    assert_eq!(n, 10);
    let s = rig.server.drc_stats().unwrap();
    assert_eq!(
        s.hits, 10,
        "{kind:?}: every retransmission was a cache hit: {s:?}"
    );
    assert_eq!(s.in_progress_drops, 0);
    // The namespace saw each operation once.
    let names: Vec<String> = std::fs::read_dir(rig._tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for gone in ["doomed", "dir", "from"] {
        assert!(!names.iter().any(|n| n == gone), "{gone} still there");
    }
    for here in ["created", "ln", "fifo", "hard", "to", "write", "setattr"] {
        assert!(names.iter().any(|n| n == here), "{here} missing");
    }
}

async fn executed_twice_without_cache(kind: Kind) {
    let rig = rig(kind, None).await;
    let mut n = 0;
    each_case(&rig, |name, first, got| {
        assert_eq!(
            status(&first),
            0,
            "{kind:?} {name}: first execution succeeded"
        );
        assert_ne!(
            got, first,
            "{kind:?} {name}: without the cache the retransmission executes again"
        );
        n += 1;
    })
    .await;
    assert_eq!(n, 10);
    assert!(rig.server.drc_stats().is_none());
}

fn run(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(120), f)
                .await
                .expect("test timed out")
        });
}

#[test]
fn tcp_retransmission_after_reconnect_gets_the_original_reply() {
    run(replayed(Kind::Tcp));
}

#[test]
fn rdma_retransmission_after_reconnect_gets_the_original_reply() {
    run(replayed(Kind::Rdma));
}

#[test]
fn tcp_without_cache_the_retransmission_runs_again() {
    run(executed_twice_without_cache(Kind::Tcp));
}

#[test]
fn rdma_without_cache_the_retransmission_runs_again() {
    run(executed_twice_without_cache(Kind::Rdma));
}

/// A call retransmitted from another port and over the other transport is the same call; a
/// call with the same XID and other arguments is not; a call from the network that is not
/// cached (GETATTR) never enters the cache.
#[test]
fn replay_crosses_transports_and_ports() {
    run(async {
        let tmp = tempfile::tempdir().unwrap();
        let server = NfsServer::new(
            tmp.path(),
            ExportOptions {
                read_only: false,
                name: "/".into(),
            },
        )
        .unwrap();
        std::fs::write(tmp.path().join("a"), b"x").unwrap();
        std::fs::write(tmp.path().join("b"), b"x").unwrap();
        let prog = server.nfs_program();
        let root = server.export().root_handle().unwrap();
        let call = |xid: u32, name: &'static [u8], peer: &str, t: oncrpc::TransportKind| {
            let args = xdr::to_bytes(&RemoveArgs {
                object: diropargs(&root, name),
            });
            Call {
                header: CallRequest::new(PROGRAM, VERSION, proc_::REMOVE, |_| {})
                    .with_cred(cred())
                    .header(xid),
                credential: oncrpc::Credential::parse(&cred()).unwrap(),
                args,
                context: Arc::new(oncrpc::CallContext {
                    peer: Some(peer.parse().unwrap()),
                    local: None,
                    transport: t,
                    back: None,
                }),
                reply_policy: xdr::DdpPolicy::Inline,
                hints: Default::default(),
            }
        };
        let results = |o: Outcome| match o {
            Outcome::Success(e) => e.unreduced(),
            other => panic!("{other:?}"),
        };
        use oncrpc::TransportKind::{Rdma, Tcp};
        let first = results(prog.call(call(7, b"a", "127.0.0.1:700", Tcp)).await);
        assert_eq!(status(&first), 0);
        let again = results(prog.call(call(7, b"a", "127.0.0.1:20001", Rdma)).await);
        assert_eq!(again, first);
        // Same XID, other arguments: a new call (removes b).
        let other = results(prog.call(call(7, b"b", "127.0.0.1:700", Tcp)).await);
        assert_eq!(status(&other), 0);
        assert!(!tmp.path().join("b").exists());
        // Same XID and arguments from another host: a new call (a is gone: NOENT).
        let host2 = results(prog.call(call(7, b"a", "127.0.0.2:700", Tcp)).await);
        assert_eq!(status(&host2), Nfsstat3::NoEnt as u32);
        let s = server.drc_stats().unwrap();
        assert_eq!((s.hits, s.misses, s.mismatches), (1, 3, 1));
    });
}
