//! The transmit side of a soft-iWARP connection: MPA framing of the engine's segments into
//! pieces of the byte stream ([`fill`]), and the writer tasks that put them on the wire.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

use super::cm::DriverCtx;
use super::engine::Engine;
use super::tx::{TxPath, refresh_fpdu};
use crate::capture::Teed;
use crate::mem::MrInner;
use crate::wire::mpa::{frame_parts, pad_len};

/// Write half of a connection.
pub(crate) enum Out {
    Tcp(Teed<OwnedWriteHalf>),
    Mem(Teed<WriteHalf<DuplexStream>>),
}

/// A piece of the outgoing byte stream: owned bytes, or bytes still in a registered region.
pub(crate) enum Piece {
    B(Bytes),
    M(Arc<MrInner>, usize, usize),
}

impl Piece {
    pub(crate) fn len(&self) -> usize {
        match self {
            Piece::B(b) => b.len(),
            Piece::M(_, _, n) => *n,
        }
    }
    fn advance(&mut self, n: usize) {
        match self {
            Piece::B(b) => b.advance(n),
            Piece::M(_, off, len) => {
                *off += n;
                *len -= n;
            }
        }
    }
    fn to_bytes(&self) -> Bytes {
        match self {
            Piece::B(b) => b.clone(),
            Piece::M(m, off, len) => m.data.lock().bytes(*off..*off + *len),
        }
    }
}

/// Payloads up to this size are copied into their FPDU's single buffer by [`fill`].
const SMALL_FPDU_PAYLOAD: usize = 1024;

/// What [`fill`] left behind.
pub(crate) struct Filled {
    /// The engine is closing (a Terminate or a disconnect): shut the stream after the pieces.
    pub(crate) closing: bool,
    /// The engine has more to send than one fill takes (~2 MiB): fill again after writing.
    pub(crate) more: bool,
    /// This fill took a bulk transfer's worth (256 KiB or more): time to look at the MSS again.
    pub(crate) bulk: bool,
}

