//! The NFSv4.1 data types that operations share (RFC 8881 §3), with checked decoders.
//!
//! Variable-length items are bounded on decode: by the protocol's own limit where it has one
//! (`NFS4_FHSIZE`, `NFS4_OPAQUE_LIMIT`), and otherwise by the constants below, which are far
//! above anything a real client sends and far below what could hurt the server.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use super::consts::{NFS4_FHSIZE, NFS4_OPAQUE_LIMIT};
use crate::xdr_util::{xdr_opaque, xdr_struct};

/// Longest component name accepted on the wire. Names longer than the file system's limit
/// (255) get NFS4ERR_NAMETOOLONG from the operation; longer than this is not a name at all.
pub const MAX_COMPONENT_WIRE: u32 = 4096;
/// Longest symbolic-link text (`linktext4`) accepted: PATH_MAX.
pub const MAX_LINKTEXT: u32 = 4096;
/// Most words in an attribute bitmap. Every attribute RFC 8881 and RFC 7862 define fits in 3;
/// a client may ask for attributes it does not know the server lacks (pynfs asks for 1000),
/// which are ignored (RFC 7530 §5, RFC 8881 §5), so a request up to attribute 2047 decodes.
pub const MAX_BITMAP_WORDS: u32 = 64;
/// Longest `attrlist4` accepted: no attribute we accept comes close.
pub const MAX_ATTRLIST: u32 = 64 * 1024;
/// Longest COMPOUND tag accepted.
pub const MAX_TAG: u32 = NFS4_OPAQUE_LIMIT;
/// Most elements in the other bounded arrays (security parameters, stateids to test).
pub const MAX_SMALL_ARRAY: u32 = 1024;

/// `verifier4`.
pub type Verifier4 = [u8; 8];
/// `sessionid4`.
pub type SessionId4 = [u8; 16];

xdr_opaque! {
    /// `nfs_fh4`: the file handle, at most 128 bytes (RFC 8881 §4.2.1).
    pub struct Fh4, max = NFS4_FHSIZE
}
xdr_opaque! {
    /// `component4`: one path component.
    pub struct Component4, max = MAX_COMPONENT_WIRE
}
xdr_opaque! {
    /// `linktext4`: a symbolic link's contents. DDP-eligible in CREATE arguments and READLINK
    /// results (RFC 8267 §6.1), where the binding encodes it itself.
    pub struct Linktext4, max = MAX_LINKTEXT
}
xdr_opaque! {
    /// Opaque owner and client identifiers (`co_ownerid`, `owner`), at most 1024 bytes.
    pub struct Opaque1024, max = NFS4_OPAQUE_LIMIT
}
xdr_opaque! {
    /// `utf8str_cs` for COMPOUND tags.
    pub struct Tag4, max = MAX_TAG
}

xdr_struct! {
    /// `stateid4` (RFC 8881 §8.2).
    #[derive(Copy, Hash)]
    pub struct Stateid4 {
        pub seqid: u32,
        pub other: [u8; 12],
    }
}

impl Stateid4 {
    /// The anonymous stateid: all zeros (RFC 8881 §8.2.3).
    pub const ANONYMOUS: Stateid4 = Stateid4 {
        seqid: 0,
        other: [0; 12],
    };
    /// The READ bypass stateid: all ones.
    pub const BYPASS: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0xff; 12],
    };
    /// The current stateid: seqid 1, other all zeros.
    pub const CURRENT: Stateid4 = Stateid4 {
        seqid: 1,
        other: [0; 12],
    };
    /// The invalid stateid: seqid all ones, other all zeros.
    pub const INVALID: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0; 12],
    };

    /// Whether `other` is all zeros or all ones, the mark of the special stateids
    /// (RFC 8881 §8.2.3).
    pub fn is_special(&self) -> bool {
        self.other == [0; 12] || self.other == [0xff; 12]
    }
}

xdr_struct! {
    /// `nfstime4`.
    #[derive(Copy)]
    pub struct Nfstime4 {
        pub seconds: i64,
        pub nseconds: u32,
    }
}

