//! Attribute and namespace operations: GETATTR (RFC 8881 §18.7), SETATTR (§18.30), VERIFY
//! (§18.31), NVERIFY (§18.15), ACCESS (§18.1), CREATE (§18.4), REMOVE (§18.25), RENAME
//! (§18.26), LINK (§18.9), READLINK (§18.24), READDIR (§18.23).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use bytes::Bytes;
use rustix::fs::{StatVfs, Statx};

use super::super::args::{CreateType, OpArgs};
use super::super::attrs::{self, AttrSource, SetAttrs, SetTime as SetTime4};
use super::super::consts::{access, attr, op};
use super::super::res::{Entry4, OpRes};
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Bitmap4, ChangeInfo4, Component4, Fattr4, Linktext4, Verifier4};
use super::Nfs4Server;
use super::compound::Ctx;
use super::fh::{Cur, Obj, PSEUDO_FSID, check_component, pseudo_fh, pseudo_stat};
use crate::fsops::{RemoveKind, v4_status};
use crate::nfs3::{MknodData3, Nfstime3, Sattr3, SetTime, Specdata3};
use crate::vfs::{Node, is_dir};

/// READDIR4resok around the entries: the cookie verifier, the end of the list and `eof`.
const READDIR_FIXED: usize = 8 + 4 + 4;

/// The settable attributes as the shared file operations take them. NFSv4 times are signed
/// 64-bit seconds; the file operations set NFSv3's unsigned 32-bit ones, so a time outside
/// 1970..2106 is NFS4ERR_INVAL.
pub(super) fn sattr3(s: &SetAttrs) -> Res4<Sattr3> {
    let t = |t: Option<SetTime4>| -> Res4<SetTime> {
        Ok(match t {
            None => SetTime::DontChange,
            Some(SetTime4::Server) => SetTime::ServerTime,
            Some(SetTime4::Client(c)) => SetTime::ClientTime(Nfstime3 {
                seconds: u32::try_from(c.seconds).map_err(|_| Nfsstat4::INVAL)?,
                nseconds: c.nseconds,
            }),
        })
    };
    Ok(Sattr3 {
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        atime: t(s.atime)?,
        mtime: t(s.mtime)?,
    })
}

/// `change_info4` of a directory changed by this server: not atomic (another client's
/// change may fall between the two reads).
pub(super) fn cinfo(before: &Statx, after: &Statx) -> ChangeInfo4 {
    ChangeInfo4 {
        atomic: false,
        before: attrs::change(before),
        after: attrs::change(after),
    }
}

impl Nfs4Server {
    /// Encode `mask` for one object.
    pub(super) fn encode_attrs(
        &self,
        mask: &Bitmap4,
        st: &Statx,
        fh: &[u8],
        fsid: u64,
        vfs: Option<&StatVfs>,
    ) -> Res4<Fattr4> {
        let src = AttrSource {
            st,
            fh,
            fsid,
            vfs,
            lease_time: self.cfg.state.lease.as_secs() as u32,
            max_read: u64::from(self.cfg.max_io),
            max_write: u64::from(self.cfg.max_io),
            mounted_on_fileid: st.stx_ino,
        };
        attrs::encode(mask, &src)
    }

    /// The file system's statistics, when `mask` needs them.
    fn vfs_for(mask: &Bitmap4, o: Option<&Obj>) -> Option<StatVfs> {
        if !attrs::needs_statvfs(mask) {
            return None;
        }
        o.and_then(|o| rustix::fs::fstatvfs(o.x.server.export().root_fd()).ok())
    }

    /// The attributes of `mask` for a resolved filehandle.
    fn cur_attrs(&self, c: &Cur, mask: &Bitmap4) -> Res4<Fattr4> {
        match c {
            Cur::Real(o) => {
                let vfs = Self::vfs_for(mask, Some(o));
                let fsid = o.x.server.export().fsid();
                self.encode_attrs(mask, &o.node.st, o.fh.as_bytes(), fsid, vfs.as_ref())
            }
            Cur::Pseudo(p) => {
                let st = pseudo_stat(p)?;
                self.encode_attrs(mask, &st, pseudo_fh(p).as_bytes(), PSEUDO_FSID, None)
            }
        }
    }

