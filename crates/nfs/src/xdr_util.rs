//! Small helpers shared by the protocol type modules: a struct macro that derives
//! `XdrEncode`/`XdrDecode` field by field, a C-like enum macro, and bounded opaque newtypes.

/// Declare a plain struct whose XDR form is its fields in order (RFC 4506 §4.14).
macro_rules! xdr_struct {
    ($(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* pub $f:ident : $t:ty ),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name { $( $(#[$fm])* pub $f: $t ),* }

        impl xdr::XdrEncode for $name {
            #[allow(unused_variables)]
            fn encode(&self, enc: &mut xdr::Encoder) {
                $( xdr::XdrEncode::encode(&self.$f, enc); )*
            }
            fn encoded_len(&self) -> usize {
                0 $( + xdr::XdrEncode::encoded_len(&self.$f) )*
            }
        }

        impl<'a> xdr::XdrDecode<'a> for $name {
            #[allow(unused_variables)]
            fn decode(dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
                Ok($name { $( $f: <$t as xdr::XdrDecode<'a>>::decode(dec)? ),* })
            }
        }
    };
}

/// Declare a C-like XDR enum (RFC 4506 §4.3) with a checked decoder.
macro_rules! xdr_enum {
    ($(#[$m:meta])* pub enum $name:ident { $( $(#[$vm:meta])* $v:ident = $n:expr ),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name { $( $(#[$vm])* $v = $n ),* }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$v ),* ];
            /// The wire value.
            pub const fn code(self) -> u32 { self as u32 }
            /// The variant for a wire value.
            pub fn from_code(v: u32) -> Option<Self> {
                match v { $( x if x == $n => Some($name::$v), )* _ => None }
            }
        }

        impl xdr::XdrEncode for $name {
            fn encode(&self, enc: &mut xdr::Encoder) { enc.put_u32(self.code()); }
            fn encoded_len(&self) -> usize { 4 }
        }

        impl<'a> xdr::XdrDecode<'a> for $name {
            fn decode(dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
                let v = dec.u32()?;
                $name::from_code(v).ok_or(xdr::XdrError::InvalidDiscriminant {
                    type_name: stringify!($name),
                    value: i64::from(v),
                })
            }
        }
    };
}

/// Declare a variable-length opaque newtype bounded by `$max` on decode.
/// `ddp` makes its encoder mark it DDP-eligible (RFC 8267 §4, §6.1): only for the items the
/// binding names.
macro_rules! xdr_opaque {
    ($(#[$m:meta])* pub struct $name:ident, max = $max:expr) => {
        xdr_opaque!(@def $(#[$m])* $name, $max, put_opaque_bytes);
    };
    ($(#[$m:meta])* pub struct $name:ident, max = $max:expr, ddp) => {
        xdr_opaque!(@def $(#[$m])* $name, $max, put_ddp_opaque_bool);
    };
    (@def $(#[$m:meta])* $name:ident, $max:expr, $put:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
        pub struct $name(pub bytes::Bytes);

        impl $name {
            /// Largest length accepted by the decoder.
            pub const MAX: u32 = $max;
            /// Wrap bytes (copied from a slice).
            pub fn from_slice(b: &[u8]) -> Self { $name(bytes::Bytes::copy_from_slice(b)) }
            /// The contents.
            pub fn as_bytes(&self) -> &[u8] { &self.0 }
            /// Length of the contents.
            pub fn len(&self) -> usize { self.0.len() }
            /// True when empty.
            pub fn is_empty(&self) -> bool { self.0.is_empty() }
        }

        impl xdr::XdrEncode for $name {
            fn encode(&self, enc: &mut xdr::Encoder) {
                $crate::xdr_util::$put(enc, self.0.clone());
            }
            fn encoded_len(&self) -> usize { xdr::opaque_len(self.0.len()) }
        }

        impl<'a> xdr::XdrDecode<'a> for $name {
            fn decode(dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
                dec.opaque_bytes($max).map($name)
            }
        }
    };
}

pub(crate) fn put_opaque_bytes(enc: &mut xdr::Encoder, b: bytes::Bytes) {
    enc.put_opaque_bytes(b);
}

pub(crate) fn put_ddp_opaque_bool(enc: &mut xdr::Encoder, b: bytes::Bytes) {
    let _reduced = enc.put_ddp_opaque(b);
}

/// XDR `void`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Void;

impl xdr::XdrEncode for Void {
    fn encode(&self, _enc: &mut xdr::Encoder) {}
    fn encoded_len(&self) -> usize {
        0
    }
}

impl<'a> xdr::XdrDecode<'a> for Void {
    fn decode(_dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
        Ok(Void)
    }
}

/// Encode a value into one contiguous buffer, inline (no reduction).
pub fn encode_to_bytes<T: xdr::XdrEncode + ?Sized>(v: &T) -> bytes::Bytes {
    xdr::to_bytes(v)
}

/// Decode exactly one `T` from `buf` (zero-copy opaques), rejecting trailing bytes.
pub fn decode_exact<T: for<'a> xdr::XdrDecode<'a>>(buf: &bytes::Bytes) -> xdr::Result<T> {
    let mut dec = xdr::Decoder::from_bytes(buf);
    let v = T::decode(&mut dec)?;
    dec.finish()?;
    Ok(v)
}

/// Decoder bound on the length of a [`List`] (MOUNT's DUMP and EXPORT lists, the port mapper's
/// DUMP lists).
pub const MAX_LIST: usize = 4096;

/// An XDR linked list (RFC 4506 §4.19: each item behind a TRUE, ended by FALSE): MOUNT's
/// `mountlist`, `exports` and `groups`, the port mapper's `pmaplist` and `rpcblist`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List<T>(pub Vec<T>);

impl<T: xdr::XdrEncode> xdr::XdrEncode for List<T> {
    fn encode(&self, enc: &mut xdr::Encoder) {
        enc.put_list(&self.0, |e, v| v.encode(e));
    }
    fn encoded_len(&self) -> usize {
        4 + self.0.iter().map(|v| 4 + v.encoded_len()).sum::<usize>()
    }
}

impl<'a, T: xdr::XdrDecode<'a>> xdr::XdrDecode<'a> for List<T> {
    fn decode(dec: &mut xdr::Decoder<'a>) -> xdr::Result<Self> {
        dec.list(MAX_LIST, T::decode).map(List)
    }
}

/// Decodes a call's arguments as `$t` from the decoder `$dec`, all of them: otherwise the
/// enclosing function returns GARBAGE_ARGS (RFC 5531 §9, `accept_stat`: the procedure cannot
/// decode its arguments).
macro_rules! args_or_garbage {
    ($dec:ident, $t:ty) => {{
        let Ok(v) = <$t as xdr::XdrDecode>::decode(&mut $dec) else {
            return oncrpc::Outcome::GarbageArgs;
        };
        if $dec.finish().is_err() {
            return oncrpc::Outcome::GarbageArgs;
        }
        v
    }};
}

pub(crate) use {args_or_garbage, xdr_enum, xdr_opaque, xdr_struct};
