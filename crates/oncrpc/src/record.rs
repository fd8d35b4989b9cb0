//! TCP record marking (RFC 5531 §11).
//!
//! On a byte stream each RPC message is a *record* made of one or more *fragments*. Every
//! fragment starts with a four-byte big-endian header: the high bit says whether this is the
//! last fragment of the record, the low 31 bits give the fragment's length in bytes.
//!
//! [`RecordDecoder`] is sans-IO: the driver appends whatever bytes it read to a [`BytesMut`] and
//! calls [`RecordDecoder::decode`] until it returns `Ok(None)`. A record that arrives as a single
//! fragment comes out as a zero-copy slice of the read buffer; only multi-fragment records are
//! reassembled by copying. A record larger than the configured maximum is a typed error, never
//! an allocation.
//!
//! [`frame`] and [`write_record`] go the other way: they put the fragment header(s) in front of
//! an [`xdr::Encoded`] gather list without copying its parts, and write the result with vectored
//! writes.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use xdr::Encoded;

/// RFC 5531 §11: the high bit of the fragment header marks the last fragment of a record.
pub const LAST_FRAGMENT: u32 = 0x8000_0000;
/// RFC 5531 §11: the fragment length is the low 31 bits of the header.
pub const MAX_FRAGMENT_LEN: usize = 0x7fff_ffff;
/// Default maximum record size accepted by [`RecordDecoder::default`]: enough for a 1 MiB NFS
/// READ or WRITE plus headers.
pub const DEFAULT_MAX_RECORD: usize = 4 << 20;

/// Errors decoding a record-marked stream. After an error the stream is out of sync and the
/// connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The record (the sum of its fragments so far) exceeds the configured maximum.
    #[error("RPC record of at least {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    /// The decoder already failed; the stream cannot be resynchronised.
    #[error("record-marking stream is out of sync after an earlier error")]
    Poisoned,
}

#[derive(Debug, Clone, Copy)]
struct Fragment {
    len: usize,
    last: bool,
}

/// Sans-IO record-marking decoder (RFC 5531 §11).
#[derive(Debug)]
pub struct RecordDecoder {
    max_record: usize,
    /// The header of the fragment being received, once read.
    fragment: Option<Fragment>,
    /// Earlier fragments of a multi-fragment record.
    partial: BytesMut,
    poisoned: bool,
}

impl Default for RecordDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RECORD)
    }
}

impl RecordDecoder {
    /// A decoder that rejects records longer than `max_record` bytes.
    pub fn new(max_record: usize) -> Self {
        RecordDecoder {
            max_record,
            fragment: None,
            partial: BytesMut::new(),
            poisoned: false,
        }
    }

    /// The maximum record size.
    pub fn max_record(&self) -> usize {
        self.max_record
    }

    /// How many more bytes `src` must hold before [`RecordDecoder::decode`] can make progress;
    /// a hint for sizing the next read.
    pub fn wanted(&self, src: &BytesMut) -> usize {
        match self.fragment {
            None => 4usize.saturating_sub(src.len()),
            Some(f) => f.len.saturating_sub(src.len()),
        }
    }

    /// The bytes of the record being received that are known to be coming: its earlier
    /// fragments plus the announced length of the current one (0 between records). A driver
    /// that reserves memory for its receive buffer reserves this much before it reads the rest
    /// (never more than the maximum record size, which the header was checked against).
    pub fn pending_len(&self) -> usize {
        self.partial
            .len()
            .saturating_add(self.fragment.map_or(0, |f| f.len))
    }