    /// The source and target of RENAME and LINK: the saved and the current filehandle, both
    /// of one export (NFS4ERR_XDEV otherwise).
    fn saved_and_current(&self, ctx: &Ctx<'_>) -> Res4<(Obj, Obj)> {
        let saved = ctx.saved.as_ref().ok_or(Nfsstat4::NOFILEHANDLE)?;
        let cur = ctx.cur.as_ref().ok_or(Nfsstat4::NOFILEHANDLE)?;
        let (Cur::Real(s), Cur::Real(c)) = (self.resolve(ctx, saved)?, self.resolve(ctx, cur)?)
        else {
            return Err(Nfsstat4::XDEV);
        };
        if s.x.server.export().fsid() != c.x.server.export().fsid() {
            return Err(Nfsstat4::XDEV);
        }
        Ok((*s, *c))
    }

    fn restat(o: &Obj) -> Statx {
        o.x.server
            .export()
            .stat_rel(&o.node.rel)
            .unwrap_or(o.node.st)
    }

    pub(super) fn file_op(&self, ctx: &mut Ctx<'_>, a: OpArgs) -> Res4<OpRes> {
        match a {
            OpArgs::Getattr(mask) => {
                let c = self.current(ctx)?;
                Ok(OpRes::Getattr(self.cur_attrs(&c, &mask)?))
            }
            OpArgs::Verify(f) => self.verify(ctx, &f, true),
            OpArgs::Nverify(f) => self.verify(ctx, &f, false),
            OpArgs::Access(want) => {
                // RFC 8881 §18.1.3, RFC 7530 §16.1.4: LOOKUP and DELETE (of a directory
                // entry) mean nothing for a non-directory, EXECUTE nothing for a directory;
                // none is "supported" there.
                let (supported, granted) = match self.current(ctx)? {
                    Cur::Real(o) => {
                        let sup = if is_dir(&o.node.st) {
                            access::ALL & !access::EXECUTE
                        } else {
                            access::ALL & !(access::LOOKUP | access::DELETE)
                        };
                        (sup, o.fs().access(&o.cred, &o.node.st))
                    }
                    Cur::Pseudo(_) => (
                        access::ALL & !access::EXECUTE,
                        access::READ | access::LOOKUP,
                    ),
                };
                Ok(OpRes::Access {
                    supported: want & supported,
                    access: want & granted,
                })
            }
            OpArgs::Setattr { stateid, attrs } => {
                let o = self.current_obj(ctx, Nfsstat4::ROFS)?;
                let s = attrs::decode_set(&attrs)?;
                if s.size.is_some() {
                    // RFC 8881 §18.30.3: a size change is checked like a WRITE.
                    let sid = ctx.stateid(&stateid)?;
                    self.state().check_io(ctx.clientid, &sid, o.key(), true)?;
                }
                let s3 = sattr3(&s)?;
                o.fs()
                    .setattr(&o.cred, &o.node, &s3, None)
                    .map_err(v4_status)?;
                Ok(OpRes::Setattr(Nfsstat4::OK, s.mask()))
            }
            OpArgs::Readlink => {
                let o = self.current_obj(ctx, Nfsstat4::INVAL)?;
                let t = o.fs().readlink(&o.node).map_err(v4_status)?;
                Ok(OpRes::Readlink(Linktext4(Bytes::from(t))))
            }
            OpArgs::Create {
                objtype,
                name,
                attrs,
            } => self.create(ctx, objtype, &name, &attrs),
            OpArgs::Remove(name) => {
                let dir = self.dir_obj(ctx)?;
                let n = check_component(&name)?;
                dir.fs()
                    .remove(&dir.cred, &dir.node, n, RemoveKind::Any)
                    .map_err(v4_status)?;
                Ok(OpRes::Remove(cinfo(&dir.node.st, &Self::restat(&dir))))
            }
            OpArgs::Rename { old, new } => {
                let (from, to) = self.saved_and_current(ctx)?;
                // RFC 8881 §18.26.3: both the saved (source) and the current (target)
                // filehandles must be directories, NFS4ERR_NOTDIR otherwise (not the
                // permission error the rename itself would give).
                if !is_dir(&from.node.st) || !is_dir(&to.node.st) {
                    return Err(Nfsstat4::NOTDIR);
                }
                let on = check_component(&old)?;
                let nn = check_component(&new)?;
                to.fs()
                    .rename(&to.cred, &from.node, on, &to.node, nn)
                    .map_err(v4_status)?;
                Ok(OpRes::Rename {
                    source: cinfo(&from.node.st, &Self::restat(&from)),
                    target: cinfo(&to.node.st, &Self::restat(&to)),
                })
            }
            OpArgs::Link(name) => {
                let (file, dir) = self.saved_and_current(ctx)?;
                // RFC 8881 §18.9.3, RFC 7530 §16.9.4: the current filehandle must be a
                // directory (checked before any permission).
                if !is_dir(&dir.node.st) {
                    return Err(Nfsstat4::NOTDIR);
                }
                let n = check_component(&name)?;
                dir.fs()
                    .link(&dir.cred, &file.node, &dir.node, n)
                    .map_err(v4_status)?;
                Ok(OpRes::Link(cinfo(&dir.node.st, &Self::restat(&dir))))
            }
            OpArgs::Readdir {
                cookie,
                verf,
                dircount,
                maxcount,
                attrs,
            } => self.readdir(ctx, cookie, verf, dircount, maxcount, &attrs),
            _ => Err(Nfsstat4::SERVERFAULT),
        }
    }

