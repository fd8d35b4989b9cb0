//! The receive side of an RDS-over-RDMA connection, run in the provider's context.
//!
//! Receive completions are taken by a handler on the receive completion queue
//! ([`verbs::CompletionQueue::set_handler`]): soft-iWARP runs it on the connection's receive
//! task between the FPDUs of one read, rdma-core on its completion thread. Like Linux's
//! `rds_ib_recv_cqe_handler`, it re-posts the buffer, reassembles fragments, takes the credits
//! the peer granted and hands complete messages to the engine, with no task to wake in between.
//! The connection task ([`super::conn_task`]) is woken only when it has something to do: the
//! engine queued a message or an ack (through [`crate::tcp::pump`]), credits arrived while it
//! was stopped for want of them, or enough receive buffers wait to be advertised.

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;
use verbs::{Completion, QueuePair, RecvWr, WcOpcode, WcStatus};

use super::{BUF_LEN, CounterCells, Credits, Reassembler};
use crate::engine::Token;
use crate::tcp::{Inner, pump};

/// The credit state both sides of the driver share.
#[derive(Debug)]
pub(super) struct TxCredits {
    pub(super) c: Credits,
    /// The connection task stopped posting for want of credit: wake it on a grant.
    pub(super) stalled: bool,
}

/// What the receive handler needs; owned by the connection task, which the handler reaches
/// through a weak reference (a dropped connection leaves the handler nothing to do).
pub(super) struct Rx {
    pub(super) inner: Weak<Inner>,
    pub(super) tok: Token,
    pub(super) qp: QueuePair,
    pub(super) ring: verbs::MemoryRegion,
    /// Receive buffers posted (`RdmaConfig::recv_bufs`).
    pub(super) ring_n: u32,
    pub(super) reasm: Mutex<Reassembler>,
    pub(super) credits: Arc<Mutex<TxCredits>>,
    /// The connection task's wake-up.
    pub(super) wake: Arc<Notify>,
    /// Set when a completion failed or a message was bad: the connection must go.
    pub(super) dead: AtomicBool,
    pub(super) failed: Notify,
    pub(super) ctr: Arc<CounterCells>,
    /// The runtime the stack runs on: rdma-core calls the handler from a thread of its own, and
    /// the engine's actions may spawn tasks.
    pub(super) rt: tokio::runtime::Handle,
}

impl Rx {
    /// Installs the handler on the QP's receive queue; `false` if it already had one.
    pub(super) fn install(self: &Arc<Self>) -> bool {
        let w = Arc::downgrade(self);
        self.qp.recv_cq().set_handler(Box::new(move |c| {
            if let Some(rx) = w.upgrade() {
                rx.on_completion(&c);
            }
        }))
    }

    fn on_completion(&self, c: &Completion) {
        if self.dead.load(Ordering::Acquire) {
            return;
        }
        let _rt = self.rt.enter();
        if let Err(why) = self.take(c) {
            tracing::debug!(
                tok = self.tok,
                why,
                "rds/rdma: receive side ends the connection"
            );
            self.dead.store(true, Ordering::Release);
            self.failed.notify_one();
        }
    }

    /// One receive completion.
    fn take(&self, c: &Completion) -> Result<(), &'static str> {
        if c.status != WcStatus::Success || c.opcode != WcOpcode::Recv {
            return Err("receive completion failed (flushed)");
        }
        let off = c.wr_id as usize * BUF_LEN;
        let len = c.byte_len as usize;
        if len > BUF_LEN || off + BUF_LEN > self.ring.len() {
            return Err("receive outside the ring");
        }
        // Reassembled straight from the ring (one copy, into the message), then the buffer
        // goes back to the receive queue.
        let out = self
            .ring
            .with_bytes(|ring| self.reasm.lock().on_send(&ring[off..off + len]))
            .map_err(|e| {
                tracing::warn!(%e, "rds/rdma: bad fragment, dropping connection");
                "bad fragment"
            })?;
        self.qp
            .post_recv(RecvWr::new(
                c.wr_id,
                self.ring.sge(off as u64, BUF_LEN as u32),
            ))
            .map_err(|_| "cannot re-post a receive buffer")?;
        CounterCells::add(&self.ctr.recvs, 1);
        let wake = {
            let mut cr = self.credits.lock();
            cr.c.posted();
            cr.c.grant(out.credit);
            tracing::trace!(tok = self.tok, len, grant = out.credit, credits = ?cr.c,
                "rds/rdma: recv");
            // Credits for a stopped sender (any: with one it may still send an ack-only or a
            // credit update, which may take the last credit), or enough buffers to advertise on
            // their own.
            let unstalled = cr.stalled && cr.c.can_send(true);
            if unstalled {
                cr.stalled = false;
            }
            unstalled || cr.c.wants_update(self.ring_n)
        };
        if let Some(m) = out.message {
            let Some(i) = self.inner.upgrade() else {
                return Err("stack gone");
            };
            let r = i.engine.lock().on_recv_bytes(Instant::now(), self.tok, m);
            if let Err(e) = r {
                tracing::warn!(%e, "rds/rdma: protocol error, dropping connection");
                return Err("protocol error");
            }
            // Delivery to the socket, and a wake-up of the connection task if the engine now
            // has something to send (an ack the message asked for).
            super::tx::IN_RECEIVE_HANDLER.set(true);
            pump(&i);
            super::tx::IN_RECEIVE_HANDLER.set(false);
        }
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }
}
