//! Reusable payload buffers handed out as [`Bytes`]: a buffer goes back to its pool when the
//! last `Bytes` over it is dropped (after a reply was encoded, or its RDMA Write transmitted).
//! Zeroing, and in fresh memory faulting in, 1 MiB for every NFS READ was 4-6 % of the CPU of
//! `oxrdma nfs bench` at 1 MiB (perf); the NFS server's READ buffers and RPC-over-RDMA's large
//! sink regions come from here.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use bytes::Bytes;

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
    /// A pool that keeps at most `keep` idle buffers (more are freed).
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
            Some(i) => free.swap_remove(i),
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
        let mut free = self.pool.lock();
        if free.len() < self.pool.keep {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_bytes_go() {
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
        // At most `keep` idle buffers are kept.
        drop(pool.wrap(vec![1; 8], 0..8));
        drop(pool.wrap(vec![2; 8], 0..8));
        assert_eq!(pool.lock().len(), 1);
    }
}
