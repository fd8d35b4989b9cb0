//! # xdr — External Data Representation (RFC 4506) for oxrdma
//!
//! What it does:
//! - [`Decoder`]: a borrowing, checked decoder for every XDR type (int, unsigned int, hyper,
//!   unsigned hyper, float, double, bool, enum, fixed and variable-length opaque, string,
//!   fixed and variable-length arrays, optional-data and discriminated unions). It never panics:
//!   every read is bounds-checked, every variable-length item is checked against the maximum the
//!   caller declares, and failures come back as a typed [`XdrError`]. Decoding from a [`Bytes`]
//!   buffer lets large opaques come out as zero-copy [`Bytes`] slices.
//! - [`Encoder`]: builds an XDR stream as a list of [`Bytes`] parts. Small items are copied into
//!   a growing buffer; large opaque bodies are appended **by reference** (no copy), so a 1 MiB
//!   NFS READ result can be sent with a vectored write or placed into registered memory once.
//! - **Reduction** (RPC-over-RDMA, RFC 8166 §3.4.1 and §3.4.4.4): when the encoder is given a
//!   [`DdpPolicy::Reduce`], items that the Upper-Layer Binding marks DDP-eligible
//!   ([`Encoder::put_ddp_opaque`]) are removed from the stream together with their XDR
//!   round-up padding. Only the length word stays in the Payload stream; the item is returned as
//!   a [`ReducedItem`] with its XDR Position (byte offset in the stream where its contents
//!   would have started), ready to be moved through a Read or Write chunk.
//! - [`XdrEncode`] / [`XdrDecode`] traits for plain structs, implemented for the primitives.
//!
//! What it does not do: no code generation from `.x` files, no RPC framing (see `oncrpc`), and
//! no decisions about *which* items are DDP-eligible: that belongs to each Upper-Layer Binding
//! (RFC 8166 §6), which calls [`Encoder::put_ddp_opaque`] only for eligible items.

#![forbid(unsafe_code)]

mod decode;
mod encode;

pub use decode::Decoder;
pub use encode::{DdpPolicy, Encoded, Encoder, Parts, PutWords, ReducedItem};

use bytes::Bytes;
use thiserror::Error;

/// Size of an XDR unit: every item occupies a multiple of four bytes (RFC 4506 §3).
pub const UNIT: usize = 4;

/// Errors produced while decoding an XDR stream.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum XdrError {
    /// The stream ended before an item was complete.
    #[error(
        "XDR stream truncated at offset {offset}: {needed} bytes needed, {available} available"
    )]
    Truncated {
        offset: usize,
        needed: usize,
        available: usize,
    },
    /// A variable-length item declared more elements than the protocol allows.
    #[error("XDR length {len} at offset {offset} exceeds the maximum {max}")]
    TooLong { offset: usize, len: u32, max: u32 },
    /// A boolean was neither 0 nor 1 (RFC 4506 §4.4).
    #[error("invalid XDR bool {value} at offset {offset}")]
    InvalidBool { offset: usize, value: u32 },
    /// An enum or union discriminant outside the declared set (RFC 4506 §4.3, §4.15).
    #[error("invalid {type_name} discriminant {value}")]
    InvalidDiscriminant { type_name: &'static str, value: i64 },
    /// An optional-data flag was neither 0 nor 1 (RFC 4506 §4.19).
    #[error("invalid XDR optional-data flag {value} at offset {offset}")]
    InvalidOptional { offset: usize, value: u32 },
    /// Padding bytes were not zero (only in strict mode, RFC 4506 §3: "residual bytes are zero").
    #[error("non-zero XDR padding at offset {offset}")]
    NonZeroPadding { offset: usize },
    /// A string that must be UTF-8 was not.
    #[error("XDR string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: usize },
    /// Bytes remained after a complete item where none were expected.
    #[error("{count} trailing bytes after a complete XDR item")]
    TrailingBytes { count: usize },
}

/// Result alias for XDR decoding.
pub type Result<T> = std::result::Result<T, XdrError>;

/// Number of zero bytes that follow `len` bytes of opaque data (RFC 4506 §4.9, §4.10).
#[inline]
pub const fn pad_len(len: usize) -> usize {
    (UNIT - (len % UNIT)) % UNIT
}

/// `len` rounded up to a multiple of four (the XDR "round-up").
#[inline]
pub const fn padded(len: usize) -> usize {
    len + pad_len(len)
}

