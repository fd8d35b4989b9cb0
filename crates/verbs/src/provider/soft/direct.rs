//! Direct placement: the payload of a large tagged segment read from the socket straight into
//! its region, without passing through the reader's buffer; inside an RDMA Read's sink, the
//! Read's next segments are read ahead in the same `readv`.
//!
//! A 1 MiB Read Response is 16 FPDUs of 64 KiB. Placed one at a time, each costs at least one
//! `readv`, and on loopback the reader, as fast as the sender, catches up after most of them
//! and waits in `epoll_wait` (45 system calls per 1 MiB NFS WRITE against NFS over TCP's 6,
//! docs/performance.md, stop 41). A Read's sink is one contiguous range that nothing else may
//! be placed in before the Read completes, and whose contents are undefined until then, so the
//! reader may read ahead into it on the guess that the peer cut the rest of the Read into
//! segments as long as this one. Every guessed segment's header is checked when it has
//! arrived, by the engine's own `DirectTarget` check plus the MPA length; if one is not what
//! was guessed (another message in between, other sizes), what arrived from its header on is
//! copied back into the reader's buffer for the normal path, and the guessed part of the sink
//! is overwritten later by the real segments. RDMA Writes get no read-ahead: what follows a
//! Write's segment in its region may hold data the peer never targeted.

use std::io::{self, IoSliceMut, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use smallvec::{SmallVec, smallvec};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::cm::DriverCtx;
use super::tx::transmit_now;
use crate::mem::MrInner;
use crate::wire::ddp::{Segment, TAGGED_HDR_LEN};
use crate::wire::mpa::{Fpdu, pad_len};

/// Below this payload size a tagged segment is not worth placing directly from the socket.
pub(super) const DIRECT_MIN: usize = 8192;

/// An FPDU's length field and tagged DDP/RDMAP header (RFC 5044 §4.1, RFC 5041 §4.2).
const H: usize = 2 + TAGGED_HDR_LEN;

/// Most segments of one Read asked for in one `readv` after the one being placed: 1 MiB in
/// the 64 KiB FPDUs of a loopback MSS.
const READ_AHEAD: usize = 16;

// The runs of a plan (one payload, then a tail and a payload per segment read ahead, then a
// tail) fit `read_plan`'s iovecs on the stack.
const _: () = assert!(2 * READ_AHEAD + 2 <= 36);

/// A trailer (pad of up to 3 bytes and the 4-byte CRC field) and the next FPDU's header.
const TAIL: usize = 8 + H;

/// What [`place_direct`] did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placed {
    /// The last segment placed was not its message's last (RFC 5041 §4.2): the next FPDU is
    /// most likely the message's next segment.
    pub(super) continues: bool,
}

/// A tagged segment whose header has arrived and whose payload is being placed.
struct Placing {
    hdr: [u8; TAGGED_HDR_LEN],
    mr: Arc<MrInner>,
    at: At,
}

/// Where the stream is in the segment being placed.
#[derive(Debug, Clone, Copy)]
struct At {
    /// The segment's payload length.
    plen: usize,
    /// Offset in the region of the next payload byte to arrive, and how many are still to come.
    at: usize,
    left: usize,
    /// Bytes of the trailer (pad and CRC) still to come after the payload.
    trailer: usize,
    /// The Read's sink after this segment (the engine's `DirectTarget::read_rest`).
    read_rest: usize,
}

/// What one `readv` asks for, in stream order: the rest of the segment being placed and of its
/// trailer; then, for each segment read ahead, its header and payload and trailer; then a
/// look-ahead of one FPDU header, taken if it has arrived and never waited for.
struct Plan {
    /// Payload lengths of the segments read ahead: each as long as the one being placed, the
    /// last what remains of the Read (or of the look-ahead bound).
    ahead: SmallVec<[usize; READ_AHEAD]>,
    /// Trailer lengths: what is left of the placed segment's, then each read-ahead segment's.
    trailers: SmallVec<[usize; READ_AHEAD + 1]>,
}