xdr_struct! {
    /// `change_info4` (RFC 8881 §3.3.12).
    pub struct ChangeInfo4 {
        pub atomic: bool,
        pub before: u64,
        pub after: u64,
    }
}

xdr_struct! {
    /// `state_owner4`, the open owner and the lock owner (RFC 8881 §3.3.10).
    pub struct StateOwner4 {
        pub clientid: u64,
        pub owner: Opaque1024,
    }
}

xdr_struct! {
    /// `client_owner4` (RFC 8881 §2.4).
    pub struct ClientOwner4 {
        pub verifier: [u8; 8],
        pub ownerid: Opaque1024,
    }
}

xdr_struct! {
    /// `server_owner4` (RFC 8881 §2.5).
    pub struct ServerOwner4 {
        pub minor_id: u64,
        pub major_id: Opaque1024,
    }
}

xdr_opaque! {
    /// `utf8str_cis` / `utf8str_cs` in implementation ids.
    pub struct Utf8Limited, max = NFS4_OPAQUE_LIMIT
}

xdr_struct! {
    /// `nfs_impl_id4` (RFC 8881 §3.3.21).
    pub struct NfsImplId4 {
        pub domain: Utf8Limited,
        pub name: Utf8Limited,
        pub date: Nfstime4,
    }
}

/// `bitmap4`: bit N is bit N mod 32 of word N / 32 (RFC 8881 §3.3.7).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Bitmap4(pub Vec<u32>);

impl Bitmap4 {
    /// A bitmap with these bits set.
    pub fn from_bits(bits: &[u32]) -> Self {
        let mut b = Bitmap4::default();
        for &n in bits {
            b.set(n);
        }
        b
    }

    /// Whether bit `n` is set.
    pub fn get(&self, n: u32) -> bool {
        self.0
            .get((n / 32) as usize)
            .is_some_and(|w| w & (1 << (n % 32)) != 0)
    }

    /// Set bit `n`.
    pub fn set(&mut self, n: u32) {
        let w = (n / 32) as usize;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (n % 32);
    }

    /// Clear bit `n`.
    pub fn clear(&mut self, n: u32) {
        if let Some(w) = self.0.get_mut((n / 32) as usize) {
            *w &= !(1 << (n % 32));
        }
    }

    /// The set bits, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..32u32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u32 * 32 + b)
        })
    }

    /// The bits set in both.
    pub fn intersect(&self, other: &Bitmap4) -> Bitmap4 {
        let mut out = Bitmap4(self.0.iter().zip(&other.0).map(|(a, b)| a & b).collect());
        out.trim();
        out
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// Drop trailing zero words (the shortest encoding).
    pub fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }
}

impl XdrEncode for Bitmap4 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.0.len() as u32);
        for &w in &self.0 {
            enc.put_u32(w);
        }
    }
    fn encoded_len(&self) -> usize {
        4 + 4 * self.0.len()
    }
}

impl<'a> XdrDecode<'a> for Bitmap4 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        dec.array(MAX_BITMAP_WORDS, |d| d.u32()).map(Bitmap4)
    }
}

/// `fattr4`: an attribute bitmap and the attribute values it names, in bit order
/// (RFC 8881 §3.3.8). The values are interpreted by [`super::attrs`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fattr4 {
    pub mask: Bitmap4,
    pub vals: Bytes,
}

impl XdrEncode for Fattr4 {
    fn encode(&self, enc: &mut Encoder) {
        self.mask.encode(enc);
        enc.put_opaque(&self.vals);
    }
    fn encoded_len(&self) -> usize {
        self.mask.encoded_len() + xdr::opaque_len(self.vals.len())
    }
}

impl<'a> XdrDecode<'a> for Fattr4 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        let mask = Bitmap4::decode(dec)?;
        let vals = dec.opaque_bytes(MAX_ATTRLIST)?;
        Ok(Fattr4 { mask, vals })
    }
}

/// `channel_attrs4` (RFC 8881 §18.36).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChannelAttrs4 {
    pub headerpadsize: u32,
    pub maxrequestsize: u32,
    pub maxresponsesize: u32,
    pub maxresponsesize_cached: u32,
    pub maxoperations: u32,
    pub maxrequests: u32,
    /// `ca_rdma_ird<1>`.
    pub rdma_ird: Option<u32>,
}

