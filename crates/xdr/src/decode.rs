//! The checked, borrowing XDR decoder.

use bytes::Bytes;

use crate::{Result, UNIT, XdrError, pad_len};

/// Reads XDR items from a byte slice. Every method is bounds-checked and returns
/// [`XdrError`] instead of panicking; on error the position is left where the failing item began
/// only for the length/discriminant word (callers normally abandon the stream on error).
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    backing: Option<&'a Bytes>,
    strict_padding: bool,
}

impl<'a> Decoder<'a> {
    /// Decode from a borrowed slice. Opaques from [`Decoder::opaque_bytes`] are copied.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder {
            buf,
            pos: 0,
            backing: None,
            strict_padding: false,
        }
    }

    /// Decode from a [`Bytes`] buffer; [`Decoder::opaque_bytes`] then returns zero-copy slices.
    pub fn from_bytes(buf: &'a Bytes) -> Self {
        Decoder {
            buf: buf.as_ref(),
            pos: 0,
            backing: Some(buf),
            strict_padding: false,
        }
    }

    /// Reject non-zero padding bytes (RFC 4506 §3 says they are zero; most peers, Linux included,
    /// do not check, so the default is lenient).
    pub fn strict_padding(mut self, strict: bool) -> Self {
        self.strict_padding = strict;
        self
    }

    /// Byte offset of the next item from the start of the stream.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True when the whole stream has been consumed.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The unconsumed tail of the stream, without consuming it.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// The unconsumed tail as [`Bytes`] (zero-copy when decoding from `Bytes`), consuming it.
    pub fn take_rest(&mut self) -> Bytes {
        let start = self.pos;
        self.pos = self.buf.len();
        self.slice_to_bytes(start, self.buf.len())
    }

    /// Fails with [`XdrError::TrailingBytes`] unless the stream is fully consumed.
    pub fn finish(&self) -> Result<()> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(XdrError::TrailingBytes { count }),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let available = self.remaining();
        if n > available {
            return Err(XdrError::Truncated {
                offset: self.pos,
                needed: n,
                available,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn word(&mut self) -> Result<[u8; 4]> {
        let s = self.take(UNIT)?;
        Ok([s[0], s[1], s[2], s[3]])
    }

    fn dword(&mut self) -> Result<[u8; 8]> {
        let s = self.take(8)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(s);
        Ok(w)
    }

    /// Skip `n` bytes of padding after an `n`-byte-aligned body, checking them in strict mode.
    fn skip_pad(&mut self, body_len: usize) -> Result<()> {
        let p = pad_len(body_len);
        let offset = self.pos;
        let pad = self.take(p)?;
        if self.strict_padding && pad.iter().any(|&b| b != 0) {
            return Err(XdrError::NonZeroPadding { offset });
        }
        Ok(())
    }

    /// `unsigned int` (RFC 4506 §4.2).
    pub fn u32(&mut self) -> Result<u32> {
        self.word().map(u32::from_be_bytes)
    }

    /// `int` (RFC 4506 §4.1).
    pub fn i32(&mut self) -> Result<i32> {
        self.word().map(i32::from_be_bytes)
    }

    /// `unsigned hyper` (RFC 4506 §4.5).
    pub fn u64(&mut self) -> Result<u64> {
        self.dword().map(u64::from_be_bytes)
    }

    /// `hyper` (RFC 4506 §4.5).
    pub fn i64(&mut self) -> Result<i64> {
        self.dword().map(i64::from_be_bytes)
    }

    /// `float` (RFC 4506 §4.6), IEEE single precision.
    pub fn f32(&mut self) -> Result<f32> {
        self.word().map(f32::from_be_bytes)
    }

    /// `double` (RFC 4506 §4.7), IEEE double precision.
    pub fn f64(&mut self) -> Result<f64> {
        self.dword().map(f64::from_be_bytes)
    }

    /// `bool` (RFC 4506 §4.4): only 0 and 1 are valid.
    pub fn bool(&mut self) -> Result<bool> {
        let offset = self.pos;
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            value => {
                self.pos = offset;
                Err(XdrError::InvalidBool { offset, value })
            }
        }
    }

    /// An `enum` (RFC 4506 §4.3) whose valid values `map` accepts; others fail with
    /// [`XdrError::InvalidDiscriminant`] naming `type_name`.
    pub fn enumeration<T>(
        &mut self,
        type_name: &'static str,
        map: impl FnOnce(i32) -> Option<T>,
    ) -> Result<T> {
        let v = self.i32()?;
        map(v).ok_or(XdrError::InvalidDiscriminant {
            type_name,
            value: i64::from(v),
        })
    }

    /// Fixed-length opaque `opaque x[n]` (RFC 4506 §4.9), padding skipped.
    pub fn opaque_fixed(&mut self, n: usize) -> Result<&'a [u8]> {
        let body = self.take(n)?;
        self.skip_pad(n)?;
        Ok(body)
    }

    /// The length word of a variable-length item, checked against `max`.
    pub fn length(&mut self, max: u32) -> Result<u32> {
        let offset = self.pos;
        let len = self.u32()?;
        if len > max {
            return Err(XdrError::TooLong { offset, len, max });
        }
        Ok(len)
    }

    /// Variable-length opaque `opaque x<max>` (RFC 4506 §4.10).
    pub fn opaque(&mut self, max: u32) -> Result<&'a [u8]> {
        let len = self.length(max)? as usize;
        self.opaque_fixed(len)
    }

    /// Variable-length opaque as [`Bytes`]: zero-copy when the decoder was built with
    /// [`Decoder::from_bytes`], a copy otherwise.
    pub fn opaque_bytes(&mut self, max: u32) -> Result<Bytes> {
        let len = self.length(max)? as usize;
        let start = self.pos;
        self.take(len)?;
        self.skip_pad(len)?;
        Ok(self.slice_to_bytes(start, start + len))
    }

    fn slice_to_bytes(&self, start: usize, end: usize) -> Bytes {
        match self.backing {
            Some(b) => b.slice(start..end),
            None => Bytes::copy_from_slice(&self.buf[start..end]),
        }
    }

    /// `string x<max>` (RFC 4506 §4.11) as raw bytes: XDR strings are ASCII by definition but
    /// file names and paths in NFS are arbitrary bytes, so no character check is made here.
    pub fn string(&mut self, max: u32) -> Result<&'a [u8]> {
        self.opaque(max)
    }

    /// `string x<max>` that must be valid UTF-8.
    pub fn string_utf8(&mut self, max: u32) -> Result<&'a str> {
        let offset = self.pos;
        let s = self.opaque(max)?;
        std::str::from_utf8(s).map_err(|_| XdrError::InvalidUtf8 { offset })
    }

    /// Fixed-length array `T x[n]` (RFC 4506 §4.12).
    pub fn array_fixed<T>(
        &mut self,
        n: usize,
        mut item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        // Never trust a count for allocation: each element takes at least one XDR unit.
        let mut out = Vec::with_capacity(n.min(self.remaining() / UNIT));
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }

    /// Variable-length array `T x<max>` (RFC 4506 §4.13).
    pub fn array<T>(
        &mut self,
        max: u32,
        item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let n = self.length(max)? as usize;
        self.array_fixed(n, item)
    }

    /// Optional-data `T *x` (RFC 4506 §4.19).
    pub fn optional<T>(&mut self, item: impl FnOnce(&mut Self) -> Result<T>) -> Result<Option<T>> {
        let offset = self.pos;
        match self.u32()? {
            0 => Ok(None),
            1 => item(self).map(Some),
            value => Err(XdrError::InvalidOptional { offset, value }),
        }
    }

    /// A linked list encoded as repeated optional-data (`entry *next`), the form NFS READDIR and
    /// RPC-over-RDMA chunk lists use. `max` bounds the element count.
    pub fn list<T>(
        &mut self,
        max: usize,
        mut item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        loop {
            let offset = self.pos;
            match self.u32()? {
                0 => return Ok(out),
                1 => {
                    if out.len() >= max {
                        return Err(XdrError::TooLong {
                            offset,
                            len: u32::try_from(out.len() + 1).unwrap_or(u32::MAX),
                            max: u32::try_from(max).unwrap_or(u32::MAX),
                        });
                    }
                    out.push(item(self)?);
                }
                value => return Err(XdrError::InvalidOptional { offset, value }),
            }
        }
    }

    /// Skip `n` raw bytes.
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.take(n).map(|_| ())
    }

    /// Read one value of a type implementing [`crate::XdrDecode`].
    pub fn get<T: crate::XdrDecode<'a>>(&mut self) -> Result<T> {
        T::decode(self)
    }
}
