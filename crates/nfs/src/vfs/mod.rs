//! The exported directory: file handles, confined path resolution, attributes and permission
//! checks (`vfs/perm.rs`). Blocking system calls: the RPC program makes them on the calling task
//! when they cannot wait for a disk (`server::program`), on tokio's blocking pool otherwise.
//!
//! ## File handles (decision)
//! Handles are stateless and 32 bytes long:
//! `[version=1, 0, 0, 0] | fsid (8) | inode number (8) | birth time seconds (8) | birth time ns (4)`.
//! `fsid` is a fixed mix of the export root's device and inode numbers, so it is the same after a
//! restart. The birth time (statx `btime`) distinguishes a reused inode number: a handle whose
//! inode now carries another birth time is STALE (the role `i_generation` plays for knfsd).
//! Resolution goes through an in-memory inode → path index, filled as handles are handed out
//! and rebuilt lazily after a restart by walking the export when a handle's inode is unknown
//! or its remembered path no longer leads to it. No state is stored on disk. Filesystems without
//! birth times get 0, so only the inode number identifies the object there.
//!
//! ## Confinement
//! Every path is relative to the export root and is walked one component at a time with
//! `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)` from a descriptor of the root, so neither `..` nor
//! a symbolic link can lead outside the export; the final component is always used with
//! `*at` calls that do not follow symbolic links. Names carrying `/` or NUL are refused (ACCES),
//! and `.`/`..` are resolved by the server, never by the host filesystem (`..` at the root is
//! the root). The remaining window: `chmod` of the final component follows a symbolic link
//! that replaces a regular file between the type check and the call (Linux has no `lchmod`).
//! A walk's result is kept for a second by the directory-descriptor cache
//! ([`crate::dircache`]), which serves a directory a handle names only as that same directory;
//! regular files stay open in the open-file cache ([`crate::filecache`]) on the same terms.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fs::{AtFlags, Mode, OFlags, Statx, StatxFlags};

use crate::dircache::{DirCache, DirCacheConfig, DirCacheStats, DirId};
use crate::filecache::{FileCache, FileCacheConfig, FileCacheStats, OpenFile};
use crate::nfs3::{Fattr3, Fh3, Ftype3, Nfsstat3, Nfstime3, Specdata3, WccAttr};

/// Handle format version.
pub const FH_VERSION: u8 = 1;
/// Encoded handle length.
pub const FH_LEN: usize = 32;
/// Longest name the server accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Bound on the number of objects one index rebuild visits.
const MAX_WALK: usize = 4_000_000;

/// Result of a file-system operation, failing with the NFS status to return.
pub type NfsResult<T> = Result<T, Nfsstat3>;

mod perm;
pub use perm::*;
use perm::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK};

/// A decoded file handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleData {
    pub fsid: u64,
    pub ino: u64,
    pub btime_sec: i64,
    pub btime_nsec: u32,
}

impl HandleData {
    /// Encode as a 32-byte `nfs_fh3`.
    pub fn to_fh(&self) -> Fh3 {
        let mut b = Vec::with_capacity(FH_LEN);
        b.extend_from_slice(&[FH_VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.fsid.to_be_bytes());
        b.extend_from_slice(&self.ino.to_be_bytes());
        b.extend_from_slice(&self.btime_sec.to_be_bytes());
        b.extend_from_slice(&self.btime_nsec.to_be_bytes());
        Fh3(b.into())
    }

    /// Decode; a handle of the wrong length or version is BADHANDLE (RFC 1813 §2.6).
    pub fn from_fh(fh: &Fh3) -> NfsResult<Self> {
        let b = fh.as_bytes();
        if b.len() != FH_LEN || b[0] != FH_VERSION || b[1..4] != [0, 0, 0] {
            return Err(Nfsstat3::BadHandle);
        }
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            w
        };
        let mut n = [0u8; 4];
        n.copy_from_slice(&b[28..32]);
        Ok(HandleData {
            fsid: u64::from_be_bytes(u64_at(4)),
            ino: u64::from_be_bytes(u64_at(12)),
            btime_sec: i64::from_be_bytes(u64_at(20)),
            btime_nsec: u32::from_be_bytes(n),
        })
    }
}

