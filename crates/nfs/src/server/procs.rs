//! The NFSv3 procedures (RFC 1813 §3.3), each over the export's file operations.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use bytes::Bytes;
use rustix::fs::Statx;
use xdr::XdrEncode;

use super::{DTPREF, INLINE_WRITE_MAX, MAX_IO, NfsServer};
use crate::fsops::{ReadOut, RemoveKind};
use crate::nfs3::*;
use crate::vfs::{Cred, Export, NAME_MAX, NfsResult, Node, Opened, Resolved, io_to_nfs};
use crate::xdr_util::Void;

impl NfsServer {
    pub(super) fn getattr(&self, a: GetattrArgs) -> GetattrRes {
        match self.export.resolve_open(&a.object, false) {
            Ok(r) => Res::Ok(GetattrOk {
                obj_attributes: self.export.fattr(r.st()),
            }),
            Err(s) => Res::Err(s, Void),
        }
    }

    pub(super) fn setattr(&self, cred: &Cred, a: SetattrArgs) -> SetattrRes {
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

    pub(super) fn lookup(&self, cred: &Cred, a: LookupArgs) -> LookupRes {
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

    pub(super) fn access(&self, cred: &Cred, a: AccessArgs) -> AccessRes {
        let r = match self.export.resolve_open(&a.object, false) {
            Ok(r) => r,
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        // RFC 1813 §3.3.4: report which of the requested rights the caller has.
        Res::Ok(AccessOk {
            obj_attributes: Some(self.export.fattr(r.st())),
            access: a.access & self.fs().access(cred, r.st()),
        })
    }

    pub(super) fn readlink(&self, a: ReadlinkArgs) -> ReadlinkRes {
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

    fn read_ok(&self, r: ReadOut) -> ReadRes {
        Res::Ok(ReadOk {
            file_attributes: Some(self.export.fattr(&r.st)),
            count: r.data.len() as u32,
            eof: r.eof,
            data: Data(r.data),
        })
    }

    /// READ answered from the page cache through the open-file cache, without waiting for the
    /// disk: `None` when it would have to wait (or the file cannot be kept open), so the caller
    /// runs [`Self::read`] on a blocking thread.
    pub(super) fn read_nowait(&self, cred: &Cred, a: &ReadArgs) -> Option<ReadRes> {
        let o = match self.export.resolve_open(&a.file, true) {
            Ok(Resolved::Open(o)) => o,
            Ok(Resolved::Node(_)) => return None,
            Err(s) => return Some(Res::Err(s, AttrOnly { attributes: None })),
        };
        match self
            .fs()
            .read_open(cred, &o, a.offset, a.count, &self.read_bufs, true)
        {
            Ok(Some(r)) => Some(self.read_ok(r)),
            Ok(None) => None,
            Err(s) => Some(Res::Err(
                s,
                AttrOnly {
                    attributes: Some(self.export.fattr(&o.st)),
                },
            )),
        }
    }

    pub(super) fn read(&self, cred: &Cred, a: ReadArgs) -> ReadRes {
        let r = match self.export.resolve_open(&a.file, true) {
            Ok(Resolved::Open(o)) => self
                .fs()
                .read_open(cred, &o, a.offset, a.count, &self.read_bufs, false)
                .and_then(|r| r.ok_or(Nfsstat3::Io))
                .map_err(|s| (s, o.st)),
            Ok(Resolved::Node(n)) => self
                .fs()
                .read(cred, &n, a.offset, a.count, &self.read_bufs)
                .map_err(|s| (s, n.st)),
            Err(s) => return Res::Err(s, AttrOnly { attributes: None }),
        };
        match r {
            Ok(r) => self.read_ok(r),
            Err((s, st)) => Res::Err(
                s,
                AttrOnly {
                    attributes: Some(self.export.fattr(&st)),
                },
            ),
        }
    }

    /// WRITE on the calling task, through a file the open-file cache holds open for writing:
    /// an UNSTABLE one of at most [`INLINE_WRITE_MAX`] bytes (a copy into the page cache), or,
    /// for a call alone on its connection, one of up to [`MAX_IO`] to a file in memory (tmpfs:
    /// neither the copy nor a sync waits for a disk). `None` for anything else (the caller runs
    /// [`Self::write`] on a blocking thread).
    pub(super) fn write_inline(&self, cred: &Cred, a: &WriteArgs, alone: bool) -> Option<WriteRes> {
        let len = (a.count as usize).min(a.data.len());
        let small = a.stable == StableHow::Unstable && len <= INLINE_WRITE_MAX;
        let lone_large = alone && len <= MAX_IO as usize;
        if !(small || lone_large) {
            return None;
        }
        match self.export.resolve_open(&a.file, true) {
            Ok(Resolved::Open(o)) if o.file.writable() && (small || o.file.in_memory()) => {
                Some(self.write_open(cred, a, &o))
            }
            Ok(_) => None,
            Err(s) => Some(Res::Err(s, WccOnly { wcc: WccData::NONE })),
        }
    }

    fn write_open(&self, cred: &Cred, a: &WriteArgs, o: &Opened) -> WriteRes {
        // RFC 1813 §3.3.7: count is the number of bytes of data; never write past it.
        let len = (a.count as usize).min(a.data.len());
        let r = self
            .fs()
            .write_open(cred, o, a.offset, &a.data.0[..len], a.stable);
        self.write_res(r, self.wcc_open(o), a.stable)
    }

    fn write_res(&self, r: NfsResult<u32>, wcc: WccData, stable: StableHow) -> WriteRes {
        match r {
            Ok(count) => Res::Ok(WriteOk {
                file_wcc: wcc,
                count,
                committed: stable,
                verf: self.write_verf,
            }),
            Err(s) => Res::Err(s, WccOnly { wcc }),
        }
    }

    pub(super) fn write(&self, cred: &Cred, a: WriteArgs) -> WriteRes {
        let n = match self.export.resolve_open(&a.file, true) {
            Ok(Resolved::Open(o)) if o.file.writable() => return self.write_open(cred, &a, &o),
            // Not open for writing by the cache: the path walk's object, opened for this call.
            Ok(_) => match self.export.resolve(&a.file) {
                Ok(n) => n,
                Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
            },
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        // RFC 1813 §3.3.7: count is the number of bytes of data; never write past it.
        let len = (a.count as usize).min(a.data.len());
        let r = self
            .fs()
            .write(cred, &n, a.offset, &a.data.0[..len], a.stable);
        let wcc = self.wcc(&n.st, &n.rel);
        self.write_res(r, wcc, a.stable)
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

    pub(super) fn create(&self, cred: &Cred, a: CreateArgs) -> NewObjRes {
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

    pub(super) fn mkdir(&self, cred: &Cred, a: MkdirArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self
            .fs()
            .mkdir(cred, &dir, a.where_.name.as_bytes(), &a.attributes);
        self.new_obj(&dir, r)
    }

    pub(super) fn symlink(&self, cred: &Cred, a: SymlinkArgs) -> NewObjRes {
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

    pub(super) fn mknod(&self, cred: &Cred, a: MknodArgs) -> NewObjRes {
        let dir = match self.dir(&a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        let r = self
            .fs()
            .mknod(cred, &dir, a.where_.name.as_bytes(), &a.what);
        self.new_obj(&dir, r)
    }

    pub(super) fn remove(&self, cred: &Cred, a: RemoveArgs, kind: RemoveKind) -> RemoveRes {
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

    pub(super) fn rename(&self, cred: &Cred, a: RenameArgs) -> RenameRes {
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

    pub(super) fn link(&self, cred: &Cred, a: LinkArgs) -> LinkRes {
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

    /// RFC 1813 §3.3.16, §3.3.17: NFS3ERR_TOOSMALL when not even one entry fits the count.
    fn too_small<T>(&self, dir: &Node) -> Res<T, AttrOnly> {
        Res::Err(
            Nfsstat3::TooSmall,
            AttrOnly {
                attributes: Some(self.export.fattr(&dir.st)),
            },
        )
    }

    pub(super) fn readdir(&self, cred: &Cred, a: ReaddirArgs) -> ReaddirRes {
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
            return self.too_small(&dir);
        }
        Res::Ok(ReaddirOk {
            dir_attributes: Some(self.export.fattr(&dir.st)),
            cookieverf: [0; 8],
            entries: EntryList(out),
            eof,
        })
    }

    pub(super) fn readdirplus(&self, cred: &Cred, a: ReaddirplusArgs) -> ReaddirplusRes {
        let (dir, entries, start) = match self.readdir_common(cred, &a.dir, a.cookie) {
            Ok(x) => x,
            Err((s, attributes)) => return Res::Err(s, AttrOnly { attributes }),
        };
        let dfd = match self.export.open_dir_of(&dir) {
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
            return self.too_small(&dir);
        }
        Res::Ok(ReaddirplusOk {
            dir_attributes: Some(self.export.fattr(&dir.st)),
            cookieverf: [0; 8],
            entries: EntryList(out),
            eof,
        })
    }

    pub(super) fn fsstat(&self, a: FsArgs) -> FsstatRes {
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

    pub(super) fn fsinfo(&self, a: FsArgs) -> FsinfoRes {
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

    pub(super) fn pathconf(&self, a: FsArgs) -> PathconfRes {
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

    pub(super) fn commit(&self, a: CommitArgs) -> CommitRes {
        // Through the open-file cache: the descriptor WRITE used, no path walk and open.
        let (r, wcc) = match self.export.resolve_open(&a.file, false) {
            Ok(Resolved::Open(o)) => return self.commit_open(&o),
            Ok(Resolved::Node(n)) => (self.fs().commit(&n), self.wcc(&n.st, &n.rel)),
            Err(s) => return Res::Err(s, WccOnly { wcc: WccData::NONE }),
        };
        self.commit_res(r, wcc)
    }

    /// COMMIT on the calling task, of a file in memory (tmpfs) that the open-file cache holds
    /// open: its sync waits for no disk, so the hop to a blocking thread and back would be
    /// most of the call. `None` for anything else (the caller runs [`Self::commit`] on a
    /// blocking thread).
    pub(super) fn commit_inline(&self, a: &CommitArgs) -> Option<CommitRes> {
        match self.export.resolve_open(&a.file, false) {
            Ok(Resolved::Open(o)) if o.file.in_memory() => Some(self.commit_open(&o)),
            Ok(_) => None,
            Err(s) => Some(Res::Err(s, WccOnly { wcc: WccData::NONE })),
        }
    }

    fn commit_open(&self, o: &Opened) -> CommitRes {
        // RFC 1813 §3.3.21: the data written is on stable storage when COMMIT answers.
        let r = o.file.file().sync_data().map_err(|e| io_to_nfs(&e));
        self.commit_res(r, self.wcc_open(o))
    }

    fn commit_res(&self, r: NfsResult<()>, wcc: WccData) -> CommitRes {
        match r {
            Ok(()) => Res::Ok(CommitOk {
                file_wcc: wcc,
                verf: self.write_verf,
            }),
            Err(s) => Res::Err(s, WccOnly { wcc }),
        }
    }
}

/// A directory, its entries in cookie order, and the index to start at.
type Listing = (Node, Vec<(Vec<u8>, u64)>, usize);
