//! The protocol-neutral file operations NFSv3 and NFSv4 share, over one [`Export`].
//!
//! Each operation takes the caller's [`Cred`], resolved [`Node`]s and plain values, applies the
//! AUTH_SYS permission rules (`may`, the owner overrides knfsd applies to READ, WRITE and
//! truncation, the sticky bit, set-gid inheritance and clearing, read-only exports, names
//! confined to one component) and returns an [`NfsResult`]. The protocol layers add their own
//! results around them (NFSv3's weak cache consistency data, NFSv4's change info).
//!
//! Errors are `Nfsstat3`; [`v4_status`] gives the NFSv4 code (equal for every errno-derived
//! code, and for the 1000x codes both versions share).
//!
//! `create`: the operations that make objects (regular files in the three create modes,
//! directories, symbolic links, special files).

mod create;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rustix::fs::{AtFlags, Mode, OFlags, Statx, Timestamps};

use crate::filecache::NowaitReads;
use crate::nfs3::{Nfsstat3, Nfstime3, Sattr3, SetTime, StableHow, access};
use crate::nfs4::Nfsstat4;
use crate::vfs::{
    Cred, Export, MAY_EXEC, MAY_READ, MAY_WRITE, NfsResult, Node, Opened, S_ISGID, S_ISVTX,
    check_name, io_to_nfs, is_dir, is_lnk, is_reg, may,
};

/// Largest READ and WRITE the server serves.
pub const MAX_IO: u32 = 1 << 20;
/// READs of at least this many bytes use a pooled buffer ([`oncrpc::BufPool`]) instead of a
/// freshly zeroed one, its size the READ's count rounded up to a power of two (at most
/// `MAX_IO`). With the bound at 256 KiB, zeroing a fresh buffer for every 64 KiB READ was 1.5 %
/// of the user-space CPU samples of `nfs bench --io 64k --depth 4` (perf, stop 40).
const POOLED_READ_MIN: usize = 32 << 10;

/// The NFSv4 status for an NFSv3 one. RFC 8881 §15.1 keeps the values of every code derived
/// from an errno and of the 1000x codes NFSv3 defines (NFS3ERR_JUKEBOX is NFS4ERR_DELAY,
/// 10008). The NFSv3 codes without an NFSv4 twin of the same number: NFS3ERR_NODEV (19) is
/// NFS4ERR_NXIO, as nfsd maps ENODEV; NFS3ERR_REMOTE (71) is NFS4ERR_IO; NFS3ERR_NOT_SYNC
/// (10002, the ctime guard of NFSv3 SETATTR, which NFSv4 never passes) is NFS4ERR_INVAL.
pub fn v4_status(s: Nfsstat3) -> Nfsstat4 {
    match s {
        Nfsstat3::NoDev => Nfsstat4::NXIO,
        Nfsstat3::Remote => Nfsstat4::IO,
        Nfsstat3::NotSync => Nfsstat4::INVAL,
        other => Nfsstat4(other.code()),
    }
}

/// Which kinds of object a remove may take away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveKind {
    /// NFSv3 REMOVE: not a directory (ISDIR).
    NonDir,
    /// NFSv3 RMDIR: only a directory (NOTDIR).
    Dir,
    /// NFSv4 REMOVE: either.
    Any,
}

/// A file created (or found, for UNCHECKED and a retransmitted EXCLUSIVE).
#[derive(Debug, Clone)]
pub struct Created {
    pub st: Statx,
    /// Whether this call made the file (false: it already existed).
    pub created: bool,
}

/// What a READ returned.
#[derive(Debug, Clone)]
pub struct ReadOut {
    pub data: Bytes,
    pub eof: bool,
    /// The file's status after the read.
    pub st: Statx,
}

/// File-system totals (FSSTAT, and NFSv4's space/files attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    pub tbytes: u64,
    pub fbytes: u64,
    pub abytes: u64,
    pub tfiles: u64,
    pub ffiles: u64,
    pub afiles: u64,
}

