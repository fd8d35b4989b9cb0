//! The duplicate request cache (DRC): replies of non-idempotent NFSv3 calls, kept so that a
//! call retransmitted after a reconnect gets the reply of its first execution instead of
//! running again (a retransmitted REMOVE would otherwise answer NFS3ERR_NOENT for a file it
//! removed itself).
//!
//! Behaviour follows Linux nfsd's reply cache (fs/nfsd/nfscache.c), with the differences noted
//! below. [`ReplyCache`] is a plain data structure with no I/O and no clock of its own: callers
//! pass `now`. [`SharedCache`] and [`Ticket`] are the thin layer the NFS program uses.
//!
//! - **Which calls**: RFC 1813's non-idempotent procedures SETATTR, CREATE (exclusive CREATE
//!   included), MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and LINK, and WRITE, which nfsd
//!   caches too (its NFSv3 table marks WRITE `RC_REPLBUFF`): a WRITE replayed after a later
//!   WRITE to the same range would put old data back. Reads and lookups are not cached.
//! - **Key**: the client's IP address, XID, program, version, procedure, and the length and a
//!   CRC-32C of the argument bytes. nfsd compares address *and port* and the transport
//!   protocol; here the port and transport are left out on purpose, because an RPC-over-RDMA
//!   client reconnects from a new port, and a client may come back over the other transport.
//!   The arguments are the same bytes over either transport (RPC-over-RDMA puts Read chunk
//!   data back in place before the program sees it).
//! - **Checksum**: nfsd sums the first 256 bytes of the arguments plus their length, to keep
//!   the cost of summing a large WRITE down. Here the first [`CSUM_PREFIX`] bytes are summed
//!   with CRC-32C (hardware-assisted where the CPU has it): that covers every argument of the
//!   cached procedures except WRITE's data (two file handles and two names of RENAME fit), and
//!   a WRITE's handle, offset, count and the start of its data. A call that reuses an XID with
//!   different arguments is a new call ([`DrcStats::mismatches`] counts them).
//! - **States**: a new call enters *in progress*; its reply makes it *done*. A duplicate of a
//!   done call is answered with the cached reply. A duplicate of a call in progress waits up
//!   to [`DrcConfig::in_progress_wait`] for the original to finish and gets its reply; if the
//!   original is still running then, the duplicate is answered with nothing. nfsd answers
//!   with nothing at once (a wait of zero here) and relies on the client retransmitting
//!   again after its timeout; the clients here (`oncrpc::TcpClient`, `rpcrdma::RdmaClient`)
//!   retransmit only after a reconnect, and a TCP client reconnects within a millisecond,
//!   often while the original is still executing. A call whose execution did not
//!   produce a reply to cache (its future dropped, an RPC-level error) leaves the cache.
//! - **Bounds**: at most [`DrcConfig::max_entries`] entries and [`DrcConfig::max_bytes`] bytes
//!   (each entry is charged [`ENTRY_OVERHEAD`] plus its reply), evicting the least recently
//!   used done entry; entries unused for [`DrcConfig::max_age`] are dropped (nfsd: 120 s).
//!   In-progress entries are never evicted; when the cache is full of them, a new call runs
//!   uncached ([`DrcStats::uncached`]), as nfsd does when it cannot allocate an entry.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::nfs3;

/// Bytes of the arguments that go into the checksum (see the module documentation).
pub const CSUM_PREFIX: usize = 1024;

/// What each entry is charged on top of its reply: key, state, LRU and map bookkeeping.
pub const ENTRY_OVERHEAD: usize = 128;

/// Cache bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrcConfig {
    /// Most entries (in progress and done).
    pub max_entries: usize,
    /// Most bytes: [`ENTRY_OVERHEAD`] per entry plus the cached replies.
    pub max_bytes: usize,
    /// A done entry unused for this long is dropped.
    pub max_age: Duration,
    /// How long a duplicate of a call in progress waits for it before being dropped.
    pub in_progress_wait: Duration,
}

