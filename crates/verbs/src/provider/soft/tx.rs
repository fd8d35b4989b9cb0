//! Transmit scheduling of soft-iWARP: who puts what the engine has to send on the wire, and
//! when — the poster's thread directly, the reader at the end of a batch, or the writer task.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

use super::cm::DriverCtx;
use super::writer::{Piece, fill, try_write_pieces};
use super::{SoftQp, TxSchedule};
use crate::capture::Teed;

/// The largest FPDU for the connection's current MSS, rounded down to a multiple of 8, as siw
/// sizes its FPDUs (RFC 5044 §5: an FPDU should fit the TCP segment; MULPDU follows the EMSS).
pub(crate) fn fpdu_for_mss(s: &TcpStream, cap: usize) -> usize {
    let mss = socket2::SockRef::from(s)
        .tcp_mss()
        .map_or(1460, |m| m as usize);
    (mss.min(cap) & !7).max(64)
}

/// Follow the MSS, as siw does before each work request (`siw_update_tcpseg`): on loopback it
/// starts at half its final size (32,741 against 65,483 once the window has opened), and an
/// FPDU size fixed at connection time kept bulk transfers at twice the FPDUs they need. Asked
/// only after bulk fills: a system call per small message would cost more than it saves.
pub(crate) fn refresh_fpdu(s: &TcpStream, ctx: &DriverCtx) {
    let fpdu = fpdu_for_mss(s, ctx.fpdu_cap);
    // ULPDU + 2-byte length + 4-byte CRC; a multiple of 8, so no pad.
    ctx.engine().set_max_ulpdu(fpdu - 6);
}

/// The transmit side of a connection over TCP. Whoever holds `pieces` owns the stream's write
/// order: the writer task, or a thread that posted a WR (or the reader, for Read Responses and
/// Terminates) and found the queue idle.
pub(crate) struct TxPath {
    pub(crate) w: Teed<OwnedWriteHalf>,
    pub(crate) pieces: Mutex<VecDeque<Piece>>,
    pub(crate) ctx: Arc<DriverCtx>,
}

/// Puts what the engine has to send on the wire from the caller's context when the transmit
/// queue is idle, like Linux siw, which sends from `siw_post_send` when the SQ is not already
/// being processed (`siw_sq_start` otherwise). A round trip then costs no task wake-ups for
/// sending. Whatever cannot be written at once (the socket is full) is left queued in order for
/// the writer task, which is woken for it; so is everything when another thread is writing.
///
/// Only the first transmission after bytes arrived goes directly: request/response traffic
/// (one message answers another) then never waits for the writer task, while a burst of posts
/// (pipelined calls, replies to a batch of calls read at once, bulk writes) still leaves through
/// the writer task, which sends it with few vectored writes instead of one system call per
/// message. Measured with `oxrdma rpc bench --self`: direct for every post doubled NULL calls/s
/// at depth 1 but lost a fifth at depth 64; this rule keeps the first and not the second.
/// Posts that completion handlers make on the receive task itself are different again: they
/// may be held while the batch of FPDUs is taken in, to leave together, directly
/// ([`transmit_batch`]; `rpc bench` depth 64, RDMA ÷ TCP went from 0.96-1.06 to 1.04-1.24),
/// but for no longer than [`SoftQp::batch_hold_ns`] ([`flush_mid_batch`]).
pub(crate) fn transmit_now(qp: &SoftQp) {
    if qp.batching.load(Ordering::Acquire) {
        // The reader is taking in a batch (this is most likely one of the completion handlers
        // it runs): this leaves with the rest of the batch's output (`transmit_batch`), unless
        // it has waited long enough already.
        if flush_mid_batch(qp) {
            transmit(qp, true);
        }
        return;
    }
    let armed = qp.direct_armed.swap(false, Ordering::AcqRel) || qp.tx == TxSchedule::Direct;
    transmit(qp, armed);
}

/// Run `take` (the reader's pass over what one read brought) with posts for `qp` held back,
/// then send everything it produced (replies that handlers posted, Read Responses, Terminates)
/// from this thread in one vectored write. A server that read 64 calls at once answers them
/// with one `writev` and no writer-task wake-up. `take` returns whether the engine has output.
///
/// The engine delivers the batch's completions through its outbox as each FPDU is taken in,
/// so the handlers' posts happen inside `take`, while `batching` is set. A post from another
/// thread in that window is held back too and leaves with the batch: `batching` is cleared
/// before the engine is asked for output, and a poster that saw it set had already queued its
/// work under the engine lock.
///
/// Holding everything to the end of the batch cost overlap where each call is expensive: a
/// server that took 4 NFS READs in one read answered none of them before it had done all 4,
/// so its client had nothing to do meanwhile, and then everything at once. So output is held
/// only for [`SoftQp::batch_hold_ns`] ([`flush_mid_batch`]), or for the whole batch with
/// `hold_all` (a capture is on: what was read is recorded before anything answers it).
pub(crate) fn transmit_batch<R>(
    qp: &SoftQp,
    hold_all: bool,
    take: impl FnOnce() -> (bool, R),
) -> R {
    qp.batch_hold_all.store(hold_all, Ordering::Relaxed);
    qp.batch_posts.store(0, Ordering::Relaxed);
    qp.batching.store(true, Ordering::Release);
    let (send, r) = take();
    qp.batching.store(false, Ordering::Release);
    if send || qp.engine().has_tx() {
        transmit(qp, true);
    }
    r
}

