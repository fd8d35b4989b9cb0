//! Reusable payload buffers handed out as [`Bytes`]: a buffer goes back to its pool when the
//! last `Bytes` over it is dropped (after a reply was encoded, or its RDMA Write transmitted).
//! Zeroing, and in fresh memory faulting in, 1 MiB for every NFS READ was 4-6 % of the CPU of
//! `oxrdma nfs bench` at 1 MiB (perf); the NFS server's READ buffers and RPC-over-RDMA's large
//! sink regions come from here.
//!
//! A pool frees its idle buffers when it is dropped (an RPC-over-RDMA connection's sink pool
//! goes with the connection); [`idle_bytes`] counts what every pool of the process holds idle,
//! so tests can see that memory come back.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard};

/// Bytes held idle by every [`BufPool`] of this process.
static IDLE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes held idle (kept for reuse) by every [`BufPool`] of this process now.
pub fn idle_bytes() -> usize {
    IDLE_BYTES.load(Ordering::Relaxed)
}

/// A pool of idle buffers, matched by exact length.
#[derive(Default)]
pub struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("idle", &self.lock().len())
            .field("keep", &self.keep)
            .finish()
    }
}

impl BufPool {
    /// A pool that keeps at most `keep` idle buffers, the most recently returned (older ones
    /// are freed).
    pub fn new(keep: usize) -> Arc<Self> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            keep,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock()
    }

    /// A buffer of exactly `len` bytes: an idle one (holding what its last user left there),
    /// or a new zeroed one.
    pub fn get(&self, len: usize) -> Vec<u8> {
        let mut free = self.lock();
        match free.iter().position(|v| v.len() == len) {
            Some(i) => {
                IDLE_BYTES.fetch_sub(len, Ordering::Relaxed);
                // `remove`, not `swap_remove`: the idle list stays oldest first, which is what
                // a full pool lets go of (`Pooled::drop`).
                free.remove(i)
            }
            None => {
                drop(free);
                vec![0; len]
            }
        }
    }

    /// `range` of `buf` as `Bytes`; `buf` comes back to this pool when the last of them goes.
    pub fn wrap(self: &Arc<Self>, buf: Vec<u8>, range: Range<usize>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
        .slice(range)
    }
}

/// A buffer on its way back to its pool.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if self.pool.keep == 0 {
            return;
        }
        let mut free = self.pool.lock();
        // A full pool lets its oldest idle buffer go: what it keeps follows the sizes in use
        // now, and a pool filled with one size does not turn every other size away for ever.
        if free.len() >= self.pool.keep {
            let old = free.remove(0);
            IDLE_BYTES.fetch_sub(old.len(), Ordering::Relaxed);
        }
        IDLE_BYTES.fetch_add(buf.len(), Ordering::Relaxed);
        free.push(buf);
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        let free = self.free.get_mut();
        let held: usize = free.iter().map(Vec::len).sum();
        IDLE_BYTES.fetch_sub(held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The idle count is process-wide: these tests take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn buffers_come_back_when_the_last_bytes_go() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pool = BufPool::new(1);
        let mut v = pool.get(8);
        assert_eq!(v, [0; 8]);
        v[..3].copy_from_slice(b"abc");
        let whole = pool.wrap(v, 0..8);
        let part = whole.slice(1..3);
        drop(whole);
        // Still held by `part`: a new request gets a fresh buffer.
        assert_eq!(pool.get(8), [0; 8]);
        assert_eq!(&part[..], b"bc");
        drop(part);
        // Back, with its contents; other lengths do not match it.
        assert_eq!(pool.get(4), [0; 4]);
        assert_eq!(&pool.get(8)[..3], b"abc");
        // At most `keep` idle buffers are kept: the most recent.
        drop(pool.wrap(vec![1; 8], 0..8));
        drop(pool.wrap(vec![2; 16], 0..16));
        assert_eq!(pool.lock().len(), 1);
        assert_eq!(pool.get(8), [0; 8], "the older buffer was let go");
        assert_eq!(pool.get(16), [2; 16]);
    }

    #[test]
    fn a_full_pool_lets_its_oldest_idle_buffer_go() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pool = BufPool::new(3);
        for (fill, len) in [(1u8, 8usize), (2, 16), (3, 32)] {
            drop(pool.wrap(vec![fill; len], 0..len));
        }
        // Taking the oldest out must not move the newest to the front of the idle list.
        assert_eq!(pool.get(8), [1; 8]);
        drop(pool.wrap(vec![4; 64], 0..64));
        drop(pool.wrap(vec![5; 128], 0..128));
        // Full at the last return: the 16-byte buffer, now the oldest, was let go.
        assert_eq!(pool.get(16), [0; 16]);
        assert_eq!(pool.get(32), [3; 32]);
        assert_eq!(pool.get(64), [4; 64]);
        assert_eq!(pool.get(128), [5; 128]);
    }

    #[test]
    fn a_dropped_pool_gives_its_idle_buffers_back() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let pool = BufPool::new(4);
        let before = idle_bytes();
        drop(pool.wrap(vec![0; 1000], 0..1000));
        drop(pool.wrap(vec![0; 1000], 0..1000));
        assert_eq!(idle_bytes(), before + 2000);
        // A buffer still out when its pool goes comes back to it, and is freed with it.
        let out = pool.wrap(vec![0; 500], 0..500);
        drop(pool);
        drop(out);
        assert_eq!(idle_bytes(), before);
    }
}
