//! Transport properties of RPC-over-RDMA version 2 (draft-cel-nfsv4-rpcrdma-version-two-05 §6).
//!
//! Two layers, as for the headers: [`PropSet`], [`PropSubset`] and the four property messages
//! decode with a bounded, never-panicking [`xdr::Decoder`] and encode exactly
//! `encoded_len` bytes; [`PropVal::interpret`] gives the typed value of a property this crate
//! knows ([`Property`]) and reports the XDR error the draft asks for when a known property's
//! value does not decode.
//!
//! The draft's XDR has typos (gap 9 in `shared/facts/rpcrdma-v2-rrc-nfsv4.md`):
//! `typedef rpcrdma2_propid uint32` is written backwards; it is read here as
//! `typedef uint32 rpcrdma2_propid`.

use std::ops::RangeInclusive;

use bytes::{BufMut, Bytes, BytesMut};
use xdr::{Decoder, XdrError};

/// `rpcrdma2_propid` (§6.1.1).
pub type PropId = u32;

/// Receive Buffer Size (§6.2.1): a `uint32`, default 4096.
pub const PROPID_RBSIZ: PropId = 1;
/// Backward Request Support (§6.2.2): an `rpcrdma2_bkreqsup`, default INLINE.
pub const PROPID_BRS: PropId = 2;

/// §6.4.2: "rpcrdma2_propid values in the range from 4,294,967,040 to 4,294,967,295 are
/// reserved for experimental use".
pub const EXPERIMENTAL: RangeInclusive<PropId> = 0xFFFF_FF00..=0xFFFF_FFFF;

/// §3.3: "senders MUST assume a receiver's inline threshold is 4096 bytes" (the RBSIZ
/// default of Table 1).
pub const DEFAULT_RBSIZ: u32 = 4096;

/// Bounds a receiver puts on property lists. A header is at most one receive buffer long,
/// which bounds these already; the limits keep what we hold proportional to what we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropLimits {
    /// Properties in one `rpcrdma2_propset`.
    pub max_props: u32,
    /// Bytes of one property's `rdma_data`.
    pub max_data: u32,
    /// Words of one `rpcrdma2_propsubset`.
    pub max_subset_words: u32,
}

impl Default for PropLimits {
    fn default() -> Self {
        PropLimits {
            max_props: 64,
            max_data: 1024,
            // Enough for a subset of `max_props` properties.
            max_subset_words: 2,
        }
    }
}

/// `rpcrdma2_bkreqsup` (§6.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardSupport {
    /// RDMA2_BKREQSUP_NONE: backward-direction requests and replies are not received.
    None = 0,
    /// RDMA2_BKREQSUP_INLINE: only inline backward-direction messages (the default).
    Inline = 1,
    /// RDMA2_BKREQSUP_GENL: backward-direction messages as forward ones (chunks too).
    General = 2,
}

impl BackwardSupport {
    fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(BackwardSupport::None),
            1 => Some(BackwardSupport::Inline),
            2 => Some(BackwardSupport::General),
            _ => None,
        }
    }
}

/// A property this crate interprets, with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Property {
    /// RBSIZ: the largest message the sender can receive (its inline threshold).
    ReceiveBufferSize(u32),
    /// BRS: the sender's support for backward-direction requests.
    BackwardRequestSupport(BackwardSupport),
    /// Any other id, its data uninterpreted (§6.1.1: "no error is to be reported if
    /// rdma_which is unknown to the receiver").
    Unknown { which: PropId, data: Bytes },
}

/// Why a known property's value did not decode (§6.1.1: the receiver "MUST report an XDR
/// error"; the draft leaves which one open, and RDMA2_ERR_BAD_XDR is the one whose meaning
/// fits — see CONFORMANCE.md).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropError {
    /// `rdma_data` is too short for the property's type.
    #[error("property {which}: {len} bytes of data, {needed} needed")]
    Short {
        which: PropId,
        len: usize,
        needed: usize,
    },
    /// `rdma_data` holds a value outside the property's type (an unknown enum value).
    #[error("property {which}: invalid value {value}")]
    Invalid { which: PropId, value: u32 },
}

/// `rpcrdma2_propval`: one property's id and its XDR-encoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropVal {
    pub which: PropId,
    /// Empty means "the default value" (§6.1.1).
    pub data: Bytes,
}

