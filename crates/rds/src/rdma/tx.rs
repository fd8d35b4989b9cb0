//! The transmit side of an RDS-over-RDMA connection: the messages the engine queued, cut into
//! fragments and posted as Sends within the credits the peer granted.
//!
//! A pass ([`Tx::pass`]) takes the Send completions waiting, pulls what the engine has to send
//! and posts what credits and the send queue allow, in one post list (one vectored write on
//! soft-iWARP). An application that queues a message runs it at once when no other pass is
//! running ([`transmit`]); only when one is running elsewhere is the connection task woken for
//! the next. A request and its answer then cost no task wake-up for sending: with a task of its
//! own posting every Send, RDS over RDMA had its two runtime workers waking each other for
//! every batch (docs/performance.md, "Where RDS over RDMA loses"). What a receive handler makes
//! due (the ack a message asked for) is left to the connection task, which runs after the
//! applications the handler woke, so that their answers carry the ack instead of an ack-only
//! message per request.
//!
//! Send completions are taken by the next pass; the connection task waits for them only when
//! they are what holds the next Send back (half the send queue in flight, or an RDMA Read that
//! must complete before the Send naming it), so a completion wakes no task otherwise.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use verbs::{Access, Completion, CompletionQueue, QueuePair, SendWr, WcStatus};

use super::rx::TxCredits;
use super::{CounterCells, Fragment, Fragmenter, PendingOp, SQ_DEPTH, Splitter};
use crate::engine::Token;
use crate::tcp::{Inner, pump};

/// A Read posted ahead of the Send that must follow it.
struct HeldRead {
    wr_id: u64,
    sink: verbs::MemoryRegion,
    len: usize,
    done: Option<tokio::sync::oneshot::Sender<Bytes>>,
    frag: Fragment,
}

/// What only one pass at a time may touch.
#[derive(Default)]
pub(super) struct TxState {
    split: Splitter,
    outq: VecDeque<Fragment>,
    in_flight: usize,
    next_wr: u64,
    /// RDMA Reads: who waits for each (by rkey).
    read_waiters: HashMap<u32, tokio::sync::oneshot::Sender<Bytes>>,
    /// The Read whose Send waits for it (the Send that names the rkey goes out only once the
    /// Read completed, like Linux's RDS_RDMA_FENCE; nothing is posted behind it meanwhile,
    /// which keeps RDS's order).
    held: Option<HeldRead>,
}

impl TxState {
    /// Whether the next Send waits for a Send completion: the connection task must then wait
    /// for one rather than for the next pass to find it.
    pub(super) fn needs_completions(&self) -> bool {
        self.held.is_some() || self.in_flight >= SQ_DEPTH / 2
    }
}

/// One connection's transmit side, shared by its task and by [`transmit`].
pub(crate) struct Tx {
    pub(super) st: Mutex<TxState>,
    pub(super) qp: QueuePair,
    pub(super) scq: CompletionQueue,
    pub(super) credits: Arc<Mutex<TxCredits>>,
    /// Receive buffers posted (`RdmaConfig::recv_bufs`).
    pub(super) ring_n: u32,
    pub(super) ctr: Arc<CounterCells>,
    pub(super) tok: Token,
    pub(super) local: Ipv4Addr,
    /// The connection task's wake-up.
    pub(super) wake: Arc<Notify>,
    /// A pass found the connection broken: its task ends it.
    pub(super) dead: AtomicBool,
}