/// One export with the options that apply to this call.
#[derive(Debug, Clone, Copy)]
pub struct FsOps<'a> {
    pub export: &'a Export,
    /// Refuse every modifying operation with ROFS.
    pub read_only: bool,
}

impl<'a> FsOps<'a> {
    /// The operations of `export`.
    pub fn new(export: &'a Export, read_only: bool) -> Self {
        FsOps { export, read_only }
    }

    /// ROFS on a read-only export.
    pub fn rofs(&self) -> NfsResult<()> {
        if self.read_only {
            Err(Nfsstat3::Rofs)
        } else {
            Ok(())
        }
    }

    /// Resolve `name` in the directory `dir` (LOOKUP semantics, `.` and `..` included), with
    /// no permission check.
    pub fn child(&self, dir: &Node, name: &[u8]) -> NfsResult<Node> {
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
                // The name is looked up in the directory the handle named (its descriptor
                // usually cached, crate::dircache), not by walking its path again.
                let dfd = self.export.open_dir_of(dir)?;
                let st = self.export.stat_at(&dfd, name)?;
                let rel = dir.rel.join(name);
                self.export.remember(st.stx_ino, &rel);
                Ok(Node { rel, st })
            }
        }
    }

    /// LOOKUP of `name` in the directory `dir`: search permission on it, then [`Self::child`].
    pub fn lookup(&self, cred: &Cred, dir: &Node, name: &[u8]) -> NfsResult<Node> {
        if !is_dir(&dir.st) {
            return Err(Nfsstat3::NotDir);
        }
        if !may(&dir.st, cred, MAY_EXEC) {
            return Err(Nfsstat3::Acces);
        }
        self.child(dir, name)
    }

    /// The ACCESS bits (RFC 1813 §3.3.4; RFC 8881 §18.1 uses the same values) the caller
    /// holds on `st`, out of all six.
    pub fn access(&self, cred: &Cred, st: &Statx) -> u32 {
        let mut granted = 0;
        if may(st, cred, MAY_READ) {
            granted |= access::READ;
        }
        if !self.read_only && may(st, cred, MAY_WRITE) {
            granted |= access::MODIFY | access::EXTEND;
            if is_dir(st) {
                granted |= access::DELETE;
            }
        }
        if may(st, cred, MAY_EXEC) {
            granted |= if is_dir(st) {
                access::LOOKUP
            } else {
                access::EXECUTE
            };
        }
        granted
    }

    /// The target of the symbolic link `n` (INVAL for anything else).
    pub fn readlink(&self, n: &Node) -> NfsResult<Vec<u8>> {
        if !is_lnk(&n.st) {
            return Err(Nfsstat3::Inval);
        }
        let (dir, name) = self.export.parent_of(&n.rel)?;
        Ok(rustix::fs::readlinkat(&dir, name, Vec::new())?.into_bytes())
    }

    /// Read and execute rights on a regular file for I/O (the owner may always, knfsd's
    /// owner override: the client checked at open).
    fn io_allowed(cred: &Cred, st: &Statx, want: u32) -> NfsResult<()> {
        if is_dir(st) {
            return Err(Nfsstat3::IsDir);
        }
        if !is_reg(st) {
            return Err(Nfsstat3::Inval);
        }
        if !may(st, cred, want) && cred.uid != st.stx_uid {
            return Err(Nfsstat3::Acces);
        }
        Ok(())
    }

    /// Read up to `count` bytes (at most [`MAX_IO`]) at `offset`; large reads use `pool`.
    pub fn read(
        &self,
        cred: &Cred,
        n: &Node,
        offset: u64,
        count: u32,
        pool: &Arc<oncrpc::BufPool>,
    ) -> NfsResult<ReadOut> {
        Self::io_allowed(cred, &n.st, MAY_READ)?;
        let f = self.export.open_file(&n.rel, false)?;
        let ReadInto::Got(data, got) = read_into(&f, offset, count, pool, false)? else {
            return Err(Nfsstat3::Io);
        };
        let st = self.export.stat_rel(&n.rel).unwrap_or(n.st);
        let eof = offset.saturating_add(got as u64) >= st.stx_size;
        Ok(ReadOut { data, eof, st })
    }

    /// [`Self::read`] of a file open in the open-file cache. With `nowait`, only from the page
    /// cache (`preadv2(RWF_NOWAIT)`; a file in memory, such as on tmpfs, is read plainly):
    /// `Ok(None)` when that would wait for the disk, or when the file system cannot tell
    /// ([`NowaitReads::Never`]), so the caller can go on to a blocking thread.
    pub fn read_open(
        &self,
        cred: &Cred,
        o: &Opened,
        offset: u64,
        count: u32,
        pool: &Arc<oncrpc::BufPool>,
        nowait: bool,
    ) -> NfsResult<Option<ReadOut>> {
        Self::io_allowed(cred, &o.st, MAY_READ)?;
        let mut mode = if nowait {
            o.file.nowait_reads()
        } else {
            NowaitReads::Plain
        };
        let (data, got) = loop {
            let r = match mode {
                NowaitReads::Never => return Ok(None),
                NowaitReads::Try => read_into(o.file.file(), offset, count, pool, true)?,
                NowaitReads::Plain => read_into(o.file.file(), offset, count, pool, false)?,
            };
            match r {
                ReadInto::Got(data, got) => break (data, got),
                ReadInto::WouldWait => return Ok(None),
                // Learnt once per open file (tmpfs: read it plainly, here).
                ReadInto::Refused => mode = o.file.nowait_refused(),
            }
        };
        let nowait = mode == NowaitReads::Try;
        let st = self.export.stat_open(&o.file).unwrap_or(o.st);
        let end = offset.saturating_add(got as u64);
        // A short read that is not at the end of the file stopped at a page not in memory.
        if nowait && got < (count.min(MAX_IO) as usize) && end < st.stx_size {
            return Ok(None);
        }
        Ok(Some(ReadOut {
            data,
            eof: end >= st.stx_size,
            st,
        }))
    }

    /// Write `data` at `offset`, then sync as `stable` asks; the number of bytes written.
    pub fn write(
        &self,
        cred: &Cred,
        n: &Node,
        offset: u64,
        data: &[u8],
        stable: StableHow,
    ) -> NfsResult<u32> {
        self.rofs()?;
        Self::io_allowed(cred, &n.st, MAY_WRITE)?;
        let f = self.export.open_file(&n.rel, true)?;
        write_sync(&f, offset, data, stable)
    }

    /// [`Self::write`] through a file open for writing in the open-file cache (INVAL if its
    /// descriptor is read-only: the caller uses [`Self::write`]).
    pub fn write_open(
        &self,
        cred: &Cred,
        o: &Opened,
        offset: u64,
        data: &[u8],
        stable: StableHow,
    ) -> NfsResult<u32> {
        self.rofs()?;
        Self::io_allowed(cred, &o.st, MAY_WRITE)?;
        if !o.file.writable() {
            return Err(Nfsstat3::Inval);
        }
        write_sync(o.file.file(), offset, data, stable)
    }

    /// The permission checks of an NFSv4 OPEN of an existing object (RFC 8881 §18.16.3):
    /// ISDIR for a directory, SYMLINK for a symbolic link, WRONG_TYPE-like INVAL for other
    /// non-regular files (the caller maps it), read and write rights as asked, ROFS for write
    /// access to a read-only export. The owner may always (knfsd's owner override).
    pub fn may_open(&self, cred: &Cred, n: &Node, read: bool, write: bool) -> NfsResult<()> {
        if is_dir(&n.st) {
            return Err(Nfsstat3::IsDir);
        }
        if !is_reg(&n.st) {
            return Err(Nfsstat3::Inval);
        }
        if write {
            self.rofs()?;
        }
        let want = if read { MAY_READ } else { 0 } | if write { MAY_WRITE } else { 0 };
        if !may(&n.st, cred, want) && cred.uid != n.st.stx_uid {
            return Err(Nfsstat3::Acces);
        }
        Ok(())
    }

    /// The next data (`data`) or hole at or after `offset` (lseek SEEK_DATA / SEEK_HOLE,
    /// RFC 7862 §15.11): NXIO past the end of the file.
    pub fn seek(&self, cred: &Cred, n: &Node, offset: u64, data: bool) -> NfsResult<u64> {
        Self::io_allowed(cred, &n.st, MAY_READ)?;
        let f = self.export.open_file(&n.rel, false)?;
        let to = if data {
            rustix::fs::SeekFrom::Data(offset)
        } else {
            rustix::fs::SeekFrom::Hole(offset)
        };
        Ok(rustix::fs::seek(&f, to)?)
    }

    /// Reserve (`punch` false, RFC 7862 §15.1 ALLOCATE) or punch out (`punch` true, §15.4
    /// DEALLOCATE, the size kept) the range `offset..offset+len`.
    pub fn allocate(
        &self,
        cred: &Cred,
        n: &Node,
        offset: u64,
        len: u64,
        punch: bool,
    ) -> NfsResult<()> {
        self.rofs()?;
        Self::io_allowed(cred, &n.st, MAY_WRITE)?;
        let f = self.export.open_file(&n.rel, true)?;
        let mode = if punch {
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE
        } else {
            rustix::fs::FallocateFlags::empty()
        };
        Ok(rustix::fs::fallocate(&f, mode, offset, len)?)
    }

    /// COMMIT: everything written UNSTABLE is on stable storage before the reply (RFC 1813
    /// §3.3.21, RFC 8881 §18.3). fsync through any descriptor flushes the file's dirty pages.
    pub fn commit(&self, n: &Node) -> NfsResult<()> {
        if is_dir(&n.st) {
            return Err(Nfsstat3::IsDir);
        }
        if !is_reg(&n.st) {
            return Err(Nfsstat3::Inval);
        }
        let f = self.export.open_file(&n.rel, false)?;
        f.sync_data().map_err(|e| io_to_nfs(&e))
    }

    /// Sticky-directory rule: in a directory with S_ISVTX only the owner of the directory or
    /// of the entry (or root) may remove or rename it.
    fn sticky_ok(cred: &Cred, dir: &Statx, victim: &Statx) -> bool {
        u32::from(dir.stx_mode) & S_ISVTX == 0
            || cred.uid == 0
            || cred.uid == dir.stx_uid
            || cred.uid == victim.stx_uid
    }

    /// REMOVE / RMDIR of `name` in `dir`.
    pub fn remove(&self, cred: &Cred, dir: &Node, name: &[u8], kind: RemoveKind) -> NfsResult<()> {
        self.rofs()?;
        match name {
            b"." => return Err(Nfsstat3::Inval),
            b".." => {
                return Err(if kind == RemoveKind::Dir {
                    Nfsstat3::NotEmpty
                } else {
                    Nfsstat3::Inval
                });
            }
            _ => {}
        }
        let name = check_name(name)?;
        if !may(&dir.st, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Nfsstat3::Acces);
        }
        let dfd = self.export.open_dir_of(dir)?;
        let victim = self.export.stat_at(&dfd, name)?;
        if !Self::sticky_ok(cred, &dir.st, &victim) {
            return Err(Nfsstat3::Acces);
        }
        let rmdir = match kind {
            RemoveKind::Dir if !is_dir(&victim) => return Err(Nfsstat3::NotDir),
            // RFC 1813 §3.3.12: REMOVE of a directory fails; ISDIR, as Linux says.
            RemoveKind::NonDir if is_dir(&victim) => return Err(Nfsstat3::IsDir),
            _ => is_dir(&victim),
        };
        let flags = if rmdir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&dfd, name, flags)?;
        // The open-file cache must not keep the removed file's blocks (crate::filecache):
        // `forget` drops its descriptor along with the rest when the last name went,
        // `close_cached` alone when other links remain.
        if rmdir || victim.stx_nlink <= 1 {
            self.export.forget(&victim);
        } else {
            self.export.close_cached(victim.stx_ino);
        }
        Ok(())
    }

    /// RENAME `fname` in `from` to `tname` in `to`.
    pub fn rename(
        &self,
        cred: &Cred,
        from: &Node,
        fname: &[u8],
        to: &Node,
        tname: &[u8],
    ) -> NfsResult<()> {
        self.rofs()?;
        for n in [fname, tname] {
            if n == b"." || n == b".." {
                return Err(Nfsstat3::Inval);
            }
        }
        let fname = check_name(fname)?;
        let tname = check_name(tname)?;
        if !may(&from.st, cred, MAY_WRITE | MAY_EXEC) || !may(&to.st, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Nfsstat3::Acces);
        }
        let ffd = self.export.open_dir_of(from)?;
        let tfd = self.export.open_dir_of(to)?;
        let victim = self.export.stat_at(&ffd, fname)?;
        if !Self::sticky_ok(cred, &from.st, &victim) {
            return Err(Nfsstat3::Acces);
        }
        let replaced = self.export.stat_at(&tfd, tname).ok();
        if let Some(target) = &replaced {
            if target.stx_ino == victim.stx_ino {
                // RFC 1813 §3.3.14, RFC 8881 §18.26.4: renaming onto the same object is a
                // successful no-op.
                return Ok(());
            }
            if !Self::sticky_ok(cred, &to.st, target) {
                return Err(Nfsstat3::Acces);
            }
            if is_dir(&victim) != is_dir(target) {
                return Err(if is_dir(target) {
                    Nfsstat3::IsDir
                } else {
                    Nfsstat3::NotDir
                });
            }
        }
        rustix::fs::renameat(&ffd, fname, &tfd, tname)?;
        if let Some(target) = replaced {
            // The replaced object lost this name (crate::filecache).
            self.export.close_cached(target.stx_ino);
        }
        let old = from.rel.join(fname);
        let new = to.rel.join(tname);
        self.export.remember(victim.stx_ino, &new);
        if is_dir(&victim) {
            self.export.renamed(&old, &new);
        }
        Ok(())
    }

    /// LINK `file` as `name` in `dir`.
    pub fn link(&self, cred: &Cred, file: &Node, dir: &Node, name: &[u8]) -> NfsResult<()> {
        self.rofs()?;
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
        let dfd = self.export.open_dir_of(dir)?;
        rustix::fs::linkat(&sfd, sname, &dfd, name, AtFlags::empty())?;
        Ok(())
    }

    /// The directory's entries in cookie order: `.`, `..`, then the names sorted, each with
    /// its file id.
    pub fn dir_entries(&self, dir: &Node) -> NfsResult<Vec<(Vec<u8>, u64)>> {
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

    /// Read permission on a directory for READDIR.
    pub fn may_list(&self, cred: &Cred, dir: &Node) -> NfsResult<()> {
        if !is_dir(&dir.st) {
            return Err(Nfsstat3::NotDir);
        }
        if !may(&dir.st, cred, MAY_READ) {
            return Err(Nfsstat3::Acces);
        }
        Ok(())
    }

    /// SETATTR with the ownership rules of chown(2)/chmod(2)/utimensat(2) for an AUTH_SYS
    /// caller; `guard` is NFSv3's ctime guard (RFC 1813 §3.3.2).
    pub fn setattr(
        &self,
        cred: &Cred,
        n: &Node,
        s: &Sattr3,
        guard: Option<Nfstime3>,
    ) -> NfsResult<()> {
        self.rofs()?;
        if let Some(guard) = guard
            && guard != crate::vfs::nfstime(&n.st.stx_ctime)
        {
            return Err(Nfsstat3::NotSync);
        }
        // A symbolic link has no mode of its own to set (Linux has no lchmod): the request's
        // mode is ignored and the rest applied, as Linux nfsd does (nfsd_sanitize_attrs), so a
        // client's `chmod -R` over a tree with links succeeds.
        let mode = s.mode.filter(|_| !is_lnk(&n.st));
        let owner = cred.uid == 0 || cred.uid == n.st.stx_uid;
        if mode.is_some() && !owner {
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
            f.set_len(size).map_err(|e| io_to_nfs(&e))?;
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
        if let Some(mode) = mode {
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

    /// The export's file-system totals.
    pub fn fsstat(&self) -> NfsResult<FsStat> {
        let v = rustix::fs::fstatvfs(self.export.root_fd())?;
        Ok(FsStat {
            tbytes: v.f_blocks.saturating_mul(v.f_frsize),
            fbytes: v.f_bfree.saturating_mul(v.f_frsize),
            abytes: v.f_bavail.saturating_mul(v.f_frsize),
            tfiles: v.f_files,
            ffiles: v.f_ffree,
            afiles: v.f_favail,
        })
    }
}

/// What [`read_into`] read.
enum ReadInto {
    /// The data and its length.
    Got(Bytes, usize),
    /// With `nowait`: not even the first page is in memory.
    WouldWait,
    /// With `nowait`: the file system refuses `RWF_NOWAIT` (EOPNOTSUPP).
    Refused,
}

/// Read up to `count` bytes (at most [`MAX_IO`]) at `offset` into a fresh buffer, or a pooled one
/// for large reads. With `nowait`, only what the page cache holds (`RWF_NOWAIT`, Linux 4.14).
fn read_into(
    f: &std::fs::File,
    offset: u64,
    count: u32,
    pool: &Arc<oncrpc::BufPool>,
    nowait: bool,
) -> NfsResult<ReadInto> {
    let count = count.min(MAX_IO) as usize;
    let fill = |buf: &mut [u8]| -> NfsResult<Result<usize, ReadInto>> {
        let mut got = 0;
        while got < buf.len() {
            let at = offset.saturating_add(got as u64);
            let r = if nowait {
                let mut v = [std::io::IoSliceMut::new(&mut buf[got..])];
                rustix::io::preadv2(f, &mut v, at, rustix::io::ReadWriteFlags::NOWAIT)
                    .map_err(std::io::Error::from)
            } else {
                f.read_at(&mut buf[got..], at)
            };
            match r {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if nowait && e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Ok(if got > 0 {
                        Ok(got)
                    } else {
                        Err(ReadInto::WouldWait)
                    });
                }
                // A file system that cannot say whether a read would wait (tmpfs on Linux 6.1
                // and on this VM's 6.18, procfs) refuses RWF_NOWAIT with EOPNOTSUPP: the caller
                // learns which kind it is (`OpenFile::nowait_refused`). Answering the READ with
                // NFS3ERR_NOTSUPP failed the kernel client's reads from a tmpfs export (its
                // `dd` got errno 524) in the kernel lab.
                Err(e)
                    if nowait
                        && e.raw_os_error()
                            == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error()) =>
                {
                    return Ok(Err(ReadInto::Refused));
                }
                Err(e) => return Err(io_to_nfs(&e)),
            }
        }
        Ok(Ok(got))
    };
    if count >= POOLED_READ_MIN {
        let mut buf = pool.get(count.next_power_of_two().min(MAX_IO as usize));
        Ok(match fill(&mut buf[..count])? {
            Ok(got) => ReadInto::Got(pool.wrap(buf, 0..got), got),
            Err(no) => no,
        })
    } else {
        let mut buf = BytesMut::zeroed(count);
        Ok(match fill(&mut buf)? {
            Ok(got) => {
                buf.truncate(got);
                ReadInto::Got(buf.freeze(), got)
            }
            Err(no) => no,
        })
    }
}

/// Write all of `data` at `offset`, then sync as `stable` asks (RFC 1813 §3.3.7).
fn write_sync(f: &std::fs::File, offset: u64, data: &[u8], stable: StableHow) -> NfsResult<u32> {
    f.write_all_at(data, offset).map_err(|e| io_to_nfs(&e))?;
    match stable {
        StableHow::Unstable => {}
        StableHow::DataSync => f.sync_data().map_err(|e| io_to_nfs(&e))?,
        StableHow::FileSync => f.sync_all().map_err(|e| io_to_nfs(&e))?,
    }
    Ok(data.len() as u32)
}

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