/// One run of the stream: payload bytes in the region, or a tail buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Region { off: usize, len: usize },
    Tail { idx: usize, len: usize },
}

impl Plan {
    fn new(p: &At, region_len: usize) -> Plan {
        let mut ahead = SmallVec::new();
        let mut trailers = smallvec![p.trailer];
        let mut rest = p.read_rest;
        // The guessed segments must lie in the region; the engine's checks at the Read's post
        // ensure it, and a sink that did not would only lose the read-ahead.
        let room = region_len.saturating_sub(p.at + p.left);
        if rest <= room && p.plen > 0 {
            while rest > 0 && ahead.len() < READ_AHEAD {
                let n = p.plen.min(rest);
                ahead.push(n);
                trailers.push(pad_len(TAGGED_HDR_LEN + n) + 4);
                rest -= n;
            }
        }
        Plan { ahead, trailers }
    }

    /// The runs of the stream this plan reads, in order.
    fn runs(&self, p: &At) -> impl Iterator<Item = Run> + '_ {
        let mut off = p.at + p.left;
        let first = Run::Region {
            off: p.at,
            len: p.left,
        };
        std::iter::once(first).chain((0..=self.ahead.len()).flat_map(move |i| {
            let tail = Run::Tail {
                idx: i,
                len: self.trailers[i] + H,
            };
            let payload = self.ahead.get(i).map(|&n| {
                let r = Run::Region { off, len: n };
                off += n;
                r
            });
            std::iter::once(tail).chain(payload)
        }))
    }

    /// The bytes that must arrive before anything is placed: the payload and trailer of the
    /// segment being placed.
    fn required(&self, p: &At) -> usize {
        p.left + self.trailers[0]
    }

    /// Bytes from the start of the plan to the end of the region's runs.
    fn span(&self, p: &At) -> usize {
        p.left + self.ahead.iter().sum::<usize>()
    }

    /// All the bytes the plan asks for.
    #[cfg(test)]
    fn total(&self, p: &At) -> usize {
        self.span(p) + self.trailers.iter().map(|t| t + H).sum::<usize>()
    }
}

