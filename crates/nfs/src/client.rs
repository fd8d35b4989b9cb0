//! NFSv3, MOUNT v3 and port mapper clients over any [`oncrpc::RpcTransport`] (TCP or
//! RPC-over-RDMA).
//!
//! The NFS Upper-Layer Binding is applied on the call side: WRITE data and the SYMLINK path
//! are encoded with `put_ddp_opaque` (the [`Data`] and [`NfsPath`] types do it), so an
//! RPC-over-RDMA transport can move them through Read chunks; READ and READLINK calls carry a
//! [`ReplyExpectation`] with one DDP-eligible item of the requested size and the procedure's
//! maximum reply size (RFC 8267 §4, §4.1), so the transport can provision a Write chunk.
//! Every call returns the procedure's result union ([`Res`]): the NFS status and its
//! weak-cache-consistency data stay visible to the caller.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{AuthSys, CallRequest, OpaqueAuth, ReplyExpectation, RpcError, RpcTransport};
use xdr::{XdrDecode, XdrEncode};

use crate::mount::{self, DirPath, Exports, MountList, MountRes};
use crate::nfs3::*;
use crate::portmap::{self, Mapping, Rpcb, RpcbString};
use crate::ulb;
use crate::xdr_util::{Void, decode_exact};

/// Why a client call failed (the NFS status of a completed call is in its result instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The RPC layer failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The results did not decode.
    #[error("malformed results: {0}")]
    Decode(#[from] xdr::XdrError),
    /// The server answered with an NFS or MOUNT error status.
    #[error("server returned {0}")]
    Status(Nfsstat3),
    /// MOUNT refused the path.
    #[error("MNT failed: {0:?}")]
    Mount(mount::Mountstat3),
}

impl<T, F> Res<T, F> {
    /// The success body, or the status as a [`ClientError::Status`].
    pub fn into_result(self) -> Result<T, ClientError> {
        match self {
            Res::Ok(t) => Ok(t),
            Res::Err(s, _) => Err(ClientError::Status(s)),
        }
    }
}

/// Shared plumbing: a transport, a credential, a timeout.
#[derive(Clone)]
struct Caller {
    rpc: Arc<dyn RpcTransport>,
    cred: OpaqueAuth,
    timeout: Option<Duration>,
}

impl Caller {
    async fn call<A, R>(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: A,
        reply: ReplyExpectation,
    ) -> Result<R, ClientError>
    where
        A: XdrEncode + Send + Sync + 'static,
        R: for<'a> XdrDecode<'a>,
    {
        let mut req = CallRequest::new(prog, vers, proc_, move |e| args.encode(e))
            .with_cred(self.cred.clone())
            .with_reply(reply);
        req.timeout = self.timeout;
        let out: Bytes = self.rpc.call(req).await?;
        Ok(decode_exact(&out)?)
    }
}

/// An NFS version 3 client.
#[derive(Clone)]
pub struct Nfs3Client {
    c: Caller,
}

impl std::fmt::Debug for Nfs3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nfs3Client")
            .field("transport", &self.c.rpc.describe())
            .finish_non_exhaustive()
    }
}

