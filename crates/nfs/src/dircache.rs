//! A bounded cache of open directory descriptors (`O_PATH`) keyed by their path in the export,
//! so that a namespace call on a name in a directory below the root needs no `openat` walk
//! and `close` of that directory (issue 23). Before it, a small-file workload in a directory
//! of the export opened and closed that directory 12 times per file (CREATE once, SETATTR
//! three times, LOOKUP and REMOVE once each), more system calls than the work itself; the
//! export's root has always been lent ([`crate::vfs::DirFd::Root`]).
//!
//! What keeps it correct (the same rules as [`crate::filecache`]):
//! - Every entry records the identity (inode number and birth time) of the directory it opened.
//!   A caller that knows which directory it means (a handle resolved to a [`crate::vfs::Node`])
//!   is served only an entry of that identity ([`crate::vfs::Export::open_dir_of`]), so a
//!   directory another process renamed away, with a new one made under its old name, is never
//!   mistaken for the new one.
//! - Where the path alone is known (the parent of an object being resolved), the object found
//!   through the descriptor is checked against its handle by the caller, as before.
//! - An entry is served only for [`DirCacheConfig::recheck`] after the walk that opened it;
//!   then the next use walks again. A directory another process moves within or out of the
//!   export stops being reached by its old path within that time.
//! - The server's own RMDIR and RENAME drop the entries they make stale
//!   ([`DirCache::forget_ino`], [`DirCache::forget_under`]).
//! - Bounded: at most [`DirCacheConfig::capacity`] descriptors. Inserting into a full cache
//!   drops the entries past their recheck time, then the oldest one.
//!
//! The cache holds no attributes: callers read them with `statx` as before.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bounds of the directory-descriptor cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirCacheConfig {
    /// Most open directory descriptors kept (0: no cache, every use walks).
    pub capacity: usize,
    /// How long an entry is served after the walk that opened it.
    pub recheck: Duration,
}

impl Default for DirCacheConfig {
    fn default() -> Self {
        DirCacheConfig {
            capacity: 64,
            recheck: Duration::from_secs(1),
        }
    }
}

/// A directory's identity: inode number and birth time (seconds, nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirId {
    pub ino: u64,
    pub btime: (i64, u32),
}

#[derive(Debug)]
struct Entry {
    fd: Arc<OwnedFd>,
    id: DirId,
    opened: Instant,
}

/// Counters of the directory-descriptor cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirCacheStats {
    pub entries: usize,
    pub hits: u64,
    pub misses: u64,
}

