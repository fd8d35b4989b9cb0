//! Completion queues and work requests.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Completion status (rdma-core `ibv_wc_status`, the subset iWARP can produce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// A receive buffer was too small, or a gather list was longer than the message allows.
    LocalLengthError,
    /// Local QP operation error (e.g. RTR protocol violation).
    LocalQpOperationError,
    /// A local lkey was invalid or lacked the needed access.
    LocalProtectionError,
    /// The QP went to the error state before this WR finished.
    WrFlushError,
    /// The peer reported a protection error on this WR (Terminate, remote protection).
    RemoteAccessError,
    /// The peer reported an operation error (Terminate, remote operation).
    RemoteOperationError,
    /// The peer's request was invalid.
    RemoteInvalidRequestError,
    /// Fatal transport error.
    FatalError,
}

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum WcOpcode {
    /// Send / Send with Invalidate / Send with SE.
    Send,
    /// RDMA Write.
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// Local Invalidate.
    LocalInvalidate,
    /// A receive WR consumed by an incoming Send.
    Recv,
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The WR's id.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WcOpcode,
    /// Status.
    pub status: WcStatus,
    /// Bytes transferred (receives: message length; reads: bytes read).
    pub byte_len: u32,
    /// For receives of Send with Invalidate: the STag the peer invalidated.
    pub invalidated_rkey: Option<u32>,
    /// For receives: the Send carried the Solicited Event flag.
    pub solicited: bool,
    /// QP number that produced it.
    pub qp_num: u32,
}

/// A function given each completion of a queue, in the provider's context: see
/// [`CompletionQueue::set_handler`].
pub type CqHandler = Box<dyn Fn(Completion) + Send + Sync>;

#[derive(Default)]
pub(crate) struct CqInner {
    q: Mutex<VecDeque<Completion>>,
    notify: Notify,
    handler: OnceLock<CqHandler>,
    /// Held by the thread running the handler: completions are handed over in queue order.
    draining: Mutex<()>,
}

impl fmt::Debug for CqInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqInner")
            .field("pending", &self.q.lock().len())
            .field("handler", &self.handler.get().is_some())
            .finish()
    }
}

impl CqInner {
    /// Queue `c`; `true` if the queue has a handler, which the caller must then run
    /// ([`CqInner::run_handler`]) once it holds no provider lock, since a handler may post
    /// work requests. Without a handler a waiter is woken.
    pub(crate) fn enqueue(&self, c: Completion) -> bool {
        self.q.lock().push_back(c);
        if self.handler.get().is_none() {
            self.notify.notify_one();
            return false;
        }
        true
    }

    /// Hands queued completions to the handler, in order, unless another thread (or an outer
    /// frame of this one) is doing so; that one then also takes what was queued meanwhile.
    pub(crate) fn run_handler(&self) {
        let Some(h) = self.handler.get() else { return };
        loop {
            {
                let Some(_draining) = self.draining.try_lock() else {
                    return;
                };
                loop {
                    let next = self.q.lock().pop_front();
                    let Some(c) = next else { break };
                    h(c);
                }
            }
            // Pushed after the last pop but while `draining` was still held: take it too.
            if self.q.lock().is_empty() {
                return;
            }
        }
    }
}

/// A completion queue. Cloning gives another handle to the same queue; several QPs may share one.
#[derive(Clone, Default)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
    /// The native CQ feeding `inner` (or why it could not be created).
    pub(crate) native: Option<Result<Arc<dyn crate::provider::NativeCq>, crate::VerbsError>>,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("pending", &self.inner.q.lock().len())
            .finish()
    }
}

impl CompletionQueue {
    /// New, empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Non-blocking: take up to `max` completions (rdma-core `ibv_poll_cq`).
    pub fn poll(&self, max: usize) -> Vec<Completion> {
        let mut q = self.inner.q.lock();
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// Non-blocking: take one completion.
    pub fn try_next(&self) -> Option<Completion> {
        self.inner.q.lock().pop_front()
    }

    /// Hand every completion of this queue to `handler` from now on, in the context that
    /// produces it, instead of queueing it for [`next`](Self::next) / [`poll`](Self::poll)
    /// (like a kernel ULP's `ib_cq` completion handler, which runs in the provider's context).
    /// Completions queued before are handed over at once. Saves waking a task per batch of
    /// completions.
    ///
    /// soft-iWARP and loopback run it on the connection's receive task (or on whichever thread
    /// posted the work request that completed), after releasing the queue pair's lock, so the
    /// handler may post work requests; rdma-core runs it on the queue's polling thread, outside
    /// any tokio runtime. It must not block for long: it holds up its connection's receive
    /// path. Completions are handed over one at a time and in queue order. A queue has at most
    /// one handler: a second call returns `false` and changes nothing.
    pub fn set_handler(&self, handler: CqHandler) -> bool {
        if self.inner.handler.set(handler).is_err() {
            return false;
        }
        self.inner.run_handler();
        true
    }

    /// Wait for the next completion.
    pub async fn next(&self) -> Completion {
        loop {
            let notified = self.inner.notify.notified();
            if let Some(c) = self.try_next() {
                return c;
            }
            notified.await;
        }
    }
}

/// One scatter/gather element: `length` bytes at tagged offset `addr` of the region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Local key of a registered region.
    pub lkey: u32,
    /// Address inside the region (region `addr()` + offset).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
}

/// Send-queue operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOp {
    /// RDMAP Send.
    Send,
    /// Send with Invalidate of the peer's `rkey` (RFC 5040 §5.3).
    SendWithInvalidate(u32),
    /// RDMA Write to the peer's region.
    RdmaWrite {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// Peer's STag.
        rkey: u32,
    },
    /// RDMA Read from the peer's region into the (single) local sge.
    RdmaRead {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// Peer's STag.
        rkey: u32,
    },
    /// Invalidate a local STag in order with the send queue.
    LocalInvalidate(u32),
}

/// Where the bytes of a send come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Gather list of registered memory.
    Sgl(Vec<Sge>),
    /// Owned bytes (like inline data; only for Send / Send with Invalidate / RDMA Write).
    Inline(Bytes),
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: SendOp,
    /// Data.
    pub payload: Payload,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the Solicited Event flag on Sends.
    pub solicited: bool,
}

impl SendWr {
    /// Signaled WR with a gather list.
    pub fn new(wr_id: u64, opcode: SendOp, sgl: Vec<Sge>) -> Self {
        Self {
            wr_id,
            opcode,
            payload: Payload::Sgl(sgl),
            signaled: true,
            solicited: false,
        }
    }

    /// Signaled Send of owned bytes.
    pub fn send_bytes(wr_id: u64, data: Bytes) -> Self {
        Self {
            wr_id,
            opcode: SendOp::Send,
            payload: Payload::Inline(data),
            signaled: true,
            solicited: false,
        }
    }

    /// Total length of the payload.
    pub fn len(&self) -> u64 {
        match &self.payload {
            Payload::Sgl(v) => v.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(b) => b.len() as u64,
        }
    }

    /// True if no payload bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive work request's scatter list: one or two elements on the stack (a receive is
/// reposted for every message; a heap allocation each before).
pub type RecvSgl = smallvec::SmallVec<[Sge; 2]>;

/// A receive-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list (needs LOCAL_WRITE).
    pub sgl: RecvSgl,
}

impl RecvWr {
    /// A receive into one buffer, the common case.
    pub fn new(wr_id: u64, sge: Sge) -> Self {
        let mut sgl = RecvSgl::new();
        sgl.push(sge);
        RecvWr { wr_id, sgl }
    }
}