impl XdrEncode for ChannelAttrs4 {
    fn encode(&self, enc: &mut Encoder) {
        for v in [
            self.headerpadsize,
            self.maxrequestsize,
            self.maxresponsesize,
            self.maxresponsesize_cached,
            self.maxoperations,
            self.maxrequests,
        ] {
            enc.put_u32(v);
        }
        match self.rdma_ird {
            Some(ird) => {
                enc.put_u32(1);
                enc.put_u32(ird);
            }
            None => enc.put_u32(0),
        }
    }
    fn encoded_len(&self) -> usize {
        6 * 4 + 4 + if self.rdma_ird.is_some() { 4 } else { 0 }
    }
}

impl<'a> XdrDecode<'a> for ChannelAttrs4 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        let mut v = [0u32; 6];
        for x in &mut v {
            *x = dec.u32()?;
        }
        let ird = dec.array(1, |d| d.u32())?;
        Ok(ChannelAttrs4 {
            headerpadsize: v[0],
            maxrequestsize: v[1],
            maxresponsesize: v[2],
            maxresponsesize_cached: v[3],
            maxoperations: v[4],
            maxrequests: v[5],
            rdma_ird: ird.first().copied(),
        })
    }
}

/// `authsys_parms` as carried in `callback_sec_parms4` (RFC 5531 Appendix A).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSysParms {
    pub stamp: u32,
    pub machinename: Bytes,
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

/// `callback_sec_parms4` (RFC 8881 §18.36): the credential the server uses for callbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallbackSecParms4 {
    None,
    Sys(AuthSysParms),
    /// RPCSEC_GSS handles: kept only so that they can be refused.
    Gss,
}

impl CallbackSecParms4 {
    pub const FLAVOR_GSS: u32 = super::consts::RPCSEC_GSS;
}

impl XdrEncode for CallbackSecParms4 {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            CallbackSecParms4::None => enc.put_u32(super::consts::AUTH_NONE),
            CallbackSecParms4::Sys(p) => {
                enc.put_u32(super::consts::AUTH_SYS);
                enc.put_u32(p.stamp);
                enc.put_opaque(&p.machinename);
                enc.put_u32(p.uid);
                enc.put_u32(p.gid);
                enc.put_array(&p.gids, |e, g| e.put_u32(*g));
            }
            // Never encoded by us with contents: an empty GSS triple.
            CallbackSecParms4::Gss => {
                enc.put_u32(Self::FLAVOR_GSS);
                enc.put_u32(1);
                enc.put_u32(0);
                enc.put_u32(0);
            }
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            CallbackSecParms4::None => 4,
            CallbackSecParms4::Sys(p) => {
                4 + 4 + xdr::opaque_len(p.machinename.len()) + 8 + 4 + 4 * p.gids.len()
            }
            CallbackSecParms4::Gss => 16,
        }
    }
}

impl<'a> XdrDecode<'a> for CallbackSecParms4 {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match dec.u32()? {
            super::consts::AUTH_NONE => Ok(CallbackSecParms4::None),
            super::consts::AUTH_SYS => {
                let stamp = dec.u32()?;
                let machinename = dec.opaque_bytes(255)?;
                let uid = dec.u32()?;
                let gid = dec.u32()?;
                let gids = dec.array(16, |d| d.u32())?;
                Ok(CallbackSecParms4::Sys(AuthSysParms {
                    stamp,
                    machinename,
                    uid,
                    gid,
                    gids,
                }))
            }
            super::consts::RPCSEC_GSS => {
                let _service = dec.u32()?;
                let _from_server = dec.opaque(NFS4_OPAQUE_LIMIT)?;
                let _from_client = dec.opaque(NFS4_OPAQUE_LIMIT)?;
                Ok(CallbackSecParms4::Gss)
            }
            v => Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "callback_sec_parms4",
                value: i64::from(v),
            }),
        }
    }
}

/// `state_protect4_a` (RFC 8881 §18.35): only SP4_NONE is granted; the others are decoded so
/// that they can be answered with the right error instead of BADXDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateProtectA {
    None,
    MachCred {
        must_enforce: Bitmap4,
        must_allow: Bitmap4,
    },
    Ssv,
}

