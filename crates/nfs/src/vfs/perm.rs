//! Who may do what in an export: the identity a call runs as, the UNIX permission check, file
//! types from a status, names checked for a directory entry, and OS errors as `nfsstat3`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::Statx;

use super::{NAME_MAX, NfsResult};
use crate::nfs3::Nfsstat3;

/// The identity a call runs as (AUTH_SYS; AUTH_NONE maps to nobody).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

impl Cred {
    /// uid/gid 65534.
    pub fn nobody() -> Self {
        Cred {
            uid: 65534,
            gid: 65534,
            gids: Vec::new(),
        }
    }
    /// uid/gid 0.
    pub fn root() -> Self {
        Cred {
            uid: 0,
            gid: 0,
            gids: Vec::new(),
        }
    }
    /// Whether the identity is a member of `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.contains(&gid)
    }
}

/// Permission bits asked of [`may`].
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

const S_IFMT: u32 = 0o170000;
pub(super) const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
pub(super) const S_IFLNK: u32 = 0o120000;
pub(super) const S_IFBLK: u32 = 0o060000;
pub(super) const S_IFCHR: u32 = 0o020000;
pub(super) const S_IFIFO: u32 = 0o010000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

/// File type bits of a stat.
pub fn fmt(st: &Statx) -> u32 {
    u32::from(st.stx_mode) & S_IFMT
}
/// Whether a stat is a directory.
pub fn is_dir(st: &Statx) -> bool {
    fmt(st) == S_IFDIR
}
/// Whether a stat is a regular file.
pub fn is_reg(st: &Statx) -> bool {
    fmt(st) == S_IFREG
}
/// Whether a stat is a symbolic link.
pub fn is_lnk(st: &Statx) -> bool {
    fmt(st) == S_IFLNK
}

/// Classic UNIX permission check (owner, group, other), the way knfsd checks an AUTH_SYS caller
/// with `no_root_squash`: uid 0 may read and write anything and execute anything with an x bit
/// (directories are always searchable by root).
pub fn may(st: &Statx, cred: &Cred, want: u32) -> bool {
    let mode = u32::from(st.stx_mode);
    if cred.uid == 0 {
        return want & MAY_EXEC == 0 || is_dir(st) || mode & 0o111 != 0;
    }
    let bits = if st.stx_uid == cred.uid {
        (mode >> 6) & 7
    } else if cred.in_group(st.stx_gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & want == want
}

/// Map an OS error to `nfsstat3` (RFC 1813 §2.6).
pub fn errno_to_nfs(e: rustix::io::Errno) -> Nfsstat3 {
    use rustix::io::Errno as E;
    match e {
        E::PERM => Nfsstat3::Perm,
        E::NOENT => Nfsstat3::NoEnt,
        E::NXIO => Nfsstat3::Nxio,
        E::ACCESS => Nfsstat3::Acces,
        E::EXIST => Nfsstat3::Exist,
        E::XDEV => Nfsstat3::Xdev,
        E::NODEV => Nfsstat3::NoDev,
        E::NOTDIR => Nfsstat3::NotDir,
        E::ISDIR => Nfsstat3::IsDir,
        E::INVAL => Nfsstat3::Inval,
        E::FBIG => Nfsstat3::FBig,
        E::NOSPC => Nfsstat3::NoSpc,
        E::ROFS => Nfsstat3::Rofs,
        E::MLINK => Nfsstat3::MLink,
        E::NAMETOOLONG => Nfsstat3::NameTooLong,
        E::NOTEMPTY => Nfsstat3::NotEmpty,
        E::DQUOT => Nfsstat3::DQuot,
        E::STALE => Nfsstat3::Stale,
        E::LOOP => Nfsstat3::Acces,
        E::OPNOTSUPP | E::NOSYS => Nfsstat3::NotSupp,
        E::AGAIN | E::BUSY | E::TXTBSY => Nfsstat3::Jukebox,
        _ => Nfsstat3::Io,
    }
}

/// Map a std I/O error to `nfsstat3`.
pub fn io_to_nfs(e: &std::io::Error) -> Nfsstat3 {
    match e.raw_os_error() {
        Some(n) => errno_to_nfs(rustix::io::Errno::from_raw_os_error(n)),
        None => Nfsstat3::Io,
    }
}

impl From<rustix::io::Errno> for Nfsstat3 {
    fn from(e: rustix::io::Errno) -> Self {
        errno_to_nfs(e)
    }
}

/// Check a name for a new or looked-up directory entry: no `/`, no NUL, at most NAME_MAX bytes.
/// `.` and `..` are handled by the callers.
pub fn check_name(name: &[u8]) -> NfsResult<&OsStr> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Nfsstat3::Acces);
    }
    if name.len() > NAME_MAX {
        return Err(Nfsstat3::NameTooLong);
    }
    Ok(OsStr::from_bytes(name))
}