    /// The current filehandle as an export directory (a pseudo directory is read-only).
    fn dir_obj(&self, ctx: &Ctx<'_>) -> Res4<Obj> {
        match self.current_dir(ctx)? {
            Cur::Real(o) => Ok(*o),
            Cur::Pseudo(_) => Err(Nfsstat4::ROFS),
        }
    }

    /// VERIFY (`verify` true) and NVERIFY.
    pub(super) fn verify(&self, ctx: &Ctx<'_>, f: &Fattr4, verify: bool) -> Res4<OpRes> {
        let c = self.current(ctx)?;
        let same = match &c {
            Cur::Real(o) => {
                let vfs = Self::vfs_for(&f.mask, Some(o));
                let src = AttrSource {
                    st: &o.node.st,
                    fh: o.fh.as_bytes(),
                    fsid: o.x.server.export().fsid(),
                    vfs: vfs.as_ref(),
                    lease_time: self.cfg.state.lease.as_secs() as u32,
                    max_read: u64::from(self.cfg.max_io),
                    max_write: u64::from(self.cfg.max_io),
                    mounted_on_fileid: o.node.st.stx_ino,
                };
                attrs::same(f, &src)?
            }
            Cur::Pseudo(p) => {
                let st = pseudo_stat(p)?;
                let fh = pseudo_fh(p);
                let src = AttrSource {
                    st: &st,
                    fh: fh.as_bytes(),
                    fsid: PSEUDO_FSID,
                    vfs: None,
                    lease_time: self.cfg.state.lease.as_secs() as u32,
                    max_read: u64::from(self.cfg.max_io),
                    max_write: u64::from(self.cfg.max_io),
                    mounted_on_fileid: st.stx_ino,
                };
                attrs::same(f, &src)?
            }
        };
        let n = if verify { op::VERIFY } else { op::NVERIFY };
        match (verify, same) {
            (true, true) | (false, false) => Ok(OpRes::Status(n, Nfsstat4::OK)),
            (true, false) => Err(Nfsstat4::NOT_SAME),
            (false, true) => Err(Nfsstat4::SAME),
        }
    }

