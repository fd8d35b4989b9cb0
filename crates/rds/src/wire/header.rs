//! The 48-byte RDS header: [`HeaderView`], a checked view of the bytes that every decoder and
//! every peek at a received header goes through, and [`Header`], the plain struct.

use std::ops::Range;

use bytes::{BufMut, BytesMut};

use crate::error::WireError;

use super::{EXT_SPACE, ExtList, HEADER_LEN, MAX_MSG_LEN, PROBE_PORT, flags, rfc1071};

/// Byte ranges of the header fields (Linux's `struct rds_header`, facts/rds-linux.md "Header").
mod field {
    use std::ops::Range;

    /// `h_sequence`, be64.
    pub const SEQ: Range<usize> = 0..8;
    /// `h_ack`, be64.
    pub const ACK: Range<usize> = 8..16;
    /// `h_len`, be32.
    pub const LEN: Range<usize> = 16..20;
    /// `h_sport`, be16.
    pub const SPORT: Range<usize> = 20..22;
    /// `h_dport`, be16.
    pub const DPORT: Range<usize> = 22..24;
    /// `h_flags`.
    pub const FLAGS: usize = 24;
    /// `h_credit`.
    pub const CREDIT: usize = 25;
    /// `h_padding[4]` (26..30) stays zero; `h_csum`, be16.
    pub const CSUM: Range<usize> = 30..32;
    /// `h_exthdr`.
    pub const EXT: Range<usize> = 32..48;
}