impl Default for DrcConfig {
    /// 4096 entries, 8 MiB, 120 s, a 1 s wait for an original in progress.
    ///
    /// The entry bound is what matters: the cache has to hold a reply from its execution until
    /// the client's retransmission after a reconnect (well under a second for both transports
    /// here), while other calls go on. 4096 entries cover 32 clients each with 128
    /// RPC-over-RDMA credits (the default grant) full of non-idempotent calls. The replies of
    /// the cached procedures are small (the largest, CREATE/MKDIR/SYMLINK/MKNOD with a handle,
    /// attributes and directory wcc data, is under 300 bytes), so 4096 full entries take about
    /// 1.7 MB; the 8 MiB byte bound is a backstop that never binds with these replies. The age
    /// is nfsd's (`RC_EXPIRE`). One second covers any namespace operation of a working
    /// server; a duplicate waiting holds one of its connection's call slots (TCP
    /// `max_in_flight`, an RPC-over-RDMA credit), which bounds how many can wait.
    fn default() -> Self {
        DrcConfig {
            max_entries: 4096,
            max_bytes: 8 << 20,
            max_age: Duration::from_secs(120),
            in_progress_wait: Duration::from_secs(1),
        }
    }
}

/// Counters since the cache was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrcStats {
    /// Duplicates answered with a cached reply.
    pub hits: u64,
    /// New calls (entries created).
    pub misses: u64,
    /// Duplicates of a call still in progress, answered with nothing
    /// ([`ReplyCache::note_in_progress_drop`]).
    pub in_progress_drops: u64,
    /// Done entries evicted to stay within the bounds.
    pub evictions: u64,
    /// Done entries dropped for age.
    pub expired: u64,
    /// New calls whose client and XID matched an entry with other arguments (or procedure).
    pub mismatches: u64,
    /// Calls run without an entry (the cache was full of calls in progress), and replies that
    /// did not fit the byte bound.
    pub uncached: u64,
    /// Entries in the cache now.
    pub entries: u64,
    /// Bytes charged now.
    pub bytes: u64,
}

/// What identifies one call (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub client: IpAddr,
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    /// Length of the argument bytes.
    pub args_len: u32,
    /// CRC-32C of the first [`CSUM_PREFIX`] argument bytes.
    pub args_sum: u32,
}

impl Key {
    /// The key of a call from `client` with these header fields and argument bytes. An
    /// IPv4-mapped IPv6 address is taken as the IPv4 address it maps.
    pub fn new(client: IpAddr, xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Key {
        let n = args.len().min(CSUM_PREFIX);
        Key {
            client: client.to_canonical(),
            xid,
            prog,
            vers,
            proc_,
            args_len: u32::try_from(args.len()).unwrap_or(u32::MAX),
            args_sum: crc32c::crc32c(&args[..n]),
        }
    }
}

/// Whether NFSv3 procedure `proc_` goes through the cache.
pub fn is_cached_proc(proc_: u32) -> bool {
    // The non-idempotent procedures are the ones that change the file system.
    nfs3::modifies(proc_)
}

/// What to do with a call ([`ReplyCache::begin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// A new call: execute it, then [`ReplyCache::complete`] or [`ReplyCache::abandon`].
    Run,
    /// A duplicate of a call still executing: wait for it, or send nothing.
    InProgress,
    /// A duplicate of a finished call: send this reply (the results, after the RPC header).
    Replay(Bytes),
    /// No room for an entry: execute without caching.
    Uncached,
}

#[derive(Debug)]
enum State {
    InProgress,
    Done {
        reply: Bytes,
        seq: u64,
        used: Instant,
    },
}

/// The cache itself (no I/O, no clock).
#[derive(Debug)]
pub struct ReplyCache {
    cfg: DrcConfig,
    entries: HashMap<Key, State>,
    /// Done entries, least recently used first.
    lru: BTreeMap<u64, Key>,
    /// Entries per (client, XID), to count XIDs reused with other arguments.
    xids: HashMap<(IpAddr, u32), u32>,
    next_seq: u64,
    bytes: usize,
    stats: DrcStats,
}