thread_local! {
    /// Set while a receive handler runs the engine's actions ([`super::rx`]).
    pub(super) static IN_RECEIVE_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Why a pass gave up on the connection.
#[derive(Debug)]
pub(super) struct Broken(pub(super) &'static str);

/// A pass for connection `tx` from the caller's context (the engine asked for a transmission),
/// unless one is running elsewhere: then the connection task runs the next one.
pub(crate) fn transmit(inner: &Arc<Inner>, tx: &Tx) {
    if IN_RECEIVE_HANDLER.get() {
        // What a received message makes due (mostly the ack it asked for) waits for the
        // connection task, which runs after the applications it woke: their answers then carry
        // the ack (h_ack) instead of an ack-only message each, and leave in one post list.
        tx.wake.notify_one();
        return;
    }
    let Some(mut st) = tx.st.try_lock() else {
        tx.wake.notify_one();
        return;
    };
    CounterCells::add(&tx.ctr.direct_passes, 1);
    if let Err(Broken(why)) = tx.pass(&mut st, inner) {
        tracing::debug!(
            tok = tx.tok,
            why,
            "rds/rdma: transmit side ends the connection"
        );
        tx.dead.store(true, Ordering::Release);
        tx.wake.notify_one();
    } else if st.needs_completions() {
        // The connection task waits for completions only when it looks: let it look.
        tx.wake.notify_one();
    }
}

impl Tx {
    /// One pass: completions, then the engine's messages, then the Sends credits allow.
    pub(super) fn pass(&self, st: &mut TxState, i: &Arc<Inner>) -> Result<(), Broken> {
        while let Some(c) = self.scq.try_next() {
            self.completed(st, &c)?;
        }
        self.pull(st, i)?;
        // (Delivers what the pull made due, such as room in the send buffer; a transmission it
        // asks for finds this pass running and wakes the connection task.)
        pump(i);
        self.post(st)
    }

    /// One Send completion.
    pub(super) fn completed(&self, st: &mut TxState, c: &Completion) -> Result<(), Broken> {
        if c.status != WcStatus::Success {
            return Err(Broken("send completion failed"));
        }
        st.in_flight = st.in_flight.saturating_sub(1);
        if st.held.as_ref().is_some_and(|h| h.wr_id == c.wr_id)
            && let Some(h) = st.held.take()
        {
            // The Read is done: hand its bytes over and let its Send go first.
            let data = h.sink.take(h.len).map_err(|_| Broken("RDMA Read sink"))?;
            if let Some(tx) = h.done {
                let _ = tx.send(data);
            }
            st.outq.push_front(h.frag);
        }
        Ok(())
    }

    /// Pulls messages from the engine while the queue is short.
    fn pull(&self, st: &mut TxState, i: &Inner) -> Result<(), Broken> {
        if st.outq.len() >= SQ_DEPTH {
            return Ok(());
        }
        let mut e = i.engine.lock();
        while st.outq.len() < SQ_DEPTH {
            let Some(b) = e.poll_transmit(self.tok) else {
                break;
            };
            st.split.push_bytes(b);
            loop {
                match st.split.next_msg() {
                    Ok(Some((h, p))) => {
                        let mut fr = Fragmenter::fragments(&h, &p);
                        // Facts: the RDMA op is posted before the Send that follows it (same
                        // QP, so it is placed first).
                        for x in &h.ext.items {
                            if let crate::wire::Extension::Rdma { rkey } = x
                                && let Some(op) = i.rdma_ops.lock().remove(rkey)
                                && let Some(f0) = fr.first_mut()
                            {
                                match op {
                                    PendingOp::Write(off, data) => {
                                        f0.write = Some((*rkey, off, data));
                                    }
                                    PendingOp::Read(off, len, tx) => {
                                        f0.read = Some((*rkey, off, len));
                                        st.read_waiters.insert(*rkey, tx);
                                    }
                                }
                            }
                        }
                        st.outq.extend(fr);
                    }
                    Ok(None) => break,
                    Err(err) => {
                        tracing::warn!(%err, "rds/rdma: engine stream");
                        return Err(Broken("engine stream"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Posts what credits allow, all in one list: soft-iWARP then frames every Send of this
    /// pass into one vectored write instead of one system call (or one writer-task wake-up) per
    /// Send. Posted under the pass's lock, so Sends leave in the order they were queued.
    fn post(&self, st: &mut TxState) -> Result<(), Broken> {
        let mut wrs: Vec<SendWr> = Vec::new();
        let mut failed = None;
        {
            let mut cr = self.credits.lock();
            while st.in_flight < SQ_DEPTH && st.held.is_none() {
                // A standalone credit update (ack-only header carrying h_credit) when at least
                // half the ring waits to be advertised. Only then: single-credit updates
                // bouncing between two blocked senders would keep the credits split into
                // 1-credit packets for ever.
                let front_is_update = st
                    .outq
                    .front()
                    .is_some_and(|f| f.first && f.payload.is_empty() && f.header.is_ack_only());
                if cr.c.wants_update(self.ring_n) && !front_is_update {
                    CounterCells::add(&self.ctr.credit_updates, 1);
                    st.outq.push_front(Fragment {
                        header: crate::wire::ack_only(0),
                        payload: Bytes::new(),
                        first: true,
                        write: None,
                        read: None,
                    });
                }
                let Some(f) = st.outq.front() else { break };
                let update = f.first
                    && f.payload.is_empty()
                    && f.header.is_ack_only()
                    && cr.c.unadvertised > 0;
                if !cr.c.can_send(update) {
                    // The receive handler wakes the connection task when credits arrive.
                    cr.stalled = true;
                    CounterCells::add(&self.ctr.credit_stalls, 1);
                    break;
                }
                let Some(mut f) = st.outq.pop_front() else {
                    break;
                };
                if let Some((rkey, off, len)) = f.read.take() {
                    let Ok(sink) = self
                        .qp
                        .pd()
                        .register_len((len as usize).max(1), Access::LOCAL_WRITE)
                    else {
                        failed = Some(Broken("cannot register an RDMA Read sink"));
                        break;
                    };
                    st.next_wr += 1;
                    wrs.push(SendWr::new(
                        st.next_wr,
                        verbs::SendOp::RdmaRead {
                            remote_addr: off,
                            rkey,
                        },
                        if len == 0 {
                            Vec::new()
                        } else {
                            vec![sink.sge(0, len)]
                        },
                    ));
                    st.in_flight += 1;
                    let done = st.read_waiters.remove(&rkey);
                    st.held = Some(HeldRead {
                        wr_id: st.next_wr,
                        sink,
                        len: len as usize,
                        done,
                        frag: f,
                    });
                    break;
                }
                if let Some((rkey, off, data)) = f.write.take() {
                    st.next_wr += 1;
                    wrs.push(SendWr {
                        wr_id: st.next_wr,
                        opcode: verbs::SendOp::RdmaWrite {
                            remote_addr: off,
                            rkey,
                        },
                        payload: verbs::Payload::Inline(data),
                        signaled: true,
                        solicited: false,
                    });
                    st.in_flight += 1;
                }
                let c = cr.c.take(f.first);
                let Ok(bytes) = f.encode(c) else {
                    failed = Some(Broken("cannot encode a fragment"));
                    break;
                };
                tracing::trace!(
                    local = %self.local,
                    tok = self.tok,
                    len = bytes.len(),
                    c,
                    credits = ?cr.c,
                    "rds/rdma: send"
                );
                st.next_wr += 1;
                wrs.push(SendWr::send_bytes(st.next_wr, bytes));
                CounterCells::add(&self.ctr.sends, 1);
                st.in_flight += 1;
            }
        }
        if !wrs.is_empty() {
            CounterCells::add(&self.ctr.post_calls, 1);
            self.qp
                .post_send_list(wrs)
                .map_err(|_| Broken("post_send failed"))?;
        }
        failed.map_or(Ok(()), Err)
    }
}