    /// CREATE of a non-regular object (RFC 8881 §18.4); the new object becomes the current
    /// filehandle.
    fn create(
        &self,
        ctx: &mut Ctx<'_>,
        objtype: CreateType,
        name: &Component4,
        fattr: &Fattr4,
    ) -> Res4<OpRes> {
        let dir = self.dir_obj(ctx)?;
        let n = check_component(name)?;
        let s = attrs::decode_set(fattr)?;
        let mut set = s.mask();
        let s3 = sattr3(&s)?;
        let fs = dir.fs();
        let st = match objtype {
            CreateType::Dir => fs.mkdir(&dir.cred, &dir.node, n, &s3),
            CreateType::Link(t) => {
                set.clear(attr::MODE);
                fs.symlink(&dir.cred, &dir.node, n, t.as_bytes(), &s3)
            }
            CreateType::Blk(a, b) | CreateType::Chr(a, b) => {
                let d = Specdata3 {
                    specdata1: a,
                    specdata2: b,
                };
                let what = if matches!(objtype, CreateType::Blk(..)) {
                    MknodData3::Blk(s3, d)
                } else {
                    MknodData3::Chr(s3, d)
                };
                fs.mknod(&dir.cred, &dir.node, n, &what)
            }
            CreateType::Sock => fs.mknod(&dir.cred, &dir.node, n, &MknodData3::Sock(s3)),
            CreateType::Fifo => fs.mknod(&dir.cred, &dir.node, n, &MknodData3::Fifo(s3)),
            // RFC 8881 §18.4.3: regular files are made by OPEN.
            CreateType::Other(_) => return Err(Nfsstat4::BADTYPE),
        }
        .map_err(v4_status)?;
        let ci = cinfo(&dir.node.st, &Self::restat(&dir));
        let rel = dir.node.rel.join(OsStr::from_bytes(n));
        let obj = dir.sibling(Node { rel, st });
        ctx.set_fh(obj.cur());
        set.trim();
        Ok(OpRes::Create {
            cinfo: ci,
            attrset: set,
        })
    }

    /// READDIR (RFC 8881 §18.23): cookies are an entry's position + 3 (0, 1 and 2 are
    /// reserved), the cookie verifier is the server's and changes when it restarts, `maxcount`
    /// bounds the whole result and `dircount` the names and cookies.
    fn readdir(
        &self,
        ctx: &Ctx<'_>,
        cookie: u64,
        verf: Verifier4,
        dircount: u32,
        maxcount: u32,
        mask: &Bitmap4,
    ) -> Res4<OpRes> {
        let dir = self.current_dir(ctx)?;
        if mask.get(attr::TIME_ACCESS_SET) || mask.get(attr::TIME_MODIFY_SET) {
            return Err(Nfsstat4::INVAL);
        }
        if cookie == 1 || cookie == 2 {
            return Err(Nfsstat4::BAD_COOKIE);
        }
        let ours = self.cookie_verifier();
        if cookie != 0 && verf != ours && verf != [0; 8] {
            return Err(Nfsstat4::NOT_SAME);
        }
        let names: Vec<Vec<u8>> = match &dir {
            Cur::Real(o) => {
                let fs = o.fs();
                fs.may_list(&o.cred, &o.node).map_err(v4_status)?;
                let all = fs.dir_entries(&o.node).map_err(v4_status)?;
                all.into_iter().skip(2).map(|(n, _)| n).collect()
            }
            Cur::Pseudo(p) => self.pseudo_entries(ctx, p),
        };
        let start = if cookie == 0 {
            0
        } else {
            usize::try_from(cookie - 2).unwrap_or(usize::MAX)
        };
        if start > names.len() {
            return Err(Nfsstat4::BAD_COOKIE);
        }
        let limit = (maxcount as usize).min(ctx.room.saturating_sub(8));
        // A maxcount that cannot hold even an empty reply is NFS4ERR_TOOSMALL (RFC 8881
        // §18.23.3, RFC 7530 §16.24.4), whether or not the directory has entries.
        if limit < READDIR_FIXED {
            return Err(Nfsstat4::TOOSMALL);
        }
        let vfs = match &dir {
            Cur::Real(o) => Self::vfs_for(mask, Some(o)),
            Cur::Pseudo(_) => None,
        };
        let dfd = match &dir {
            Cur::Real(o) => Some(
                o.x.server
                    .export()
                    .open_dir_of(&o.node)
                    .map_err(v4_status)?,
            ),
            Cur::Pseudo(_) => None,
        };
        let mut size = READDIR_FIXED;
        let mut dsize = 0usize;
        let mut out = Vec::new();
        let mut eof = true;
        for (i, name) in names.iter().enumerate().skip(start) {
            let attrs = match (&dir, &dfd) {
                (Cur::Real(o), Some(dfd)) => {
                    self.entry_attrs_real(o, dfd, name, mask, vfs.as_ref())?
                }
                (Cur::Pseudo(p), _) => self.entry_attrs_pseudo(ctx, p, name, mask)?,
                _ => Fattr4::default(),
            };
            let e = Entry4 {
                cookie: i as u64 + 3,
                name: Component4::from_slice(name),
                attrs,
            };
            let len = e.encoded_len();
            let dlen = 8 + xdr::opaque_len(name.len());
            if size + len > limit
                || (dircount > 0 && dsize + dlen > dircount as usize && !out.is_empty())
            {
                eof = false;
                break;
            }
            size += len;
            dsize += dlen;
            out.push(e);
        }
        if out.is_empty() && !eof {
            return Err(Nfsstat4::TOOSMALL);
        }
        Ok(OpRes::Readdir {
            verf: ours,
            entries: out,
            eof,
        })
    }

