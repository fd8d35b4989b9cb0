//! A bounded cache of open regular files keyed by inode number, so that GETATTR, ACCESS, READ,
//! WRITE and COMMIT of a file named by a handle need neither a path walk nor an open and close
//! per call (issue 23). knfsd keeps such a cache too (`fs/nfsd/filecache.c`).
//!
//! What keeps it correct:
//! - No attributes are cached: every use reads them again with `statx` on the open descriptor,
//!   so a write, truncation or `chmod` by another process is seen by the next call.
//! - The handle's birth time is compared with the descriptor's on every use, and an entry whose
//!   file has no link left (`stx_nlink` 0: removed by the server or by another process) is
//!   dropped on use; the handle then goes through [`crate::vfs::Export::resolve`] (STALE).
//! - REMOVE and a RENAME over an existing target drop the entry of the object they unlink
//!   ([`crate::vfs::Export::forget`]), so the server does not keep a removed file's blocks.
//! - An entry is only served for [`FileCacheConfig::recheck`] after the path walk last confirmed
//!   it; then the next use walks again. A file another process moves out of the export stops
//!   being reachable through its handle within that time, as it is without the cache.
//! - Bounded: at most [`FileCacheConfig::capacity`] descriptors; inserting into a full cache
//!   drops the entries idle for [`FileCacheConfig::idle`], then the least recently used one.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bounds of the open-file cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileCacheConfig {
    /// Most open descriptors kept (0: no cache, every call opens the file).
    pub capacity: usize,
    /// How long an entry is served after the path walk last confirmed it.
    pub recheck: Duration,
    /// Entries unused this long are the first dropped when the cache is full.
    pub idle: Duration,
}

impl Default for FileCacheConfig {
    fn default() -> Self {
        FileCacheConfig {
            capacity: 256,
            recheck: Duration::from_secs(1),
            idle: Duration::from_secs(10),
        }
    }
}

/// One open regular file.
#[derive(Debug)]
pub struct OpenFile {
    ino: u64,
    btime: (i64, u32),
    file: File,
    writable: bool,
    confirmed: Instant,
    /// Milliseconds since the cache's epoch at the last use (for LRU and idle eviction).
    last_use: AtomicU64,
    /// What is known of the file's file system (`FS_*`).
    fs: AtomicU8,
}

/// How a READ that must not wait for the disk reads this file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NowaitReads {
    /// With `preadv2(RWF_NOWAIT)`, which reads only what the page cache holds.
    Try,
    /// With a plain read: the file system refused RWF_NOWAIT and keeps its files in memory
    /// (tmpfs, ramfs), so no read of it waits for a disk.
    Plain,
    /// Not at all (on a blocking thread instead): the file system refused RWF_NOWAIT and may
    /// wait for a device or a server (FUSE, procfs, and others without it).
    Never,
}

/// `statfs` magic numbers of the file systems whose files live in memory (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// [`OpenFile::fs`]: not asked yet; a memory file system; another that refused `RWF_NOWAIT`;
/// another, with `RWF_NOWAIT` reads not refused so far.
const FS_UNKNOWN: u8 = 0;
const FS_MEMORY: u8 = 1;
const FS_NO_NOWAIT: u8 = 2;
const FS_OTHER: u8 = 3;

impl OpenFile {
    /// An entry for the file `file` (inode `ino`, birth time `btime`), opened for writing too
    /// when `writable`, just confirmed by a path walk.
    pub fn new(ino: u64, btime: (i64, u32), file: File, writable: bool) -> Self {
        OpenFile {
            ino,
            btime,
            file,
            writable,
            confirmed: Instant::now(),
            last_use: AtomicU64::new(0),
            fs: AtomicU8::new(FS_UNKNOWN),
        }
    }
    /// Whether the file lives in memory (tmpfs, ramfs): no read or write of it waits for a
    /// disk, and syncing it is a no-op. Asked of the file system once per open file.
    pub fn in_memory(&self) -> bool {
        match self.fs.load(Ordering::Relaxed) {
            FS_UNKNOWN => {
                let memory = rustix::fs::fstatfs(&self.file).is_ok_and(|s| {
                    // `f_type` is a signed word on some targets and unsigned on others.
                    #[allow(clippy::unnecessary_cast)]
                    let t = s.f_type as i64;
                    t == TMPFS_MAGIC || t == RAMFS_MAGIC
                });
                // (A racing NOWAIT refusal of a disk file system is not overwritten.)
                let kind = if memory { FS_MEMORY } else { FS_OTHER };
                let _ = self.fs.compare_exchange(
                    FS_UNKNOWN,
                    kind,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                memory
            }
            k => k == FS_MEMORY,
        }
    }
    /// How to read this file without waiting for the disk.
    pub fn nowait_reads(&self) -> NowaitReads {
        match self.fs.load(Ordering::Relaxed) {
            FS_MEMORY => NowaitReads::Plain,
            FS_NO_NOWAIT => NowaitReads::Never,
            _ => NowaitReads::Try,
        }
    }
    /// The file system refused `RWF_NOWAIT` (EOPNOTSUPP): how such reads of this file go from
    /// now on. Each later READ of it then costs no failed system call.
    pub fn nowait_refused(&self) -> NowaitReads {
        if self.in_memory() {
            NowaitReads::Plain
        } else {
            self.fs.store(FS_NO_NOWAIT, Ordering::Relaxed);
            NowaitReads::Never
        }
    }
    /// The open descriptor.
    pub fn file(&self) -> &File {
        &self.file
    }
    /// Whether the descriptor is open for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }
    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }
    /// The birth time the handle must carry.
    pub fn btime(&self) -> (i64, u32) {
        self.btime
    }
}

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileCacheStats {
    /// Uses served by an entry.
    pub hits: u64,
    /// Lookups that found no entry that could be served.
    pub misses: u64,
    /// Entries dropped to stay within the capacity.
    pub evictions: u64,
    /// Entries dropped because their file was unlinked or their handle forgotten.
    pub dropped: u64,
}