impl PropVal {
    /// RBSIZ with `size`.
    pub fn rbsiz(size: u32) -> Self {
        PropVal {
            which: PROPID_RBSIZ,
            data: Bytes::copy_from_slice(&size.to_be_bytes()),
        }
    }

    /// BRS with `level`.
    pub fn brs(level: BackwardSupport) -> Self {
        PropVal {
            which: PROPID_BRS,
            data: Bytes::copy_from_slice(&(level as u32).to_be_bytes()),
        }
    }

    /// The typed value. Zero-length data is the property's default (§6.1.1).
    pub fn interpret(&self) -> Result<Property, PropError> {
        let word = |which| -> Result<Option<u32>, PropError> {
            match self.data.len() {
                0 => Ok(None),
                // Trailing bytes after the typed value are tolerated: the draft only names
                // values that are too short or invalid as errors.
                n if n >= 4 => Ok(Some(u32::from_be_bytes([
                    self.data[0],
                    self.data[1],
                    self.data[2],
                    self.data[3],
                ]))),
                len => Err(PropError::Short {
                    which,
                    len,
                    needed: 4,
                }),
            }
        };
        match self.which {
            PROPID_RBSIZ => Ok(Property::ReceiveBufferSize(
                word(PROPID_RBSIZ)?.unwrap_or(DEFAULT_RBSIZ),
            )),
            PROPID_BRS => match word(PROPID_BRS)? {
                None => Ok(Property::BackwardRequestSupport(BackwardSupport::Inline)),
                Some(v) => BackwardSupport::from_u32(v)
                    .map(Property::BackwardRequestSupport)
                    .ok_or(PropError::Invalid {
                        which: PROPID_BRS,
                        value: v,
                    }),
            },
            which => Ok(Property::Unknown {
                which,
                data: self.data.clone(),
            }),
        }
    }

    fn encoded_len(&self) -> usize {
        8 + xdr::pad_len(self.data.len()) + self.data.len()
    }

    fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.which);
        put_opaque(out, &self.data);
    }
}

/// `rpcrdma2_propset`: properties in no particular order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropSet(pub Vec<PropVal>);

impl PropSet {
    /// Decode with `lim`. Never panics.
    pub fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        let max_data = lim.max_data;
        d.array(lim.max_props, |d| {
            Ok(PropVal {
                which: d.u32()?,
                data: d.opaque_bytes(max_data)?,
            })
        })
        .map(PropSet)
    }

    /// Exact number of bytes [`PropSet::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        4 + self.0.iter().map(PropVal::encoded_len).sum::<usize>()
    }

    /// Append the set to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_len(out, self.0.len());
        for p in &self.0 {
            p.encode(out);
        }
    }

    /// The first value with id `which`.
    pub fn get(&self, which: PropId) -> Option<&PropVal> {
        self.0.iter().find(|p| p.which == which)
    }

    /// Every property typed, stopping at the first known property whose value is invalid.
    pub fn interpret(&self) -> Result<Vec<Property>, PropError> {
        self.0.iter().map(PropVal::interpret).collect()
    }
}

/// `rpcrdma2_propsubset`: a bitmap over the positions of a [`PropSet`]. §6.1.1: "bit number N
/// mod 32 in word N div 32"; "words beyond the last one specified are treated as containing
/// zero".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PropSubset(pub Vec<u32>);

impl PropSubset {
    /// The subset holding these positions.
    pub fn from_positions(positions: impl IntoIterator<Item = usize>) -> Self {
        let mut s = PropSubset::default();
        for n in positions {
            s.insert(n);
        }
        s
    }

    /// Add position `n`.
    pub fn insert(&mut self, n: usize) {
        let word = n / 32;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (n % 32);
    }

    /// True when position `n` is in the subset.
    pub fn contains(&self, n: usize) -> bool {
        self.0.get(n / 32).is_some_and(|w| w & (1 << (n % 32)) != 0)
    }

    /// The positions in the subset, ascending.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i * 32 + b)
        })
    }

    /// True when the two subsets share a position.
    pub fn overlaps(&self, other: &PropSubset) -> bool {
        self.0.iter().zip(&other.0).any(|(a, b)| a & b != 0)
    }

    /// Decode with `lim`. Never panics.
    pub fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        d.array(lim.max_subset_words, Decoder::u32).map(PropSubset)
    }

    /// Exact number of bytes [`PropSubset::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        4 + 4 * self.0.len()
    }

    /// Append the subset to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        put_len(out, self.0.len());
        for w in &self.0 {
            out.put_u32(*w);
        }
    }
}