/// A resolved object: its path relative to the export root and its attributes.
#[derive(Debug, Clone)]
pub struct Node {
    pub rel: PathBuf,
    pub st: Statx,
}

/// A regular file resolved through the open-file cache: its attributes, read from the open
/// descriptor by this call, and the descriptor.
#[derive(Debug, Clone)]
pub struct Opened {
    pub st: Statx,
    pub file: std::sync::Arc<OpenFile>,
}

/// What [`Export::resolve_open`] found: an open regular file, or any other object (or a
/// regular file the server could not open) as a [`Node`].
#[derive(Debug, Clone)]
pub enum Resolved {
    Open(Opened),
    Node(Node),
}

impl Resolved {
    /// The object's attributes.
    pub fn st(&self) -> &Statx {
        match self {
            Resolved::Open(o) => &o.st,
            Resolved::Node(n) => &n.st,
        }
    }
}

/// A directory descriptor from [`Export::open_dir`]: the export root's own (lent), or one
/// below it, shared with the directory-descriptor cache ([`crate::dircache`]).
#[derive(Debug)]
pub enum DirFd<'a> {
    /// The export's root.
    Root(BorrowedFd<'a>),
    /// A directory below it.
    Below(std::sync::Arc<OwnedFd>),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            DirFd::Root(b) => *b,
            DirFd::Below(o) => o.as_fd(),
        }
    }
}

/// One exported directory.
#[derive(Debug)]
pub struct Export {
    root: PathBuf,
    root_fd: OwnedFd,
    fsid: u64,
    root_ino: u64,
    index: Mutex<HashMap<u64, PathBuf>>,
    /// When the last index rebuild walked the whole export without finding its inode: handles
    /// for unknown inodes then get STALE without another walk for [`FAILED_WALK_HOLDOFF`], so a
    /// client cannot make the server walk a large export on every call.
    failed_walk: Mutex<Option<std::time::Instant>>,
    /// Open regular files by inode number ([`crate::filecache`]).
    files: FileCache,
    /// Open directories below the root by path ([`crate::dircache`]).
    dirs: DirCache,
}

/// See [`Export`]'s `failed_walk`.
const FAILED_WALK_HOLDOFF: std::time::Duration = std::time::Duration::from_secs(2);

fn mix(mut h: u64, v: u64) -> u64 {
    // FNV-1a over the eight bytes: fixed, so fsid is stable across restarts.
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A directory's identity for [`crate::dircache`].
fn dir_id(st: &Statx) -> DirId {
    DirId {
        ino: st.stx_ino,
        btime: (st.stx_btime.tv_sec, st.stx_btime.tv_nsec),
    }
}

fn statx_flags() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::BTIME
}