macro_rules! simple_calls {
    ($( $(#[$m:meta])* $name:ident($proc:ident, $args:ty) -> $res:ty; )*) => {
        $(
            $(#[$m])*
            pub async fn $name(&self, args: $args) -> Result<$res, ClientError> {
                self.call(proc_::$proc, args).await
            }
        )*
    };
}

impl Nfs3Client {
    /// A client that calls with AUTH_NONE.
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        Nfs3Client {
            c: Caller {
                rpc,
                cred: OpaqueAuth::none(),
                timeout: None,
            },
        }
    }

    /// Call with an AUTH_SYS credential.
    pub fn with_auth_sys(mut self, uid: u32, gid: u32, gids: Vec<u32>) -> Self {
        self.c.cred = OpaqueAuth::sys(&AuthSys {
            stamp: 0,
            machinename: Bytes::from_static(b"oxrdma"),
            uid,
            gid,
            gids,
        });
        self
    }

    /// Per-call timeout (the transport's default otherwise).
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.c.timeout = Some(t);
        self
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn RpcTransport> {
        &self.c.rpc
    }

    async fn call<A, R>(&self, proc_: u32, args: A) -> Result<R, ClientError>
    where
        A: XdrEncode + Send + Sync + 'static,
        R: for<'a> XdrDecode<'a>,
    {
        // RFC 8267 §4.1: the maximum reply size (and the Write chunk for READ / READLINK)
        // comes from the procedure and the counts in its arguments.
        let reply = match proc_ {
            proc_::READ | proc_::READDIR | proc_::READDIRPLUS => {
                ulb::nfs3_reply_expectation(proc_, &xdr::to_bytes(&args))
            }
            _ => ulb::nfs3_reply_expectation(proc_, &[]),
        };
        self.c.call(PROGRAM, VERSION, proc_, args, reply).await
    }

    /// NULL.
    pub async fn null(&self) -> Result<(), ClientError> {
        let _: Void = self.call(proc_::NULL, Void).await?;
        Ok(())
    }

    simple_calls! {
        /// GETATTR.
        getattr_args(GETATTR, GetattrArgs) -> GetattrRes;
        /// SETATTR.
        setattr(SETATTR, SetattrArgs) -> SetattrRes;
        /// LOOKUP.
        lookup_args(LOOKUP, LookupArgs) -> LookupRes;
        /// ACCESS.
        access_args(ACCESS, AccessArgs) -> AccessRes;
        /// READ; the data is DDP-eligible in the reply.
        read_args(READ, ReadArgs) -> ReadRes;
        /// WRITE; the data is DDP-eligible in the call.
        write_args(WRITE, WriteArgs) -> WriteRes;
        /// CREATE.
        create_args(CREATE, CreateArgs) -> NewObjRes;
        /// MKDIR.
        mkdir_args(MKDIR, MkdirArgs) -> NewObjRes;
        /// SYMLINK; the path is DDP-eligible in the call.
        symlink_args(SYMLINK, SymlinkArgs) -> NewObjRes;
        /// MKNOD.
        mknod(MKNOD, MknodArgs) -> NewObjRes;
        /// REMOVE.
        remove_args(REMOVE, RemoveArgs) -> RemoveRes;
        /// RMDIR.
        rmdir_args(RMDIR, RemoveArgs) -> RemoveRes;
        /// RENAME.
        rename_args(RENAME, RenameArgs) -> RenameRes;
        /// LINK.
        link_args(LINK, LinkArgs) -> LinkRes;
        /// READDIR.
        readdir(READDIR, ReaddirArgs) -> ReaddirRes;
        /// READDIRPLUS.
        readdirplus(READDIRPLUS, ReaddirplusArgs) -> ReaddirplusRes;
        /// COMMIT.
        commit_args(COMMIT, CommitArgs) -> CommitRes;
    }

    /// GETATTR.
    pub async fn getattr(&self, fh: &Fh3) -> Result<GetattrRes, ClientError> {
        self.getattr_args(GetattrArgs { object: fh.clone() }).await
    }

    /// LOOKUP `name` in `dir`.
    pub async fn lookup(&self, dir: &Fh3, name: &[u8]) -> Result<LookupRes, ClientError> {
        self.lookup_args(LookupArgs {
            what: diropargs(dir, name),
        })
        .await
    }

    /// ACCESS.
    pub async fn access(&self, fh: &Fh3, access: u32) -> Result<AccessRes, ClientError> {
        self.access_args(AccessArgs {
            object: fh.clone(),
            access,
        })
        .await
    }

    /// READLINK; the path is DDP-eligible in the reply.
    pub async fn readlink(&self, fh: &Fh3) -> Result<ReadlinkRes, ClientError> {
        self.call(
            proc_::READLINK,
            ReadlinkArgs {
                symlink: fh.clone(),
            },
        )
        .await
    }

    /// READ `count` bytes at `offset`.
    pub async fn read(&self, fh: &Fh3, offset: u64, count: u32) -> Result<ReadRes, ClientError> {
        self.read_args(ReadArgs {
            file: fh.clone(),
            offset,
            count,
        })
        .await
    }

    /// WRITE `data` at `offset`.
    pub async fn write(
        &self,
        fh: &Fh3,
        offset: u64,
        data: Bytes,
        stable: StableHow,
    ) -> Result<WriteRes, ClientError> {
        self.write_args(WriteArgs {
            file: fh.clone(),
            offset,
            count: u32::try_from(data.len()).unwrap_or(u32::MAX),
            stable,
            data: Data(data),
        })
        .await
    }

    /// CREATE `name` in `dir`.
    pub async fn create(
        &self,
        dir: &Fh3,
        name: &[u8],
        how: CreateHow3,
    ) -> Result<NewObjRes, ClientError> {
        self.create_args(CreateArgs {
            where_: diropargs(dir, name),
            how,
        })
        .await
    }

    /// MKDIR `name` in `dir` with `mode`.
    pub async fn mkdir(&self, dir: &Fh3, name: &[u8], mode: u32) -> Result<NewObjRes, ClientError> {
        self.mkdir_args(MkdirArgs {
            where_: diropargs(dir, name),
            attributes: Sattr3 {
                mode: Some(mode),
                ..Sattr3::default()
            },
        })
        .await
    }

    /// SYMLINK `name` in `dir` pointing at `target`.
    pub async fn symlink(
        &self,
        dir: &Fh3,
        name: &[u8],
        target: &[u8],
    ) -> Result<NewObjRes, ClientError> {
        self.symlink_args(SymlinkArgs {
            where_: diropargs(dir, name),
            symlink_attributes: Sattr3::default(),
            symlink_data: NfsPath(Bytes::copy_from_slice(target)),
        })
        .await
    }

    /// REMOVE `name` from `dir`.
    pub async fn remove(&self, dir: &Fh3, name: &[u8]) -> Result<RemoveRes, ClientError> {
        self.remove_args(RemoveArgs {
            object: diropargs(dir, name),
        })
        .await
    }

    /// RMDIR `name` from `dir`.
    pub async fn rmdir(&self, dir: &Fh3, name: &[u8]) -> Result<RemoveRes, ClientError> {
        self.rmdir_args(RemoveArgs {
            object: diropargs(dir, name),
        })
        .await
    }

    /// RENAME.
    pub async fn rename(
        &self,
        from: &Fh3,
        fname: &[u8],
        to: &Fh3,
        tname: &[u8],
    ) -> Result<RenameRes, ClientError> {
        self.rename_args(RenameArgs {
            from: diropargs(from, fname),
            to: diropargs(to, tname),
        })
        .await
    }

    /// LINK.
    pub async fn link(&self, file: &Fh3, dir: &Fh3, name: &[u8]) -> Result<LinkRes, ClientError> {
        self.link_args(LinkArgs {
            file: file.clone(),
            link: diropargs(dir, name),
        })
        .await
    }

    /// FSSTAT.
    pub async fn fsstat(&self, root: &Fh3) -> Result<FsstatRes, ClientError> {
        self.call(
            proc_::FSSTAT,
            FsArgs {
                fsroot: root.clone(),
            },
        )
        .await
    }

    /// FSINFO.
    pub async fn fsinfo(&self, root: &Fh3) -> Result<FsinfoRes, ClientError> {
        self.call(
            proc_::FSINFO,
            FsArgs {
                fsroot: root.clone(),
            },
        )
        .await
    }

    /// PATHCONF.
    pub async fn pathconf(&self, fh: &Fh3) -> Result<PathconfRes, ClientError> {
        self.call(proc_::PATHCONF, FsArgs { fsroot: fh.clone() })
            .await
    }

    /// COMMIT the whole file.
    pub async fn commit(&self, fh: &Fh3) -> Result<CommitRes, ClientError> {
        self.commit_args(CommitArgs {
            file: fh.clone(),
            offset: 0,
            count: 0,
        })
        .await
    }

    /// Read a whole file with READs of `chunk` bytes, up to eof.
    pub async fn read_all(&self, fh: &Fh3, chunk: u32) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        loop {
            let r = self
                .read(fh, out.len() as u64, chunk)
                .await?
                .into_result()?;
            out.extend_from_slice(&r.data.0);
            if r.eof || r.data.is_empty() {
                return Ok(out);
            }
        }
    }

    /// Write `data` from offset 0 with UNSTABLE WRITEs of `chunk` bytes, then COMMIT; fails
    /// with [`ClientError::Status`] (NFS3ERR_IO) if the write verifier changed in between,
    /// as RFC 1813 §3.3.21 makes the caller re-send in that case.
    pub async fn write_all(&self, fh: &Fh3, data: &Bytes, chunk: usize) -> Result<(), ClientError> {
        let mut verf = None;
        let mut off = 0usize;
        let chunk = chunk.max(1);
        while off < data.len() {
            let end = (off + chunk).min(data.len());
            let w = self
                .write(fh, off as u64, data.slice(off..end), StableHow::Unstable)
                .await?
                .into_result()?;
            if w.count == 0 {
                return Err(ClientError::Status(Nfsstat3::Io));
            }
            if *verf.get_or_insert(w.verf) != w.verf {
                return Err(ClientError::Status(Nfsstat3::Io));
            }
            off += w.count as usize;
        }
        let c = self.commit(fh).await?.into_result()?;
        if verf.is_some_and(|v| v != c.verf) {
            return Err(ClientError::Status(Nfsstat3::Io));
        }
        Ok(())
    }

    /// All entries of a directory via READDIRPLUS.
    pub async fn readdirplus_all(&self, dir: &Fh3) -> Result<Vec<Entryplus3>, ClientError> {
        let mut out: Vec<Entryplus3> = Vec::new();
        let mut cookie = 0;
        let mut cookieverf = [0; 8];
        loop {
            let r = self
                .readdirplus(ReaddirplusArgs {
                    dir: dir.clone(),
                    cookie,
                    cookieverf,
                    dircount: 8192,
                    maxcount: 65536,
                })
                .await?
                .into_result()?;
            cookieverf = r.cookieverf;
            if let Some(last) = r.entries.0.last() {
                cookie = last.cookie;
            }
            let done = r.eof || r.entries.0.is_empty();
            out.extend(r.entries.0);
            if done {
                return Ok(out);
            }
        }
    }
}

/// Build `diropargs3`.
pub fn diropargs(dir: &Fh3, name: &[u8]) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: Filename3(Bytes::copy_from_slice(name)),
    }
}