    /// Take the next complete record out of `src`, if there is one. Consumed bytes are removed
    /// from `src`; a partial fragment is left in place until the rest arrives.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordError> {
        if self.poisoned {
            return Err(RecordError::Poisoned);
        }
        loop {
            let frag = match self.fragment {
                Some(f) => f,
                None => {
                    if src.len() < 4 {
                        return Ok(None);
                    }
                    let header = src.get_u32();
                    let frag = Fragment {
                        len: (header & !LAST_FRAGMENT) as usize,
                        last: header & LAST_FRAGMENT != 0,
                    };
                    let total = self.partial.len().saturating_add(frag.len);
                    if total > self.max_record {
                        self.poisoned = true;
                        return Err(RecordError::TooLarge {
                            len: total,
                            max: self.max_record,
                        });
                    }
                    self.fragment = Some(frag);
                    frag
                }
            };
            if src.len() < frag.len {
                // Wait for the rest. No memory is reserved here on the peer's say-so: the driver
                // sizes its reads ([`RecordDecoder::wanted`]) within its own limits.
                return Ok(None);
            }
            self.fragment = None;
            let body = src.split_to(frag.len);
            if frag.last {
                if self.partial.is_empty() {
                    // The common case: a single-fragment record, handed out without a copy.
                    return Ok(Some(body.freeze()));
                }
                self.partial.extend_from_slice(&body);
                return Ok(Some(self.partial.split().freeze()));
            }
            self.partial.extend_from_slice(&body);
        }
    }
}

/// The four-byte fragment header for a fragment of `len` bytes (`len` ≤ [`MAX_FRAGMENT_LEN`]).
pub fn fragment_header(len: usize, last: bool) -> [u8; 4] {
    let len = u32::try_from(len.min(MAX_FRAGMENT_LEN)).unwrap_or(u32::MAX >> 1);
    let v = if last { len | LAST_FRAGMENT } else { len };
    v.to_be_bytes()
}

/// Frame `msg` as one record: fragment headers interleaved with the message's parts, split into
/// fragments of at most `max_fragment` bytes (clamped to 1..=[`MAX_FRAGMENT_LEN`]). The parts are
/// sliced, never copied. An empty message is a single empty last fragment.
pub fn frame(msg: &Encoded, max_fragment: usize) -> Vec<Bytes> {
    let max_fragment = max_fragment.clamp(1, MAX_FRAGMENT_LEN);
    let total = msg.len();
    let mut out = Vec::with_capacity(msg.parts.len() + 1 + total / max_fragment);
    if total == 0 {
        out.push(Bytes::copy_from_slice(&fragment_header(0, true)));
        return out;
    }
    let mut remaining_total = total;
    let mut left_in_fragment = 0usize;
    for part in &msg.parts {
        let mut part = part.clone();
        while !part.is_empty() {
            if left_in_fragment == 0 {
                let len = remaining_total.min(max_fragment);
                out.push(Bytes::copy_from_slice(&fragment_header(
                    len,
                    len == remaining_total,
                )));
                left_in_fragment = len;
            }
            let n = part.len().min(left_in_fragment);
            out.push(part.split_to(n));
            left_in_fragment -= n;
            remaining_total -= n;
        }
    }
    out
}

/// Write a framed record ([`frame`] with the largest fragment size) with vectored writes.
pub async fn write_record<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    msg: &Encoded,
) -> std::io::Result<()> {
    let mut parts: VecDeque<Bytes> = frame(msg, MAX_FRAGMENT_LEN).into();
    write_all_parts(w, &mut parts).await
}