/// Nanoseconds on a clock private to this module (its epoch is its first reading).
pub(crate) fn clock_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let e = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(e.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a post made while a batch is taken in leaves now rather than with the batch's end.
/// The first two posts of a batch leave at once (with no clock read: a batch of one call is
/// the common case, and in the lab guest a clock read is a system call); from the third on,
/// a post leaves once [`SoftQp::batch_hold_ns`] has passed since output last left, taking
/// what was held with it. With a hold of zero every post leaves at once; cheap calls read
/// together still share `writev`s of up to the hold's worth of answers.
fn flush_mid_batch(qp: &SoftQp) -> bool {
    if qp.batch_hold_all.load(Ordering::Relaxed) {
        return false;
    }
    let n = qp.batch_posts.fetch_add(1, Ordering::Relaxed);
    let mark = qp.batch_mark.load(Ordering::Relaxed);
    let (go, new_mark) = batch_decision(n, qp.batch_hold_ns, mark, clock_ns);
    if let Some(m) = new_mark {
        qp.batch_mark.store(m, Ordering::Relaxed);
    }
    go
}

/// [`flush_mid_batch`]'s rule for the post that `n` posts of the batch came before: whether
/// it leaves now, and the new mark (when output last left) if the clock was read. `now` is
/// read only when the rule needs it.
fn batch_decision(
    n: u32,
    hold_ns: u64,
    mark: u64,
    now: impl FnOnce() -> u64,
) -> (bool, Option<u64>) {
    match n {
        0 => (true, None),
        _ if hold_ns == 0 => (true, None),
        1 => (true, Some(now())),
        _ => {
            let t = now();
            if t.saturating_sub(mark) < hold_ns {
                (false, None)
            } else {
                (true, Some(t))
            }
        }
    }
}

/// Transmit from this thread if `direct` and the queue is idle; otherwise wake the writer.
fn transmit(qp: &SoftQp, direct: bool) {
    let tx = if direct && qp.tx != TxSchedule::WriterTask {
        qp.direct_tx.lock().clone()
    } else {
        None
    };
    let Some(tx) = tx else {
        qp.wake.notify_one();
        return;
    };
    let Some(mut pieces) = tx.pieces.try_lock() else {
        qp.wake.notify_one();
        return;
    };
    if !pieces.is_empty() {
        // The writer task is waiting for the socket to drain; it will pick this up.
        qp.wake.notify_one();
        return;
    }
    let before = tx.ctx.stats.fpdus_tx.load(Ordering::Relaxed);
    let f = fill(&mut tx.ctx.engine(), &mut pieces, &tx.ctx);
    let n = tx.ctx.stats.fpdus_tx.load(Ordering::Relaxed) - before;
    tx.ctx.stats.direct_tx_fpdus.fetch_add(n, Ordering::Relaxed);
    // On an error the writer task meets the same error on its next write and tears down.
    let done = try_write_pieces(&tx.w, &mut pieces).unwrap_or_default();
    if f.bulk {
        refresh_fpdu(tx.w.get_ref().as_ref(), &tx.ctx);
    }
    // The rest of a large post (beyond one fill), a full socket, or the close: the writer
    // task's job, not the poster's.
    if !done || f.more || f.closing {
        qp.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::batch_decision;

    fn no_clock() -> u64 {
        panic!("the clock was read")
    }

    #[test]
    fn the_first_two_posts_of_a_batch_leave_at_once() {
        assert_eq!(batch_decision(0, 5_000, 0, no_clock), (true, None));
        // The second reads the clock, to time the posts after it.
        assert_eq!(batch_decision(1, 5_000, 0, || 100), (true, Some(100)));
    }

    #[test]
    fn later_posts_wait_for_the_hold_since_output_last_left() {
        assert_eq!(batch_decision(2, 5_000, 100, || 4_000), (false, None));
        assert_eq!(batch_decision(3, 5_000, 100, || 5_099), (false, None));
        assert_eq!(batch_decision(4, 5_000, 100, || 5_100), (true, Some(5_100)));
        assert_eq!(
            batch_decision(9, 5_000, 5_100, || 40_000),
            (true, Some(40_000))
        );
    }

    #[test]
    fn a_hold_of_zero_sends_every_post_without_reading_the_clock() {
        for n in 0..10 {
            assert_eq!(batch_decision(n, 0, 0, no_clock), (true, None));
        }
    }
}