/// A MOUNT version 3 client (RFC 8267 §5.1: use it over TCP).
#[derive(Clone)]
pub struct MountClient {
    c: Caller,
}

impl std::fmt::Debug for MountClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountClient")
            .field("transport", &self.c.rpc.describe())
            .finish_non_exhaustive()
    }
}

impl MountClient {
    /// A client calling with AUTH_SYS uid/gid 0 (mountd accepts AUTH_NONE too).
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        MountClient {
            c: Caller {
                rpc,
                cred: OpaqueAuth::sys(&AuthSys {
                    stamp: 0,
                    machinename: Bytes::from_static(b"oxrdma"),
                    uid: 0,
                    gid: 0,
                    gids: Vec::new(),
                }),
                timeout: None,
            },
        }
    }

    async fn call<A, R>(&self, proc_: u32, args: A) -> Result<R, ClientError>
    where
        A: XdrEncode + Send + Sync + 'static,
        R: for<'a> XdrDecode<'a>,
    {
        self.c
            .call(
                mount::PROGRAM,
                mount::VERSION,
                proc_,
                args,
                ReplyExpectation::default(),
            )
            .await
    }

    /// NULL.
    pub async fn null(&self) -> Result<(), ClientError> {
        let _: Void = self.call(mount::proc_::NULL, Void).await?;
        Ok(())
    }

    /// MNT: the root file handle of `path`.
    pub async fn mnt(&self, path: &str) -> Result<Fh3, ClientError> {
        let r: MountRes = self
            .call(
                mount::proc_::MNT,
                DirPath(Bytes::copy_from_slice(path.as_bytes())),
            )
            .await?;
        match r {
            MountRes::Ok(ok) => Ok(Fh3(ok.fhandle.0)),
            MountRes::Err(s) => Err(ClientError::Mount(s)),
        }
    }

    /// DUMP.
    pub async fn dump(&self) -> Result<MountList, ClientError> {
        self.call(mount::proc_::DUMP, Void).await
    }

    /// UMNT.
    pub async fn umnt(&self, path: &str) -> Result<(), ClientError> {
        let _: Void = self
            .call(
                mount::proc_::UMNT,
                DirPath(Bytes::copy_from_slice(path.as_bytes())),
            )
            .await?;
        Ok(())
    }

    /// UMNTALL.
    pub async fn umntall(&self) -> Result<(), ClientError> {
        let _: Void = self.call(mount::proc_::UMNTALL, Void).await?;
        Ok(())
    }

    /// EXPORT.
    pub async fn export(&self) -> Result<Exports, ClientError> {
        self.call(mount::proc_::EXPORT, Void).await
    }
}