/// Encoded size of a variable-length opaque or string of `len` bytes: length word plus padded body.
#[inline]
pub const fn opaque_len(len: usize) -> usize {
    UNIT + padded(len)
}

/// A value that can be written to an XDR stream.
pub trait XdrEncode {
    /// Append `self` to the stream.
    fn encode(&self, enc: &mut Encoder);
    /// Exact number of bytes [`XdrEncode::encode`] appends when nothing is reduced.
    fn encoded_len(&self) -> usize;
}

/// A value that can be read from an XDR stream.
pub trait XdrDecode<'a>: Sized {
    /// Read one value, advancing the decoder.
    fn decode(dec: &mut Decoder<'a>) -> Result<Self>;
}

/// Encode one value into a contiguous buffer.
pub fn to_bytes<T: XdrEncode + ?Sized>(value: &T) -> Bytes {
    let mut enc = Encoder::with_capacity(value.encoded_len());
    value.encode(&mut enc);
    enc.into_bytes()
}

/// Decode exactly one value from `buf`; trailing bytes are an error.
pub fn from_slice<'a, T: XdrDecode<'a>>(buf: &'a [u8]) -> Result<T> {
    let mut dec = Decoder::new(buf);
    let v = T::decode(&mut dec)?;
    dec.finish()?;
    Ok(v)
}

macro_rules! primitive {
    ($t:ty, $put:ident, $get:ident, $len:expr) => {
        impl XdrEncode for $t {
            #[inline]
            fn encode(&self, enc: &mut Encoder) {
                enc.$put(*self);
            }
            #[inline]
            fn encoded_len(&self) -> usize {
                $len
            }
        }
        impl<'a> XdrDecode<'a> for $t {
            #[inline]
            fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
                dec.$get()
            }
        }
    };
}

primitive!(u32, put_u32, u32, 4);
primitive!(i32, put_i32, i32, 4);
primitive!(u64, put_u64, u64, 8);
primitive!(i64, put_i64, i64, 8);
primitive!(f32, put_f32, f32, 4);
primitive!(f64, put_f64, f64, 8);
primitive!(bool, put_bool, bool, 4);

/// Fixed-length opaque `opaque x[N]` (RFC 4506 §4.9).
impl<const N: usize> XdrEncode for [u8; N] {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_opaque_fixed(self);
    }
    fn encoded_len(&self) -> usize {
        padded(N)
    }
}

impl<'a, const N: usize> XdrDecode<'a> for [u8; N] {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        let s = dec.opaque_fixed(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }
}

/// Optional-data `T *x` (RFC 4506 §4.19).
impl<T: XdrEncode> XdrEncode for Option<T> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            Some(v) => {
                enc.put_bool(true);
                v.encode(enc);
            }
            None => enc.put_bool(false),
        }
    }
    fn encoded_len(&self) -> usize {
        UNIT + self.as_ref().map_or(0, XdrEncode::encoded_len)
    }
}

impl<'a, T: XdrDecode<'a>> XdrDecode<'a> for Option<T> {
    fn decode(dec: &mut Decoder<'a>) -> Result<Self> {
        dec.optional(T::decode)
    }
}

/// Variable-length opaque with no protocol maximum beyond 2^32 - 1 (RFC 4506 §4.10).
impl XdrEncode for Bytes {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_opaque_bytes(self.clone());
    }
    fn encoded_len(&self) -> usize {
        opaque_len(self.len())
    }
}

impl XdrEncode for [u8] {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_opaque(self);
    }
    fn encoded_len(&self) -> usize {
        opaque_len(self.len())
    }
}

impl XdrEncode for str {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_opaque(self.as_bytes());
    }
    fn encoded_len(&self) -> usize {
        opaque_len(self.len())
    }
}

/// Variable-length array `T x<>` with no protocol maximum (RFC 4506 §4.13).
impl<T: XdrEncode> XdrEncode for Vec<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_array(self, |e, v| v.encode(e));
    }
    fn encoded_len(&self) -> usize {
        UNIT + self.iter().map(XdrEncode::encoded_len).sum::<usize>()
    }
}

impl<T: XdrEncode + ?Sized> XdrEncode for &T {
    fn encode(&self, enc: &mut Encoder) {
        (**self).encode(enc);
    }
    fn encoded_len(&self) -> usize {
        (**self).encoded_len()
    }
}
