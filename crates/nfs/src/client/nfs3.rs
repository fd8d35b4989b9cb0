//! The NFSv3 client (RFC 1813).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{OpaqueAuth, RpcTransport};
use xdr::{XdrDecode, XdrEncode};

use super::{Caller, ClientError, auth_sys};
use crate::nfs3::*;
use crate::ulb;
use crate::xdr_util::Void;

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
        self.c.cred = auth_sys(uid, gid, gids);
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

    /// All entries of a directory via READDIR calls of `count` bytes each; the entries and
    /// the number of calls made.
    pub async fn readdir_all(
        &self,
        dir: &Fh3,
        count: u32,
    ) -> Result<(Vec<crate::nfs3::Entry3>, usize), ClientError> {
        let mut out = Vec::new();
        let (mut cookie, mut cookieverf, mut calls) = (0, [0; 8], 0);
        loop {
            let r = self
                .readdir(crate::nfs3::ReaddirArgs {
                    dir: dir.clone(),
                    cookie,
                    cookieverf,
                    count,
                })
                .await?
                .into_result()?;
            calls += 1;
            cookieverf = r.cookieverf;
            if let Some(last) = r.entries.0.last() {
                cookie = last.cookie;
            }
            let done = r.eof || r.entries.0.is_empty();
            out.extend(r.entries.0);
            if done {
                return Ok((out, calls));
            }
        }
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