/// A port mapper / rpcbind client.
#[derive(Clone)]
pub struct PortmapClient {
    c: Caller,
}

impl std::fmt::Debug for PortmapClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortmapClient")
            .field("transport", &self.c.rpc.describe())
            .finish_non_exhaustive()
    }
}

impl PortmapClient {
    /// A client calling with AUTH_NONE.
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        PortmapClient {
            c: Caller {
                rpc,
                cred: OpaqueAuth::none(),
                timeout: None,
            },
        }
    }

    /// PMAPPROC_GETPORT (v2): the TCP port of (prog, vers), 0 when unregistered.
    pub async fn getport(&self, prog: u32, vers: u32) -> Result<u16, ClientError> {
        let port: u32 = self
            .c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::GETPORT,
                Mapping {
                    prog,
                    vers,
                    prot: portmap::IPPROTO_TCP,
                    port: 0,
                },
                ReplyExpectation::default(),
            )
            .await?;
        Ok(u16::try_from(port).unwrap_or(0))
    }

    /// PMAPPROC_DUMP (v2).
    pub async fn dump(&self) -> Result<portmap::List<Mapping>, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::DUMP,
                Void,
                ReplyExpectation::default(),
            )
            .await
    }

    /// RPCBPROC_GETADDR (rpcbind `vers` 3 or 4): the universal address, empty when unregistered.
    pub async fn getaddr(
        &self,
        vers: u32,
        prog: u32,
        prog_vers: u32,
        netid: &str,
    ) -> Result<String, ClientError> {
        let s: RpcbString = self
            .c
            .call(
                portmap::PROGRAM,
                vers,
                portmap::rpcb_proc::GETADDR,
                Rpcb {
                    prog,
                    vers: prog_vers,
                    netid: RpcbString(Bytes::copy_from_slice(netid.as_bytes())),
                    addr: RpcbString::default(),
                    owner: RpcbString::default(),
                },
                ReplyExpectation::default(),
            )
            .await?;
        Ok(String::from_utf8_lossy(s.as_bytes()).into_owned())
    }
}

