//! The duplicate request cache of the NFSv3 server.
//!
//! RPC-over-RDMA clients retransmit every call that was outstanding when a connection was
//! lost, with the same XID, on the next connection (RFC 8166 §4.2.1 keeps XIDs across
//! retransmission); TCP clients do the same after a reconnect. A non-idempotent procedure run
//! twice answers the retransmission with an error for work that succeeded (a REMOVE gets
//! NFS3ERR_NOENT, an exclusive CREATE NFS3ERR_EXIST). Like Linux nfsd's reply cache
//! (`fs/nfsd/nfscache.c`), this cache remembers the replies of the non-idempotent procedures and
//! answers a retransmission with the reply the first execution produced; a retransmission that
//! arrives while the first execution still runs gets no reply at all (the client will retransmit
//! again).
//!
//! The cache is a plain data structure: no I/O, no clock. It is bounded in entries and in bytes
//! of cached replies, evicting the least recently inserted completed entry; entries still in
//! progress are never evicted, and a call that would need more room than the bounds allow is
//! simply run uncached.
//!
//! The key is the client's IP address (not its port: an RPC-over-RDMA reconnect comes from a
//! new port, and may come over the other transport), the XID, program, version and procedure,
//! and the length and CRC32C of the whole argument stream. nfsd sums only the first 256 bytes;
//! the arguments of the procedures cached here are at most a few KiB (names, a symlink path,
//! attributes), so hashing all of them costs little and tells apart two calls that share an XID
//! but not their arguments (a client that reused an XID for a different call after a restart).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use xdr::Encoded;

use crate::nfs3::proc_;

/// Bounds of a [`DuplicateCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrcConfig {
    /// Entries kept (completed and in progress).
    pub max_entries: usize,
    /// Bytes of cached replies kept, with [`ENTRY_OVERHEAD`] counted per entry.
    pub max_bytes: usize,
}

impl Default for DrcConfig {
    /// 4096 entries and 8 MiB: replies of the cached procedures are a few hundred bytes, so
    /// the entry bound is the one that applies. nfsd sizes its cache from memory (a few
    /// thousand entries per GiB); 4096 covers several clients' full credit windows of
    /// non-idempotent calls (a Linux client keeps at most 128 RPC-over-RDMA credits).
    fn default() -> Self {
        DrcConfig {
            max_entries: 4096,
            max_bytes: 8 << 20,
        }
    }
}

/// Bytes counted for an entry besides its reply.
pub const ENTRY_OVERHEAD: usize = 96;

/// What identifies one call for the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DrcKey {
    pub client: IpAddr,
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub args_len: u32,
    pub args_crc: u32,
}