/// A view of the RDS header at the start of a buffer (smoltcp style). [`HeaderView::new_checked`]
/// is the only constructor and checks that the buffer holds a whole header, so no getter or
/// setter can panic. The bytes after the header are [`HeaderView::payload`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HeaderView<T> {
    /// Wraps `buffer`; fails with [`WireError::Short`] when it is shorter than [`HEADER_LEN`].
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Short {
                need: HEADER_LEN,
                have,
            });
        }
        Ok(HeaderView { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 48 header bytes.
    pub fn header_bytes(&self) -> &[u8] {
        // `new_checked` made sure the buffer holds them.
        &self.buffer.as_ref()[..HEADER_LEN]
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    fn array<const N: usize>(&self, r: Range<usize>) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&self.header_bytes()[r]);
        a
    }

    /// `h_sequence`.
    pub fn seq(&self) -> u64 {
        u64::from_be_bytes(self.array(field::SEQ))
    }

    /// `h_ack`.
    pub fn ack(&self) -> u64 {
        u64::from_be_bytes(self.array(field::ACK))
    }

    /// `h_len`: the payload bytes the message carries (not checked here).
    pub fn msg_len(&self) -> u32 {
        u32::from_be_bytes(self.array(field::LEN))
    }

    /// `h_sport`.
    pub fn sport(&self) -> u16 {
        u16::from_be_bytes(self.array(field::SPORT))
    }

    /// `h_dport`.
    pub fn dport(&self) -> u16 {
        u16::from_be_bytes(self.array(field::DPORT))
    }

    /// `h_flags`, see [`flags`].
    pub fn flags(&self) -> u8 {
        self.header_bytes()[field::FLAGS]
    }

    /// `h_credit`.
    pub fn credit(&self) -> u8 {
        self.header_bytes()[field::CREDIT]
    }

    /// `h_csum` as carried (0 = not computed).
    pub fn csum(&self) -> u16 {
        u16::from_be_bytes(self.array(field::CSUM))
    }

    /// The raw 16-byte extension area (`h_exthdr`); [`ExtList::decode`] parses it.
    pub fn ext_area(&self) -> [u8; EXT_SPACE] {
        self.array(field::EXT)
    }

    /// Whether the checksum is acceptable: `h_csum` is 0 (not computed) or the 48 bytes sum to
    /// zero (facts "Checksum").
    pub fn checksum_ok(&self) -> bool {
        self.csum() == 0 || rfc1071(self.header_bytes()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HeaderView<T> {
    fn put(&mut self, r: Range<usize>, v: &[u8]) {
        self.buffer.as_mut()[r].copy_from_slice(v);
    }

    /// Sets `h_sequence`.
    pub fn set_seq(&mut self, v: u64) {
        self.put(field::SEQ, &v.to_be_bytes());
    }

    /// Sets `h_ack`.
    pub fn set_ack(&mut self, v: u64) {
        self.put(field::ACK, &v.to_be_bytes());
    }

    /// Sets `h_len`.
    pub fn set_msg_len(&mut self, v: u32) {
        self.put(field::LEN, &v.to_be_bytes());
    }

    /// Sets `h_sport`.
    pub fn set_sport(&mut self, v: u16) {
        self.put(field::SPORT, &v.to_be_bytes());
    }

    /// Sets `h_dport`.
    pub fn set_dport(&mut self, v: u16) {
        self.put(field::DPORT, &v.to_be_bytes());
    }

    /// Sets `h_flags`.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }

    /// Sets `h_credit`.
    pub fn set_credit(&mut self, v: u8) {
        self.buffer.as_mut()[field::CREDIT] = v;
    }

    /// Sets `h_csum`.
    pub fn set_csum(&mut self, v: u16) {
        self.put(field::CSUM, &v.to_be_bytes());
    }

    /// Sets the 16-byte extension area.
    pub fn set_ext_area(&mut self, area: &[u8; EXT_SPACE]) {
        self.put(field::EXT, area);
    }

    /// Fills `h_csum` with the RFC 1071 checksum of the 48 bytes, computed with `h_csum` zeroed.
    pub fn fill_checksum(&mut self) {
        self.set_csum(0);
        let c = rfc1071(self.header_bytes());
        self.set_csum(c);
    }
}

/// The 48-byte RDS header (facts/rds-linux.md "Header").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    /// `h_sequence`.
    pub seq: u64,
    /// `h_ack`: last sequence number received (0 on TCP).
    pub ack: u64,
    /// `h_len`: payload bytes that follow.
    pub len: u32,
    /// `h_sport`.
    pub sport: u16,
    /// `h_dport`.
    pub dport: u16,
    /// `h_flags`, see [`flags`].
    pub flags: u8,
    /// `h_credit` (IB flow control; 0 on TCP).
    pub credit: u8,
    /// `h_csum` as carried (0 = not computed). [`Header::encode`] writes this value; use
    /// [`Header::encode_with_checksum`] to compute it.
    pub csum: u16,
    /// `h_exthdr`.
    pub ext: ExtList,
}

impl Header {
    /// Always [`HEADER_LEN`].
    pub const fn encoded_len(&self) -> usize {
        HEADER_LEN
    }

    /// Encodes the header with `csum` as stored (0 on TCP, which is what Linux's rds_tcp sends).
    pub fn encode(&self) -> Result<[u8; HEADER_LEN], WireError> {
        let mut b = [0u8; HEADER_LEN];
        self.write_to(&mut HeaderView::new_checked(&mut b)?)?;
        Ok(b)
    }

    /// Writes every field into `v` (the padding bytes are left as they are).
    fn write_to<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        v: &mut HeaderView<T>,
    ) -> Result<(), WireError> {
        v.set_seq(self.seq);
        v.set_ack(self.ack);
        v.set_msg_len(self.len);
        v.set_sport(self.sport);
        v.set_dport(self.dport);
        v.set_flags(self.flags);
        v.set_credit(self.credit);
        v.set_csum(self.csum);
        v.set_ext_area(&self.ext.encode()?);
        Ok(())
    }

    /// Encodes the header and fills `h_csum` with the RFC 1071 checksum over the 48 bytes
    /// (computed with `h_csum` zeroed), as the IB transport does.
    pub fn encode_with_checksum(&self) -> Result<[u8; HEADER_LEN], WireError> {
        let mut b = [0u8; HEADER_LEN];
        let mut v = HeaderView::new_checked(&mut b)?;
        self.write_to(&mut v)?;
        v.fill_checksum();
        Ok(b)
    }

    /// Appends the encoded header to `out`.
    pub fn encode_to(&self, out: &mut BytesMut) -> Result<(), WireError> {
        out.put_slice(&self.encode()?);
        Ok(())
    }

    /// Decodes a header from the first 48 bytes of `buf`.
    ///
    /// Checks: enough bytes; the checksum is 0 or the header sums to zero (facts "Checksum");
    /// `h_len` at most 1 MiB. The extension area is parsed as Linux does (never fails).
    pub fn decode(buf: &[u8]) -> Result<Header, WireError> {
        Header::from_view(&HeaderView::new_checked(buf)?)
    }

    /// [`Header::decode`] of a header already wrapped in a view: checks the checksum and
    /// `h_len`, parses the extension area.
    pub fn from_view<T: AsRef<[u8]>>(v: &HeaderView<T>) -> Result<Header, WireError> {
        if !v.checksum_ok() {
            return Err(WireError::BadChecksum(v.csum()));
        }
        let len = v.msg_len();
        if len as usize > MAX_MSG_LEN {
            return Err(WireError::TooLong(len));
        }
        Ok(Header {
            seq: v.seq(),
            ack: v.ack(),
            len,
            sport: v.sport(),
            dport: v.dport(),
            flags: v.flags(),
            credit: v.credit(),
            csum: v.csum(),
            ext: ExtList::decode(&v.ext_area()),
        })
    }

    /// Whether this is an ack-only header (spec 3.1 "ACK-only Messages": ports and length 0,
    /// no extensions, no flags) — and it is not a congestion map.
    pub fn is_ack_only(&self) -> bool {
        self.sport == 0
            && self.dport == 0
            && self.len == 0
            && self.flags == 0
            && self.ext.items.is_empty()
    }

    /// Whether this is a congestion map update.
    pub fn is_cong_map(&self) -> bool {
        self.flags & flags::CONG_BITMAP != 0
    }

    /// Whether this is a multipath probe ping (sport [`PROBE_PORT`], dport 0).
    pub fn is_probe(&self) -> bool {
        self.sport == PROBE_PORT && self.dport == 0
    }

    /// Whether this is a ping (dport 0).
    pub fn is_ping(&self) -> bool {
        self.dport == 0 && !self.is_cong_map()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Extension, probe};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_layout_matches_linux() {
        let h = Header {
            seq: 0x0102030405060708,
            ack: 0x1112131415161718,
            len: 20,
            sport: 4000,
            dport: 4001,
            flags: flags::ACK_REQUIRED | flags::RETRANSMITTED,
            credit: 7,
            csum: 0,
            ext: ExtList {
                items: vec![Extension::Npaths(8)],
            },
        };
        let b = h.encode().unwrap();
        assert_eq!(b.len(), 48);
        assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..20], &[0, 0, 0, 20]);
        assert_eq!(&b[20..24], &[0x0f, 0xa0, 0x0f, 0xa1]);
        assert_eq!(b[24], 0x06);
        assert_eq!(b[25], 7);
        assert_eq!(&b[32..35], &[5, 0, 8]);
        assert!(b[35..].iter().all(|&x| x == 0));
        assert_eq!(Header::decode(&b).unwrap(), h);
    }

    #[test]
    fn vmlab_probe_bytes_decode() {
        // vmlab "Seen on the wire": seq 1, sport 1, dport 0, one extension 05 0008.
        let mut b = [0u8; 48];
        b[7] = 1;
        b[21] = 1;
        b[32..35].copy_from_slice(&[5, 0, 8]);
        let h = Header::decode(&b).unwrap();
        assert!(h.is_probe());
        assert_eq!(h.ext.npaths(), Some(8));
        assert_eq!(h.ext.gen_num(), None);
    }

    #[test]
    fn checksum_roundtrip_and_zero_accepted() {
        let h = probe(5, 8, 0xdeadbeef);
        let b = h.encode_with_checksum().unwrap();
        assert_ne!(u16::from_be_bytes([b[30], b[31]]), 0);
        assert_eq!(rfc1071(&b), 0);
        assert!(Header::decode(&b).is_ok());
        let mut bad = b;
        bad[0] ^= 0x40;
        assert!(matches!(
            Header::decode(&bad),
            Err(WireError::BadChecksum(_))
        ));
        // h_csum = 0 means "not computed" and is accepted.
        assert!(Header::decode(&h.encode().unwrap()).is_ok());
    }

    #[test]
    fn too_long_rejected() {
        let mut b = [0u8; 48];
        b[16..20].copy_from_slice(&((MAX_MSG_LEN as u32) + 1).to_be_bytes());
        assert!(matches!(Header::decode(&b), Err(WireError::TooLong(_))));
        assert!(matches!(
            Header::decode(&b[..47]),
            Err(WireError::Short { .. })
        ));
    }

    fn arb_ext() -> impl Strategy<Value = Extension> {
        prop_oneof![
            any::<u32>().prop_map(Extension::Version),
            any::<u32>().prop_map(|rkey| Extension::Rdma { rkey }),
            (any::<u32>(), any::<u32>())
                .prop_map(|(rkey, offset)| Extension::RdmaDest { rkey, offset }),
            (any::<u32>(), any::<u8>())
                .prop_map(|(bytes, flags)| Extension::RdmaBytes { bytes, flags }),
            any::<u16>().prop_map(Extension::Npaths),
            any::<u32>().prop_map(Extension::GenNum),
            any::<u8>().prop_map(Extension::SportIdx),
            prop_oneof![Just(7u8), 9u8..16].prop_map(Extension::Unknown),
        ]
    }

    fn arb_header() -> impl Strategy<Value = Header> {
        (
            any::<u64>(),
            any::<u64>(),
            0u32..=(MAX_MSG_LEN as u32),
            any::<u16>(),
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
            proptest::collection::vec(arb_ext(), 0..4),
        )
            .prop_filter_map(
                "ext fits",
                |(seq, ack, len, sport, dport, flags, credit, items)| {
                    let ext = ExtList { items };
                    (ext.encoded_len() <= EXT_SPACE).then_some(Header {
                        seq,
                        ack,
                        len,
                        sport,
                        dport,
                        flags,
                        credit,
                        csum: 0,
                        ext,
                    })
                },
            )
    }

    proptest! {
        #[test]
        fn header_roundtrip(h in arb_header()) {
            let b = h.encode().unwrap();
            prop_assert_eq!(Header::decode(&b).unwrap(), h.clone());
            let c = h.encode_with_checksum().unwrap();
            let mut d = Header::decode(&c).unwrap();
            d.csum = 0;
            prop_assert_eq!(d, h);
        }
    }
}