impl ReplyCache {
    /// An empty cache with these bounds.
    pub fn new(cfg: DrcConfig) -> Self {
        ReplyCache {
            cfg,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            xids: HashMap::new(),
            next_seq: 0,
            bytes: 0,
            stats: DrcStats::default(),
        }
    }

    /// The bounds.
    pub fn config(&self) -> &DrcConfig {
        &self.cfg
    }

    /// Counters, with the current size.
    pub fn stats(&self) -> DrcStats {
        DrcStats {
            entries: self.entries.len() as u64,
            bytes: self.bytes as u64,
            ..self.stats
        }
    }

    /// Entries now (in progress and done).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes charged now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A duplicate of a call in progress was answered with nothing (counted here, not by
    /// [`ReplyCache::begin`], since a duplicate may look the call up more than once while it
    /// waits).
    pub fn note_in_progress_drop(&mut self) {
        self.stats.in_progress_drops += 1;
    }

    /// Look a call up; a new call gets an in-progress entry (when there is room).
    pub fn begin(&mut self, key: Key, now: Instant) -> Begin {
        self.expire(now);
        match self.entries.get_mut(&key) {
            Some(State::InProgress) => return Begin::InProgress,
            Some(State::Done { reply, seq, used }) => {
                self.stats.hits += 1;
                let r = reply.clone();
                // Most recently used again (nfsd moves a hit to the tail of its LRU).
                self.lru.remove(seq);
                *seq = self.next_seq;
                *used = now;
                self.lru.insert(self.next_seq, key);
                self.next_seq += 1;
                return Begin::Replay(r);
            }
            None => {}
        }
        self.stats.misses += 1;
        if self.xids.contains_key(&(key.client, key.xid)) {
            self.stats.mismatches += 1;
        }
        if !self.make_room(1, ENTRY_OVERHEAD) {
            self.stats.uncached += 1;
            return Begin::Uncached;
        }
        self.entries.insert(key, State::InProgress);
        *self.xids.entry((key.client, key.xid)).or_default() += 1;
        self.bytes += ENTRY_OVERHEAD;
        Begin::Run
    }

    /// The call `key` (begun with [`Begin::Run`]) produced `reply`: keep it for duplicates.
    /// A reply that cannot fit the byte bound is not kept (the entry goes).
    pub fn complete(&mut self, key: &Key, reply: Bytes, now: Instant) {
        if !matches!(self.entries.get(key), Some(State::InProgress)) {
            return;
        }
        // A reply that could never fit does not empty the cache first.
        if ENTRY_OVERHEAD + reply.len() > self.cfg.max_bytes || !self.make_room(0, reply.len()) {
            self.stats.uncached += 1;
            self.remove(key);
            return;
        }
        self.bytes += reply.len();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.lru.insert(seq, *key);
        self.entries.insert(
            *key,
            State::Done {
                reply,
                seq,
                used: now,
            },
        );
    }

    /// The call `key` ended without a reply to keep (its execution was abandoned, or it failed
    /// at the RPC level): forget it, so that a retransmission executes it.
    pub fn abandon(&mut self, key: &Key) {
        if matches!(self.entries.get(key), Some(State::InProgress)) {
            self.remove(key);
        }
    }

    /// Evict least recently used done entries until `entries` more entries and `bytes` more
    /// bytes fit. False if they cannot (only in-progress entries left, or too large).
    fn make_room(&mut self, entries: usize, bytes: usize) -> bool {
        while self.entries.len() + entries > self.cfg.max_entries
            || self.bytes + bytes > self.cfg.max_bytes
        {
            let Some((_, victim)) = self.lru.first_key_value().map(|(s, k)| (*s, *k)) else {
                return false;
            };
            self.remove(&victim);
            self.stats.evictions += 1;
        }
        true
    }

