//! Making objects: the create checks, ownership and attributes of a new object, regular files
//! (UNCHECKED, GUARDED, EXCLUSIVE with the verifier in the times), directories, symbolic links
//! and special files.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode, OFlags, Statx};

use super::{Created, FsOps, timestamps};
use crate::nfs3::{CreateHow3, MknodData3, Nfsstat3, Nfstime3, Sattr3, SetTime};
use crate::vfs::{
    Cred, DirFd, MAY_EXEC, MAY_WRITE, NfsResult, Node, S_ISGID, check_name, io_to_nfs, is_dir,
    is_lnk, is_reg, may,
};

impl FsOps<'_> {
    /// Common checks for creating `name` in the directory `dir`; returns the checked name.
    pub fn prepare_create<'n>(
        &self,
        cred: &Cred,
        dir: &Node,
        name: &'n [u8],
    ) -> NfsResult<&'n OsStr> {
        if !is_dir(&dir.st) {
            return Err(Nfsstat3::NotDir);
        }
        self.rofs()?;
        if name == b"." || name == b".." {
            return Err(Nfsstat3::Exist);
        }
        let name = check_name(name)?;
        if !may(&dir.st, cred, MAY_WRITE | MAY_EXEC) {
            return Err(Nfsstat3::Acces);
        }
        Ok(name)
    }

    /// Give a new object its owner (the caller, or the directory's group under set-gid) and
    /// the requested attributes; its status after. `attrs` is `None` for an object that
    /// already existed (UNCHECKED or a retransmitted EXCLUSIVE CREATE): it keeps its owner and
    /// attributes. `dfd` is `dir`, open. An owner or mode the new object already has is not
    /// set again (a root caller's file is the server's own), nor the status read again after
    /// nothing changed: under an emulated CPU each system call is a large part of a CREATE.
    /// Times with no size change are set before the status is first read (neither a chown nor
    /// a chmod changes them), so an EXCLUSIVE CREATE reads it once.
    pub fn finish_create(
        &self,
        cred: &Cred,
        dir: &Node,
        dfd: &DirFd<'_>,
        name: &OsStr,
        attrs: Option<&Sattr3>,
    ) -> NfsResult<Statx> {
        let rel = dir.rel.join(name);
        // (A size change comes first when there is one: a truncation sets the modify time.)
        let times_first = attrs.filter(|s| s.size.is_none()).and_then(timestamps);
        if let Some(ts) = &times_first {
            rustix::fs::utimensat(dfd, name, ts, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        let mut st = self.export.stat_at(dfd, name)?;
        if let Some(s) = attrs {
            let mut changed = false;
            // Requested owners follow the SETATTR rules: only root gives an object away, and a
            // group must be one of the caller's.
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
            if st.stx_uid != uid || st.stx_gid != gid {
                // Only possible when the server runs as root; otherwise the server's own
                // identity owns the object.
                changed |= rustix::fs::chownat(
                    dfd,
                    name,
                    Some(super::uid(uid)),
                    Some(super::gid(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .is_ok();
                // (A chown clears set-uid and set-gid bits: the mode below is read afresh.)
                if changed {
                    st = self.export.stat_at(dfd, name)?;
                    changed = false;
                }
            }
            if let Some(mode) = s.mode
                && !is_lnk(&st)
                && u32::from(st.stx_mode) & 0o7777 != mode & 0o7777
            {
                rustix::fs::chmodat(
                    dfd,
                    name,
                    Mode::from_raw_mode(mode & 0o7777),
                    AtFlags::empty(),
                )?;
                changed = true;
            }
            if let Some(size) = s.size
                && is_reg(&st)
            {
                self.export
                    .open_file(&rel, true)?
                    .set_len(size)
                    .map_err(|e| io_to_nfs(&e))?;
                changed = true;
            }
            if times_first.is_none()
                && let Some(ts) = timestamps(s)
            {
                rustix::fs::utimensat(dfd, name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
                changed = true;
            }
            if changed {
                st = self.export.stat_at(dfd, name)?;
            }
        }
        self.export.remember(st.stx_ino, &rel);
        Ok(st)
    }

    /// Create the regular file `name` in `dir` (RFC 1813 §3.3.8; NFSv4 OPEN's createhow4 maps
    /// onto the same three modes).
    pub fn create_file(
        &self,
        cred: &Cred,
        dir: &Node,
        name: &[u8],
        how: &CreateHow3,
    ) -> NfsResult<Created> {
        let name = self.prepare_create(cred, dir, name)?;
        let dfd = self.export.open_dir_of(dir)?;
        let base =
            OFlags::CREATE | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        match how {
            CreateHow3::Unchecked(s) | CreateHow3::Guarded(s) => {
                let excl = matches!(how, CreateHow3::Guarded(_));
                let mode = Mode::from_raw_mode(s.mode.unwrap_or(0o644) & 0o7777);
                // RFC 1813 §3.3.8: UNCHECKED on an existing file applies the attributes only.
                // Both try an exclusive create first: one system call when the name is new.
                let existed = match rustix::fs::openat(&dfd, name, base | OFlags::EXCL, mode) {
                    Ok(_) => false,
                    Err(rustix::io::Errno::EXIST) if !excl => true,
                    Err(e) => return Err(e.into()),
                };
                if existed {
                    let rel = dir.rel.join(name);
                    let st = self.export.stat_rel(&rel)?;
                    let node = Node { rel, st };
                    let s = Sattr3 {
                        mode: None,
                        ..s.clone()
                    };
                    self.setattr(cred, &node, &s, None)?;
                    let st = self.finish_create(cred, dir, &dfd, name, None)?;
                    return Ok(Created { st, created: false });
                }
                let st = self.finish_create(cred, dir, &dfd, name, Some(s))?;
                Ok(Created { st, created: true })
            }
            CreateHow3::Exclusive(verf) => {
                // The verifier is kept in atime/mtime seconds (as knfsd does) so that a
                // retransmitted EXCLUSIVE CREATE is recognised (RFC 1813 §3.3.8, RFC 8881
                // §18.16.3).
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
                    Ok(_) => {
                        let st = self.finish_create(cred, dir, &dfd, name, Some(&ts))?;
                        Ok(Created { st, created: true })
                    }
                    Err(rustix::io::Errno::EXIST) => match self.export.stat_at(&dfd, name) {
                        Ok(st)
                            if is_reg(&st)
                                && st.stx_atime.tv_sec == i64::from(va)
                                && st.stx_mtime.tv_sec == i64::from(vm) =>
                        {
                            let st = self.finish_create(cred, dir, &dfd, name, None)?;
                            Ok(Created { st, created: false })
                        }
                        _ => Err(Nfsstat3::Exist),
                    },
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// MKDIR.
    pub fn mkdir(&self, cred: &Cred, dir: &Node, name: &[u8], attrs: &Sattr3) -> NfsResult<Statx> {
        let name = self.prepare_create(cred, dir, name)?;
        let mode = Mode::from_raw_mode(attrs.mode.unwrap_or(0o755) & 0o7777);
        let dfd = self.export.open_dir_of(dir)?;
        rustix::fs::mkdirat(&dfd, name, mode)?;
        self.finish_create(cred, dir, &dfd, name, Some(attrs))
    }

    /// SYMLINK to `target` (not empty, no NUL byte); the link's mode is not settable.
    pub fn symlink(
        &self,
        cred: &Cred,
        dir: &Node,
        name: &[u8],
        target: &[u8],
        attrs: &Sattr3,
    ) -> NfsResult<Statx> {
        let name = self.prepare_create(cred, dir, name)?;
        if target.is_empty() || target.contains(&0) {
            return Err(Nfsstat3::Inval);
        }
        let dfd = self.export.open_dir_of(dir)?;
        rustix::fs::symlinkat(OsStr::from_bytes(target), &dfd, name)?;
        let attrs = Sattr3 {
            mode: None,
            ..attrs.clone()
        };
        self.finish_create(cred, dir, &dfd, name, Some(&attrs))
    }

    /// MKNOD of a device, socket or FIFO (BADTYPE for the other types, RFC 1813 §3.3.11);
    /// devices need a root caller.
    pub fn mknod(
        &self,
        cred: &Cred,
        dir: &Node,
        name: &[u8],
        what: &MknodData3,
    ) -> NfsResult<Statx> {
        let name = self.prepare_create(cred, dir, name)?;
        use rustix::fs::FileType as T;
        let (ft, attrs, dev) = match what {
            MknodData3::Chr(s, d) => (T::CharacterDevice, s, Some(*d)),
            MknodData3::Blk(s, d) => (T::BlockDevice, s, Some(*d)),
            MknodData3::Sock(s) => (T::Socket, s, None),
            MknodData3::Fifo(s) => (T::Fifo, s, None),
            MknodData3::Other(_) => return Err(Nfsstat3::BadType),
        };
        if dev.is_some() && cred.uid != 0 {
            return Err(Nfsstat3::Perm);
        }
        let rdev = dev.map_or(0, |d| rustix::fs::makedev(d.specdata1, d.specdata2));
        let mode = Mode::from_raw_mode(attrs.mode.unwrap_or(0o644) & 0o7777);
        let dfd = self.export.open_dir_of(dir)?;
        rustix::fs::mknodat(&dfd, name, ft, mode, rdev)?;
        self.finish_create(cred, dir, &dfd, name, Some(attrs))
    }
}