impl<'a> XdrDecode<'a> for StateProtectA {
    fn decode(dec: &mut Decoder<'a>) -> xdr::Result<Self> {
        match dec.u32()? {
            0 => Ok(StateProtectA::None),
            1 => {
                let must_enforce = Bitmap4::decode(dec)?;
                let must_allow = Bitmap4::decode(dec)?;
                Ok(StateProtectA::MachCred {
                    must_enforce,
                    must_allow,
                })
            }
            2 => {
                let _enforce = Bitmap4::decode(dec)?;
                let _allow = Bitmap4::decode(dec)?;
                let _hash =
                    dec.array(MAX_SMALL_ARRAY, |d| d.opaque(NFS4_OPAQUE_LIMIT).map(|_| ()))?;
                let _encr =
                    dec.array(MAX_SMALL_ARRAY, |d| d.opaque(NFS4_OPAQUE_LIMIT).map(|_| ()))?;
                let _window = dec.u32()?;
                let _handles = dec.u32()?;
                Ok(StateProtectA::Ssv)
            }
            v => Err(xdr::XdrError::InvalidDiscriminant {
                type_name: "state_protect_how4",
                value: i64::from(v),
            }),
        }
    }
}

impl XdrEncode for StateProtectA {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            StateProtectA::None => enc.put_u32(0),
            StateProtectA::MachCred {
                must_enforce,
                must_allow,
            } => {
                enc.put_u32(1);
                must_enforce.encode(enc);
                must_allow.encode(enc);
            }
            StateProtectA::Ssv => {
                // Empty SSV parameters (a client of ours never asks for SSV).
                enc.put_u32(2);
                for _ in 0..6 {
                    enc.put_u32(0);
                }
            }
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            StateProtectA::None => 4,
            StateProtectA::MachCred {
                must_enforce,
                must_allow,
            } => 4 + must_enforce.encoded_len() + must_allow.encoded_len(),
            StateProtectA::Ssv => 28,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_bits_follow_word_and_bit_order() {
        let b = Bitmap4::from_bits(&[0, 1, 33, 75]);
        assert_eq!(b.0, vec![0b11, 0b10, 1 << 11]);
        assert!(b.get(33) && b.get(75) && !b.get(2) && !b.get(200));
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![0, 1, 33, 75]);
        let only = b.intersect(&Bitmap4::from_bits(&[1, 75]));
        assert_eq!(only.iter().collect::<Vec<_>>(), vec![1, 75]);
    }

    #[test]
    fn bitmap_decode_is_bounded() {
        let mut enc = Encoder::new();
        enc.put_u32(MAX_BITMAP_WORDS + 1);
        for _ in 0..=MAX_BITMAP_WORDS {
            enc.put_u32(0);
        }
        let buf = enc.into_bytes();
        assert!(Bitmap4::decode(&mut Decoder::new(&buf)).is_err());
    }

    #[test]
    fn special_stateids() {
        assert!(Stateid4::ANONYMOUS.is_special());
        assert!(Stateid4::BYPASS.is_special());
        assert!(Stateid4::CURRENT.is_special());
        let s = Stateid4 {
            seqid: 1,
            other: [1; 12],
        };
        assert!(!s.is_special());
        let bytes = xdr::to_bytes(&s);
        assert_eq!(bytes.len(), 16);
        assert_eq!(xdr::from_slice::<Stateid4>(&bytes).unwrap(), s);
    }

    #[test]
    fn channel_attrs_round_trip_with_and_without_ird() {
        for ird in [None, Some(16)] {
            let c = ChannelAttrs4 {
                headerpadsize: 0,
                maxrequestsize: 1 << 20,
                maxresponsesize: 1 << 20,
                maxresponsesize_cached: 4096,
                maxoperations: 16,
                maxrequests: 64,
                rdma_ird: ird,
            };
            let b = xdr::to_bytes(&c);
            assert_eq!(b.len(), c.encoded_len());
            assert_eq!(xdr::from_slice::<ChannelAttrs4>(&b).unwrap(), c);
        }
    }
}
