//! One TCP connection's calls and replies: the reply queue that bounds what a peer leaves
//! untaken, each call's execution (on the reader's task when it is alone and finishes at once,
//! in a task of its own otherwise), and the writer that sends replies in completion order.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};
use xdr::DdpPolicy;

use super::server::TcpServerStats;
use crate::budget::Reservation;
use crate::record::{MAX_FRAGMENT_LEN, frame, write_all_parts};
use crate::service::{CallContext, CallHints, Dispatcher, ReplyMessage};

/// One connection's replies waiting to be written.
#[derive(Debug)]
pub(super) struct ReplyQueue {
    bytes: AtomicUsize,
    /// Calls admitted whose reply is not queued yet.
    pub(super) executing: AtomicUsize,
    /// The largest reply of this connection so far.
    pub(super) largest: AtomicUsize,
    drained: Notify,
    server: Arc<TcpServerStats>,
}

impl ReplyQueue {
    pub(super) fn new(server: Arc<TcpServerStats>) -> Self {
        ReplyQueue {
            bytes: AtomicUsize::new(0),
            executing: AtomicUsize::new(0),
            largest: AtomicUsize::new(0),
            drained: Notify::new(),
            server,
        }
    }

    /// A call's reply (of `n` bytes) is queued; `None`: the call has none.
    pub(super) fn done(self: &Arc<Self>, n: Option<usize>) -> Option<Queued> {
        let q = n.map(|n| self.add(n));
        self.executing.fetch_sub(1, Ordering::AcqRel);
        if q.is_none() {
            self.drained.notify_waiters();
        }
        q
    }

    fn add(self: &Arc<Self>, n: usize) -> Queued {
        self.largest.fetch_max(n, Ordering::Relaxed);
        self.bytes.fetch_add(n, Ordering::AcqRel);
        let total = self
            .server
            .queued_reply_bytes
            .fetch_add(n, Ordering::AcqRel)
            + n;
        self.server
            .peak_queued_reply_bytes
            .fetch_max(total, Ordering::Relaxed);
        Queued {
            queue: self.clone(),
            bytes: n,
        }
    }

    /// Wait until the replies queued and those the executing calls will add (estimated at the
    /// largest so far) are under `limit`, then count one more executing call.
    pub(super) async fn admit(&self, limit: usize) {
        let mut paused = false;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let executing = self.executing.load(Ordering::Acquire);
            let expected = self
                .bytes
                .load(Ordering::Acquire)
                .saturating_add(executing.saturating_mul(self.largest.load(Ordering::Relaxed)));
            if expected < limit || (executing == 0 && self.bytes.load(Ordering::Acquire) == 0) {
                self.executing.fetch_add(1, Ordering::AcqRel);
                return;
            }
            if !paused {
                paused = true;
                self.server.read_pauses.fetch_add(1, Ordering::Relaxed);
            }
            drained.await;
        }
    }
}

/// Reply bytes counted in a [`ReplyQueue`] until written (or dropped with the connection).
#[derive(Debug)]
pub(super) struct Queued {
    queue: Arc<ReplyQueue>,
    bytes: usize,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.queue
            .server
            .queued_reply_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        self.queue.drained.notify_waiters();
    }
}

/// A reply on its way to the writer: the in-flight permit, its bytes in the connection's
/// [`ReplyQueue`] and, with a budget, its reservation, all given back once it is written.
pub(super) type ReplyItem = (
    ReplyMessage,
    OwnedSemaphorePermit,
    Queued,
    Option<Reservation>,
);