/// A failed [`selftest`] step.
#[derive(Debug, thiserror::Error)]
#[error("selftest step {step} failed: {error}")]
pub struct SelftestError {
    /// The step's name.
    pub step: String,
    /// What went wrong.
    pub error: String,
}

/// Round trips against any NFSv3 server (the same ones the interop lab's
/// `guest/nfs-roundtrip.sh` makes through the kernel client): in a fresh directory under
/// `root`, files of 0, 1, 4095, 4096, 65537 bytes, 1 MiB and `max_mb` MiB are written with
/// UNSTABLE WRITEs of the server's preferred size, COMMITted, read back and compared; then
/// READDIRPLUS, GETATTR, MKDIR, RENAME, SYMLINK/READLINK, REMOVE and RMDIR, and a final LOOKUP
/// that must fail with NOENT. `log` receives one line per step ("OK step ..."). Everything
/// created is removed again on success.
pub async fn selftest(
    c: &Nfs3Client,
    root: &Fh3,
    max_mb: usize,
    mut log: impl FnMut(&str),
) -> Result<(), SelftestError> {
    fn fail(step: &str, e: impl std::fmt::Display) -> SelftestError {
        SelftestError {
            step: step.to_string(),
            error: e.to_string(),
        }
    }
    let info = c
        .fsinfo(root)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("fsinfo", e))?;
    let wsize = info.wtpref.clamp(4096, 1 << 20) as usize;
    let rsize = info.rtpref.clamp(4096, 1 << 20);
    log(&format!(
        "OK fsinfo rtpref={} wtpref={}",
        info.rtpref, info.wtpref
    ));
    let dname = format!(
        "oxrdma-selftest.{}.{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let d = c
        .mkdir(root, dname.as_bytes(), 0o755)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("mkdir", e))?
        .obj
        .ok_or_else(|| fail("mkdir", "no handle returned"))?;
    log(&format!("OK mkdir {dname}"));
    let mut sizes = vec![0usize, 1, 4095, 4096, 65537, 1 << 20];
    if max_mb > 1 {
        sizes.push(max_mb << 20);
    }
    let mut files = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let step = format!("write-{n}");
        let name = format!("f.{n}");
        let fh = c
            .create(
                &d,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3 {
                    mode: Some(0o644),
                    ..Sattr3::default()
                }),
            )
            .await
            .and_then(Res::into_result)
            .map_err(|e| fail(&step, e))?
            .obj
            .ok_or_else(|| fail(&step, "no handle returned"))?;
        let data = selftest_data(n, i as u32);
        c.write_all(&fh, &data, wsize)
            .await
            .map_err(|e| fail(&step, e))?;
        log(&format!("OK {step}"));
        files.push((name, fh, data));
    }
    for (name, fh, data) in &files {
        let step = format!("read-cmp-{}", data.len());
        let back = c.read_all(fh, rsize).await.map_err(|e| fail(&step, e))?;
        if back.len() != data.len() || back[..] != data[..] {
            let at = back.iter().zip(data.iter()).position(|(a, b)| a != b);
            return Err(fail(
                &step,
                format!(
                    "{name}: {} bytes back, first difference at {at:?}",
                    back.len()
                ),
            ));
        }
        log(&format!("OK {step}"));
    }
    let entries = c
        .readdirplus_all(&d)
        .await
        .map_err(|e| fail("readdirplus", e))?;
    let n = entries
        .iter()
        .filter(|e| e.name.as_bytes().starts_with(b"f."))
        .count();
    if n != sizes.len() {
        return Err(fail(
            "readdirplus",
            format!("{n} files listed, {} expected", sizes.len()),
        ));
    }
    log(&format!("OK readdirplus {} entries", entries.len()));
    let f65537 = &files[4].1;
    let a = c
        .getattr(f65537)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("stat-size", e))?;
    if a.obj_attributes.size != 65537 {
        return Err(fail("stat-size", format!("size {}", a.obj_attributes.size)));
    }
    log("OK stat-size");
    let sub = c
        .mkdir(&d, b"sub", 0o755)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("mkdir-sub", e))?
        .obj
        .ok_or_else(|| fail("mkdir-sub", "no handle returned"))?;
    log("OK mkdir-sub");
    c.rename(&d, b"f.4096", &sub, b"renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rename", e))?;
    let moved = c
        .lookup(&sub, b"renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rename-check", e))?;
    let back = c
        .read_all(&moved.object, rsize)
        .await
        .map_err(|e| fail("rename-check", e))?;
    if back[..] != files[3].2[..] {
        return Err(fail("rename-check", "contents differ after rename"));
    }
    log("OK rename");
    let ln = c
        .symlink(&d, b"link", b"sub/renamed")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("symlink", e))?
        .obj
        .ok_or_else(|| fail("symlink", "no handle returned"))?;
    let rl = c
        .readlink(&ln)
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("readlink", e))?;
    if rl.data.as_bytes() != b"sub/renamed" {
        return Err(fail(
            "readlink",
            format!("{:?}", String::from_utf8_lossy(rl.data.as_bytes())),
        ));
    }
    log("OK symlink/readlink");
    let rm = |dir: Fh3, name: Vec<u8>| async move {
        c.remove(&dir, &name)
            .await
            .and_then(Res::into_result)
            .map(drop)
    };
    rm(d.clone(), b"link".to_vec())
        .await
        .map_err(|e| fail("rm", e))?;
    rm(sub.clone(), b"renamed".to_vec())
        .await
        .map_err(|e| fail("rm", e))?;
    for (name, _, _) in &files {
        if name != "f.4096" {
            rm(d.clone(), name.clone().into_bytes())
                .await
                .map_err(|e| fail("rm", e))?;
        }
    }
    log("OK rm");
    c.rmdir(&d, b"sub")
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rmdir", e))?;
    c.rmdir(root, dname.as_bytes())
        .await
        .and_then(Res::into_result)
        .map_err(|e| fail("rmdir", e))?;
    log("OK rmdir");
    match c
        .lookup(root, dname.as_bytes())
        .await
        .map_err(|e| fail("gone", e))?
        .status()
    {
        Nfsstat3::NoEnt => log("OK gone"),
        s => return Err(fail("gone", format!("LOOKUP after RMDIR gave {s}"))),
    }
    Ok(())
}