    /// Drop done entries unused for longer than the maximum age (they are at the front of the
    /// LRU order, since `now` does not go backwards).
    fn expire(&mut self, now: Instant) {
        while let Some((_, key)) = self.lru.first_key_value().map(|(s, k)| (*s, *k)) {
            let old = match self.entries.get(&key) {
                Some(State::Done { used, .. }) => {
                    now.saturating_duration_since(*used) >= self.cfg.max_age
                }
                _ => true,
            };
            if !old {
                break;
            }
            self.remove(&key);
            self.stats.expired += 1;
        }
    }

    fn remove(&mut self, key: &Key) {
        let Some(state) = self.entries.remove(key) else {
            return;
        };
        self.bytes -= ENTRY_OVERHEAD;
        if let State::Done { reply, seq, .. } = state {
            self.bytes -= reply.len();
            self.lru.remove(&seq);
        }
        let xk = (key.client, key.xid);
        if let Some(n) = self.xids.get_mut(&xk) {
            *n -= 1;
            if *n == 0 {
                self.xids.remove(&xk);
            }
        }
    }
}

/// A [`ReplyCache`] shared by the NFS program's calls on every connection and transport.
#[derive(Debug)]
pub struct SharedCache {
    cache: Mutex<ReplyCache>,
    /// Woken whenever an in-progress entry completes or goes.
    settled: tokio::sync::Notify,
}

/// What the NFS program does with a call ([`SharedCache::admit`]).
#[derive(Debug)]
pub enum Admit {
    /// Execute; give the reply to the ticket (if any: an uncached call has none).
    Run(Option<Ticket>),
    /// Send nothing.
    Drop,
    /// Send these results.
    Replay(Bytes),
}