/// Moves what the engine has to send into `pieces` (at most ~2 MiB at a time).
pub(crate) fn fill(eng: &mut Engine, pieces: &mut VecDeque<Piece>, ctx: &DriverCtx) -> Filled {
    let mut bytes = 0usize;
    while pieces.len() < 1000 && bytes < (2 << 20) {
        let Some(s) = eng.poll_transmit() else { break };
        let (prefix, trailer) = match &s.mr_payload {
            // Zero-copy segments are only produced without CRC: the CRC field is zero.
            Some(_) => {
                let l = s.len();
                ((l as u16).to_be_bytes(), ([0u8; 8], pad_len(l) + 4))
            }
            None => frame_parts(&[&s.hdr, &s.payload], ctx.crc),
        };
        let (trailer, tl) = trailer;
        bytes += s.len() + 2 + tl;
        ctx.stats.fpdus_tx.fetch_add(1, Ordering::Relaxed);
        ctx.stats
            .bytes_tx
            .fetch_add((s.len() + 2 + tl) as u64, Ordering::Relaxed);
        if let Some((_, _, n)) = &s.mr_payload {
            ctx.stats
                .zero_copy_tx_bytes
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        if s.mr_payload.is_none() && s.payload.len() <= SMALL_FPDU_PAYLOAD {
            // A small FPDU (an RPC call or reply, an ack) is one piece: one allocation and one
            // iovec instead of three.
            let mut whole = BytesMut::with_capacity(2 + s.hdr.len() + s.payload.len() + tl);
            whole.extend_from_slice(&prefix);
            whole.extend_from_slice(&s.hdr);
            whole.extend_from_slice(&s.payload);
            whole.extend_from_slice(&trailer[..tl]);
            pieces.push_back(Piece::B(whole.freeze()));
            continue;
        }
        let mut head = BytesMut::with_capacity(2 + s.hdr.len());
        head.extend_from_slice(&prefix);
        head.extend_from_slice(&s.hdr);
        pieces.push_back(Piece::B(head.freeze()));
        if let Some((m, off, n)) = s.mr_payload {
            pieces.push_back(Piece::M(m, off, n));
        } else if !s.payload.is_empty() {
            pieces.push_back(Piece::B(s.payload));
        }
        // Without CRC the trailer (pad and CRC field) is all zeros: no allocation for it.
        let trailer = if trailer[..tl].iter().all(|&b| b == 0) {
            Bytes::from_static(&[0u8; 8][..tl])
        } else {
            Bytes::copy_from_slice(&trailer[..tl])
        };
        pieces.push_back(Piece::B(trailer));
    }
    Filled {
        closing: eng.closing,
        more: eng.has_tx(),
        bulk: bytes >= BULK_FILL,
    }
}

/// A fill of at least this many bytes is a bulk transfer (see [`Filled::bulk`]).
const BULK_FILL: usize = 256 << 10;

/// Writes as much of `pieces` as the socket takes without waiting. `Ok(true)` when all went.
pub(crate) fn try_write_pieces(
    s: &Teed<OwnedWriteHalf>,
    pieces: &mut VecDeque<Piece>,
) -> io::Result<bool> {
    while !pieces.is_empty() {
        let res = {
            let region = pieces.iter().take(512).find_map(|p| match p {
                Piece::M(m, ..) => Some(m.clone()),
                Piece::B(_) => None,
            });
            let guard = region.as_ref().map(|m| m.data.lock());
            // On the stack up to 64 iovecs: a small FPDU is one, and this runs once per
            // direct send (one heap allocation per message before, stop 38).
            let mut slices: SmallVec<[IoSlice<'_>; 64]> = SmallVec::new();
            for p in pieces.iter().take(512) {
                match p {
                    Piece::B(b) => slices.push(IoSlice::new(b)),
                    Piece::M(m, off, len) => match (&region, &guard) {
                        (Some(r), Some(g)) if Arc::ptr_eq(r, m) => {
                            slices.push(IoSlice::new(&g[*off..*off + *len]))
                        }
                        _ => break,
                    },
                }
            }
            s.try_write_vectored(&slices)
        };
        match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => advance_pieces(pieces, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The writer task of a TCP connection: sends what nobody could send directly, and waits for
/// the socket to drain when it is full. Vectored writes go straight from registered memory; a
/// region's lock is held only for one `try_write_vectored`, never across an await.
pub(crate) async fn tcp_writer_loop(tx: Arc<TxPath>) -> io::Result<()> {
    let ctx = &tx.ctx;
    let s: &TcpStream = tx.w.get_ref().as_ref();
    loop {
        let notified = ctx.qp.wake.notified();
        let (f, empty) = {
            let mut pieces = tx.pieces.lock();
            let f = fill(&mut ctx.engine(), &mut pieces, ctx);
            let empty = try_write_pieces(&tx.w, &mut pieces)?;
            (f, empty)
        };
        if f.bulk {
            refresh_fpdu(s, ctx);
        }
        if !empty {
            s.writable().await?;
        } else if f.more {
            // One fill's worth went out; there is more: fill again at once.
            tokio::task::yield_now().await;
        } else if f.closing {
            // Half-close the stream, as dropping the write half would.
            return s_shutdown(tx.w.get_ref());
        } else {
            notified.await;
            // Let the tasks that are ready to run post first (a batch of replies just woke
            // their callers): what they post then leaves in one vectored write instead of one
            // system call per message, like TCP's autocorking. Woken from a worker thread,
            // this task would otherwise run next, before any of them.
            tokio::task::yield_now().await;
        }
    }
}

fn s_shutdown(w: &OwnedWriteHalf) -> io::Result<()> {
    let sock = socket2::SockRef::from(w.as_ref());
    match sock.shutdown(std::net::Shutdown::Write) {
        Err(e) if e.kind() != io::ErrorKind::NotConnected => Err(e),
        _ => Ok(()),
    }
}

/// The writer task of an in-memory (loopback provider) connection.
pub(crate) async fn mem_writer_loop(
    mut w: Teed<WriteHalf<DuplexStream>>,
    ctx: &DriverCtx,
) -> io::Result<()> {
    let mut pieces: VecDeque<Piece> = VecDeque::new();
    loop {
        let notified = ctx.qp.wake.notified();
        let closing = {
            let mut e = ctx.engine();
            let closing = fill(&mut e, &mut pieces, ctx).closing;
            // Before the engine is released (see `SoftQp::send_queue_idle`).
            if !pieces.is_empty() {
                ctx.qp.mem_unwritten.store(true, Ordering::Release);
            }
            closing
        };
        if pieces.is_empty() {
            if closing {
                w.shutdown().await?;
                return Ok(());
            }
            notified.await;
            continue;
        }
        let mut chunks: VecDeque<Bytes> = pieces.drain(..).map(|p| p.to_bytes()).collect();
        write_chunks(&mut w, &mut chunks).await?;
        ctx.qp.mem_unwritten.store(false, Ordering::Release);
    }
}

fn advance_pieces(pieces: &mut VecDeque<Piece>, mut n: usize) {
    while n > 0 {
        let Some(f) = pieces.front_mut() else { break };
        if n >= f.len() {
            n -= f.len();
            pieces.pop_front();
        } else {
            f.advance(n);
            n = 0;
        }
    }
}

async fn write_chunks<W: AsyncWrite + Unpin>(
    w: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !chunks.is_empty() {
        let slices: Vec<IoSlice<'_>> = chunks.iter().take(512).map(|c| IoSlice::new(c)).collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(f) = chunks.front_mut() else { break };
            if n >= f.len() {
                n -= f.len();
                chunks.pop_front();
            } else {
                f.advance(n);
                n = 0;
            }
        }
    }
    w.flush().await
}