/// The cache (see the module documentation).
#[derive(Debug)]
pub struct FileCache {
    cfg: FileCacheConfig,
    epoch: Instant,
    map: Mutex<HashMap<u64, Arc<OpenFile>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    dropped: AtomicU64,
}

impl FileCache {
    /// An empty cache with these bounds.
    pub fn new(cfg: FileCacheConfig) -> Self {
        FileCache {
            cfg,
            epoch: Instant::now(),
            map: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The bounds.
    pub fn config(&self) -> FileCacheConfig {
        self.cfg
    }

    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    fn ms_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// The entry of `ino`, if there is one the path walk confirmed less than `recheck` ago.
    pub fn get(&self, ino: u64) -> Option<Arc<OpenFile>> {
        // One clock read per look-up that finds an entry, none for a miss (a clock read is a
        // system call where the clock source has no vDSO), and not under the lock.
        let entry = self.map.lock().get(&ino).cloned();
        let found = entry.and_then(|e| {
            let now = Instant::now();
            (now.saturating_duration_since(e.confirmed) < self.cfg.recheck).then_some((e, now))
        });
        match found {
            Some((e, now)) => {
                e.last_use.store(self.ms_at(now), Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(e)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keep `f` (replacing any entry of its inode); with a capacity of 0 nothing is kept.
    pub fn insert(&self, f: OpenFile) -> Arc<OpenFile> {
        let now = self.now_ms();
        f.last_use.store(now, Ordering::Relaxed);
        let f = Arc::new(f);
        if self.cfg.capacity == 0 {
            return f;
        }
        let mut map = self.map.lock();
        map.remove(&f.ino);
        if map.len() >= self.cfg.capacity {
            let idle = u64::try_from(self.cfg.idle.as_millis()).unwrap_or(u64::MAX);
            let before = map.len();
            map.retain(|_, e| now.saturating_sub(e.last_use.load(Ordering::Relaxed)) < idle);
            let mut evicted = (before - map.len()) as u64;
            while map.len() >= self.cfg.capacity {
                let Some(lru) = map
                    .iter()
                    .min_by_key(|(_, e)| e.last_use.load(Ordering::Relaxed))
                    .map(|(k, _)| *k)
                else {
                    break;
                };
                map.remove(&lru);
                evicted += 1;
            }
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        map.insert(f.ino, f.clone());
        f
    }

    /// Drop the entry of `ino` (its file was unlinked, or its handle is no longer good).
    pub fn remove(&self, ino: u64) {
        if self.map.lock().remove(&ino).is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether `ino` has an entry (served or due for a recheck).
    pub fn contains(&self, ino: u64) -> bool {
        self.map.lock().contains_key(&ino)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    pub fn stats(&self) -> FileCacheStats {
        FileCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dir: &std::path::Path, ino: u64) -> OpenFile {
        let f = File::create(dir.join(format!("f{ino}"))).expect("create");
        OpenFile::new(ino, (0, 0), f, true)
    }

    #[test]
    fn capacity_bounds_the_entries_and_drops_the_least_recently_used() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = FileCache::new(FileCacheConfig {
            capacity: 3,
            recheck: Duration::from_secs(60),
            idle: Duration::from_secs(60),
        });
        for ino in 1..=3 {
            c.insert(entry(d.path(), ino));
            std::thread::sleep(Duration::from_millis(2));
        }
        // 1 is used again, so 2 is now the least recently used.
        assert!(c.get(1).is_some());
        c.insert(entry(d.path(), 4));
        assert_eq!(c.len(), 3);
        assert!(c.contains(1) && !c.contains(2) && c.contains(3) && c.contains(4));
        assert_eq!(c.stats().evictions, 1);
        for ino in 5..50 {
            c.insert(entry(d.path(), ino));
            assert!(c.len() <= 3);
        }
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = FileCache::new(FileCacheConfig {
            capacity: 0,
            ..FileCacheConfig::default()
        });
        let e = c.insert(entry(d.path(), 7));
        assert_eq!(e.ino(), 7);
        assert!(c.is_empty());
        assert!(c.get(7).is_none());
    }

    #[test]
    fn an_entry_past_its_recheck_time_is_not_served() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = FileCache::new(FileCacheConfig {
            capacity: 4,
            recheck: Duration::ZERO,
            idle: Duration::from_secs(60),
        });
        c.insert(entry(d.path(), 1));
        assert!(c.contains(1));
        assert!(c.get(1).is_none());
        assert_eq!(c.stats().misses, 1);
    }

    #[test]
    fn remove_drops_the_entry() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = FileCache::new(FileCacheConfig::default());
        c.insert(entry(d.path(), 1));
        c.remove(1);
        c.remove(1);
        assert!(c.is_empty());
        assert_eq!(c.stats().dropped, 1);
    }
}