impl SharedCache {
    /// An empty shared cache.
    pub fn new(cfg: DrcConfig) -> Arc<Self> {
        Arc::new(SharedCache {
            cache: Mutex::new(ReplyCache::new(cfg)),
            settled: tokio::sync::Notify::new(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> DrcStats {
        self.cache.lock().stats()
    }

    /// Look a call up (see [`ReplyCache::begin`]); a duplicate of a call in progress waits
    /// for it up to [`DrcConfig::in_progress_wait`].
    pub async fn admit(self: &Arc<Self>, key: Key) -> Admit {
        // One clock read serves the first look-up and, for a duplicate that must wait, its
        // deadline (a clock read is a system call where the clock source has no vDSO).
        let mut at = Instant::now();
        let deadline = {
            let c = self.cache.lock();
            tokio::time::Instant::from_std(at) + c.config().in_progress_wait
        };
        loop {
            // Registered before looking, so a completion between the look-up and the wait
            // is not missed.
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let begun = self.cache.lock().begin(key, at);
            match begun {
                Begin::Run => {
                    return Admit::Run(Some(Ticket {
                        cache: self.clone(),
                        key,
                        done: false,
                    }));
                }
                Begin::Uncached => return Admit::Run(None),
                Begin::Replay(r) => return Admit::Replay(r),
                Begin::InProgress => {}
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                self.cache.lock().note_in_progress_drop();
                return Admit::Drop;
            }
            at = Instant::now();
        }
    }
}

/// An in-progress entry. Completing it stores the reply; dropping it without completing
/// (the call's future was dropped, or the call failed at the RPC level) removes the entry.
#[derive(Debug)]
pub struct Ticket {
    cache: Arc<SharedCache>,
    key: Key,
    done: bool,
}

impl Ticket {
    /// Keep `reply` (the results, all items inline) for duplicates of this call.
    pub fn complete(mut self, reply: Bytes) {
        self.done = true;
        self.cache
            .cache
            .lock()
            .complete(&self.key, reply, Instant::now());
        self.cache.settled.notify_waiters();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.cache.cache.lock().abandon(&self.key);
            self.cache.settled.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs3::proc_;

    fn key(xid: u32, args: &[u8]) -> Key {
        Key::new(
            "192.0.2.7".parse().unwrap(),
            xid,
            100003,
            3,
            proc_::REMOVE,
            args,
        )
    }

    fn cfg(entries: usize, bytes: usize) -> DrcConfig {
        DrcConfig {
            max_entries: entries,
            max_bytes: bytes,
            max_age: Duration::from_secs(120),
            in_progress_wait: Duration::ZERO,
        }
    }

    #[test]
    fn new_then_in_progress_then_replay() {
        let mut c = ReplyCache::new(DrcConfig::default());
        let t = Instant::now();
        let k = key(1, b"args");
        assert_eq!(c.begin(k, t), Begin::Run);
        assert_eq!(c.begin(k, t), Begin::InProgress);
        c.note_in_progress_drop();
        c.complete(&k, Bytes::from_static(b"reply"), t);
        assert_eq!(c.begin(k, t), Begin::Replay(Bytes::from_static(b"reply")));
        let s = c.stats();
        assert_eq!((s.misses, s.in_progress_drops, s.hits), (1, 1, 1));
        assert_eq!(s.entries, 1);
        assert_eq!(s.bytes, (ENTRY_OVERHEAD + 5) as u64);
    }

    #[test]
    fn same_xid_other_arguments_is_a_new_call() {
        let mut c = ReplyCache::new(DrcConfig::default());
        let t = Instant::now();
        let a = key(9, b"remove a");
        let b = key(9, b"remove b");
        assert_ne!(a, b);
        assert_eq!(c.begin(a, t), Begin::Run);
        c.complete(&a, Bytes::from_static(b"ok a"), t);
        assert_eq!(c.begin(b, t), Begin::Run);
        assert_eq!(c.stats().mismatches, 1);
        // Another procedure with the same XID and arguments is not a duplicate either.
        let mut other = a;
        other.proc_ = proc_::RMDIR;
        assert_eq!(c.begin(other, t), Begin::Run);
        // The first call still replays.
        assert_eq!(c.begin(a, t), Begin::Replay(Bytes::from_static(b"ok a")));
    }

    #[test]
    fn port_is_not_part_of_the_key_and_mapped_v4_is_v4() {
        let v4 = Key::new("127.0.0.1".parse().unwrap(), 5, 1, 3, 12, b"x");
        let mapped = Key::new("::ffff:127.0.0.1".parse().unwrap(), 5, 1, 3, 12, b"x");
        assert_eq!(v4, mapped);
        let other_host = Key::new("127.0.0.2".parse().unwrap(), 5, 1, 3, 12, b"x");
        assert_ne!(v4, other_host);
    }

    #[test]
    fn checksum_covers_a_prefix_and_the_length() {
        let mut a = vec![7u8; CSUM_PREFIX + 100];
        let b = a.clone();
        a[CSUM_PREFIX + 50] = 8;
        // Beyond the prefix, only the length tells calls apart.
        assert_eq!(key(1, &a), key(1, &b));
        a.push(0);
        assert_ne!(key(1, &a), key(1, &b));
        let mut c = b.clone();
        c[3] = 0;
        assert_ne!(key(1, &c), key(1, &b));
    }

    #[test]
    fn entry_bound_evicts_least_recently_used_done_entries() {
        let mut c = ReplyCache::new(cfg(3, 1 << 20));
        let t = Instant::now();
        for x in 0..3 {
            assert_eq!(c.begin(key(x, b"a"), t), Begin::Run);
            c.complete(&key(x, b"a"), Bytes::from_static(b"r"), t);
        }
        // Touch 0: 1 is now the least recently used.
        assert!(matches!(c.begin(key(0, b"a"), t), Begin::Replay(_)));
        assert_eq!(c.begin(key(3, b"a"), t), Begin::Run);
        assert_eq!(c.len(), 3);
        assert_eq!(c.stats().evictions, 1);
        assert!(matches!(c.begin(key(0, b"a"), t), Begin::Replay(_)));
        assert!(matches!(c.begin(key(2, b"a"), t), Begin::Replay(_)));
        // 1 was evicted: its duplicate now runs again.
        assert_eq!(c.begin(key(1, b"a"), t), Begin::Run);
        assert!(c.len() <= 3);
    }

    #[test]
    fn in_progress_entries_are_never_evicted() {
        let mut c = ReplyCache::new(cfg(2, 1 << 20));
        let t = Instant::now();
        assert_eq!(c.begin(key(1, b"a"), t), Begin::Run);
        assert_eq!(c.begin(key(2, b"a"), t), Begin::Run);
        assert_eq!(c.begin(key(3, b"a"), t), Begin::Uncached);
        assert_eq!(c.begin(key(1, b"a"), t), Begin::InProgress);
        assert_eq!(c.stats().uncached, 1);
        assert_eq!(c.len(), 2);
        c.abandon(&key(2, b"a"));
        assert_eq!(c.begin(key(3, b"a"), t), Begin::Run);
    }

    #[test]
    fn byte_bound_holds() {
        let max = 4 * ENTRY_OVERHEAD + 300;
        let mut c = ReplyCache::new(cfg(1000, max));
        let t = Instant::now();
        for x in 0..50 {
            let k = key(x, b"a");
            assert_eq!(c.begin(k, t), Begin::Run);
            c.complete(&k, Bytes::from(vec![0u8; 100]), t);
            assert!(c.bytes() <= max, "{} > {max}", c.bytes());
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.stats().evictions, 47);
        // A reply larger than the whole budget is not kept.
        let k = key(100, b"a");
        assert_eq!(c.begin(k, t), Begin::Run);
        c.complete(&k, Bytes::from(vec![0u8; max]), t);
        assert_eq!(c.begin(k, t), Begin::Run);
        assert!(c.bytes() <= max);
    }

    #[test]
    fn abandoned_calls_run_again_and_old_entries_expire() {
        let mut c = ReplyCache::new(cfg(10, 1 << 20));
        let t = Instant::now();
        let k = key(1, b"a");
        assert_eq!(c.begin(k, t), Begin::Run);
        c.abandon(&k);
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        assert_eq!(c.begin(k, t), Begin::Run);
        c.complete(&k, Bytes::from_static(b"r"), t);
        let later = t + Duration::from_secs(121);
        assert_eq!(c.begin(k, later), Begin::Run);
        assert_eq!(c.stats().expired, 1);
    }

    #[tokio::test]
    async fn in_progress_duplicate_is_dropped_and_abandoned_ticket_frees_the_entry() {
        // A wait of zero: nfsd's behaviour.
        let c = SharedCache::new(cfg(16, 1 << 20));
        let k = key(4, b"a");
        let Admit::Run(Some(t)) = c.admit(k).await else {
            panic!("new call")
        };
        assert!(matches!(c.admit(k).await, Admit::Drop));
        assert_eq!(c.stats().in_progress_drops, 1);
        drop(t);
        assert_eq!(c.stats().entries, 0);
        let Admit::Run(Some(t)) = c.admit(k).await else {
            panic!("runs again")
        };
        t.complete(Bytes::from_static(b"done"));
        assert!(matches!(c.admit(k).await, Admit::Replay(r) if &r[..] == b"done"));
    }

    #[tokio::test]
    async fn in_progress_duplicate_waits_for_the_original() {
        let c = SharedCache::new(DrcConfig {
            in_progress_wait: Duration::from_secs(30),
            ..DrcConfig::default()
        });
        let k = key(5, b"a");
        let Admit::Run(Some(t)) = c.admit(k).await else {
            panic!("new call")
        };
        let c2 = c.clone();
        let dup = tokio::spawn(async move { c2.admit(k).await });
        // Whenever the duplicate looks, the original is in progress or done: it can only
        // end with the original's reply.
        tokio::task::yield_now().await;
        t.complete(Bytes::from_static(b"first"));
        let got = dup.await.unwrap();
        assert!(matches!(got, Admit::Replay(r) if &r[..] == b"first"));
        assert_eq!(c.stats().in_progress_drops, 0);
        assert_eq!(c.stats().hits, 1);
    }
}