/// Open directory descriptors by path relative to the export's root (see the module docs).
#[derive(Debug)]
pub struct DirCache {
    cfg: DirCacheConfig,
    map: Mutex<HashMap<PathBuf, Entry>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl DirCache {
    /// An empty cache with these bounds.
    pub fn new(cfg: DirCacheConfig) -> Self {
        DirCache {
            cfg,
            map: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The bounds.
    pub fn config(&self) -> DirCacheConfig {
        self.cfg
    }

    /// The descriptor of the directory at `rel` and its identity, if an entry opened less than
    /// [`DirCacheConfig::recheck`] before `now` holds it and, with `want`, it is that directory.
    pub fn get(
        &self,
        rel: &Path,
        want: Option<DirId>,
        now: Instant,
    ) -> Option<(Arc<OwnedFd>, DirId)> {
        let found = {
            let map = self.map.lock();
            map.get(rel)
                .filter(|e| now.saturating_duration_since(e.opened) < self.cfg.recheck)
                .filter(|e| want.is_none_or(|w| w == e.id))
                .map(|e| (e.fd.clone(), e.id))
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keep `fd`, the directory `id` a walk of `rel` just opened at `now` (replacing any entry
    /// of `rel`); with a capacity of 0 nothing is kept.
    pub fn insert(&self, rel: &Path, fd: OwnedFd, id: DirId, now: Instant) -> Arc<OwnedFd> {
        let fd = Arc::new(fd);
        if self.cfg.capacity == 0 {
            return fd;
        }
        let mut map = self.map.lock();
        map.remove(rel);
        if map.len() >= self.cfg.capacity {
            map.retain(|_, e| now.saturating_duration_since(e.opened) < self.cfg.recheck);
            while map.len() >= self.cfg.capacity {
                let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, e)| e.opened)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                map.remove(&oldest);
            }
        }
        map.insert(
            rel.to_path_buf(),
            Entry {
                fd: fd.clone(),
                id,
                opened: now,
            },
        );
        fd
    }

    /// Drop the entries of the directory with inode number `ino` (it was removed).
    pub fn forget_ino(&self, ino: u64) {
        self.map.lock().retain(|_, e| e.id.ino != ino);
    }

    /// Drop the entries of `rel` and of every directory below it (it was renamed or removed).
    pub fn forget_under(&self, rel: &Path) {
        self.map.lock().retain(|k, _| !k.starts_with(rel));
    }

    /// Counters.
    pub fn stats(&self) -> DirCacheStats {
        DirCacheStats {
            entries: self.map.lock().len(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/").unwrap().into()
    }

    fn id(ino: u64) -> DirId {
        DirId {
            ino,
            btime: (ino as i64, 0),
        }
    }

    #[test]
    fn an_entry_is_served_until_its_recheck_time_and_only_as_the_directory_it_opened() {
        let c = DirCache::new(DirCacheConfig::default());
        let t = Instant::now();
        c.insert(Path::new("a"), fd(), id(7), t);
        assert_eq!(c.get(Path::new("a"), None, t).map(|x| x.1), Some(id(7)));
        assert_eq!(
            c.get(Path::new("a"), Some(id(7)), t).map(|x| x.1),
            Some(id(7))
        );
        // Another directory now under that name, or the same one with another birth time.
        assert!(c.get(Path::new("a"), Some(id(8)), t).is_none());
        let reborn = DirId {
            ino: 7,
            btime: (99, 0),
        };
        assert!(c.get(Path::new("a"), Some(reborn), t).is_none());
        assert!(c.get(Path::new("b"), None, t).is_none());
        let late = t + DirCacheConfig::default().recheck;
        assert!(c.get(Path::new("a"), None, late).is_none());
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (2, 4));
    }

    #[test]
    fn a_full_cache_drops_the_stale_then_the_oldest_entries() {
        let cfg = DirCacheConfig {
            capacity: 3,
            recheck: Duration::from_secs(1),
        };
        let c = DirCache::new(cfg);
        let t = Instant::now();
        c.insert(Path::new("old"), fd(), id(1), t);
        let t1 = t + Duration::from_millis(600);
        c.insert(Path::new("a"), fd(), id(2), t1);
        c.insert(Path::new("b"), fd(), id(3), t1 + Duration::from_millis(1));
        // Full at 1.2 s: "old" is past its recheck time and goes first.
        let t2 = t + Duration::from_millis(1200);
        c.insert(Path::new("c"), fd(), id(4), t2);
        assert_eq!(c.stats().entries, 3);
        assert!(c.get(Path::new("old"), None, t2).is_none());
        // Full again with nothing stale: the oldest ("a") goes.
        c.insert(Path::new("d"), fd(), id(5), t2);
        assert_eq!(c.stats().entries, 3);
        assert!(c.get(Path::new("a"), None, t2).is_none());
        for k in ["b", "c", "d"] {
            assert!(c.get(Path::new(k), None, t2).is_some(), "{k}");
        }
        // A capacity of 0 keeps nothing.
        let none = DirCache::new(DirCacheConfig { capacity: 0, ..cfg });
        none.insert(Path::new("a"), fd(), id(1), t);
        assert_eq!(none.stats().entries, 0);
    }

    #[test]
    fn removal_and_rename_drop_what_they_make_stale() {
        let c = DirCache::new(DirCacheConfig::default());
        let t = Instant::now();
        for (k, i) in [("a", 1), ("a/b", 2), ("a/b/c", 3), ("ab", 4), ("x", 5)] {
            c.insert(Path::new(k), fd(), id(i), t);
        }
        c.forget_under(Path::new("a"));
        // Components, not string prefixes: "ab" stays.
        for (k, kept) in [
            ("a", false),
            ("a/b", false),
            ("a/b/c", false),
            ("ab", true),
            ("x", true),
        ] {
            assert_eq!(c.get(Path::new(k), None, t).is_some(), kept, "{k}");
        }
        c.forget_ino(5);
        assert!(c.get(Path::new("x"), None, t).is_none());
        assert_eq!(c.stats().entries, 1);
    }
}