/// Write every part of a gather list, in order, with `write_vectored` (up to 64 parts per
/// system call). Parts are consumed as they are written.
pub async fn write_all_parts<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    parts: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    const MAX_IOV: usize = 64;
    while !parts.is_empty() {
        let written = {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut n = 0;
            for p in parts.iter().filter(|p| !p.is_empty()).take(MAX_IOV) {
                iov[n] = IoSlice::new(p);
                n += 1;
            }
            if n == 0 {
                parts.clear();
                break;
            }
            w.write_vectored(&iov[..n]).await?
        };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 {
            let Some(front) = parts.front_mut() else {
                break;
            };
            if front.len() <= left {
                left -= front.len();
                parts.pop_front();
            } else {
                front.advance(left);
                left = 0;
            }
        }
        while parts.front().is_some_and(Bytes::is_empty) {
            parts.pop_front();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(parts: &[&[u8]]) -> Encoded {
        let mut enc = xdr::Encoder::new().with_ref_threshold(1);
        for p in parts {
            enc.put_raw_bytes(Bytes::copy_from_slice(p));
        }
        enc.finish()
    }

    fn concat(parts: &[Bytes]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn single_fragment_is_zero_copy() {
        let mut src = BytesMut::new();
        src.extend_from_slice(&fragment_header(8, true));
        src.extend_from_slice(b"abcdefgh");
        let base = src.as_ptr() as usize;
        let mut d = RecordDecoder::default();
        let rec = d.decode(&mut src).unwrap().unwrap();
        assert_eq!(&rec[..], b"abcdefgh");
        assert_eq!(rec.as_ptr() as usize, base + 4);
        assert_eq!(d.decode(&mut src).unwrap(), None);
    }

    #[test]
    fn multi_fragment_record() {
        let msg = encoded(&[b"0123", b"4567", b"89ab"]);
        let framed = frame(&msg, 5);
        let wire = concat(&framed);
        // 12 bytes in fragments of 5, 5, 2: three headers.
        assert_eq!(wire.len(), 12 + 3 * 4);
        assert_eq!(&wire[..4], &[0, 0, 0, 5]);
        assert_eq!(&wire[9..13], &[0, 0, 0, 5]);
        assert_eq!(&wire[18..22], &[0x80, 0, 0, 2]);
        let mut d = RecordDecoder::default();
        let mut src = BytesMut::new();
        // Byte at a time.
        let mut out = Vec::new();
        for b in wire {
            src.extend_from_slice(&[b]);
            while let Some(r) = d.decode(&mut src).unwrap() {
                out.push(r);
            }
        }
        assert_eq!(out, vec![Bytes::from_static(b"0123456789ab")]);
    }

    #[test]
    fn pending_len_is_what_the_headers_announced() {
        let msg = encoded(&[b"0123", b"4567", b"89ab"]);
        let wire = concat(&frame(&msg, 5));
        let mut d = RecordDecoder::default();
        let mut src = BytesMut::new();
        assert_eq!(d.pending_len(), 0);
        // The first header announces 5 bytes; after that fragment and the second header,
        // 5 received and 5 more announced.
        src.extend_from_slice(&wire[..4]);
        assert_eq!(d.decode(&mut src).unwrap(), None);
        assert_eq!(d.pending_len(), 5);
        src.extend_from_slice(&wire[4..13]);
        assert_eq!(d.decode(&mut src).unwrap(), None);
        assert_eq!(d.pending_len(), 10);
        src.extend_from_slice(&wire[13..]);
        assert!(d.decode(&mut src).unwrap().is_some());
        assert_eq!(d.pending_len(), 0, "nothing pending between records");
    }

    #[test]
    fn too_large_is_typed_and_sticky() {
        let mut d = RecordDecoder::new(10);
        let mut src = BytesMut::new();
        src.extend_from_slice(&fragment_header(8, false));
        src.extend_from_slice(&[0; 8]);
        src.extend_from_slice(&fragment_header(3, true));
        assert_eq!(
            d.decode(&mut src),
            Err(RecordError::TooLarge { len: 11, max: 10 })
        );
        assert_eq!(d.decode(&mut src), Err(RecordError::Poisoned));
    }

    #[test]
    fn huge_header_does_not_allocate_the_claimed_size() {
        let mut d = RecordDecoder::new(usize::MAX);
        let mut src = BytesMut::new();
        src.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.decode(&mut src), Ok(None));
        assert_eq!(d.wanted(&src), MAX_FRAGMENT_LEN);
    }

    #[test]
    fn empty_message_is_one_empty_last_fragment() {
        let framed = frame(&Encoded::default(), 100);
        assert_eq!(concat(&framed), vec![0x80, 0, 0, 0]);
    }

    #[tokio::test]
    async fn vectored_write_writes_everything() {
        let msg = encoded(&[&[1u8; 1000], &[2u8; 3], &[3u8; 70000]]);
        let mut out: Vec<u8> = Vec::new();
        write_record(&mut out, &msg).await.unwrap();
        let mut src = BytesMut::from(&out[..]);
        let rec = RecordDecoder::default().decode(&mut src).unwrap().unwrap();
        assert_eq!(rec, msg.to_bytes());
        assert!(src.is_empty());
    }
}
