//! Filehandles: the current and saved filehandle, PUTFH/PUTROOTFH/PUTPUBFH, GETFH,
//! SAVEFH/RESTOREFH, LOOKUP/LOOKUPP, SECINFO/SECINFO_NO_NAME, the export access check, and the
//! pseudo file system that leads to several exports.
//!
//! Export file handles are the NFSv3 ones ([`crate::vfs::HandleData`], 32 bytes, the export's
//! fsid inside), so one object has one handle under both versions. With several exports,
//! PUTROOTFH gives the root of a small read-only pseudo file system whose directories are the
//! ancestors of the export paths the caller may use (as Linux nfsd builds one); its handles
//! carry their own marker and a hash of their path, and its file-system id is [`PSEUDO_FSID`].

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Statx, StatxFlags};

use super::super::args::OpArgs;
use super::super::consts::{AUTH_NONE, AUTH_SYS, op};
use super::super::res::OpRes;
use super::super::state::FileKey;
use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Component4, Fh4};
use super::Nfs4Server;
use super::compound::Ctx;
use crate::fsops::{FsOps, v4_status};
use crate::gate::{Exported, squash};
use crate::nfs3::Fh3;
use crate::server::cred_of;
use crate::vfs::{Cred, HandleData, NAME_MAX, Node, is_dir, is_lnk};

/// The file-system id of the pseudo file system.
pub const PSEUDO_FSID: u64 = u64::MAX;
/// The first bytes of a pseudo file system handle (never a valid export handle: those start
/// with [`crate::vfs::FH_VERSION`] and three zeros).
const PSEUDO_MAGIC: [u8; 4] = *b"PSEU";

/// A current or saved filehandle.
#[derive(Debug, Clone)]
pub(super) enum CurFh {
    /// An object of an export.
    Real { x: Arc<Exported>, fh: Fh3 },
    /// A directory of the pseudo file system, by its absolute path.
    Pseudo(PathBuf),
}

/// An export object resolved for one operation, with the caller's identity and rights on
/// that export.
pub(super) struct Obj {
    pub(super) x: Arc<Exported>,
    pub(super) node: Node,
    pub(super) fh: Fh3,
    pub(super) cred: Cred,
    pub(super) read_only: bool,
}

impl Obj {
    /// The shared file operations with this caller's rights.
    pub(super) fn fs(&self) -> FsOps<'_> {
        FsOps::new(self.x.server.export(), self.read_only)
    }

    /// The state tables' name for this file.
    pub(super) fn key(&self) -> FileKey {
        FileKey {
            fsid: self.x.server.export().fsid(),
            ino: self.node.st.stx_ino,
        }
    }

    /// Another object of the same export.
    pub(super) fn sibling(&self, node: Node) -> Obj {
        Obj {
            x: self.x.clone(),
            fh: self.x.server.export().handle_of(&node.st),
            node,
            cred: self.cred.clone(),
            read_only: self.read_only,
        }
    }

    /// As a current filehandle.
    pub(super) fn cur(&self) -> CurFh {
        CurFh::Real {
            x: self.x.clone(),
            fh: self.fh.clone(),
        }
    }
}

/// A resolved current filehandle.
pub(super) enum Cur {
    Real(Box<Obj>),
    Pseudo(PathBuf),
}

/// FNV-1a of a path: the pseudo handle's name for a directory.
fn path_hash(p: &Path) -> u64 {
    p.as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The handle of a pseudo directory.
pub(super) fn pseudo_fh(p: &Path) -> Fh4 {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&PSEUDO_MAGIC);
    b.extend_from_slice(&path_hash(p).to_be_bytes());
    Fh4::from_slice(&b)
}

/// The status of a pseudo directory (the real directory at that path).
pub(super) fn pseudo_stat(p: &Path) -> Res4<Statx> {
    rustix::fs::statx(
        rustix::fs::CWD,
        p,
        AtFlags::empty(),
        StatxFlags::BASIC_STATS | StatxFlags::BTIME,
    )
    .map_err(Nfsstat4::from_errno)
}

