//! The NFSv3 (RFC 1813) and MOUNT v3 programs over an [`Export`].
//!
//! Each call's arguments are decoded on the async side (GARBAGE_ARGS when they do not decode
//! exactly), then the file-system work runs on tokio's blocking pool. Results are encoded with
//! [`oncrpc::Call::reply_encoder`], so the transport's reduction policy applies to the
//! DDP-eligible READ and READLINK results (RFC 8267 §4).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oncrpc::service::BoxFuture;
use oncrpc::{AuthStat, Call, Credential, Outcome, Program};
use rustix::fs::Statx;
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::drc::{Admit, DrcConfig, DrcStats, Key, SharedCache, is_cached_proc};
use crate::fsops::{FsOps, RemoveKind};
use crate::mount::{
    self, DirPath, ExportNode, Fhandle3, List, MountBody, MountOk, MountRes, Mountstat3, Name,
};
use crate::nfs3::*;
use crate::vfs::{Cred, Export, NAME_MAX, NfsResult, Node, is_dir};
use crate::xdr_util::Void;

/// Largest READ and WRITE the server advertises (FSINFO rtmax/wtmax).
pub const MAX_IO: u32 = crate::fsops::MAX_IO;
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

    /// The shared file operations over this export ([`crate::fsops`]).
    pub fn fs(&self) -> FsOps<'_> {
        FsOps::new(&self.export, self.opts.read_only)
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
            Args::Remove(a) => self.remove(cred, a, RemoveKind::NonDir).encode(enc),
            Args::Rmdir(a) => self.remove(cred, a, RemoveKind::Dir).encode(enc),
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
        let r = self.fs().setattr(cred, &n, &a.new_attributes, a.guard);
        let wcc = WccOnly {
            wcc: self.wcc(&n.st, &n.rel),
        };
        match r {
            Ok(()) => Res::Ok(wcc),
            Err(s) => Res::Err(s, wcc),
        }
    }

    fn lookup(&self, cred: &Cred, a: LookupArgs) -> LookupRes {
        let dir = match self.dir(&a.what.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let dir_attr = Some(self.export.fattr(&dir.st));
        match self.fs().lookup(cred, &dir, a.what.name.as_bytes()) {
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
        Res::Ok(AccessOk {
            obj_attributes: Some(self.export.fattr(&n.st)),
            access: a.access & self.fs().access(cred, &n.st),
        })
    }

    fn readlink(&self, a: ReadlinkArgs) -> ReadlinkRes {
        let n = match self.export.resolve(&a.symlink) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        let attr = Some(self.export.fattr(&n.st));
        match self.fs().readlink(&n) {
            Ok(target) => Res::Ok(ReadlinkOk {
                symlink_attributes: attr,
                data: NfsPath(Bytes::from(target)),
            }),
            Err(s) => Res::Err(s, AttrOnly { attributes: attr }),
        }
    }

    fn read(&self, cred: &Cred, a: ReadArgs) -> ReadRes {
        let n = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        match self.fs().read(cred, &n, a.offset, a.count, &self.read_bufs) {
            Ok(r) => Res::Ok(ReadOk {
                file_attributes: Some(self.export.fattr(&r.st)),
                count: r.data.len() as u32,
                eof: r.eof,
                data: Data(r.data),
            }),
            Err(s) => Res::Err(
                s,
                AttrOnly {
                    attributes: Some(self.export.fattr(&n.st)),
                },
            ),
        }
    }

    fn write(&self, cred: &Cred, a: WriteArgs) -> WriteRes {
        let n = match self.export.resolve(&a.file) {
            Ok(n) => n,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        // RFC 1813 §3.3.7: count is the number of bytes of data; never write past it.
        let len = (a.count as usize).min(a.data.len());
        let r = self
            .fs()
            .write(cred, &n, a.offset, &a.data.0[..len], a.stable);
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

    /// The CREATE-style result of a creation in `dir`.
    fn new_obj(&self, dir: &Node, r: NfsResult<Statx>) -> NewObjRes {
        let dir_wcc = self.wcc(&dir.st, &dir.rel);
        match r {
            Ok(st) => Res::Ok(NewObjOk {
                obj: Some(self.export.handle_of(&st)),
                obj_attributes: Some(self.export.fattr(&st)),
                dir_wcc,
            }),
            Err(s) => Res::Err(s, WccOnly { wcc: dir_wcc }),
        }
    }

    fn create(&self, cred: &Cred, a: CreateArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self
            .fs()
            .create_file(cred, &dir, a.where_.name.as_bytes(), &a.how)
            .map(|c| c.st);
        self.new_obj(&dir, r)
    }

    fn mkdir(&self, cred: &Cred, a: MkdirArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self
            .fs()
            .mkdir(cred, &dir, a.where_.name.as_bytes(), &a.attributes);
        self.new_obj(&dir, r)
    }

    fn symlink(&self, cred: &Cred, a: SymlinkArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self.fs().symlink(
            cred,
            &dir,
            a.where_.name.as_bytes(),
            a.symlink_data.as_bytes(),
            &a.symlink_attributes,
        );
        self.new_obj(&dir, r)
    }

    fn mknod(&self, cred: &Cred, a: MknodArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self
            .fs()
            .mknod(cred, &dir, a.where_.name.as_bytes(), &a.what);
        self.new_obj(&dir, r)
    }

    fn remove(&self, cred: &Cred, a: RemoveArgs, kind: RemoveKind) -> RemoveRes {
        let dir = match self.dir(&a.object.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self.fs().remove(cred, &dir, a.object.name.as_bytes(), kind);
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
        let r = self.fs().rename(
            cred,
            &from,
            a.from.name.as_bytes(),
            &to,
            a.to.name.as_bytes(),
        );
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
        let r = self.fs().link(cred, &file, &dir, a.link.name.as_bytes());
        let w = LinkWcc {
            file_attributes: self.post(&file.rel),
            linkdir_wcc: self.wcc(&dir.st, &dir.rel),
        };
        match r {
            Ok(()) => Res::Ok(w),
            Err(s) => Res::Err(s, w),
        }
    }

    /// The directory, its entries in cookie order (`.`, `..`, then the names sorted) and the
    /// index to start at. The cookie of entry i is i + 1, so it stays meaningful across calls
    /// as long as the directory does not change (the verifier is not checked, as knfsd does
    /// not).
    fn readdir_common(
        &self,
        cred: &Cred,
        fh: &Fh3,
        cookie: u64,
    ) -> Result<Listing, (Nfsstat3, PostOpAttr)> {
        let dir = self.dir(fh).map_err(|s| (s, None))?;
        let attr = Some(self.export.fattr(&dir.st));
        self.fs()
            .may_list(cred, &dir)
            .map_err(|s| (s, attr.clone()))?;
        let entries = self.fs().dir_entries(&dir).map_err(|s| (s, attr.clone()))?;
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
        match self.fs().fsstat() {
            Ok(v) => Res::Ok(FsstatOk {
                obj_attributes: attr,
                tbytes: v.tbytes,
                fbytes: v.fbytes,
                abytes: v.abytes,
                tfiles: v.tfiles,
                ffiles: v.ffiles,
                afiles: v.afiles,
                invarsec: 0,
            }),
            Err(s) => Res::Err(s, AttrOnly { attributes: attr }),
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
        let r = self.fs().commit(&n);
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
