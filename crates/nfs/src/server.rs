//! The NFSv3 (RFC 1813) and MOUNT v3 programs over an [`Export`].
//!
//! Each call's arguments are decoded on the async side (GARBAGE_ARGS when they do not decode
//! exactly), then the file-system work runs on tokio's blocking pool. Results are encoded with
//! [`oncrpc::Call::reply_encoder`], so the transport's reduction policy applies to the
//! DDP-eligible READ and READLINK results (RFC 8267 §4).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Credential, Outcome, Program};
use rustix::fs::{AtFlags, Mode, OFlags, Statx, Timestamps};
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::drc::{Admit, DrcConfig, DrcStats, Key, SharedCache, is_cached_proc};
use crate::mount::{
    self, DirPath, ExportNode, Fhandle3, List, MountBody, MountOk, MountRes, Mountstat3, Name,
};
use crate::nfs3::*;
use crate::vfs::{
    Cred, Export, MAY_EXEC, MAY_READ, MAY_WRITE, NAME_MAX, NfsResult, Node, S_ISGID, S_ISVTX,
    check_name, is_dir, is_lnk, is_reg, may,
};
use crate::xdr_util::Void;

/// Largest READ and WRITE the server advertises (FSINFO rtmax/wtmax).
pub const MAX_IO: u32 = 1 << 20;
/// Preferred READDIR size (FSINFO dtpref).
pub const DTPREF: u32 = 64 * 1024;

/// Server-wide settings of one export.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Refuse every modifying procedure with NFS3ERR_ROFS.
    pub read_only: bool,
    /// The path clients mount (MNT); the export's canonical path is accepted too.
    pub name: String,
}

/// The shared state of the NFS and MOUNT programs.
#[derive(Debug)]
pub struct NfsServer {
    export: Export,
    opts: ExportOptions,
    write_verf: Verf,
    mounts: Mutex<Vec<(String, String)>>,
    read_bufs: Arc<oncrpc::BufPool>,
    drc: Option<Arc<SharedCache>>,
}

/// READs of at least this many bytes use a pooled buffer ([`oncrpc::BufPool`]) of `MAX_IO`
/// bytes instead of a freshly zeroed one.
const POOLED_READ_MIN: usize = (MAX_IO / 4) as usize;
/// Idle pooled READ buffers kept (more are freed): enough for a client's readahead window.
const POOLED_READ_KEEP: usize = 32;

impl NfsServer {
    /// Serve the directory `root`, with a duplicate request cache of the default size
    /// ([`DrcConfig::default`]). The write verifier is new for every server instance
    /// (RFC 1813 §3.3.7: it changes when the server restarts, so clients re-send UNSTABLE data).
    pub fn new(root: &Path, opts: ExportOptions) -> std::io::Result<Arc<Self>> {
        Self::with_drc(root, opts, Some(DrcConfig::default()))
    }

    /// [`NfsServer::new`] with these duplicate request cache bounds, or none (`None`: every
    /// retransmission executes again).
    pub fn with_drc(
        root: &Path,
        opts: ExportOptions,
        drc: Option<DrcConfig>,
    ) -> std::io::Result<Arc<Self>> {
        Ok(Self::from_export(Export::open(root)?, opts, drc))
    }

    /// Serve an export already opened (see [`crate::gate::ExportTable`]).
    pub fn from_export(export: Export, opts: ExportOptions, drc: Option<DrcConfig>) -> Arc<Self> {
        let mut write_verf = rand::random::<[u8; 8]>();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        for (v, t) in write_verf.iter_mut().zip(now.to_be_bytes()) {
            *v ^= t;
        }
        Arc::new(NfsServer {
            export,
            opts,
            write_verf,
            mounts: Mutex::new(Vec::new()),
            read_bufs: oncrpc::BufPool::new(POOLED_READ_KEEP),
            drc: drc.map(SharedCache::new),
        })
    }

    /// Counters of the duplicate request cache (`None` without one).
    pub fn drc_stats(&self) -> Option<DrcStats> {
        self.drc.as_ref().map(|c| c.stats())
    }

    /// The export.
    pub fn export(&self) -> &Export {
        &self.export
    }

    /// The write verifier of this server instance.
    pub fn write_verifier(&self) -> Verf {
        self.write_verf
    }