/// A name for LOOKUP, CREATE, OPEN, REMOVE, RENAME, LINK and SECINFO (RFC 8881 §18.13.3,
/// nfsd's check_filename): empty is NFS4ERR_INVAL, longer than NAME_MAX NFS4ERR_NAMETOOLONG,
/// `.`, `..` and names with a slash or NUL NFS4ERR_BADNAME.
pub(super) fn check_component(name: &Component4) -> Res4<&[u8]> {
    let n = name.as_bytes();
    if n.is_empty() {
        return Err(Nfsstat4::INVAL);
    }
    if n.len() > NAME_MAX {
        return Err(Nfsstat4::NAMETOOLONG);
    }
    if n == b"." || n == b".." || n.contains(&b'/') || n.contains(&0) {
        return Err(Nfsstat4::BADNAME);
    }
    Ok(n)
}

impl Nfs4Server {
    /// The caller's identity and read-only flag on export `x`: its client list is checked on
    /// every use (as the NFSv3 gate does), squashing applies, a refused caller gets
    /// NFS4ERR_ACCESS.
    pub(super) fn rights(&self, ctx: &Ctx<'_>, x: &Exported) -> Res4<(Cred, bool)> {
        match ctx.req.peer {
            None => Ok((cred_of(ctx.req.cred).map_err(|_| Nfsstat4::ACCESS)?, false)),
            Some(peer) => {
                let rule = self.table.admit(x, peer).ok_or(Nfsstat4::ACCESS)?;
                let c = squash(ctx.req.cred.clone(), &rule.options);
                Ok((
                    cred_of(&c).map_err(|_| Nfsstat4::ACCESS)?,
                    rule.options.read_only,
                ))
            }
        }
    }

    /// The exports this caller may use (for the pseudo file system).
    fn visible(&self, ctx: &Ctx<'_>) -> Vec<Arc<Exported>> {
        ctx.exports
            .iter()
            .filter(|x| match ctx.req.peer {
                None => true,
                Some(peer) => x.entry.admit(peer).is_ok(),
            })
            .cloned()
            .collect()
    }

    /// Whether the pseudo file system is in use (more than one export).
    fn multi(ctx: &Ctx<'_>) -> bool {
        ctx.exports.len() > 1
    }

    /// The pseudo directories: every ancestor of a visible export path, and `/`.
    pub(super) fn pseudo_dirs(&self, ctx: &Ctx<'_>) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        out.insert(PathBuf::from("/"));
        for x in self.visible(ctx) {
            let mut p = x.entry.path.parent();
            while let Some(a) = p {
                out.insert(a.to_path_buf());
                p = a.parent();
            }
        }
        out
    }

    /// What a pseudo directory's child `name` is: an export root, another pseudo directory,
    /// or nothing (NFS4ERR_NOENT).
    pub(super) fn pseudo_child(&self, ctx: &Ctx<'_>, dir: &Path, name: &[u8]) -> Res4<CurFh> {
        let child = dir.join(std::ffi::OsStr::from_bytes(name));
        if let Some(x) = self
            .visible(ctx)
            .into_iter()
            .find(|x| x.entry.path == child)
        {
            let fh = x.server.export().root_handle().map_err(v4_status)?;
            return Ok(CurFh::Real { x, fh });
        }
        if self.pseudo_dirs(ctx).contains(&child) {
            return Ok(CurFh::Pseudo(child));
        }
        Err(Nfsstat4::NOENT)
    }

    /// The names a pseudo directory lists.
    pub(super) fn pseudo_entries(&self, ctx: &Ctx<'_>, dir: &Path) -> Vec<Vec<u8>> {
        let mut names: BTreeSet<Vec<u8>> = BTreeSet::new();
        let dirs = self.pseudo_dirs(ctx);
        let exports = self.visible(ctx);
        let paths = dirs
            .iter()
            .cloned()
            .chain(exports.iter().map(|x| x.entry.path.clone()));
        for p in paths {
            if p.parent() == Some(dir)
                && let Some(n) = p.file_name()
            {
                names.insert(n.as_bytes().to_vec());
            }
        }
        names.into_iter().collect()
    }

    /// The root filehandle (PUTROOTFH, PUTPUBFH).
    fn root_fh(&self, ctx: &Ctx<'_>) -> Res4<CurFh> {
        let root = if Self::multi(ctx) {
            self.visible(ctx)
                .into_iter()
                .find(|x| x.entry.path == Path::new("/"))
        } else {
            ctx.exports.first().cloned()
        };
        match root {
            Some(x) => {
                let fh = x.server.export().root_handle().map_err(v4_status)?;
                Ok(CurFh::Real { x, fh })
            }
            None => Ok(CurFh::Pseudo(PathBuf::from("/"))),
        }
    }