    /// One export entry's attributes; an entry that cannot be read gives `rdattr_error` when
    /// the client asked for it, else fails the READDIR (RFC 8881 §5.8.1.12).
    fn entry_attrs_real(
        &self,
        o: &Obj,
        dfd: &crate::vfs::DirFd<'_>,
        name: &[u8],
        mask: &Bitmap4,
        vfs: Option<&StatVfs>,
    ) -> Res4<Fattr4> {
        if mask.is_empty() {
            return Ok(Fattr4::default());
        }
        let export = o.x.server.export();
        let os = OsStr::from_bytes(name);
        match export.stat_at(dfd, os) {
            Ok(st) => {
                export.remember(st.stx_ino, &o.node.rel.join(os));
                let fh = export.handle_of(&st);
                self.encode_attrs(mask, &st, fh.as_bytes(), export.fsid(), vfs)
            }
            Err(e) => rdattr_error(mask, v4_status(e)),
        }
    }

    fn entry_attrs_pseudo(
        &self,
        ctx: &Ctx<'_>,
        dir: &std::path::Path,
        name: &[u8],
        mask: &Bitmap4,
    ) -> Res4<Fattr4> {
        if mask.is_empty() {
            return Ok(Fattr4::default());
        }
        let r = self
            .pseudo_child(ctx, dir, name)
            .and_then(|c| self.cur_attrs(&self.resolve(ctx, &c)?, mask));
        match r {
            Ok(f) => Ok(f),
            Err(s) => rdattr_error(mask, s),
        }
    }

    /// The READDIR cookie verifier: fixed for this server instance.
    fn cookie_verifier(&self) -> Verifier4 {
        self.cookie_verf
    }
}

/// The attributes of an entry that could not be read: `rdattr_error` alone when asked for.
fn rdattr_error(mask: &Bitmap4, s: Nfsstat4) -> Res4<Fattr4> {
    if !mask.get(attr::RDATTR_ERROR) {
        return Err(s);
    }
    let mut e = xdr::Encoder::new();
    e.put_u32(s.0);
    Ok(Fattr4 {
        mask: Bitmap4::from_bits(&[attr::RDATTR_ERROR]),
        vals: e.into_bytes(),
    })
}
