//! Giving memory back to the system once clients have gone (issue 20).
//!
//! The process allocates with mimalloc (see `main.rs`). Memory a client made the server hold
//! (its receive buffers, calls, replies) is freed when its connection closes, but mimalloc
//! returns a thread's freed pages to the system only when that thread allocates or collects
//! again, and blocks freed by another thread (a reply built on one worker and dropped on
//! another once written) wait in their owner's list until then. A server left idle after a
//! burst of hostile clients kept all of it resident.
//!
//! So: when a connection closes, [`request`] asks every runtime worker to collect
//! (`mi_collect(true)`: process the blocks freed to it by other threads, free its empty pages,
//! purge what it no longer uses) the next time it parks ([`on_park`], the runtime's
//! `on_thread_park` hook), once per request. A worker parks only when it has nothing to run, so
//! the collection never delays a call.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Collections asked for so far.
static REQUESTED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last request this thread has collected for.
    static DONE: Cell<u64> = const { Cell::new(0) };
}

unsafe extern "C" {
    /// mimalloc.h: "Eagerly free memory. If `force` is true, aggressively return memory to
    /// the OS (can be expensive!)". Linked from the static library `mimalloc` brings.
    fn mi_collect(force: bool);
}

/// Ask every runtime worker to give its freed memory back the next time it is idle.
pub fn request() {
    REQUESTED.fetch_add(1, Ordering::Relaxed);
}

/// The runtime's `on_thread_park` hook: collect once per [`request`].
pub fn on_park() {
    let want = REQUESTED.load(Ordering::Relaxed);
    DONE.with(|done| {
        if done.get() != want {
            done.set(want);
            // SAFETY: `mi_collect` takes no pointers and may be called from any thread at
            // any time; it only works on the calling thread's heap and mimalloc's own
            // shared state, under mimalloc's own synchronisation.
            unsafe { mi_collect(true) };
        }
    });
}