    /// A client's filehandle: an export's (STALE when no export has its fsid) or a pseudo
    /// directory's (STALE when it no longer leads anywhere); anything else BADHANDLE.
    fn parse_fh(&self, ctx: &Ctx<'_>, fh: &Fh4) -> Res4<CurFh> {
        let b = fh.as_bytes();
        if b.len() == 12 && b[..4] == PSEUDO_MAGIC {
            let mut h = [0u8; 8];
            h.copy_from_slice(&b[4..]);
            let h = u64::from_be_bytes(h);
            return self
                .pseudo_dirs(ctx)
                .into_iter()
                .find(|p| path_hash(p) == h)
                .map(CurFh::Pseudo)
                .ok_or(Nfsstat4::STALE);
        }
        let fh3 = Fh3(bytes::Bytes::copy_from_slice(b));
        let h = HandleData::from_fh(&fh3).map_err(|_| Nfsstat4::BADHANDLE)?;
        let x = ctx
            .exports
            .iter()
            .find(|x| x.server.export().fsid() == h.fsid)
            .ok_or(Nfsstat4::STALE)?;
        Ok(CurFh::Real {
            x: x.clone(),
            fh: fh3,
        })
    }

    /// The wire form of a filehandle.
    pub(super) fn fh4(cur: &CurFh) -> Fh4 {
        match cur {
            CurFh::Real { fh, .. } => Fh4::from_slice(fh.as_bytes()),
            CurFh::Pseudo(p) => pseudo_fh(p),
        }
    }

    /// Resolve a filehandle for one operation (export objects with the caller's rights).
    pub(super) fn resolve(&self, ctx: &Ctx<'_>, cur: &CurFh) -> Res4<Cur> {
        match cur {
            CurFh::Pseudo(p) => Ok(Cur::Pseudo(p.clone())),
            CurFh::Real { x, fh } => {
                let (cred, read_only) = self.rights(ctx, x)?;
                let node = x.server.export().resolve(fh).map_err(v4_status)?;
                Ok(Cur::Real(Box::new(Obj {
                    x: x.clone(),
                    node,
                    fh: fh.clone(),
                    cred,
                    read_only,
                })))
            }
        }
    }

    /// The current filehandle, resolved (NFS4ERR_NOFILEHANDLE without one).
    pub(super) fn current(&self, ctx: &Ctx<'_>) -> Res4<Cur> {
        let cur = ctx.cur.as_ref().ok_or(Nfsstat4::NOFILEHANDLE)?;
        self.resolve(ctx, cur)
    }

    /// The current filehandle as an export object; a pseudo directory gives `pseudo`.
    /// The state key (export, inode) of the current filehandle, read from the handle itself
    /// without resolving it: the operations that only give state back (CLOSE, LOCKU) work
    /// on a file that another client's RENAME or REMOVE has since unlinked, which the open
    /// keeps alive (as Linux nfsd does; pynfs RNM21). The stateid check then ties the
    /// stateid to that key.
    pub(super) fn current_key(&self, ctx: &Ctx<'_>, pseudo: Nfsstat4) -> Res4<FileKey> {
        match ctx.cur.as_ref().ok_or(Nfsstat4::NOFILEHANDLE)? {
            CurFh::Pseudo(_) => Err(pseudo),
            CurFh::Real { x, fh } => {
                self.rights(ctx, x)?;
                let h = HandleData::from_fh(fh).map_err(|_| Nfsstat4::BADHANDLE)?;
                Ok(FileKey {
                    fsid: x.server.export().fsid(),
                    ino: h.ino,
                })
            }
        }
    }

    pub(super) fn current_obj(&self, ctx: &Ctx<'_>, pseudo: Nfsstat4) -> Res4<Obj> {
        match self.current(ctx)? {
            Cur::Real(o) => Ok(*o),
            Cur::Pseudo(_) => Err(pseudo),
        }
    }

    /// The current filehandle as a directory (NOTDIR, or SYMLINK for a symbolic link, as
    /// RFC 8881 §18.13.3 asks of LOOKUP).
    pub(super) fn current_dir(&self, ctx: &Ctx<'_>) -> Res4<Cur> {
        let c = self.current(ctx)?;
        if let Cur::Real(o) = &c
            && !is_dir(&o.node.st)
        {
            return Err(if is_lnk(&o.node.st) {
                Nfsstat4::SYMLINK
            } else {
                Nfsstat4::NOTDIR
            });
        }
        Ok(c)
    }

