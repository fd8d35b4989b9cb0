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
/// wait for the end of the batch of FPDUs being taken in and leave together, directly
/// ([`transmit_batch`]; `rpc bench` depth 64, RDMA ÷ TCP went from 0.96-1.06 to 1.04-1.24).
pub(crate) fn transmit_now(qp: &SoftQp) {
    if qp.batching.load(Ordering::Acquire) {
        // The reader is taking in a batch (this is most likely one of the completion handlers
        // it runs): it sends this with the rest of the batch's output (`transmit_batch`).
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
pub(crate) fn transmit_batch<R>(qp: &SoftQp, take: impl FnOnce() -> (bool, R)) -> R {
    qp.batching.store(true, Ordering::Release);
    let (send, r) = take();
    qp.batching.store(false, Ordering::Release);
    if send || qp.engine().has_tx() {
        transmit(qp, true);
    }
    r
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
