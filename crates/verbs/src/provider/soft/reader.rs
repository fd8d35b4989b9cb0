//! The receive side of a soft-iWARP connection: reads the stream, takes FPDUs apart
//! ([`crate::wire::mpa::FpduDecoder`]) and hands their ULPDUs to the engine, or reads a large
//! tagged payload from the socket straight into its region.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, DuplexStream, ReadBuf, ReadHalf};
use tokio::net::tcp::OwnedReadHalf;

use super::cm::DriverCtx;
use super::direct::{DIRECT_MIN, place_direct};
use super::tx::transmit_batch;
use crate::capture::{Dir, Ticket};
use crate::wire::ddp::Segment;
use crate::wire::ddp::{TAGGED_HDR_LEN, term};
use crate::wire::mpa::{Fpdu, FpduDecoder};

/// Read half of a connection.
pub(crate) enum In {
    Tcp(OwnedReadHalf),
    Mem(ReadHalf<DuplexStream>),
}

impl AsyncRead for In {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            In::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            In::Mem(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

pub(crate) async fn reader_loop(mut r: In, mut buf: BytesMut, ctx: &DriverCtx) -> io::Result<()> {
    let mut dec = FpduDecoder::new(ctx.crc);
    // Direct placement needs the raw socket, no CRC (the CRC must be checked before placing,
    // RFC 5044 §4.1) and no capture (which records the bytes it reads).
    let direct = matches!(r, In::Tcp(_)) && !ctx.crc && !ctx.tee.is_on();
    // With a capture, what a read brought is frozen, its FPDUs taken from it without a copy,
    // and only then copied into the capture (in the place reserved for it when the read
    // returned, stamped then): the copy does not delay the completions.
    let deferred = ctx.tee.is_on();
    let mut frozen: Option<Bytes> = None;
    let mut unrecorded: Option<(Ticket, Bytes)> = None;
    // The last FPDU taken was a large tagged segment with more of its message to come: the
    // next one is most likely another, so read only its header and place it directly.
    let mut bulk = false;
    // An RDMA Read of ours is waiting for its response, none of which has come: the next bytes
    // are most likely its first segment, which is then placed directly from its header on
    // (with the Read's later segments read ahead), rather than copied through `buf`.
    let mut awaiting = false;
    loop {
        transmit_batch(&ctx.qp, deferred, || {
            loop {
                if direct
                    && let Ok(f) = Fpdu::new_checked(&buf[..])
                    && let Ok(seg) = Segment::new_checked(f.ulpdu())
                {
                    // A tagged segment with more of its message to come (RFC 5041 §4.2).
                    bulk = seg.is_tagged()
                        && !seg.is_last()
                        && f.ulpdu_len() >= TAGGED_HDR_LEN + DIRECT_MIN;
                }
                // The engine lock is taken per FPDU, not per read: posters on other threads wait
                // for one placement at most, and completion handlers run between FPDUs.
                let decoded = match frozen.as_mut() {
                    Some(f) => dec.decode_frozen(f),
                    None => dec.decode(&mut buf),
                };
                let mut eng = ctx.engine();
                let more = !eng.closing
                    && match decoded {
                        Ok(Some(u)) => {
                            ctx.stats.fpdus_rx.fetch_add(1, Ordering::Relaxed);
                            eng.on_ulpdu(&u);
                            true
                        }
                        Ok(None) => false,
                        Err(_) => {
                            // RFC 5044 §8: a CRC error is fatal; report it with a Terminate.
                            eng.on_llp_error(term::MPA_CRC);
                            false
                        }
                    };
                if !more {
                    let out = eng.has_tx() || eng.closing;
                    awaiting = direct && eng.awaits_read_response(DIRECT_MIN);
                    drop(eng);
                    // Everything this read brought has been taken in: record it, before
                    // anything is sent in answer.
                    if let Some((t, b)) = unrecorded.take() {
                        ctx.tee.fill(t, &b);
                    }
                    // A partial FPDU waits in `buf` for the rest.
                    if let Some(f) = frozen.take() {
                        buf.extend_from_slice(&f);
                    }
                    // Read Responses, Terminates and replies: out from this task when the queue
                    // is idle.
                    break (out, ());
                }
            }
        });
        if let (true, In::Tcp(tcp)) = (direct, &r)
            && let Some(placed) = place_direct(tcp.as_ref(), &mut buf, ctx).await?
        {
            bulk = placed.continues;
            continue;
        }
        if buf.capacity() - buf.len() < ctx.rx_chunk {
            buf.reserve(ctx.rx_chunk);
        }
        let limit = if direct && (bulk || awaiting) && buf.is_empty() {
            (2 + TAGGED_HDR_LEN) as u64
        } else {
            ctx.rx_chunk as u64
        };
        let n = (&mut r).take(limit).read_buf(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if deferred && let Some(t) = ctx.tee.reserve(Dir::In, n) {
            let all = buf.split().freeze();
            unrecorded = Some((t, all.slice(all.len() - n..)));
            frozen = Some(all);
        }
        ctx.qp.direct_armed.store(true, Ordering::Release);
        ctx.stats.bytes_rx.fetch_add(n as u64, Ordering::Relaxed);
        // After a Terminate nothing more is placed; keep reading until the peer closes.
        if ctx.engine().closing {
            buf.clear();
            frozen = None;
        }
    }
}