    /// LOOKUP of `name` in the current directory.
    fn lookup(&self, ctx: &Ctx<'_>, name: &Component4) -> Res4<CurFh> {
        let dir = self.current_dir(ctx)?;
        let name = check_component(name)?;
        match dir {
            Cur::Pseudo(p) => self.pseudo_child(ctx, &p, name),
            Cur::Real(o) => {
                let n = o.fs().lookup(&o.cred, &o.node, name).map_err(v4_status)?;
                Ok(o.sibling(n).cur())
            }
        }
    }

    /// LOOKUPP: the parent of the current directory; NFS4ERR_NOENT at the root
    /// (RFC 8881 §18.14.3).
    fn lookupp(&self, ctx: &Ctx<'_>) -> Res4<CurFh> {
        match self.current_dir(ctx)? {
            Cur::Pseudo(p) => p
                .parent()
                .map(|q| CurFh::Pseudo(q.to_path_buf()))
                .ok_or(Nfsstat4::NOENT),
            Cur::Real(o) if o.node.rel.as_os_str().is_empty() => {
                if !Self::multi(ctx) {
                    return Err(Nfsstat4::NOENT);
                }
                let parent = o.x.entry.path.parent().ok_or(Nfsstat4::NOENT)?;
                Ok(CurFh::Pseudo(parent.to_path_buf()))
            }
            Cur::Real(o) => {
                let n = o.fs().lookup(&o.cred, &o.node, b"..").map_err(v4_status)?;
                Ok(o.sibling(n).cur())
            }
        }
    }

    pub(super) fn fh_op(&self, ctx: &mut Ctx<'_>, a: OpArgs) -> Res4<OpRes> {
        let ok = |n| Ok(OpRes::Status(n, Nfsstat4::OK));
        match a {
            OpArgs::Putfh(fh) => {
                let c = self.parse_fh(ctx, &fh)?;
                ctx.set_fh(c);
                ok(op::PUTFH)
            }
            OpArgs::Putrootfh | OpArgs::Putpubfh => {
                let n = a.opnum();
                let c = self.root_fh(ctx)?;
                ctx.set_fh(c);
                ok(n)
            }
            OpArgs::Getfh => {
                let cur = ctx.cur.as_ref().ok_or(Nfsstat4::NOFILEHANDLE)?;
                Ok(OpRes::Getfh(Self::fh4(cur)))
            }
            OpArgs::Savefh => {
                let cur = ctx.cur.clone().ok_or(Nfsstat4::NOFILEHANDLE)?;
                ctx.saved = Some(cur);
                ctx.saved_sid = ctx.cur_sid;
                ok(op::SAVEFH)
            }
            OpArgs::Restorefh => {
                let saved = ctx.saved.clone().ok_or(Nfsstat4::RESTOREFH)?;
                ctx.cur = Some(saved);
                ctx.cur_sid = ctx.saved_sid;
                ok(op::RESTOREFH)
            }
            OpArgs::Lookup(name) => {
                let c = self.lookup(ctx, &name)?;
                ctx.set_fh(c);
                ok(op::LOOKUP)
            }
            OpArgs::Lookupp => {
                let c = self.lookupp(ctx)?;
                ctx.set_fh(c);
                ok(op::LOOKUPP)
            }
            OpArgs::Secinfo(name) => {
                self.lookup(ctx, &name)?;
                // RFC 8881 §2.6.3.1.1.8: SECINFO consumes the current filehandle.
                ctx.cur = None;
                ctx.cur_sid = None;
                Ok(OpRes::Secinfo(op::SECINFO, vec![AUTH_SYS, AUTH_NONE]))
            }
            OpArgs::SecinfoNoName(style) => {
                match style {
                    // SECINFO_STYLE4_CURRENT_FH
                    0 => {
                        self.current(ctx)?;
                    }
                    // SECINFO_STYLE4_PARENT
                    1 => {
                        self.lookupp(ctx)?;
                    }
                    _ => return Err(Nfsstat4::INVAL),
                }
                ctx.cur = None;
                ctx.cur_sid = None;
                Ok(OpRes::Secinfo(
                    op::SECINFO_NO_NAME,
                    vec![AUTH_SYS, AUTH_NONE],
                ))
            }
            _ => Err(Nfsstat4::SERVERFAULT),
        }
    }
}