    /// The NFS program (100003, version 3).
    pub fn nfs_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(NfsProgram(self.clone()))
    }

    /// The MOUNT program (100005, version 3).
    pub fn mount_program(self: &Arc<Self>) -> Arc<dyn Program> {
        Arc::new(MountProgram(self.clone()))
    }

    fn post(&self, rel: &Path) -> PostOpAttr {
        self.export
            .stat_rel(rel)
            .ok()
            .map(|st| self.export.fattr(&st))
    }

    fn wcc(&self, before: &Statx, rel: &Path) -> WccData {
        WccData {
            before: Some(Export::wcc_attr(before)),
            after: self.post(rel),
        }
    }

    fn rofs(&self) -> NfsResult<()> {
        if self.opts.read_only {
            Err(Nfsstat3::Rofs)
        } else {
            Ok(())
        }
    }

    fn dir(&self, fh: &Fh3) -> NfsResult<Node> {
        let n = self.export.resolve(fh)?;
        if !is_dir(&n.st) {
            return Err(Nfsstat3::NotDir);
        }
        Ok(n)
    }

    /// Execute one NFSv3 procedure whose arguments have been decoded; encode its results.
    pub fn execute(&self, cred: &Cred, args: Args, enc: &mut Encoder) {
        match args {
            Args::Null => {}
            Args::Getattr(a) => self.getattr(a).encode(enc),
            Args::Setattr(a) => self.setattr(cred, a).encode(enc),
            Args::Lookup(a) => self.lookup(cred, a).encode(enc),
            Args::Access(a) => self.access(cred, a).encode(enc),
            Args::Readlink(a) => self.readlink(a).encode(enc),
            Args::Read(a) => self.read(cred, a).encode(enc),
            Args::Write(a) => self.write(cred, a).encode(enc),
            Args::Create(a) => self.create(cred, a).encode(enc),
            Args::Mkdir(a) => self.mkdir(cred, a).encode(enc),
            Args::Symlink(a) => self.symlink(cred, a).encode(enc),
            Args::Mknod(a) => self.mknod(cred, a).encode(enc),
            Args::Remove(a) => self.remove(cred, a, false).encode(enc),
            Args::Rmdir(a) => self.remove(cred, a, true).encode(enc),
            Args::Rename(a) => self.rename(cred, a).encode(enc),
            Args::Link(a) => self.link(cred, a).encode(enc),
            Args::Readdir(a) => self.readdir(cred, a).encode(enc),
            Args::Readdirplus(a) => self.readdirplus(cred, a).encode(enc),
            Args::Fsstat(a) => self.fsstat(a).encode(enc),
            Args::Fsinfo(a) => self.fsinfo(a).encode(enc),
            Args::Pathconf(a) => self.pathconf(a).encode(enc),
            Args::Commit(a) => self.commit(a).encode(enc),
        }
    }

    fn getattr(&self, a: GetattrArgs) -> GetattrRes {
        match self.export.resolve(&a.object) {
            Ok(n) => Res::Ok(GetattrOk {
                obj_attributes: self.export.fattr(&n.st),
            }),
            Err(s) => Res::Err(s, Void),
        }
    }

    fn setattr(&self, cred: &Cred, a: SetattrArgs) -> SetattrRes {
        let n = match self.export.resolve(&a.object) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self.setattr_inner(cred, &n, &a);
        let wcc = WccOnly {
            wcc: self.wcc(&n.st, &n.rel),
        };
        match r {
            Ok(()) => Res::Ok(wcc),
            Err(s) => Res::Err(s, wcc),
        }
    }

    fn setattr_inner(&self, cred: &Cred, n: &Node, a: &SetattrArgs) -> NfsResult<()> {
        self.rofs()?;
        // RFC 1813 §3.3.2: the guard compares the object's ctime.
        if let Some(guard) = a.guard
            && guard != crate::vfs::nfstime(&n.st.stx_ctime)
        {
            return Err(Nfsstat3::NotSync);
        }
        let s = &a.new_attributes;
        let owner = cred.uid == 0 || cred.uid == n.st.stx_uid;
        if s.mode.is_some() && !owner {
            return Err(Nfsstat3::Perm);
        }
        if let Some(uid) = s.uid
            && uid != n.st.stx_uid
            && cred.uid != 0
        {
            return Err(Nfsstat3::Perm);
        }
        if let Some(gid) = s.gid
            && gid != n.st.stx_gid
            && cred.uid != 0
            && !(owner && cred.in_group(gid))
        {
            return Err(Nfsstat3::Perm);
        }
        if s.size.is_some() {
            if is_dir(&n.st) {
                return Err(Nfsstat3::IsDir);
            }
            if !is_reg(&n.st) {
                return Err(Nfsstat3::Inval);
            }
            if !may(&n.st, cred, MAY_WRITE) && !owner {
                return Err(Nfsstat3::Acces);
            }
        }
        match (s.atime, s.mtime) {
            (SetTime::ClientTime(_), _) | (_, SetTime::ClientTime(_)) if !owner => {
                return Err(Nfsstat3::Perm);
            }
            (SetTime::ServerTime, _) | (_, SetTime::ServerTime)
                if !owner && !may(&n.st, cred, MAY_WRITE) =>
            {
                return Err(Nfsstat3::Acces);
            }
            _ => {}
        }
        if n.rel.as_os_str().is_empty() {
            return self.setattr_root(s);
        }
        let (dir, name) = self.export.parent_of(&n.rel)?;
        if let Some(size) = s.size {
            let f = self.export.open_file(&n.rel, true)?;
            f.set_len(size).map_err(|e| crate::vfs::io_to_nfs(&e))?;
        }
        if s.uid.is_some() || s.gid.is_some() {
            rustix::fs::chownat(
                &dir,
                name,
                s.uid.map(uid),
                s.gid.map(gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(mode) = s.mode {
            if is_lnk(&n.st) {
                // Linux cannot change a symbolic link's mode.
                return Err(Nfsstat3::Inval);
            }
            // As chmod(2): a caller outside the file's group cannot set S_ISGID.
            let gid_after = s.gid.unwrap_or(n.st.stx_gid);
            let mode = if cred.uid != 0 && !cred.in_group(gid_after) {
                mode & !S_ISGID
            } else {
                mode
            };
            rustix::fs::chmodat(
                &dir,
                name,
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )?;
        }
        if let Some(ts) = timestamps(s) {
            rustix::fs::utimensat(&dir, name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    }

    fn setattr_root(&self, s: &Sattr3) -> NfsResult<()> {
        let fd = self.export.open_dir(Path::new(""))?;
        let rfd = rustix::fs::openat(&fd, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        if s.uid.is_some() || s.gid.is_some() {
            rustix::fs::fchown(&rfd, s.uid.map(uid), s.gid.map(gid))?;
        }
        if let Some(mode) = s.mode {
            rustix::fs::fchmod(&rfd, Mode::from_raw_mode(mode & 0o7777))?;
        }
        if let Some(ts) = timestamps(s) {
            rustix::fs::futimens(&rfd, &ts)?;
        }
        Ok(())
    }

    /// Resolve `name` in the directory `dir` (LOOKUP semantics, `.` and `..` included).
    fn child(&self, dir: &Node, name: &[u8]) -> NfsResult<Node> {
        match name {
            b"." => Ok(dir.clone()),
            // `..` of the export root is the root itself: nothing above it is reachable.
            b".." => {
                let rel = Export::parent_rel(&dir.rel);
                let st = self.export.stat_rel(&rel)?;
                Ok(Node { rel, st })
            }
            _ => {
                let name = check_name(name).map_err(|e| {
                    if e == Nfsstat3::Acces && name.is_empty() {
                        Nfsstat3::NoEnt
                    } else {
                        e
                    }
                })?;
                let rel = dir.rel.join(name);
                let st = self.export.stat_rel(&rel)?;
                self.export.remember(st.stx_ino, &rel);
                Ok(Node { rel, st })
            }
        }
    }

    fn lookup(&self, cred: &Cred, a: LookupArgs) -> LookupRes {
        let dir = match self.dir(&a.what.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let dir_attr = Some(self.export.fattr(&dir.st));
        if !may(&dir.st, cred, MAY_EXEC) {
            return Res::Err(
                Nfsstat3::Acces,
                AttrOnly {
                    attributes: dir_attr,
                },
            );
        }
        match self.child(&dir, a.what.name.as_bytes()) {
            Ok(n) => Res::Ok(LookupOk {
                object: self.export.handle_of(&n.st),
                obj_attributes: Some(self.export.fattr(&n.st)),
                dir_attributes: dir_attr,
            }),
            Err(s) => Res::Err(
                s,
                AttrOnly {
                    attributes: dir_attr,
                },
            ),
        }
    }

    fn access(&self, cred: &Cred, a: AccessArgs) -> AccessRes {
        let n = match self.export.resolve(&a.object) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        // RFC 1813 §3.3.4: report which of the requested rights the caller has.
        let mut granted = 0;
        if may(&n.st, cred, MAY_READ) {
            granted |= access::READ;
        }
        if !self.opts.read_only && may(&n.st, cred, MAY_WRITE) {
            granted |= access::MODIFY | access::EXTEND;
            if is_dir(&n.st) {
                granted |= access::DELETE;
            }
        }
        if may(&n.st, cred, MAY_EXEC) {
            granted |= if is_dir(&n.st) {
                access::LOOKUP
            } else {
                access::EXECUTE
            };
        }
        Res::Ok(AccessOk {
            obj_attributes: Some(self.export.fattr(&n.st)),
            access: a.access & granted,
        })
    }

    fn readlink(&self, a: ReadlinkArgs) -> ReadlinkRes {
        let n = match self.export.resolve(&a.symlink) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let attr = Some(self.export.fattr(&n.st));
        if !is_lnk(&n.st) {
            return Res::Err(Nfsstat3::Inval, AttrOnly { attributes: attr });
        }
        let r = self
            .export
            .parent_of(&n.rel)
            .and_then(|(dir, name)| Ok(rustix::fs::readlinkat(&dir, name, Vec::new())?));
        match r {
            Ok(target) => Res::Ok(ReadlinkOk {
                symlink_attributes: attr,
                data: NfsPath(Bytes::from(target.into_bytes())),
            }),
            Err(s) => Res::Err(s, AttrOnly { attributes: attr }),
        }
    }

    fn read(&self, cred: &Cred, a: ReadArgs) -> ReadRes {
        let n = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let attr = Some(self.export.fattr(&n.st));
        let err = |s| {
            Res::Err(
                s,
                AttrOnly {
                    attributes: attr.clone(),
                },
            )
        };
        if is_dir(&n.st) {
            return err(Nfsstat3::IsDir);
        }
        if !is_reg(&n.st) {
            return err(Nfsstat3::Inval);
        }
        // The owner may always read (knfsd's owner override: the client checked at open).
        if !may(&n.st, cred, MAY_READ) && cred.uid != n.st.stx_uid {
            return err(Nfsstat3::Acces);
        }
        let f = match self.export.open_file(&n.rel, false) {
            Ok(f) => f,
            Err(s) => return err(s),
        };
        let count = a.count.min(MAX_IO) as usize;
        let fill = |buf: &mut [u8]| {
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], a.offset.saturating_add(got as u64)) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(crate::vfs::io_to_nfs(&e)),
                }
            }
            Ok(got)
        };
        let (data, got) = if count >= POOLED_READ_MIN {
            let mut buf = self.read_bufs.get(MAX_IO as usize);
            match fill(&mut buf[..count]) {
                Ok(got) => (self.read_bufs.wrap(buf, 0..got), got),
                Err(s) => return err(s),
            }
        } else {
            let mut buf = BytesMut::zeroed(count);
            match fill(&mut buf) {
                Ok(got) => {
                    buf.truncate(got);
                    (buf.freeze(), got)
                }
                Err(s) => return err(s),
            }
        };
        let st = self.export.stat_rel(&n.rel).unwrap_or(n.st);
        let eof = a.offset.saturating_add(got as u64) >= st.stx_size;
        Res::Ok(ReadOk {
            file_attributes: Some(self.export.fattr(&st)),
            count: got as u32,
            eof,
            data: Data(data),
        })
    }

    fn write(&self, cred: &Cred, a: WriteArgs) -> WriteRes {
        let n = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = (|| {
            self.rofs()?;
            if is_dir(&n.st) {
                return Err(Nfsstat3::IsDir);
            }
            if !is_reg(&n.st) {
                return Err(Nfsstat3::Inval);
            }
            if !may(&n.st, cred, MAY_WRITE) && cred.uid != n.st.stx_uid {
                return Err(Nfsstat3::Acces);
            }
            // RFC 1813 §3.3.7: count is the number of bytes of data; never write past it.
            let len = (a.count as usize).min(a.data.len());
            let f = self.export.open_file(&n.rel, true)?;
            f.write_all_at(&a.data.0[..len], a.offset)
                .map_err(|e| crate::vfs::io_to_nfs(&e))?;
            match a.stable {
                StableHow::Unstable => {}
                StableHow::DataSync => f.sync_data().map_err(|e| crate::vfs::io_to_nfs(&e))?,
                StableHow::FileSync => f.sync_all().map_err(|e| crate::vfs::io_to_nfs(&e))?,
            }
            Ok(len as u32)
        })();
        let wcc = self.wcc(&n.st, &n.rel);
        match r {
            Ok(count) => Res::Ok(WriteOk {
                file_wcc: wcc,
                count,
                committed: a.stable,
                verf: self.write_verf,
            }),
            Err(s) => Res::Err(s, WccOnly { wcc }),
        }
    }

    /// Common checks for creating `name` in the directory `fh`; returns the directory and the
    /// checked name.
    fn prepare_create<'n>(
        &self,
        cred: &Cred,
        fh: &Fh3,
        name: &'n [u8],
    ) -> Result<(Node, &'n OsStr), Box<(Nfsstat3, WccData)>> {
        let dir = self.dir(fh).map_err(|s| Box::new((s, WccData::NONE)))?;
        let wcc = || self.wcc(&dir.st, &dir.rel);
        self.rofs().map_err(|s| Box::new((s, wcc())))?;
        if name == b"." || name == b".." {
            return Err(Box::new((Nfsstat3::Exist, wcc())));
        }
        let name = check_name(name).map_err(|s| Box::new((s, wcc())))?;
        if !may(&dir.st, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Box::new((Nfsstat3::Acces, wcc())));
        }
        Ok((dir, name))
    }

    /// Give a new object its owner (the caller, or the directory's group under set-gid) and
    /// the requested attributes; then build the CREATE-style result. `attrs` is `None` for an
    /// object that already existed (UNCHECKED or a retransmitted EXCLUSIVE CREATE): it keeps
    /// its owner and attributes.
    fn finish_create(
        &self,
        cred: &Cred,
        dir: &Node,
        name: &OsStr,
        attrs: Option<&Sattr3>,
    ) -> NewObjRes {
        let rel = dir.rel.join(name);
        let r = (|| {
            let dfd = self.export.open_dir(&dir.rel)?;
            if let Some(s) = attrs {
                // Requested owners follow the SETATTR rules: only root gives an object away,
                // and a group must be one of the caller's.
                let uid = s.uid.filter(|_| cred.uid == 0).unwrap_or(cred.uid);
                let default_gid = if u32::from(dir.st.stx_mode) & S_ISGID != 0 {
                    dir.st.stx_gid
                } else {
                    cred.gid
                };
                let gid = s
                    .gid
                    .filter(|g| cred.uid == 0 || cred.in_group(*g))
                    .unwrap_or(default_gid);
                // Only possible when the server runs as root; otherwise the server's own
                // identity owns the object.
                let _ = rustix::fs::chownat(
                    &dfd,
                    name,
                    Some(self::uid(uid)),
                    Some(self::gid(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            let st = self.export.stat_at(&dfd, name)?;
            if let Some(s) = attrs {
                if let Some(mode) = s.mode
                    && !is_lnk(&st)
                {
                    rustix::fs::chmodat(
                        &dfd,
                        name,
                        Mode::from_raw_mode(mode & 0o7777),
                        AtFlags::empty(),
                    )?;
                }
                if let Some(size) = s.size
                    && is_reg(&st)
                {
                    self.export
                        .open_file(&rel, true)?
                        .set_len(size)
                        .map_err(|e| crate::vfs::io_to_nfs(&e))?;
                }
                if let Some(ts) = timestamps(s) {
                    rustix::fs::utimensat(&dfd, name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
                }
            }
            self.export.stat_at(&dfd, name)
        })();
        let dir_wcc = self.wcc(&dir.st, &dir.rel);
        match r {
            Ok(st) => {
                self.export.remember(st.stx_ino, &rel);
                Res::Ok(NewObjOk {
                    obj: Some(self.export.handle_of(&st)),
                    obj_attributes: Some(self.export.fattr(&st)),
                    dir_wcc,
                })
            }
            Err(s) => Res::Err(s, WccOnly { wcc: dir_wcc }),
        }
    }

    fn create(&self, cred: &Cred, a: CreateArgs) -> NewObjRes {
        let (dir, name) = match self.prepare_create(cred, &a.where_.dir, a.where_.name.as_bytes()) {
            Ok(x) => x,
            Err(e) => return Res::Err(e.0, WccOnly { wcc: e.1 }),
        };
        let fail = |s| {
            Res::Err(
                s,
                WccOnly {
                    wcc: self.wcc(&dir.st, &dir.rel),
                },
            )
        };
        let dfd = match self.export.open_dir(&dir.rel) {
            Ok(d) => d,
            Err(s) => return fail(s),
        };
        let base =
            OFlags::CREATE | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        match &a.how {
            CreateHow3::Unchecked(s) | CreateHow3::Guarded(s) => {
                let excl = matches!(a.how, CreateHow3::Guarded(_));
                let flags = if excl { base | OFlags::EXCL } else { base };
                let mode = Mode::from_raw_mode(s.mode.unwrap_or(0o644) & 0o7777);
                // RFC 1813 §3.3.8: UNCHECKED on an existing file applies the attributes only.
                let existed = !excl && self.export.stat_at(&dfd, name).is_ok();
                if let Err(e) = rustix::fs::openat(&dfd, name, flags, mode) {
                    return fail(e.into());
                }
                if existed {
                    let rel = dir.rel.join(name);
                    let r = self.export.stat_rel(&rel).and_then(|st| {
                        self.setattr_inner(
                            cred,
                            &Node {
                                rel: rel.clone(),
                                st,
                            },
                            &SetattrArgs {
                                object: Fh3::default(),
                                new_attributes: Sattr3 {
                                    mode: None,
                                    ..s.clone()
                                },
                                guard: None,
                            },
                        )
                    });
                    if let Err(e) = r {
                        return fail(e);
                    }
                    return self.finish_create(cred, &dir, name, None);
                }
                self.finish_create(cred, &dir, name, Some(s))
            }
            CreateHow3::Exclusive(verf) => {
                // The verifier is kept in atime/mtime seconds (as knfsd does) so that a
                // retransmitted EXCLUSIVE CREATE is recognised (RFC 1813 §3.3.8).
                let va = u32::from_be_bytes([verf[0], verf[1], verf[2], verf[3]]);
                let vm = u32::from_be_bytes([verf[4], verf[5], verf[6], verf[7]]);
                let ts = Sattr3 {
                    atime: SetTime::ClientTime(Nfstime3 {
                        seconds: va,
                        nseconds: 0,
                    }),
                    mtime: SetTime::ClientTime(Nfstime3 {
                        seconds: vm,
                        nseconds: 0,
                    }),
                    ..Sattr3::default()
                };
                match rustix::fs::openat(
                    &dfd,
                    name,
                    base | OFlags::EXCL,
                    Mode::from_raw_mode(0o600),
                ) {
                    Ok(_) => self.finish_create(cred, &dir, name, Some(&ts)),
                    Err(rustix::io::Errno::EXIST) => match self.export.stat_at(&dfd, name) {
                        Ok(st)
                            if is_reg(&st)
                                && st.stx_atime.tv_sec == i64::from(va)
                                && st.stx_mtime.tv_sec == i64::from(vm) =>
                        {
                            self.finish_create(cred, &dir, name, None)
                        }
                        _ => fail(Nfsstat3::Exist),
                    },
                    Err(e) => fail(e.into()),
                }
            }
        }
    }

    fn mkdir(&self, cred: &Cred, a: MkdirArgs) -> NewObjRes {
        let (dir, name) = match self.prepare_create(cred, &a.where_.dir, a.where_.name.as_bytes()) {
            Ok(x) => x,
            Err(e) => return Res::Err(e.0, WccOnly { wcc: e.1 }),
        };
        let mode = Mode::from_raw_mode(a.attributes.mode.unwrap_or(0o755) & 0o7777);
        let r = self
            .export
            .open_dir(&dir.rel)
            .and_then(|dfd| Ok(rustix::fs::mkdirat(&dfd, name, mode)?));
        match r {
            Ok(()) => self.finish_create(cred, &dir, name, Some(&a.attributes)),
            Err(s) => Res::Err(
                s,
                WccOnly {
                    wcc: self.wcc(&dir.st, &dir.rel),
                },
            ),
        }
    }

    fn symlink(&self, cred: &Cred, a: SymlinkArgs) -> NewObjRes {
        let (dir, name) = match self.prepare_create(cred, &a.where_.dir, a.where_.name.as_bytes()) {
            Ok(x) => x,
            Err(e) => return Res::Err(e.0, WccOnly { wcc: e.1 }),
        };
        let target = a.symlink_data.as_bytes();
        let r = if target.is_empty() || target.contains(&0) {
            Err(Nfsstat3::Inval)
        } else {
            self.export.open_dir(&dir.rel).and_then(|dfd| {
                Ok(rustix::fs::symlinkat(
                    OsStr::from_bytes(target),
                    &dfd,
                    name,
                )?)
            })
        };
        let attrs = Sattr3 {
            mode: None,
            ..a.symlink_attributes
        };
        match r {
            Ok(()) => self.finish_create(cred, &dir, name, Some(&attrs)),
            Err(s) => Res::Err(
                s,
                WccOnly {
                    wcc: self.wcc(&dir.st, &dir.rel),
                },
            ),
        }
    }

    fn mknod(&self, cred: &Cred, a: MknodArgs) -> NewObjRes {
        let (dir, name) = match self.prepare_create(cred, &a.where_.dir, a.where_.name.as_bytes()) {
            Ok(x) => x,
            Err(e) => return Res::Err(e.0, WccOnly { wcc: e.1 }),
        };
        use rustix::fs::FileType as T;
        let (ft, attrs, dev) = match &a.what {
            MknodData3::Chr(s, d) => (T::CharacterDevice, s, Some(*d)),
            MknodData3::Blk(s, d) => (T::BlockDevice, s, Some(*d)),
            MknodData3::Sock(s) => (T::Socket, s, None),
            MknodData3::Fifo(s) => (T::Fifo, s, None),
            // RFC 1813 §3.3.11: MKNOD of a regular file, directory or link is BADTYPE.
            MknodData3::Other(_) => {
                return Res::Err(
                    Nfsstat3::BadType,
                    WccOnly {
                        wcc: self.wcc(&dir.st, &dir.rel),
                    },
                );
            }
        };
        if dev.is_some() && cred.uid != 0 {
            return Res::Err(
                Nfsstat3::Perm,
                WccOnly {
                    wcc: self.wcc(&dir.st, &dir.rel),
                },
            );
        }
        let rdev = dev.map_or(0, |d| rustix::fs::makedev(d.specdata1, d.specdata2));
        let mode = Mode::from_raw_mode(attrs.mode.unwrap_or(0o644) & 0o7777);
        let r = self
            .export
            .open_dir(&dir.rel)
            .and_then(|dfd| Ok(rustix::fs::mknodat(&dfd, name, ft, mode, rdev)?));
        match r {
            Ok(()) => self.finish_create(cred, &dir, name, Some(attrs)),
            Err(s) => Res::Err(
                s,
                WccOnly {
                    wcc: self.wcc(&dir.st, &dir.rel),
                },
            ),
        }
    }

    /// Sticky-directory rule: in a directory with S_ISVTX only the owner of the directory or
    /// of the entry (or root) may remove or rename it.
    fn sticky_ok(cred: &Cred, dir: &Statx, victim: &Statx) -> bool {
        u32::from(dir.stx_mode) & S_ISVTX == 0
            || cred.uid == 0
            || cred.uid == dir.stx_uid
            || cred.uid == victim.stx_uid
    }

    fn remove(&self, cred: &Cred, a: RemoveArgs, rmdir: bool) -> RemoveRes {
        let dir = match self.dir(&a.object.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = (|| {
            self.rofs()?;
            match a.object.name.as_bytes() {
                b"." => return Err(Nfsstat3::Inval),
                b".." => {
                    return Err(if rmdir {
                        Nfsstat3::NotEmpty
                    } else {
                        Nfsstat3::Inval
                    });
                }
                _ => {}
            }
            let name = check_name(a.object.name.as_bytes())?;
            if !may(&dir.st, cred, MAY_WRITE | MAY_EXEC) {
                return Err(Nfsstat3::Acces);
            }
            let dfd = self.export.open_dir(&dir.rel)?;
            let victim = self.export.stat_at(&dfd, name)?;
            if !Self::sticky_ok(cred, &dir.st, &victim) {
                return Err(Nfsstat3::Acces);
            }
            if rmdir && !is_dir(&victim) {
                return Err(Nfsstat3::NotDir);
            }
            if !rmdir && is_dir(&victim) {
                // RFC 1813 §3.3.12: REMOVE of a directory fails; knfsd says ISDIR... as Linux.
                return Err(Nfsstat3::IsDir);
            }
            let flags = if rmdir {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            rustix::fs::unlinkat(&dfd, name, flags)?;
            if rmdir || victim.stx_nlink <= 1 {
                self.export.forget(victim.stx_ino);
            }
            Ok(())
        })();
        let wcc = WccOnly {
            wcc: self.wcc(&dir.st, &dir.rel),
        };
        match r {
            Ok(()) => Res::Ok(wcc),
            Err(s) => Res::Err(s, wcc),
        }
    }

    fn rename(&self, cred: &Cred, a: RenameArgs) -> RenameRes {
        let none = RenameWcc {
            fromdir_wcc: WccData::NONE,
            todir_wcc: WccData::NONE,
        };
        let from = match self.dir(&a.from.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, none),
        };
        let to = match self.dir(&a.to.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, none),
        };
        let r = (|| {
            self.rofs()?;
            for n in [a.from.name.as_bytes(), a.to.name.as_bytes()] {
                if n == b"." || n == b".." {
                    return Err(Nfsstat3::Inval);
                }
            }
            let fname = check_name(a.from.name.as_bytes())?;
            let tname = check_name(a.to.name.as_bytes())?;
            if !may(&from.st, cred, MAY_WRITE | MAY_EXEC)
                || !may(&to.st, cred, MAY_WRITE | MAY_EXEC)
            {
                return Err(Nfsstat3::Acces);
            }
            let ffd = self.export.open_dir(&from.rel)?;
            let tfd = self.export.open_dir(&to.rel)?;
            let victim = self.export.stat_at(&ffd, fname)?;
            if !Self::sticky_ok(cred, &from.st, &victim) {
                return Err(Nfsstat3::Acces);
            }
            if let Ok(target) = self.export.stat_at(&tfd, tname) {
                if target.stx_ino == victim.stx_ino {
                    // RFC 1813 §3.3.14: renaming onto the same object is a successful no-op.
                    return Ok(());
                }
                if !Self::sticky_ok(cred, &to.st, &target) {
                    return Err(Nfsstat3::Acces);
                }
                if is_dir(&victim) != is_dir(&target) {
                    return Err(if is_dir(&target) {
                        Nfsstat3::IsDir
                    } else {
                        Nfsstat3::NotDir
                    });
                }
            }
            rustix::fs::renameat(&ffd, fname, &tfd, tname)?;
            let old = from.rel.join(fname);
            let new = to.rel.join(tname);
            self.export.remember(victim.stx_ino, &new);
            if is_dir(&victim) {
                self.export.renamed(&old, &new);
            }
            Ok(())
        })();
        let w = RenameWcc {
            fromdir_wcc: self.wcc(&from.st, &from.rel),
            todir_wcc: self.wcc(&to.st, &to.rel),
        };
        match r {
            Ok(()) => Res::Ok(w),
            Err(s) => Res::Err(s, w),
        }
    }

    fn link(&self, cred: &Cred, a: LinkArgs) -> LinkRes {
        let none = LinkWcc {
            file_attributes: None,
            linkdir_wcc: WccData::NONE,
        };
        let file = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, none),
        };
        let dir = match self.dir(&a.link.dir) {
            Ok(d) => d,
            Err(s) => {
                return Res::Err(
                    s,
                    LinkWcc {
                        file_attributes: Some(self.export.fattr(&file.st)),
                        ..none
                    },
                );
            }
        };
        let r = (|| {
            self.rofs()?;
            let name = a.link.name.as_bytes();
            if name == b"." || name == b".." {
                return Err(Nfsstat3::Exist);
            }
            let name = check_name(name)?;
            if is_dir(&file.st) {
                return Err(Nfsstat3::IsDir);
            }
            if !may(&dir.st, cred, MAY_WRITE | MAY_EXEC) {
                return Err(Nfsstat3::Acces);
            }
            let (sfd, sname) = self.export.parent_of(&file.rel)?;
            let dfd = self.export.open_dir(&dir.rel)?;
            rustix::fs::linkat(&sfd, sname, &dfd, name, AtFlags::empty())?;
            Ok(())
        })();
        let w = LinkWcc {
            file_attributes: self.post(&file.rel),
            linkdir_wcc: self.wcc(&dir.st, &dir.rel),
        };
        match r {
            Ok(()) => Res::Ok(w),
            Err(s) => Res::Err(s, w),
        }
    }

    /// The directory's entries in cookie order: `.`, `..`, then the names sorted. The cookie of
    /// entry i is i + 1, so it stays meaningful across calls as long as the directory does not
    /// change (the verifier is not checked, as knfsd does not).
    fn dir_entries(&self, dir: &Node) -> NfsResult<Vec<(Vec<u8>, u64)>> {
        let mut names = self.export.list_dir(&dir.rel)?;
        names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let parent = Export::parent_rel(&dir.rel);
        let parent_ino = self
            .export
            .stat_rel(&parent)
            .map_or(dir.st.stx_ino, |s| s.stx_ino);
        let mut out = Vec::with_capacity(names.len() + 2);
        out.push((b".".to_vec(), dir.st.stx_ino));
        out.push((b"..".to_vec(), parent_ino));
        out.extend(names.into_iter().map(|(n, ino, _)| (n, ino)));
        Ok(out)
    }

    fn readdir_common(
        &self,
        cred: &Cred,
        fh: &Fh3,
        cookie: u64,
    ) -> Result<Listing, (Nfsstat3, PostOpAttr)> {
        let dir = self.dir(fh).map_err(|s| (s, None))?;
        let attr = Some(self.export.fattr(&dir.st));
        if !may(&dir.st, cred, MAY_READ) {
            return Err((Nfsstat3::Acces, attr));
        }
        let entries = self.dir_entries(&dir).map_err(|s| (s, attr.clone()))?;
        let start = usize::try_from(cookie).unwrap_or(usize::MAX);
        if start > entries.len() {
            return Err((Nfsstat3::BadCookie, attr));
        }
        Ok((dir, entries, start))
    }

    fn readdir(&self, cred: &Cred, a: ReaddirArgs) -> ReaddirRes {
        let (dir, entries, start) = match self.readdir_common(cred, &a.dir, a.cookie) {
            Ok(x) => x,
            Err((s, attributes)) => return Res::Err(s, AttrOnly { attributes }),
        };
        // RFC 1813 §3.3.16: count bounds the whole READDIR3resok.
        let mut size = 4 + POST_OP_ATTR_MAX + 8 + 4 + 4;
        let limit = a.count as usize;
        let mut out = Vec::new();
        let mut eof = true;
        for (i, (name, ino)) in entries.iter().enumerate().skip(start) {
            let e = Entry3 {
                fileid: *ino,
                name: Filename3(Bytes::copy_from_slice(name)),
                cookie: i as u64 + 1,
            };
            let len = 4 + e.encoded_len();
            if size + len > limit {
                eof = false;
                break;
            }
            size += len;
            out.push(e);
        }
        if out.is_empty() && !eof {
            return Res::Err(
                Nfsstat3::TooSmall,
                AttrOnly {
                    attributes: Some(self.export.fattr(&dir.st)),
                },
            );
        }
        Res::Ok(ReaddirOk {
            dir_attributes: Some(self.export.fattr(&dir.st)),
            cookieverf: [0; 8],
            entries: EntryList(out),
            eof,
        })
    }

    fn readdirplus(&self, cred: &Cred, a: ReaddirplusArgs) -> ReaddirplusRes {
        let (dir, entries, start) = match self.readdir_common(cred, &a.dir, a.cookie) {
            Ok(x) => x,
            Err((s, attributes)) => return Res::Err(s, AttrOnly { attributes }),
        };
        let dfd = match self.export.open_dir(&dir.rel) {
            Ok(d) => d,
            Err(s) => {
                return Res::Err(
                    s,
                    AttrOnly {
                        attributes: Some(self.export.fattr(&dir.st)),
                    },
                );
            }
        };
        // RFC 1813 §3.3.17: dircount bounds fileid+name+cookie, maxcount the whole reply.
        let mut size = 4 + POST_OP_ATTR_MAX + 8 + 4 + 4;
        let mut dsize = 0usize;
        let mut out = Vec::new();
        let mut eof = true;
        for (i, (name, ino)) in entries.iter().enumerate().skip(start) {
            let node = match name.as_slice() {
                b"." => Some(dir.clone()),
                b".." => {
                    let rel = Export::parent_rel(&dir.rel);
                    self.export.stat_rel(&rel).ok().map(|st| Node { rel, st })
                }
                n => {
                    let os = OsStr::from_bytes(n);
                    self.export.stat_at(&dfd, os).ok().map(|st| Node {
                        rel: dir.rel.join(os),
                        st,
                    })
                }
            };
            let (attrs, fh) = match &node {
                Some(n) if n.st.stx_ino == *ino || name.starts_with(b".") => (
                    Some(self.export.fattr(&n.st)),
                    Some(self.export.handle_of(&n.st)),
                ),
                _ => (None, None),
            };
            let e = Entryplus3 {
                fileid: *ino,
                name: Filename3(Bytes::copy_from_slice(name)),
                cookie: i as u64 + 1,
                name_attributes: attrs,
                name_handle: fh,
            };
            let len = 4 + e.encoded_len();
            let dlen = 8 + xdr::opaque_len(name.len()) + 8;
            if size + len > a.maxcount as usize
                || dsize + dlen > a.dircount.max(1) as usize && !out.is_empty()
            {
                eof = false;
                break;
            }
            if let Some(n) = &node
                && name.as_slice() != b"."
                && name.as_slice() != b".."
            {
                self.export.remember(n.st.stx_ino, &n.rel);
            }
            size += len;
            dsize += dlen;
            out.push(e);
        }
        if out.is_empty() && !eof {
            return Res::Err(
                Nfsstat3::TooSmall,
                AttrOnly {
                    attributes: Some(self.export.fattr(&dir.st)),
                },
            );
        }
        Res::Ok(ReaddirplusOk {
            dir_attributes: Some(self.export.fattr(&dir.st)),
            cookieverf: [0; 8],
            entries: EntryList(out),
            eof,
        })
    }

    fn fsstat(&self, a: FsArgs) -> FsstatRes {
        let n = match self.export.resolve(&a.fsroot) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let attr = Some(self.export.fattr(&n.st));
        match rustix::fs::fstatvfs(self.export.root_fd()) {
            Ok(v) => Res::Ok(FsstatOk {
                obj_attributes: attr,
                tbytes: v.f_blocks.saturating_mul(v.f_frsize),
                fbytes: v.f_bfree.saturating_mul(v.f_frsize),
                abytes: v.f_bavail.saturating_mul(v.f_frsize),
                tfiles: v.f_files,
                ffiles: v.f_ffree,
                afiles: v.f_favail,
                invarsec: 0,
            }),
            Err(e) => Res::Err(e.into(), AttrOnly { attributes: attr }),
        }
    }

    fn fsinfo(&self, a: FsArgs) -> FsinfoRes {
        let n = match self.export.resolve(&a.fsroot) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        Res::Ok(FsinfoOk {
            obj_attributes: Some(self.export.fattr(&n.st)),
            rtmax: MAX_IO,
            rtpref: MAX_IO,
            rtmult: 4096,
            wtmax: MAX_IO,
            wtpref: MAX_IO,
            wtmult: 4096,
            dtpref: DTPREF,
            maxfilesize: i64::MAX as u64,
            time_delta: Nfstime3 {
                seconds: 0,
                nseconds: 1,
            },
            properties: fsf::LINK | fsf::SYMLINK | fsf::HOMOGENEOUS | fsf::CANSETTIME,
        })
    }

    fn pathconf(&self, a: FsArgs) -> PathconfRes {
        let n = match self.export.resolve(&a.fsroot) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        Res::Ok(PathconfOk {
            obj_attributes: Some(self.export.fattr(&n.st)),
            linkmax: 65000,
            name_max: NAME_MAX as u32,
            no_trunc: true,
            chown_restricted: true,
            case_insensitive: false,
            case_preserving: true,
        })
    }

    fn commit(&self, a: CommitArgs) -> CommitRes {
        let n = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = (|| {
            if is_dir(&n.st) {
                return Err(Nfsstat3::IsDir);
            }
            if !is_reg(&n.st) {
                return Err(Nfsstat3::Inval);
            }
            // RFC 1813 §3.3.21: everything written UNSTABLE is on stable storage before the
            // reply. fsync through any descriptor flushes the file's dirty pages.
            let f = self.export.open_file(&n.rel, false)?;
            f.sync_data().map_err(|e| crate::vfs::io_to_nfs(&e))
        })();
        let wcc = self.wcc(&n.st, &n.rel);
        match r {
            Ok(()) => Res::Ok(CommitOk {
                file_wcc: wcc,
                verf: self.write_verf,
            }),
            Err(s) => Res::Err(s, WccOnly { wcc }),
        }
    }

    // ---- MOUNT ----

    fn export_names(&self) -> Vec<String> {
        vec![
            self.opts.name.clone(),
            self.export.root_path().to_string_lossy().into_owned(),
        ]
    }

    /// MNT (RFC 1813 Appendix I): the root handle of a matching export.
    pub fn mnt(&self, path: &[u8], host: &str) -> MountRes {
        let Ok(p) = std::str::from_utf8(path) else {
            return MountRes::Err(Mountstat3::NoEnt);
        };
        let trimmed = if p.len() > 1 {
            p.trim_end_matches('/')
        } else {
            p
        };
        if !self
            .export_names()
            .iter()
            .any(|n| n.trim_end_matches('/') == trimmed || (n == "/" && trimmed == "/"))
        {
            return MountRes::Err(Mountstat3::NoEnt);
        }
        match self.export.root_handle() {
            Ok(fh) => {
                let mut m = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
                let entry = (host.to_string(), trimmed.to_string());
                if !m.contains(&entry) {
                    m.push(entry);
                }
                MountRes::Ok(MountOk {
                    fhandle: Fhandle3(fh.0),
                    auth_flavors: vec![oncrpc::auth::AUTH_SYS, oncrpc::auth::AUTH_NONE],
                })
            }
            Err(_) => MountRes::Err(Mountstat3::ServerFault),
        }
    }
}

/// A directory, its entries in cookie order, and the index to start at.
type Listing = (Node, Vec<(Vec<u8>, u64)>, usize);

fn uid(v: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(v)
}

fn gid(v: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(v)
}

fn timestamps(s: &Sattr3) -> Option<Timestamps> {
    let conv = |t: SetTime| match t {
        SetTime::DontChange => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        SetTime::ServerTime => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        SetTime::ClientTime(t) => rustix::fs::Timespec {
            tv_sec: i64::from(t.seconds),
            tv_nsec: i64::from(t.nseconds.min(999_999_999)) as _,
        },
    };
    if s.atime == SetTime::DontChange && s.mtime == SetTime::DontChange {
        return None;
    }
    Some(Timestamps {
        last_access: conv(s.atime),
        last_modification: conv(s.mtime),
    })
}

/// Decoded NFSv3 arguments of one procedure.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum Args {
    Null,
    Getattr(GetattrArgs),
    Setattr(SetattrArgs),
    Lookup(LookupArgs),
    Access(AccessArgs),
    Readlink(ReadlinkArgs),
    Read(ReadArgs),
    Write(WriteArgs),
    Create(CreateArgs),
    Mkdir(MkdirArgs),
    Symlink(SymlinkArgs),
    Mknod(MknodArgs),
    Remove(RemoveArgs),
    Rmdir(RemoveArgs),
    Rename(RenameArgs),
    Link(LinkArgs),
    Readdir(ReaddirArgs),
    Readdirplus(ReaddirplusArgs),
    Fsstat(FsArgs),
    Fsinfo(FsArgs),
    Pathconf(FsArgs),
    Commit(CommitArgs),
}

/// Why arguments could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// No such procedure (PROC_UNAVAIL).
    #[error("no such NFSv3 procedure {0}")]
    NoProc(u32),
    /// The arguments do not decode exactly (GARBAGE_ARGS).
    #[error("NFSv3 arguments do not decode: {0}")]
    Garbage(#[from] xdr::XdrError),
}

impl Args {
    /// Decode the arguments of procedure `proc_`; the whole buffer must be consumed.
    pub fn decode(proc_: u32, args: &Bytes) -> Result<Self, ArgsError> {
        let mut d = Decoder::from_bytes(args);
        let dec = &mut d;
        let a = match proc_ {
            proc_::NULL => Args::Null,
            proc_::GETATTR => Args::Getattr(XdrDecode::decode(dec)?),
            proc_::SETATTR => Args::Setattr(XdrDecode::decode(dec)?),
            proc_::LOOKUP => Args::Lookup(XdrDecode::decode(dec)?),
            proc_::ACCESS => Args::Access(XdrDecode::decode(dec)?),
            proc_::READLINK => Args::Readlink(XdrDecode::decode(dec)?),
            proc_::READ => Args::Read(XdrDecode::decode(dec)?),
            proc_::WRITE => Args::Write(XdrDecode::decode(dec)?),
            proc_::CREATE => Args::Create(XdrDecode::decode(dec)?),
            proc_::MKDIR => Args::Mkdir(XdrDecode::decode(dec)?),
            proc_::SYMLINK => Args::Symlink(XdrDecode::decode(dec)?),
            proc_::MKNOD => Args::Mknod(XdrDecode::decode(dec)?),
            proc_::REMOVE => Args::Remove(XdrDecode::decode(dec)?),
            proc_::RMDIR => Args::Rmdir(XdrDecode::decode(dec)?),
            proc_::RENAME => Args::Rename(XdrDecode::decode(dec)?),
            proc_::LINK => Args::Link(XdrDecode::decode(dec)?),
            proc_::READDIR => Args::Readdir(XdrDecode::decode(dec)?),
            proc_::READDIRPLUS => Args::Readdirplus(XdrDecode::decode(dec)?),
            proc_::FSSTAT => Args::Fsstat(XdrDecode::decode(dec)?),
            proc_::FSINFO => Args::Fsinfo(XdrDecode::decode(dec)?),
            proc_::PATHCONF => Args::Pathconf(XdrDecode::decode(dec)?),
            proc_::COMMIT => Args::Commit(XdrDecode::decode(dec)?),
            p => return Err(ArgsError::NoProc(p)),
        };
        d.finish()?;
        Ok(a)
    }
}

/// The caller's identity: AUTH_SYS as sent, AUTH_NONE as nobody; other flavors are refused.
pub fn cred_of(c: &Credential) -> Result<Cred, AuthStat> {
    match c {
        Credential::Sys(s) => Ok(Cred {
            uid: s.uid,
            gid: s.gid,
            gids: s.gids.clone(),
        }),
        Credential::None => Ok(Cred::nobody()),
        _ => Err(AuthStat::TooWeak),
    }
}

/// Procedures answered on the calling task instead of a blocking thread: attribute reads, a
/// `statx` or two of an object found through its handle. Handing a call to a blocking thread
/// and back costs two thread wake-ups, which dominated one-at-a-time calls on the project's VM
/// (GETATTR ~9k ops/s on either transport); everything that moves data, reads directories or
/// changes the namespace, and may wait for the disk, still goes to a blocking thread.
fn runs_inline(a: &Args) -> bool {
    matches!(
        a,
        Args::Getattr(_) | Args::Access(_) | Args::Fsinfo(_) | Args::Pathconf(_)
    )
}

/// NFS (100003) version 3 as an RPC program.
#[derive(Debug, Clone)]
pub struct NfsProgram(pub Arc<NfsServer>);

impl Program for NfsProgram {
    fn program(&self) -> u32 {
        PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        (VERSION, VERSION)
    }
    fn name(&self) -> &'static str {
        "nfs"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let server = self.0.clone();
        Box::pin(async move {
            let cred = match cred_of(&call.credential) {
                Ok(c) => c,
                Err(stat) => return Outcome::AuthError(stat),
            };
            let args = match Args::decode(call.header.proc_, &call.args) {
                Ok(a) => a,
                Err(ArgsError::NoProc(_)) => return Outcome::ProcUnavail,
                Err(_) => return Outcome::GarbageArgs,
            };
            if matches!(args, Args::Null) {
                return Outcome::Success(call.reply_encoder().finish());
            }
            // The duplicate request cache (crate::drc): calls from the network of the
            // procedures it covers.
            let ticket = match (&server.drc, call.context.peer) {
                (Some(cache), Some(peer)) if is_cached_proc(call.header.proc_) => {
                    let h = &call.header;
                    let key = Key::new(peer.ip(), h.xid, h.prog, h.vers, h.proc_, &call.args);
                    match cache.admit(key).await {
                        Admit::Run(t) => t,
                        Admit::Drop => return Outcome::NoReply,
                        Admit::Replay(results) => {
                            let mut enc = call.reply_encoder();
                            enc.put_raw_bytes(results);
                            return Outcome::Success(enc.finish());
                        }
                    }
                }
                _ => None,
            };
            let mut enc = call.reply_encoder();
            if runs_inline(&args) {
                server.execute(&cred, args, &mut enc);
                return Outcome::Success(enc.finish());
            }
            let s = server.clone();
            let r = tokio::task::spawn_blocking(move || {
                s.execute(&cred, args, &mut enc);
                enc.finish()
            })
            .await;
            match r {
                Ok(e) => {
                    if let Some(t) = ticket {
                        // Kept with every item inline: a replay may go over another
                        // transport, whose policy its own encoder applies (none of these
                        // procedures has a DDP-eligible result, RFC 8267 §4.1).
                        t.complete(e.unreduced());
                    }
                    Outcome::Success(e)
                }
                // Dropping the ticket forgets the call: a retransmission runs it.
                Err(_) => Outcome::SystemErr,
            }
        })
    }
}

/// MOUNT (100005) version 3 as an RPC program (RFC 8267 §5.1: offered over TCP).
#[derive(Debug, Clone)]
pub struct MountProgram(pub Arc<NfsServer>);

impl Program for MountProgram {
    fn program(&self) -> u32 {
        mount::PROGRAM
    }
    fn versions(&self) -> (u32, u32) {
        // Linux mount.nfs asks MOUNT v3; v1 shares NULL/DUMP/UMNT/UMNTALL/EXPORT encodings
        // but not MNT's result, so only v3 is offered.
        (mount::VERSION, mount::VERSION)
    }
    fn name(&self) -> &'static str {
        "mountd"
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let server = self.0.clone();
        Box::pin(async move {
            let host = call
                .context
                .peer
                .map_or_else(|| "local".to_string(), |p: SocketAddr| p.ip().to_string());
            let mut dec = call.args_decoder();
            let mut enc = call.reply_encoder();
            macro_rules! args {
                ($t:ty) => {{
                    let Ok(v) = <$t>::decode(&mut dec) else {
                        return Outcome::GarbageArgs;
                    };
                    if dec.finish().is_err() {
                        return Outcome::GarbageArgs;
                    }
                    v
                }};
            }
            match call.header.proc_ {
                mount::proc_::NULL => {
                    let _ = args!(Void);
                }
                mount::proc_::MNT => {
                    let p = args!(DirPath);
                    if cred_of(&call.credential).is_err() {
                        return Outcome::AuthError(AuthStat::TooWeak);
                    }
                    let s = server.clone();
                    let res = tokio::task::spawn_blocking(move || s.mnt(p.as_bytes(), &host)).await;
                    match res {
                        Ok(r) => r.encode(&mut enc),
                        Err(_) => return Outcome::SystemErr,
                    }
                }
                mount::proc_::DUMP => {
                    let _ = args!(Void);
                    let m = server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    List(
                        m.into_iter()
                            .map(|(h, d)| MountBody {
                                hostname: Name(Bytes::from(h)),
                                directory: DirPath(Bytes::from(d)),
                            })
                            .collect(),
                    )
                    .encode(&mut enc);
                }
                mount::proc_::UMNT => {
                    let p = args!(DirPath);
                    let p = String::from_utf8_lossy(p.as_bytes()).into_owned();
                    server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(h, d)| {
                            !(h == &host && d.trim_end_matches('/') == p.trim_end_matches('/'))
                        });
                }
                mount::proc_::UMNTALL => {
                    let _ = args!(Void);
                    server
                        .mounts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(h, _)| h != &host);
                }
                mount::proc_::EXPORT => {
                    let _ = args!(Void);
                    List(vec![ExportNode {
                        dir: DirPath(Bytes::from(server.opts.name.clone())),
                        groups: List(Vec::new()),
                    }])
                    .encode(&mut enc);
                }
                _ => return Outcome::ProcUnavail,
            }
            Outcome::Success(enc.finish())
        })
    }
}

/// Used by tests and the fuzz target: run one NFSv3 procedure synchronously (no runtime).
pub fn call_sync(
    server: &NfsServer,
    cred: &Cred,
    proc_: u32,
    args: &Bytes,
) -> Result<Bytes, ArgsError> {
    let a = Args::decode(proc_, args)?;
    let mut enc = Encoder::new();
    server.execute(cred, a, &mut enc);
    Ok(enc.into_bytes())
}