/// Deterministic test data that does not repeat every 4 KiB (xorshift).
fn selftest_data(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// An NFSACL version 3 client (program 100227): GETACL over any transport. Over
/// RPC-over-RDMA the reply is provisioned for [`ulb::NfsAclBinding::initial_entries`] entries
/// per ACL; give the transport the same binding so that a longer ACL is fetched with short
/// Reply chunk retry (RFC 8267 §3.1, §5.2).
#[derive(Clone)]
pub struct NfsAclClient {
    c: Caller,
    binding: ulb::NfsAclBinding,
}

impl std::fmt::Debug for NfsAclClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsAclClient")
            .field("transport", &self.c.rpc.describe())
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

impl NfsAclClient {
    /// A client that calls with AUTH_NONE and the default reply estimate.
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        NfsAclClient {
            c: Caller {
                rpc,
                cred: OpaqueAuth::none(),
                timeout: None,
            },
            binding: ulb::NfsAclBinding::default(),
        }
    }

    /// Use this binding's reply estimate.
    pub fn with_binding(mut self, binding: ulb::NfsAclBinding) -> Self {
        self.binding = binding;
        self
    }

    /// Call with an AUTH_SYS credential.
    pub fn with_auth_sys(mut self, uid: u32, gid: u32, gids: Vec<u32>) -> Self {
        self.c.cred = OpaqueAuth::sys(&AuthSys {
            stamp: 0,
            machinename: Bytes::from_static(b"oxrdma"),
            uid,
            gid,
            gids,
        });
        self
    }

    /// GETACL: the ACLs of `fh` that `mask` asks for ([`crate::nfsacl::mask`]).
    pub async fn getacl(
        &self,
        fh: Fh3,
        mask: u32,
    ) -> Result<crate::nfsacl::GetAclRes, ClientError> {
        use rpcrdma::ulb::UpperLayerBinding;
        let args = crate::nfsacl::GetAclArgs { fh, mask };
        let reply = ReplyExpectation {
            max_len: self.binding.max_reply_size(
                crate::nfsacl::VERSION,
                crate::nfsacl::proc_::GETACL,
                &[],
            ),
            ddp_items: Vec::new(),
        };
        self.c
            .call(
                crate::nfsacl::PROGRAM,
                crate::nfsacl::VERSION,
                crate::nfsacl::proc_::GETACL,
                args,
                reply,
            )
            .await
    }
}