fn o_path_dir() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl Export {
    /// Open an export rooted at `root` (which must be a directory).
    pub fn open(root: &Path) -> std::io::Result<Self> {
        Self::open_with_fsid(root, None)
    }

    /// [`Export::open`], with the file-system id clients see set to `fsid` (exports(5)
    /// `fsid=N`) instead of the one derived from the root's device and inode.
    pub fn open_with_fsid(root: &Path, fsid: Option<u64>) -> std::io::Result<Self> {
        let root = root.canonicalize()?;
        let root_fd = rustix::fs::open(&root, o_path_dir(), Mode::empty())?;
        let st = rustix::fs::statx(&root_fd, "", AtFlags::EMPTY_PATH, statx_flags())?;
        if !is_dir(&st) {
            return Err(std::io::Error::from(rustix::io::Errno::NOTDIR));
        }
        let derived = mix(
            mix(
                mix(0xcbf2_9ce4_8422_2325, u64::from(st.stx_dev_major)),
                u64::from(st.stx_dev_minor),
            ),
            st.stx_ino,
        );
        let fsid = fsid.unwrap_or(derived);
        let mut index = HashMap::new();
        index.insert(st.stx_ino, PathBuf::new());
        Ok(Export {
            root,
            root_fd,
            fsid,
            root_ino: st.stx_ino,
            index: Mutex::new(index),
            failed_walk: Mutex::new(None),
            files: FileCache::new(FileCacheConfig::default()),
            dirs: DirCache::new(DirCacheConfig::default()),
        })
    }

    /// The same export with an open-file cache of these bounds.
    pub fn with_file_cache(mut self, cfg: FileCacheConfig) -> Self {
        self.files = FileCache::new(cfg);
        self
    }

    /// The same export with a directory-descriptor cache of these bounds.
    pub fn with_dir_cache(mut self, cfg: DirCacheConfig) -> Self {
        self.dirs = DirCache::new(cfg);
        self
    }

    /// The directory-descriptor cache's counters.
    pub fn dir_cache_stats(&self) -> DirCacheStats {
        self.dirs.stats()
    }

    /// The open-file cache's counters.
    pub fn file_cache_stats(&self) -> FileCacheStats {
        self.files.stats()
    }

    /// Entries in the open-file cache.
    pub fn file_cache_len(&self) -> usize {
        self.files.len()
    }

    /// The canonical path of the export root.
    pub fn root_path(&self) -> &Path {
        &self.root
    }

    /// The export's file-system id (fattr3.fsid).
    pub fn fsid(&self) -> u64 {
        self.fsid
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PathBuf>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle for an object.
    pub fn handle_of(&self, st: &Statx) -> Fh3 {
        HandleData {
            fsid: self.fsid,
            ino: st.stx_ino,
            btime_sec: st.stx_btime.tv_sec,
            btime_nsec: st.stx_btime.tv_nsec,
        }
        .to_fh()
    }

    /// The root's handle.
    pub fn root_handle(&self) -> NfsResult<Fh3> {
        let st = self.stat_rel(Path::new(""))?;
        Ok(self.handle_of(&st))
    }

    /// The handle of the directory at `rel` below the root, walked one component at a time
    /// without following symbolic links (MNT of a directory below an export: the walk cannot
    /// leave the export). NOTDIR when the last component is not a directory.
    pub fn dir_handle(&self, rel: &Path) -> NfsResult<Fh3> {
        if rel.as_os_str().is_empty() {
            return self.root_handle();
        }
        let st = self.stat_rel(rel)?;
        if !is_dir(&st) {
            return Err(Nfsstat3::NotDir);
        }
        // The walk: every component a real directory, never a symlink, never `..`.
        let fd = self.open_dir(rel)?;
        let st2 = rustix::fs::statx(&fd, "", AtFlags::EMPTY_PATH, statx_flags())?;
        if st2.stx_ino != st.stx_ino {
            return Err(Nfsstat3::Stale);
        }
        self.remember(st.stx_ino, rel);
        Ok(self.handle_of(&st))
    }

    /// Remember where an object lives (called whenever a handle is handed out).
    pub fn remember(&self, ino: u64, rel: &Path) {
        if ino != self.root_ino {
            self.index().insert(ino, rel.to_path_buf());
        }
    }

    /// Forget an object, `st` its status before (after REMOVE/RMDIR when its last name is
    /// gone).
    pub fn forget(&self, st: &Statx) {
        let ino = st.stx_ino;
        self.files.remove(ino);
        // Only directories are in the directory-descriptor cache: a file's REMOVE skips it.
        if is_dir(st) {
            self.dirs.forget_ino(ino);
        }
        if ino != self.root_ino {
            self.index().remove(&ino);
        }
    }

    /// Close the cached descriptor of an object whose name was removed or replaced (its
    /// handle may still name it through another link; the next use opens it again).
    pub fn close_cached(&self, ino: u64) {
        self.files.remove(ino);
    }

    /// Resolve a handle, through the open-file cache. A regular file the cache holds comes
    /// back open, with one `statx` on its descriptor (no path walk, no open); anything else
    /// goes through [`Export::resolve`], and with `open` a regular file found that way is
    /// opened and cached. Errors as [`Export::resolve`].
    pub fn resolve_open(&self, fh: &Fh3, open: bool) -> NfsResult<Resolved> {
        let h = HandleData::from_fh(fh)?;
        if h.fsid != self.fsid {
            return Err(Nfsstat3::Stale);
        }
        if let Some(file) = self.files.get(h.ino)
            && file.btime() == (h.btime_sec, h.btime_nsec)
        {
            match rustix::fs::statx(file.file(), "", AtFlags::EMPTY_PATH, statx_flags()) {
                // A file with no name left is gone for NFS too (another process may have
                // removed it): drop it and let the path walk answer.
                Ok(st) if st.stx_nlink > 0 && Self::matches(&h, &st) => {
                    return Ok(Resolved::Open(Opened { st, file }));
                }
                _ => self.files.remove(h.ino),
            }
        }
        let n = self.resolve(fh)?;
        if !open || !is_reg(&n.st) {
            return Ok(Resolved::Node(n));
        }
        match self.open_cached(&n) {
            Some(o) => Ok(Resolved::Open(o)),
            None => Ok(Resolved::Node(n)),
        }
    }

    /// Open the regular file `n` (read-write, or read-only where the server may not write it)
    /// and cache it; `None` when it cannot be opened or is no longer the object `n` found.
    fn open_cached(&self, n: &Node) -> Option<Opened> {
        let (dir, name) = self.parent_of(&n.rel).ok()?;
        let flags = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let (fd, writable) =
            match rustix::fs::openat(&dir, name, OFlags::RDWR | flags, Mode::empty()) {
                Ok(fd) => (fd, true),
                Err(_) => (
                    rustix::fs::openat(&dir, name, OFlags::RDONLY | flags, Mode::empty()).ok()?,
                    false,
                ),
            };
        let st = rustix::fs::statx(&fd, "", AtFlags::EMPTY_PATH, statx_flags()).ok()?;
        // Replaced between the walk and the open: let the caller use the walk's result.
        if st.stx_ino != n.st.stx_ino
            || st.stx_btime.tv_sec != n.st.stx_btime.tv_sec
            || st.stx_btime.tv_nsec != n.st.stx_btime.tv_nsec
            || !is_reg(&st)
        {
            return None;
        }
        let file = self.files.insert(OpenFile::new(
            st.stx_ino,
            (st.stx_btime.tv_sec, st.stx_btime.tv_nsec),
            File::from(fd),
            writable,
        ));
        Some(Opened { st, file })
    }

    /// The attributes of an open file, read from its descriptor.
    pub fn stat_open(&self, o: &OpenFile) -> NfsResult<Statx> {
        Ok(rustix::fs::statx(
            o.file(),
            "",
            AtFlags::EMPTY_PATH,
            statx_flags(),
        )?)
    }

    /// After a directory rename, re-point the index entries beneath it.
    pub fn renamed(&self, from: &Path, to: &Path) {
        self.dirs.forget_under(from);
        self.dirs.forget_under(to);
        let mut idx = self.index();
        for p in idx.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }

    /// Open a directory (by relative path) as an O_PATH descriptor, one component at a time,
    /// never following symbolic links. The export's root is its own descriptor, lent: no
    /// `openat` and `close` for the objects in the root, which is where a flat tree's
    /// namespace calls all land. A directory below it comes from the directory-descriptor
    /// cache while its entry is fresh ([`crate::dircache`]): whatever is found through it by
    /// name is checked against its handle by the caller.
    pub fn open_dir(&self, rel: &Path) -> NfsResult<DirFd<'_>> {
        self.open_dir_as(rel, None)
    }

    /// [`Export::open_dir`] of the directory `dir` a handle resolved to: only that directory
    /// (by inode number and birth time) is served from the cache, and STALE when the walk of
    /// its path finds another one (it was replaced meanwhile).
    pub fn open_dir_of(&self, dir: &Node) -> NfsResult<DirFd<'_>> {
        self.open_dir_as(&dir.rel, Some(dir_id(&dir.st)))
    }

    fn open_dir_as(&self, rel: &Path, want: Option<DirId>) -> NfsResult<DirFd<'_>> {
        if rel.as_os_str().is_empty() {
            return Ok(DirFd::Root(self.root_fd.as_fd()));
        }
        let now = std::time::Instant::now();
        if let Some((fd, _)) = self.dirs.get(rel, want, now) {
            return Ok(DirFd::Below(fd));
        }
        let Some(fd) = self.walk_dir(rel)? else {
            return Ok(DirFd::Root(self.root_fd.as_fd()));
        };
        if want.is_none() && self.dirs.config().capacity == 0 {
            return Ok(DirFd::Below(std::sync::Arc::new(fd)));
        }
        let st = rustix::fs::statx(&fd, "", AtFlags::EMPTY_PATH, statx_flags())?;
        let id = dir_id(&st);
        if want.is_some_and(|w| w != id) {
            return Err(Nfsstat3::Stale);
        }
        Ok(DirFd::Below(self.dirs.insert(rel, fd, id, now)))
    }

    /// The walk itself, one `openat` per component from the root's descriptor (`None`: the
    /// root).
    fn walk_dir(&self, rel: &Path) -> NfsResult<Option<OwnedFd>> {
        let mut fd: Option<OwnedFd> = None;
        for c in rel.components() {
            let std::path::Component::Normal(name) = c else {
                return Err(Nfsstat3::Stale);
            };
            let at = match &fd {
                Some(f) => f.as_fd(),
                None => self.root_fd.as_fd(),
            };
            fd = Some(rustix::fs::openat(at, name, o_path_dir(), Mode::empty())?);
        }
        Ok(fd)
    }

    /// The parent directory descriptor and final name of a non-root path.
    pub fn parent_of<'p>(&self, rel: &'p Path) -> NfsResult<(DirFd<'_>, &'p OsStr)> {
        let name = rel.file_name().ok_or(Nfsstat3::Inval)?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok((self.open_dir(parent)?, name))
    }

    /// lstat an object by relative path.
    pub fn stat_rel(&self, rel: &Path) -> NfsResult<Statx> {
        if rel.as_os_str().is_empty() {
            return Ok(rustix::fs::statx(
                &self.root_fd,
                "",
                AtFlags::EMPTY_PATH,
                statx_flags(),
            )?);
        }
        let (dir, name) = self.parent_of(rel)?;
        Ok(rustix::fs::statx(
            &dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            statx_flags(),
        )?)
    }

    /// lstat a name in an open directory.
    pub fn stat_at(&self, dir: impl AsFd, name: &OsStr) -> NfsResult<Statx> {
        Ok(rustix::fs::statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            statx_flags(),
        )?)
    }

    fn matches(h: &HandleData, st: &Statx) -> bool {
        st.stx_ino == h.ino
            && st.stx_btime.tv_sec == h.btime_sec
            && st.stx_btime.tv_nsec == h.btime_nsec
    }

    /// Resolve a handle to its object: BADHANDLE for a malformed handle, STALE for one of
    /// another export or of an object that no longer exists.
    pub fn resolve(&self, fh: &Fh3) -> NfsResult<Node> {
        let h = HandleData::from_fh(fh)?;
        if h.fsid != self.fsid {
            return Err(Nfsstat3::Stale);
        }
        let known = self.index().get(&h.ino).cloned();
        if let Some(rel) = known {
            if let Ok(st) = self.stat_rel(&rel)
                && st.stx_ino == h.ino
            {
                return if Self::matches(&h, &st) {
                    Ok(Node { rel, st })
                } else {
                    Err(Nfsstat3::Stale)
                };
            }
            self.index().remove(&h.ino);
        }
        let mut failed = self.failed_walk.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_some_and(|t| t.elapsed() < FAILED_WALK_HOLDOFF) {
            return Err(Nfsstat3::Stale);
        }
        let found = self.rebuild_until(h.ino);
        *failed = found.is_none().then(std::time::Instant::now);
        drop(failed);
        match found {
            Some(rel) => {
                let st = self.stat_rel(&rel)?;
                if Self::matches(&h, &st) {
                    Ok(Node { rel, st })
                } else {
                    Err(Nfsstat3::Stale)
                }
            }
            None => Err(Nfsstat3::Stale),
        }
    }

    /// Walk the export breadth-first, recording every object, until `ino` is found.
    fn rebuild_until(&self, ino: u64) -> Option<PathBuf> {
        let mut queue = VecDeque::from([PathBuf::new()]);
        let mut visited = 0usize;
        while let Some(dir_rel) = queue.pop_front() {
            let Ok(entries) = self.list_dir(&dir_rel) else {
                continue;
            };
            let mut found = None;
            {
                let mut idx = self.index();
                for (name, e_ino, is_d) in entries {
                    visited += 1;
                    let rel = dir_rel.join(OsStr::from_bytes(&name));
                    if e_ino != self.root_ino {
                        idx.entry(e_ino).or_insert_with(|| rel.clone());
                    }
                    if e_ino == ino && found.is_none() {
                        found = Some(rel.clone());
                    }
                    if is_d {
                        queue.push_back(rel);
                    }
                }
            }
            if found.is_some() || visited > MAX_WALK {
                return found;
            }
        }
        None
    }

    /// The entries of a directory, without `.` and `..`: (name, inode number, is directory).
    pub fn list_dir(&self, rel: &Path) -> NfsResult<Vec<(Vec<u8>, u64, bool)>> {
        let pfd = self.open_dir(rel)?;
        let fd = rustix::fs::openat(
            &pfd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut dir = rustix::fs::Dir::new(fd)?;
        let mut out = Vec::new();
        while let Some(e) = dir.read() {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let is_d = e.file_type() == rustix::fs::FileType::Directory;
            out.push((name.to_vec(), e.ino(), is_d));
        }
        Ok(out)
    }

    /// Open a regular file for I/O without following symbolic links.
    pub fn open_file(&self, rel: &Path, write: bool) -> NfsResult<File> {
        let (dir, name) = self.parent_of(rel)?;
        let acc = if write {
            OFlags::WRONLY
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::openat(
            &dir,
            name,
            acc | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// Build `fattr3` from a stat.
    pub fn fattr(&self, st: &Statx) -> Fattr3 {
        let ftype = match fmt(st) {
            S_IFDIR => Ftype3::Dir,
            S_IFLNK => Ftype3::Lnk,
            S_IFBLK => Ftype3::Blk,
            S_IFCHR => Ftype3::Chr,
            S_IFIFO => Ftype3::Fifo,
            0o140000 => Ftype3::Sock,
            _ => Ftype3::Reg,
        };
        Fattr3 {
            ftype,
            mode: u32::from(st.stx_mode) & 0o7777,
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            size: st.stx_size,
            used: st.stx_blocks.saturating_mul(512),
            rdev: Specdata3 {
                specdata1: st.stx_rdev_major,
                specdata2: st.stx_rdev_minor,
            },
            fsid: self.fsid,
            fileid: st.stx_ino,
            atime: nfstime(&st.stx_atime),
            mtime: nfstime(&st.stx_mtime),
            ctime: nfstime(&st.stx_ctime),
        }
    }

    /// Build `wcc_attr` from a stat.
    pub fn wcc_attr(st: &Statx) -> WccAttr {
        WccAttr {
            size: st.stx_size,
            mtime: nfstime(&st.stx_mtime),
            ctime: nfstime(&st.stx_ctime),
        }
    }

    /// The relative path of `..` of `rel` (the root's parent is the root).
    pub fn parent_rel(rel: &Path) -> PathBuf {
        rel.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// Descriptor of the root (O_PATH).
    pub fn root_fd(&self) -> &OwnedFd {
        &self.root_fd
    }
}

/// Convert a statx timestamp.
pub fn nfstime(t: &rustix::fs::StatxTimestamp) -> Nfstime3 {
    Nfstime3 {
        seconds: u32::try_from(t.tv_sec.max(0)).unwrap_or(u32::MAX),
        nseconds: t.tv_nsec,
    }
}