impl DrcKey {
    /// The key of a call from `client` with these header fields and argument bytes.
    pub fn new(client: IpAddr, xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Self {
        // One address family for one host: an IPv4 client seen as ::ffff:a.b.c.d is the same.
        let client = match client {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
            v4 => v4,
        };
        DrcKey {
            client,
            xid,
            prog,
            vers,
            proc_,
            args_len: u32::try_from(args.len()).unwrap_or(u32::MAX),
            args_crc: crc32c::crc32c(args),
        }
    }
}

/// True for the NFSv3 procedures whose replies are cached: those that change the file system
/// in a way a second execution would report differently. WRITE is left out: executing a
/// retransmitted WRITE again stores the same bytes at the same offset and answers the same,
/// while caching every WRITE would let a stream of them evict the entries that matter.
pub fn is_cached_nfs3_proc(p: u32) -> bool {
    matches!(
        p,
        proc_::SETATTR
            | proc_::CREATE
            | proc_::MKDIR
            | proc_::SYMLINK
            | proc_::MKNOD
            | proc_::REMOVE
            | proc_::RMDIR
            | proc_::RENAME
            | proc_::LINK
    )
}

/// What to do with a call.
#[derive(Debug)]
pub enum Lookup {
    /// Not seen before: run it, then report with [`DuplicateCache::complete`] (or
    /// [`DuplicateCache::abandon`]).
    Run,
    /// Not seen before and no room to track it: run it uncached.
    RunUncached,
    /// A retransmission of a call still running: send nothing.
    InProgress,
    /// A retransmission of a completed call: send this reply again.
    Replay(Encoded),
}

#[derive(Debug)]
enum Entry {
    InProgress,
    Done { reply: Encoded, bytes: usize },
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<DrcKey, Entry>,
    /// Completed entries, oldest first (in-progress ones are not here).
    order: VecDeque<DrcKey>,
    bytes: usize,
}

/// Counters of a [`DuplicateCache`].
#[derive(Debug, Default)]
pub struct DrcStats {
    /// Retransmissions answered from the cache.
    pub replays: AtomicU64,
    /// Retransmissions dropped because the original was still running.
    pub in_progress_drops: AtomicU64,
    /// Calls run and tracked.
    pub misses: AtomicU64,
    /// Calls run untracked because the cache was full of calls in progress.
    pub uncached: AtomicU64,
    /// Completed entries evicted to make room.
    pub evictions: AtomicU64,
}

/// A bounded duplicate request cache.
#[derive(Debug)]
pub struct DuplicateCache {
    cfg: DrcConfig,
    inner: Mutex<Inner>,
    stats: DrcStats,
}

impl DuplicateCache {
    /// An empty cache with these bounds.
    pub fn new(cfg: DrcConfig) -> Self {
        DuplicateCache {
            cfg,
            inner: Mutex::new(Inner::default()),
            stats: DrcStats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters.
    pub fn stats(&self) -> &DrcStats {
        &self.stats
    }

    /// Entries held now (completed and in progress) and bytes counted.
    pub fn usage(&self) -> (usize, usize) {
        let g = self.lock();
        (g.map.len(), g.bytes)
    }

    /// Look a call up; a new call is recorded as in progress.
    pub fn begin(&self, key: DrcKey) -> Lookup {
        let mut g = self.lock();
        match g.map.get(&key) {
            Some(Entry::InProgress) => {
                self.stats.in_progress_drops.fetch_add(1, Ordering::Relaxed);
                return Lookup::InProgress;
            }
            Some(Entry::Done { reply, .. }) => {
                self.stats.replays.fetch_add(1, Ordering::Relaxed);
                return Lookup::Replay(reply.clone());
            }
            None => {}
        }
        while g.map.len() >= self.cfg.max_entries || g.bytes + ENTRY_OVERHEAD > self.cfg.max_bytes {
            if !self.evict_one(&mut g) {
                self.stats.uncached.fetch_add(1, Ordering::Relaxed);
                return Lookup::RunUncached;
            }
        }
        g.map.insert(key, Entry::InProgress);
        g.bytes += ENTRY_OVERHEAD;
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        Lookup::Run
    }

    fn evict_one(&self, g: &mut Inner) -> bool {
        while let Some(old) = g.order.pop_front() {
            if let Some(Entry::Done { bytes, .. }) = g.map.get(&old) {
                g.bytes -= *bytes;
                g.map.remove(&old);
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// The call of `key` (begun with [`Lookup::Run`]) finished with `reply`. Replies that
    /// reduced data items into chunks are not kept (the cached procedures have none).
    pub fn complete(&self, key: DrcKey, reply: &Encoded) {
        let mut g = self.lock();
        if !matches!(g.map.get(&key), Some(Entry::InProgress)) {
            return;
        }
        let size = ENTRY_OVERHEAD + reply.len();
        // The in-progress entry already counted its overhead.
        let extra = reply.len();
        if !reply.reduced.is_empty() || size > self.cfg.max_bytes {
            g.map.remove(&key);
            g.bytes -= ENTRY_OVERHEAD;
            return;
        }
        while g.bytes + extra > self.cfg.max_bytes {
            if !self.evict_one(&mut g) {
                g.map.remove(&key);
                g.bytes -= ENTRY_OVERHEAD;
                return;
            }
        }
        g.bytes += extra;
        g.map.insert(
            key,
            Entry::Done {
                reply: reply.clone(),
                bytes: size,
            },
        );
        g.order.push_back(key);
    }

    /// The call of `key` produced no reply worth keeping (an RPC-level error): forget it, so a
    /// retransmission runs again.
    pub fn abandon(&self, key: DrcKey) {
        let mut g = self.lock();
        if matches!(g.map.get(&key), Some(Entry::InProgress)) {
            g.map.remove(&key);
            g.bytes -= ENTRY_OVERHEAD;
        }
    }
}

impl Default for DuplicateCache {
    fn default() -> Self {
        DuplicateCache::new(DrcConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use xdr::Encoder;

    fn key(xid: u32, args: &[u8]) -> DrcKey {
        DrcKey::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
            xid,
            100003,
            3,
            proc_::REMOVE,
            args,
        )
    }

    fn reply(n: usize) -> Encoded {
        let mut e = Encoder::new();
        e.put_opaque_fixed(&vec![7; n]);
        e.finish()
    }

    #[test]
    fn a_completed_call_is_replayed_and_an_in_progress_one_dropped() {
        let c = DuplicateCache::default();
        let k = key(1, b"args");
        assert!(matches!(c.begin(k), Lookup::Run));
        assert!(matches!(c.begin(k), Lookup::InProgress));
        c.complete(k, &reply(8));
        match c.begin(k) {
            Lookup::Replay(r) => assert_eq!(r, reply(8)),
            other => panic!("expected a replay, got {other:?}"),
        }
        // Same XID, other arguments: a different call.
        assert!(matches!(c.begin(key(1, b"other")), Lookup::Run));
        assert_eq!(c.stats().replays.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats().in_progress_drops.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_client_is_its_address_whatever_the_family() {
        let v4 = DrcKey::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 5, 1, 3, 12, b"x");
        let mapped = DrcKey::new(
            IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped()),
            5,
            1,
            3,
            12,
            b"x",
        );
        assert_eq!(v4, mapped);
    }

    #[test]
    fn abandoned_calls_run_again() {
        let c = DuplicateCache::default();
        let k = key(2, b"a");
        assert!(matches!(c.begin(k), Lookup::Run));
        c.abandon(k);
        assert!(matches!(c.begin(k), Lookup::Run));
        assert_eq!(c.usage(), (1, ENTRY_OVERHEAD));
    }

    #[test]
    fn bounds_hold_by_evicting_the_oldest_completed_entry() {
        let c = DuplicateCache::new(DrcConfig {
            max_entries: 3,
            max_bytes: 1 << 20,
        });
        for xid in 0..10 {
            let k = key(xid, b"a");
            assert!(matches!(c.begin(k), Lookup::Run));
            c.complete(k, &reply(4));
            assert!(c.usage().0 <= 3);
        }
        assert!(matches!(c.begin(key(9, b"a")), Lookup::Replay(_)));
        assert!(matches!(c.begin(key(0, b"a")), Lookup::Run), "evicted");
        assert_eq!(c.stats().evictions.load(Ordering::Relaxed), 8);

        let c = DuplicateCache::new(DrcConfig {
            max_entries: 100,
            max_bytes: 3 * (ENTRY_OVERHEAD + 100),
        });
        for xid in 0..10 {
            let k = key(xid, b"a");
            let _ = c.begin(k);
            c.complete(k, &reply(100));
            assert!(c.usage().1 <= 3 * (ENTRY_OVERHEAD + 100));
        }
        assert_eq!(c.usage().0, 3);
    }

    #[test]
    fn calls_in_progress_are_never_evicted() {
        let c = DuplicateCache::new(DrcConfig {
            max_entries: 2,
            max_bytes: 1 << 20,
        });
        let (a, b) = (key(1, b"a"), key(2, b"a"));
        assert!(matches!(c.begin(a), Lookup::Run));
        assert!(matches!(c.begin(b), Lookup::Run));
        assert!(matches!(c.begin(key(3, b"a")), Lookup::RunUncached));
        assert!(matches!(c.begin(a), Lookup::InProgress));
        c.complete(a, &reply(1));
        assert!(matches!(c.begin(key(3, b"a")), Lookup::Run));
    }

    #[test]
    fn only_non_idempotent_procedures_are_cached() {
        for p in [
            proc_::SETATTR,
            proc_::CREATE,
            proc_::MKDIR,
            proc_::SYMLINK,
            proc_::MKNOD,
            proc_::REMOVE,
            proc_::RMDIR,
            proc_::RENAME,
            proc_::LINK,
        ] {
            assert!(is_cached_nfs3_proc(p));
        }
        for p in [
            proc_::NULL,
            proc_::GETATTR,
            proc_::LOOKUP,
            proc_::READ,
            proc_::WRITE,
            proc_::READDIR,
            proc_::COMMIT,
        ] {
            assert!(!is_cached_nfs3_proc(p));
        }
    }
}