/// Reads what `plan` asks for, from `got` bytes into it on, without waiting.
fn read_plan(
    s: &TcpStream,
    region: &mut [u8],
    tails: &mut [[u8; TAIL]; READ_AHEAD + 1],
    p: &At,
    plan: &Plan,
    got: usize,
) -> io::Result<usize> {
    let Some(mut payload) = region.get_mut(p.at..p.at + plan.span(p)) else {
        return Err(io::ErrorKind::InvalidData.into());
    };
    let mut iov: SmallVec<[IoSliceMut<'_>; 36]> = SmallVec::new();
    let mut tails = tails.iter_mut();
    for run in plan.runs(p) {
        match run {
            Run::Region { len, .. } => {
                let (a, b) = std::mem::take(&mut payload).split_at_mut(len);
                payload = b;
                iov.push(IoSliceMut::new(a));
            }
            Run::Tail { len, .. } => match tails.next() {
                Some(t) => iov.push(IoSliceMut::new(&mut t[..len])),
                None => return Err(io::ErrorKind::InvalidData.into()),
            },
        }
    }
    let mut rest = &mut iov[..];
    IoSliceMut::advance_slices(&mut rest, got);
    let asked: usize = rest.iter().map(|b| b.len()).sum();
    // A read that takes less than it asked for found the socket empty: it reports
    // `WouldBlock` to tokio from inside `try_io`, which then clears the readiness it saw before
    // the read, as its own `poll_read` does after a short read. The reader's next read then
    // waits for epoll instead of first failing with EAGAIN, and data that came after the read
    // is still seen (its readiness event is newer than the one cleared). (Clearing after the
    // read returned, with the readiness of that later moment, lost such data's wake-up.)
    let mut short = None;
    let r = s.try_io(Interest::READABLE, || {
        let n = (&*socket2::SockRef::from(s)).read_vectored(rest)?;
        if n > 0 && n < asked {
            short = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (r, short) {
        (_, Some(n)) => Ok(n),
        (r, None) => r,
    }
}

/// Appends to `buf` the plan's stream bytes `from..to` (wherever they were read to).
fn copy_back(
    buf: &mut BytesMut,
    region: &[u8],
    tails: &[[u8; TAIL]; READ_AHEAD + 1],
    p: &At,
    plan: &Plan,
    (from, to): (usize, usize),
) {
    let mut pos = 0usize;
    for run in plan.runs(p) {
        let bytes: &[u8] = match run {
            Run::Region { off, len } => &region[off..off + len],
            Run::Tail { idx, len } => &tails[idx][..len],
        };
        let (start, end) = (pos, pos + bytes.len());
        pos = end;
        let (a, b) = (from.max(start), to.min(end));
        if a < b {
            buf.extend_from_slice(&bytes[a - start..b - start]);
        }
        if pos >= to {
            break;
        }
    }
}

/// If `buf` starts with the header of a large tagged segment whose payload has not fully arrived,
/// read that payload from the socket straight into the target region, and with it (one
/// `readv`) the segment's trailer and the next FPDU's header, which is left in `buf`: in a
/// stream of RDMA Write or Read Response segments every one after the first is then placed
/// directly. Inside a Read's sink the Read's next segments come in the same `readv` (see the
/// module's documentation). `None` if the normal path applies.
pub(super) async fn place_direct(
    s: &TcpStream,
    buf: &mut BytesMut,
    ctx: &DriverCtx,
) -> io::Result<Option<Placed>> {
    let Ok(f) = Fpdu::new_checked(&buf[..]) else {
        return Ok(None);
    };
    let ulen = f.ulpdu_len();
    if ulen < TAGGED_HDR_LEN + DIRECT_MIN || f.is_complete() {
        return Ok(None);
    }
    // A tagged segment whose whole header (RFC 5041 §4.2) has arrived.
    let hdr: [u8; TAGGED_HDR_LEN] = match Segment::new_checked(f.ulpdu()).map(|s| {
        s.is_tagged()
            .then(|| s.header())
            .flatten()
            .map(<[u8; TAGGED_HDR_LEN]>::try_from)
    }) {
        Ok(Some(Ok(h))) => h,
        _ => return Ok(None),
    };
    let plen = ulen - TAGGED_HDR_LEN;
    let have = (buf.len() - H).min(plen);
    let Some(t) = ctx.engine().direct_target(&hdr, plen) else {
        return Ok(None);
    };
    t.mr.data.lock().make_mut()[t.off..t.off + have].copy_from_slice(&buf[H..H + have]);
    let trailer_have = buf.len() - H - have;
    buf.clear();
    let mut p = Placing {
        hdr,
        mr: t.mr,
        at: At {
            plen,
            at: t.off + have,
            left: plen - have,
            trailer: pad_len(ulen) + 4 - trailer_have,
            read_rest: t.read_rest,
        },
    };
    let mut tails = [[0u8; TAIL]; READ_AHEAD + 1];
    let mut send = false;
    let continues = loop {
        let plan = Plan::new(&p.at, p.mr.data.lock().len());
        let required = plan.required(&p.at);
        let mut got = 0usize;
        while got < required {
            s.readable().await?;
            loop {
                let r = {
                    let mut d = p.mr.data.lock();
                    read_plan(s, d.make_mut(), &mut tails, &p.at, &plan, got)
                };
                match r {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(k) => {
                        got += k;
                        ctx.stats.bytes_rx.fetch_add(k as u64, Ordering::Relaxed);
                        if got >= required {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        ctx.qp.direct_armed.store(true, Ordering::Release);
        let t = take_in(&p, &plan, &tails, got, buf, ctx);
        send |= ctx.engine().has_tx();
        ctx.stats
            .direct_rx_bytes
            .fetch_add(t.placed as u64, Ordering::Relaxed);
        ctx.stats
            .read_ahead_rx_bytes
            .fetch_add(t.ahead as u64, Ordering::Relaxed);
        ctx.stats.fpdus_rx.fetch_add(t.segments, Ordering::Relaxed);
        match t.next {
            Some(n) => p = n,
            None => break t.continues,
        }
    };
    if send {
        transmit_now(&ctx.qp);
    }
    Ok(Some(Placed { continues }))
}

/// Whether a tagged header has the Last flag (RFC 5041 §4.2).
fn is_last(hdr: &[u8; TAGGED_HDR_LEN]) -> bool {
    Segment::new_checked(&hdr[..]).is_ok_and(|s| s.is_last())
}

/// Takes in the `got` bytes a plan's reads brought: the placed segment, then each read-ahead
/// segment whose header is the one guessed. Whatever arrived that is not placed (a look-ahead
/// header, a header not as guessed and all after it) is appended to `buf`.
fn take_in(
    p: &Placing,
    plan: &Plan,
    tails: &[[u8; TAIL]; READ_AHEAD + 1],
    got: usize,
    buf: &mut BytesMut,
    ctx: &DriverCtx,
) -> TakenIn {
    let a = &p.at;
    ctx.engine().on_placed(&p.hdr, a.plen);
    let mut r = TakenIn {
        next: None,
        placed: a.left,
        ahead: 0,
        segments: 1,
        continues: !is_last(&p.hdr),
    };
    // Stream position of the next header, and where the next segment's payload would go.
    let mut pos = plan.required(a);
    let mut off = a.at + a.left;
    for i in 0..=plan.ahead.len() {
        let tail = &tails[i][plan.trailers[i]..plan.trailers[i] + H];
        let arrived = got.saturating_sub(pos).min(H);
        let Some(&n) = plan.ahead.get(i).filter(|_| arrived == H) else {
            // The look-ahead, or a header cut short: the normal path takes it from `buf`.
            buf.extend_from_slice(&tail[..arrived]);
            break;
        };
        let hdr: [u8; TAGGED_HDR_LEN] = match tail[2..].try_into() {
            Ok(h) => h,
            Err(_) => unreachable!("a tail holds a whole header"),
        };
        let target = (usize::from(u16::from_be_bytes([tail[0], tail[1]])) == TAGGED_HDR_LEN + n)
            .then(|| ctx.engine().direct_target(&hdr, n))
            .flatten()
            .filter(|t| Arc::ptr_eq(&t.mr, &p.mr) && t.off == off);
        let Some(t) = target else {
            // Not the segment guessed: everything from its header on goes the normal way.
            copy_back(buf, &p.mr.data.lock(), tails, a, plan, (pos, got));
            break;
        };
        pos += H;
        let have = got.saturating_sub(pos).min(n);
        pos += have;
        let trailer = plan.trailers[i + 1];
        let trailer_have = got.saturating_sub(pos).min(trailer);
        if have < n || trailer_have < trailer {
            // The bytes ended inside this segment: it is the one being placed now.
            let next = Placing {
                hdr,
                mr: t.mr,
                at: At {
                    plen: n,
                    at: off + have,
                    left: n - have,
                    trailer: trailer - trailer_have,
                    read_rest: t.read_rest,
                },
            };
            r.next = Some(next);
            r.placed += have;
            r.ahead += have;
            return r;
        }
        pos += trailer;
        ctx.engine().on_placed(&hdr, n);
        r.placed += n;
        r.ahead += n;
        r.segments += 1;
        r.continues = !is_last(&hdr);
        off += n;
    }
    r
}

/// What [`take_in`] found.
struct TakenIn {
    /// The segment still being placed, if the bytes ended inside one that checked out.
    next: Option<Placing>,
    /// Payload bytes placed, and of those the ones read ahead; segments done.
    placed: usize,
    ahead: usize,
    segments: u64,
    /// The last segment done was not its message's last.
    continues: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placing(left: usize, trailer: usize, plen: usize, read_rest: usize) -> At {
        At {
            plen,
            at: 100,
            left,
            trailer,
            read_rest,
        }
    }

    #[test]
    fn a_write_or_a_reads_last_segment_reads_only_itself_and_a_header() {
        let p = placing(500, 4, 9000, 0);
        let plan = Plan::new(&p, 1 << 20);
        assert!(plan.ahead.is_empty());
        assert_eq!(plan.required(&p), 504);
        let runs: Vec<Run> = plan.runs(&p).collect();
        assert_eq!(
            runs,
            [
                Run::Region { off: 100, len: 500 },
                Run::Tail { idx: 0, len: 4 + H }
            ]
        );
    }

    #[test]
    fn the_rest_of_a_read_is_guessed_in_segments_as_long_as_this_one() {
        // 9000-byte segments (ULPDU 9014: pad 0); 20,001 bytes of the Read after this one.
        let p = placing(8000, 4, 9000, 20_001);
        let plan = Plan::new(&p, 1 << 20);
        assert_eq!(&plan.ahead[..], [9000, 9000, 2001]);
        // A 2001-byte payload: ULPDU 2015, 2 + 2015 + 3 pad ≡ 0 mod 4.
        assert_eq!(&plan.trailers[..], [4, 4, 4, 7]);
        let runs: Vec<Run> = plan.runs(&p).collect();
        assert_eq!(
            runs,
            [
                Run::Region {
                    off: 100,
                    len: 8000
                },
                Run::Tail { idx: 0, len: 4 + H },
                Run::Region {
                    off: 8100,
                    len: 9000
                },
                Run::Tail { idx: 1, len: 4 + H },
                Run::Region {
                    off: 17_100,
                    len: 9000
                },
                Run::Tail { idx: 2, len: 4 + H },
                Run::Region {
                    off: 26_100,
                    len: 2001
                },
                Run::Tail { idx: 3, len: 7 + H },
            ]
        );
        assert_eq!(plan.span(&p), 8000 + 20_001);
        let runs_len: usize = runs
            .iter()
            .map(|r| match r {
                Run::Region { len, .. } | Run::Tail { len, .. } => *len,
            })
            .sum();
        assert_eq!(plan.total(&p), runs_len);
        assert_eq!(runs_len, 8000 + 20_001 + 3 * (4 + H) + 7 + H);
    }

    #[test]
    fn read_ahead_is_bounded_and_stays_in_the_region() {
        let p = placing(0, 4, 65_000, 10 << 20);
        assert_eq!(Plan::new(&p, 11 << 20).ahead.len(), READ_AHEAD);
        // A sink that would end past the region (never made by the engine): no read-ahead.
        assert!(Plan::new(&p, 1 << 20).ahead.is_empty());
    }

    #[test]
    fn copy_back_takes_a_stream_range_from_wherever_it_was_read() {
        let p = placing(3, 4, 9000, 5);
        let plan = Plan::new(&p, 1 << 20);
        assert_eq!(&plan.ahead[..], [5]);
        let mut region = vec![0u8; 200];
        region[100..103].copy_from_slice(b"abc");
        region[103..108].copy_from_slice(b"VWXYZ");
        let mut tails = [[0u8; TAIL]; READ_AHEAD + 1];
        for (i, t) in tails.iter_mut().enumerate() {
            for (j, b) in t.iter_mut().enumerate() {
                *b = (i * 40 + j) as u8;
            }
        }
        // The stream: abc | tail 0 (4 + 16) | VWXYZ | tail 1 (pad 3 + 4 + 16).
        let mut buf = BytesMut::new();
        copy_back(&mut buf, &region, &tails, &p, &plan, (5, 3 + 20 + 2));
        let mut want = tails[0][2..20].to_vec();
        want.extend_from_slice(b"VW");
        assert_eq!(&buf[..], &want[..]);
    }
}