/// `rpcrdma2_connprop` (§6.3.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnProp {
    /// Every property the sender knows of.
    pub start: PropSet,
    /// Positions in `start` whose values will not change on this connection.
    pub nochg: PropSubset,
}

/// `rpcrdma2_reqprop` (§6.3.2).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReqProp {
    /// The values the sender asks for.
    pub want: PropSet,
}

/// `rpcrdma2_resprop` (§6.3.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResProp {
    /// Positions of the request's `want` that were changed as asked.
    pub done: PropSubset,
    /// Positions of the request's `want` that were refused.
    pub rejected: PropSubset,
    /// New values of requested properties that changed to something other than asked.
    pub other: PropSet,
}

/// `rpcrdma2_updprop` (§6.3.4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpdProp {
    /// The values now in effect.
    pub now: PropSet,
}

impl ConnProp {
    pub(crate) fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        Ok(ConnProp {
            start: PropSet::decode(d, lim)?,
            nochg: PropSubset::decode(d, lim)?,
        })
    }
    pub(crate) fn encoded_len(&self) -> usize {
        self.start.encoded_len() + self.nochg.encoded_len()
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        self.start.encode(out);
        self.nochg.encode(out);
    }
}

impl ReqProp {
    pub(crate) fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        Ok(ReqProp {
            want: PropSet::decode(d, lim)?,
        })
    }
    pub(crate) fn encoded_len(&self) -> usize {
        self.want.encoded_len()
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        self.want.encode(out);
    }
}

impl ResProp {
    pub(crate) fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        Ok(ResProp {
            done: PropSubset::decode(d, lim)?,
            rejected: PropSubset::decode(d, lim)?,
            other: PropSet::decode(d, lim)?,
        })
    }
    pub(crate) fn encoded_len(&self) -> usize {
        self.done.encoded_len() + self.rejected.encoded_len() + self.other.encoded_len()
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        self.done.encode(out);
        self.rejected.encode(out);
        self.other.encode(out);
    }

    /// The positions of `want` that this response leaves rejected, following §6.3.3: "the
    /// subsets ... MUST NOT overlap ... If the receiver finds such an overlap or mismatch, it
    /// SHOULD treat properties missing or within the overlap as having been rejected". A
    /// property counts as changed when it is in `done`, or when `other` carries a value for it
    /// (values in `other` for properties that were not requested are ignored, as the draft's
    /// MUST requires of the receiver).
    pub fn effective_rejections(&self, want: &PropSet) -> PropSubset {
        let mut out = PropSubset::default();
        for (n, p) in want.0.iter().enumerate() {
            let done = self.done.contains(n);
            let rejected = self.rejected.contains(n);
            let other = self.other.get(p.which).is_some();
            let claims = usize::from(done) + usize::from(rejected) + usize::from(other);
            if claims != 1 || rejected {
                out.insert(n);
            }
        }
        out
    }
}

impl UpdProp {
    pub(crate) fn decode(d: &mut Decoder<'_>, lim: &PropLimits) -> Result<Self, XdrError> {
        Ok(UpdProp {
            now: PropSet::decode(d, lim)?,
        })
    }
    pub(crate) fn encoded_len(&self) -> usize {
        self.now.encoded_len()
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        self.now.encode(out);
    }
}

fn put_len(out: &mut BytesMut, n: usize) {
    // Lengths here are bounded by PropLimits and buffer sizes, far below u32::MAX.
    out.put_u32(u32::try_from(n).unwrap_or(u32::MAX));
}