/// Run one call. A call alone on its connection ([`CallHints::alone`]) is first polled here,
/// on the reader's task: if it finishes at once (a service that answers without waiting: the
/// NFS server's GETATTR, LOOKUP, a READ from the page cache) no task is spawned and no other
/// worker woken for it. A call that waits (a blocking thread, memory), and every call that
/// has neighbours, runs in a task of its own, so that the calls of one connection proceed
/// concurrently on the runtime's workers: run on the reader's task, they would take turns.
/// Measured with `nfs bench` (docs/performance.md): polling every call here cost NFS over
/// TCP up to a third of its rate at depths 4 and 16, while one call at a time gained.
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_call(
    record: Bytes,
    hints: CallHints,
    dispatcher: &Arc<Dispatcher>,
    context: &Arc<CallContext>,
    tx: &mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
    queue: &Arc<ReplyQueue>,
    held: Option<Reservation>,
) {
    let fut = run_call(
        record,
        hints,
        dispatcher.clone(),
        context.clone(),
        tx.clone(),
        permit,
        queue.clone(),
        held,
    );
    if !hints.alone {
        tokio::spawn(fut);
        return;
    }
    let mut fut = Box::pin(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(fut);
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_call(
    record: Bytes,
    hints: CallHints,
    d: Arc<Dispatcher>,
    ctx: Arc<CallContext>,
    tx: mpsc::UnboundedSender<ReplyItem>,
    permit: OwnedSemaphorePermit,
    queue: Arc<ReplyQueue>,
    mut held: Option<Reservation>,
) {
    // TCP carries every result inline: no Write chunks exist.
    let reply = d
        .dispatch_hinted(record, ctx, DdpPolicy::Inline, hints)
        .await;
    // The call's record is gone: what it reserved now covers its reply, which stays
    // reserved until written. A reply larger than that gives it back and waits for the
    // whole (as RPC-over-RDMA does: a call never holds part of its memory while it waits
    // for the rest), unless the connection goes meanwhile.
    let len = reply.as_ref().map_or(0, |r| r.message.len());
    if let Some(h) = held.as_mut() {
        if len <= h.bytes() {
            h.shrink(len);
        } else {
            let share = h.connection().clone();
            held = None;
            tokio::select! {
                r = share.reserve_queued(len) => match r {
                    Ok(r) => held = Some(r),
                    // Larger than the connection may ever hold: sent as it is.
                    Err(e) => tracing::debug!(error = %e, "reply larger than the budget allows"),
                },
                _ = tx.closed() => {
                    queue.done(None);
                    return;
                }
            }
        }
    }
    // The permit travels with the reply and is released once it has been written, so
    // replies the peer is slow to read also count against the limit; their bytes count
    // until written (or dropped with the connection).
    if let Some(queued) = queue.done(reply.as_ref().map(|r| r.message.len()))
        && let Some(reply) = reply
    {
        let _ = tx.send((reply, permit, queued, held));
    }
}

/// Write `parts`; with `idle`, fail with `TimedOut` when the peer takes none of them for that
/// long (the socket accepts no byte: its buffers are full and the peer does not read).
async fn write_parts(
    wr: &mut OwnedWriteHalf,
    parts: &mut VecDeque<Bytes>,
    idle: Option<Duration>,
) -> io::Result<()> {
    let Some(idle) = idle else {
        return write_all_parts(wr, parts).await;
    };
    let left = |p: &VecDeque<Bytes>| p.iter().map(Bytes::len).sum::<usize>();
    loop {
        let before = left(parts);
        // `write_all_parts` takes parts off as the socket accepts them, so what is left after
        // the timeout is exactly what was not written.
        match tokio::time::timeout(idle, write_all_parts(wr, parts)).await {
            Ok(r) => return r,
            Err(_) if left(parts) < before => {}
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer took none of its replies for {idle:?}"),
                ));
            }
        }
    }
}

pub(super) async fn writer_task(
    wr: OwnedWriteHalf,
    rx: mpsc::UnboundedReceiver<ReplyItem>,
    calls: mpsc::UnboundedReceiver<Bytes>,
    idle: Option<Duration>,
    gone: Arc<Notify>,
) -> io::Result<()> {
    let r = write_replies(wr, rx, calls, idle).await;
    if let Err(e) = &r
        && e.kind() == io::ErrorKind::TimedOut
    {
        tracing::warn!(error = %e, "closing RPC/TCP connection: replies not taken");
    }
    // The reader stops at once: with no writer, its calls' replies have nowhere to go.
    gone.notify_one();
    r
}

async fn write_replies(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<ReplyItem>,
    mut calls: mpsc::UnboundedReceiver<Bytes>,
    idle: Option<Duration>,
) -> io::Result<()> {
    const BATCH: usize = 64;
    let mut parts = VecDeque::new();
    let mut held = Vec::with_capacity(BATCH);
    let mut calls_open = true;
    loop {
        let (reply, permit, queued, reserved) = tokio::select! {
            r = rx.recv() => match r {
                Some(item) => item,
                None => break,
            },
            c = calls.recv(), if calls_open => {
                match c {
                    // A backward call: written as it comes (they are few and small).
                    Some(call) => {
                        let mut msg = xdr::Encoded::default();
                        msg.prepend(call);
                        let mut p: VecDeque<Bytes> = frame(&msg, MAX_FRAGMENT_LEN).into();
                        write_parts(&mut wr, &mut p, idle).await?;
                    }
                    None => calls_open = false,
                }
                continue;
            }
        };
        parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
        held.push((permit, queued, reserved));
        // Coalesce replies that are already waiting into one vectored write.
        while held.len() < BATCH {
            match rx.try_recv() {
                Ok((reply, permit, queued, reserved)) => {
                    parts.extend(frame(&reply.message, MAX_FRAGMENT_LEN));
                    held.push((permit, queued, reserved));
                }
                Err(_) => break,
            }
        }
        write_parts(&mut wr, &mut parts, idle).await?;
        held.clear();
    }
    wr.shutdown().await
}