pub(crate) fn put_opaque(out: &mut BytesMut, data: &[u8]) {
    put_len(out, data.len());
    out.put_slice(data);
    out.put_bytes(0, xdr::pad_len(data.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_set(s: &PropSet) -> PropSet {
        let mut b = BytesMut::new();
        s.encode(&mut b);
        assert_eq!(b.len(), s.encoded_len());
        let mut d = Decoder::new(&b);
        let back = PropSet::decode(&mut d, &PropLimits::default()).unwrap();
        assert!(d.is_empty());
        back
    }

    #[test]
    fn known_properties_roundtrip_and_interpret() {
        let s = PropSet(vec![
            PropVal::rbsiz(65536),
            PropVal::brs(BackwardSupport::General),
            PropVal {
                which: 0xFFFF_FF07,
                data: Bytes::from_static(b"abc"),
            },
        ]);
        let back = roundtrip_set(&s);
        assert_eq!(back, s);
        assert_eq!(
            back.interpret().unwrap(),
            vec![
                Property::ReceiveBufferSize(65536),
                Property::BackwardRequestSupport(BackwardSupport::General),
                Property::Unknown {
                    which: 0xFFFF_FF07,
                    data: Bytes::from_static(b"abc")
                },
            ]
        );
        assert!(EXPERIMENTAL.contains(&0xFFFF_FF07));
        assert!(!EXPERIMENTAL.contains(&PROPID_BRS));
    }

    #[test]
    fn empty_data_means_the_default() {
        let empty = |which| PropVal {
            which,
            data: Bytes::new(),
        };
        assert_eq!(
            empty(PROPID_RBSIZ).interpret(),
            Ok(Property::ReceiveBufferSize(4096))
        );
        assert_eq!(
            empty(PROPID_BRS).interpret(),
            Ok(Property::BackwardRequestSupport(BackwardSupport::Inline))
        );
    }

    #[test]
    fn bad_values_of_known_properties_are_errors_and_unknown_ones_are_not() {
        let short = PropVal {
            which: PROPID_RBSIZ,
            data: Bytes::from_static(&[0, 1]),
        };
        assert!(matches!(
            short.interpret(),
            Err(PropError::Short { len: 2, .. })
        ));
        let bad_enum = PropVal {
            which: PROPID_BRS,
            data: Bytes::from_static(&[0, 0, 0, 7]),
        };
        assert_eq!(
            bad_enum.interpret(),
            Err(PropError::Invalid {
                which: PROPID_BRS,
                value: 7
            })
        );
        let unknown = PropVal {
            which: 99,
            data: Bytes::from_static(&[1]),
        };
        assert!(unknown.interpret().is_ok());
    }

    #[test]
    fn data_beyond_the_message_is_an_xdr_error() {
        // One property claiming 100 bytes of data in a 16-byte message.
        let wire = [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 100, 0, 0, 0, 0];
        let mut d = Decoder::new(&wire);
        assert!(PropSet::decode(&mut d, &PropLimits::default()).is_err());
        // More properties than the limit allows.
        let wire = [0, 0, 0, 200];
        let mut d = Decoder::new(&wire);
        assert!(matches!(
            PropSet::decode(&mut d, &PropLimits::default()),
            Err(XdrError::TooLong { len: 200, .. })
        ));
    }

    #[test]
    fn subset_bits_follow_n_mod_32_in_word_n_div_32() {
        let s = PropSubset::from_positions([0, 31, 32, 40]);
        assert_eq!(s.0, vec![0x8000_0001, 0x0000_0101]);
        assert!(s.contains(40) && !s.contains(41) && !s.contains(1000));
        assert_eq!(s.positions().collect::<Vec<_>>(), vec![0, 31, 32, 40]);
        assert!(s.overlaps(&PropSubset::from_positions([40])));
        assert!(!s.overlaps(&PropSubset::from_positions([1, 64])));
    }

    #[test]
    fn resprop_overlaps_and_gaps_count_as_rejected() {
        let want = PropSet(vec![
            PropVal::rbsiz(8192),
            PropVal::brs(BackwardSupport::General),
            PropVal::rbsiz(1),
        ]);
        // 0 done; 1 both done and rejected (overlap); 2 in neither (gap).
        let r = ResProp {
            done: PropSubset::from_positions([0, 1]),
            rejected: PropSubset::from_positions([1]),
            other: PropSet::default(),
        };
        assert_eq!(
            r.effective_rejections(&want)
                .positions()
                .collect::<Vec<_>>(),
            vec![1, 2]
        );
        // A value in `other` counts as a change; one for an unrequested id is ignored.
        let r = ResProp {
            done: PropSubset::default(),
            rejected: PropSubset::default(),
            other: PropSet(vec![
                PropVal::brs(BackwardSupport::Inline),
                PropVal::rbsiz(7),
            ]),
        };
        let want2 = PropSet(vec![PropVal::brs(BackwardSupport::General)]);
        assert_eq!(r.effective_rejections(&want2).positions().count(), 0);
    }
}
