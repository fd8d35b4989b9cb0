//! RDS 3.1 wire formats: the 48-byte header, its extension list, the RFC 1071 checksum,
//! the congestion map and the small control messages (ack-only, ping/pong, multipath probe).
//!
//! Every decoder here is checked: it returns a typed [`WireError`] and never panics, whatever the
//! input.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::WireError;

/// Size of the RDS header on the wire.
///
/// Spec 3.1 says 40 bytes; Linux's `struct rds_header` is 48 on the wire (32 bytes of fixed fields
/// and 16 of extension space) and we match Linux (facts/rds-linux.md "Header").
pub const HEADER_LEN: usize = 48;
/// Size of the extension area (`h_exthdr`). Spec 3.1 "RDS 3.1 header": 128 bits.
pub const EXT_SPACE: usize = 16;
/// Largest message payload RDS accepts (Linux `RDS_MAX_MSG_SIZE`, 1 MiB).
pub const MAX_MSG_LEN: usize = 1 << 20;
/// Size of a congestion map (spec 3.1 "Congestion control": 8 KiB).
pub const CONG_MAP_LEN: usize = 8192;
/// Fragment size of the IB transport (spec 3.1 "Fragmented messages").
pub const FRAG_SIZE: usize = 4096;
/// IANA port of the RDS-over-TCP service (spec 3.1, "RDGS").
pub const RDS_TCP_PORT: u16 = 16385;
/// The reserved port multipath probes are sent from (`RDS_FLAG_PROBE_PORT`).
pub const PROBE_PORT: u16 = 1;
/// Number of paths Linux supports per connection (`RDS_MPATH_WORKERS`).
pub const MAX_PATHS: u16 = 8;
/// Protocol version 3.1 as carried in the (unused) VERSION extension and IB private data.
pub const PROTOCOL_3_1: u32 = 0x0301;

/// `h_flags` bits (facts/rds-linux.md "Header").
pub mod flags {
    /// The payload is a congestion map.
    pub const CONG_BITMAP: u8 = 0x01;
    /// The sender asks for an acknowledgement.
    pub const ACK_REQUIRED: u8 = 0x02;
    /// This is a retransmission after a reconnect.
    pub const RETRANSMITTED: u8 = 0x04;
    /// Oracle kernels: heartbeat ping.
    pub const HB_PING: u8 = 0x08;
    /// Oracle kernels: heartbeat pong.
    pub const HB_PONG: u8 = 0x10;
    /// Newer kernels: extension area continues past the header.
    pub const EXTHDR_EXTENSION: u8 = 0x20;
}

/// Extension header type codes (spec 3.1 "Extension Headers", facts table).
pub mod ext_type {
    /// End of the list.
    pub const NONE: u8 = 0;
    /// be32 protocol version (no longer sent).
    pub const VERSION: u8 = 1;
    /// be32 rkey of the RDMA operation just done.
    pub const RDMA: u8 = 2;
    /// be32 rkey, be32 offset for the peer to use.
    pub const RDMA_DEST: u8 = 3;
    /// be32 byte count, u8 flags, 3 bytes pad.
    pub const RDMA_BYTES: u8 = 4;
    /// be16 number of multipath paths.
    pub const NPATHS: u8 = 5;
    /// be32 generation number of the sender.
    pub const GEN_NUM: u8 = 6;
    /// u8 source path index (newer kernels).
    pub const SPORT_IDX: u8 = 8;
    /// Linux's `__RDS_EXTHDR_MAX`: a type byte at or above this ends the list.
    pub const MAX: u8 = 16;
}

/// Payload size implied by an extension type, Linux's `rds_exthdr_size[]` table.
/// Types below [`ext_type::MAX`] that Linux does not know have size 0.
///
/// Note: Linux 6.1's table has no entries for RDMA_BYTES (4) and SPORT_IDX (8), so a 6.1
/// receiver treats them as zero-length; newer kernels give them 8 and 1 bytes, which we follow
/// (facts/rds-linux.md). Put such extensions last when talking to old kernels.
pub fn ext_payload_len(ty: u8) -> usize {
    match ty {
        ext_type::VERSION => 4,
        ext_type::RDMA => 4,
        ext_type::RDMA_DEST => 8,
        ext_type::RDMA_BYTES => 8,
        ext_type::NPATHS => 2,
        ext_type::GEN_NUM => 4,
        ext_type::SPORT_IDX => 1,
        _ => 0,
    }
}

/// One extension header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Extension {
    /// `EXTHDR_VERSION`: protocol version of the sender.
    Version(u32),
    /// `EXTHDR_RDMA`: rkey used by the RDMA operation preceding this message.
    Rdma {
        /// The rkey to release.
        rkey: u32,
    },
    /// `EXTHDR_RDMA_DEST`: rkey and offset the peer may use.
    RdmaDest {
        /// Remote key.
        rkey: u32,
        /// Offset in the region.
        offset: u32,
    },
    /// `EXTHDR_RDMA_BYTES`: bytes moved by the preceding RDMA operation.
    RdmaBytes {
        /// Byte count.
        bytes: u32,
        /// 1 = write, 2 = read.
        flags: u8,
    },
    /// `EXTHDR_NPATHS`: number of multipath paths the sender supports.
    Npaths(u16),
    /// `EXTHDR_GEN_NUM`: generation number of the sender's RDS instance.
    GenNum(u32),
    /// `EXTHDR_SPORT_IDX`: the path index the sender used.
    SportIdx(u8),
    /// A type below 16 that Linux has no size for: Linux treats it as zero-length and keeps
    /// parsing at the next byte.
    Unknown(u8),
}

impl Extension {
    /// Type byte of this extension.
    pub fn ty(&self) -> u8 {
        match self {
            Extension::Version(_) => ext_type::VERSION,
            Extension::Rdma { .. } => ext_type::RDMA,
            Extension::RdmaDest { .. } => ext_type::RDMA_DEST,
            Extension::RdmaBytes { .. } => ext_type::RDMA_BYTES,
            Extension::Npaths(_) => ext_type::NPATHS,
            Extension::GenNum(_) => ext_type::GEN_NUM,
            Extension::SportIdx(_) => ext_type::SPORT_IDX,
            Extension::Unknown(t) => *t,
        }
    }

    /// Encoded size: the type byte plus the payload.
    pub fn encoded_len(&self) -> usize {
        1 + ext_payload_len(self.ty())
    }

    fn encode_into(&self, out: &mut [u8]) {
        // Callers check `out.len() >= self.encoded_len()`.
        out[0] = self.ty();
        let p = &mut out[1..];
        match *self {
            Extension::Version(v) | Extension::GenNum(v) => {
                p[..4].copy_from_slice(&v.to_be_bytes())
            }
            Extension::Rdma { rkey } => p[..4].copy_from_slice(&rkey.to_be_bytes()),
            Extension::RdmaDest { rkey, offset } => {
                p[..4].copy_from_slice(&rkey.to_be_bytes());
                p[4..8].copy_from_slice(&offset.to_be_bytes());
            }
            Extension::RdmaBytes { bytes, flags } => {
                p[..4].copy_from_slice(&bytes.to_be_bytes());
                p[4] = flags;
                p[5..8].fill(0);
            }
            Extension::Npaths(n) => p[..2].copy_from_slice(&n.to_be_bytes()),
            Extension::SportIdx(i) => p[0] = i,
            Extension::Unknown(_) => {}
        }
    }

    fn decode_payload(ty: u8, p: &[u8]) -> Extension {
        // `p` has exactly `ext_payload_len(ty)` bytes (checked by the list decoder).
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        match ty {
            ext_type::VERSION => Extension::Version(be32(p)),
            ext_type::RDMA => Extension::Rdma { rkey: be32(p) },
            ext_type::RDMA_DEST => Extension::RdmaDest {
                rkey: be32(p),
                offset: be32(&p[4..]),
            },
            ext_type::RDMA_BYTES => Extension::RdmaBytes {
                bytes: be32(p),
                flags: p[4],
            },
            ext_type::NPATHS => Extension::Npaths(u16::from_be_bytes([p[0], p[1]])),
            ext_type::GEN_NUM => Extension::GenNum(be32(p)),
            ext_type::SPORT_IDX => Extension::SportIdx(p[0]),
            t => Extension::Unknown(t),
        }
    }
}

/// The extension list carried in `h_exthdr`.
///
/// Decoding follows Linux's `rds_message_next_extension()` (net/rds/message.c, 6.1), read for
/// its behaviour:
/// - a type byte of 0 ends the list;
/// - a type byte at or above `__RDS_EXTHDR_MAX` (16) also ends the list, silently;
/// - a type below 16 with no entry in Linux's size table has size 0: it is reported and parsing
///   continues at the very next byte;
/// - an extension whose payload would run past the 16-byte area ends the list, silently.
///
/// So decoding the 16 bytes never fails; [`ExtList::decode`] reports what Linux would see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtList {
    /// Extensions in wire order.
    pub items: Vec<Extension>,
}

impl ExtList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the list occupies (without the terminating 0, which the zeroed area provides).
    pub fn encoded_len(&self) -> usize {
        self.items.iter().map(Extension::encoded_len).sum()
    }

    /// Writes the list into a 16-byte extension area. Unused bytes are zero (`EXTHDR_NONE`).
    pub fn encode(&self) -> Result<[u8; EXT_SPACE], WireError> {
        let mut out = [0u8; EXT_SPACE];
        if self.encoded_len() > EXT_SPACE {
            return Err(WireError::ExtensionsTooLong(self.encoded_len()));
        }
        let mut off = 0;
        for e in &self.items {
            e.encode_into(&mut out[off..]);
            off += e.encoded_len();
        }
        Ok(out)
    }

    /// Parses a 16-byte extension area the way Linux does (see the type's documentation).
    pub fn decode(area: &[u8; EXT_SPACE]) -> ExtList {
        let mut items = Vec::new();
        let mut off = 0usize;
        while off < EXT_SPACE {
            let ty = area[off];
            off += 1;
            if ty == ext_type::NONE || ty >= ext_type::MAX {
                break;
            }
            let len = ext_payload_len(ty);
            let Some(p) = area.get(off..off + len) else {
                break;
            };
            items.push(Extension::decode_payload(ty, p));
            off += len;
        }
        ExtList { items }
    }

    /// The first NPATHS value, if any.
    pub fn npaths(&self) -> Option<u16> {
        self.items.iter().find_map(|e| match e {
            Extension::Npaths(n) => Some(*n),
            _ => None,
        })
    }

    /// The first GEN_NUM value, if any.
    pub fn gen_num(&self) -> Option<u32> {
        self.items.iter().find_map(|e| match e {
            Extension::GenNum(n) => Some(*n),
            _ => None,
        })
    }
}

/// RFC 1071 Internet checksum: one's-complement of the one's-complement sum of big-endian
/// 16-bit words (an odd trailing byte is padded with zero).
pub fn rfc1071(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
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
        b[0..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..16].copy_from_slice(&self.ack.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b[20..22].copy_from_slice(&self.sport.to_be_bytes());
        b[22..24].copy_from_slice(&self.dport.to_be_bytes());
        b[24] = self.flags;
        b[25] = self.credit;
        // 26..30 padding stays zero.
        b[30..32].copy_from_slice(&self.csum.to_be_bytes());
        b[32..48].copy_from_slice(&self.ext.encode()?);
        Ok(b)
    }

    /// Encodes the header and fills `h_csum` with the RFC 1071 checksum over the 48 bytes
    /// (computed with `h_csum` zeroed), as the IB transport does.
    pub fn encode_with_checksum(&self) -> Result<[u8; HEADER_LEN], WireError> {
        let mut h = self.clone();
        h.csum = 0;
        let mut b = h.encode()?;
        let c = rfc1071(&b);
        b[30..32].copy_from_slice(&c.to_be_bytes());
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
        let b: &[u8; HEADER_LEN] = buf
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Short {
                need: HEADER_LEN,
                have: buf.len(),
            })?;
        let csum = u16::from_be_bytes([b[30], b[31]]);
        if csum != 0 && rfc1071(b) != 0 {
            return Err(WireError::BadChecksum(csum));
        }
        let be64 = |s: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            u64::from_be_bytes(a)
        };
        let len = u32::from_be_bytes([b[16], b[17], b[18], b[19]]);
        if len as usize > MAX_MSG_LEN {
            return Err(WireError::TooLong(len));
        }
        let mut area = [0u8; EXT_SPACE];
        area.copy_from_slice(&b[32..48]);
        Ok(Header {
            seq: be64(&b[0..8]),
            ack: be64(&b[8..16]),
            len,
            sport: u16::from_be_bytes([b[20], b[21]]),
            dport: u16::from_be_bytes([b[22], b[23]]),
            flags: b[24],
            credit: b[25],
            csum,
            ext: ExtList::decode(&area),
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

/// Builds an ack-only header (spec 3.1 "ACK-only Messages").
pub fn ack_only(ack: u64) -> Header {
    Header {
        ack,
        ..Header::default()
    }
}

/// Builds a ping header (zero-length, to port 0) with sequence `seq`.
pub fn ping(seq: u64, sport: u16) -> Header {
    Header {
        seq,
        sport,
        dport: 0,
        ..Header::default()
    }
}

/// Builds a pong answering a ping from `ping_sport`: sport 0, dport = ping's sport.
pub fn pong(seq: u64, ping_sport: u16, ext: ExtList) -> Header {
    Header {
        seq,
        sport: 0,
        dport: ping_sport,
        ext,
        ..Header::default()
    }
}

/// Builds the multipath probe: sport 1, dport 0, NPATHS and GEN_NUM.
pub fn probe(seq: u64, npaths: u16, gen_num: u32) -> Header {
    Header {
        seq,
        sport: PROBE_PORT,
        dport: 0,
        ext: ExtList {
            items: vec![Extension::Npaths(npaths), Extension::GenNum(gen_num)],
        },
        ..Header::default()
    }
}

/// The congestion map: one bit per RDS port, set = congested.
///
/// Facts "Congestion map": port P is byte P/8, bit P%8, least significant bit first. This is the
/// same layout as the spec's "1024 little-endian u64 words".
#[derive(Clone, PartialEq, Eq)]
pub struct CongMap {
    bits: Box<[u8; CONG_MAP_LEN]>,
}

impl std::fmt::Debug for CongMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.congested_ports().take(16).collect();
        f.debug_struct("CongMap")
            .field("congested(first 16)", &ports)
            .finish()
    }
}

impl Default for CongMap {
    fn default() -> Self {
        CongMap {
            bits: Box::new([0u8; CONG_MAP_LEN]),
        }
    }
}

impl CongMap {
    /// An all-clear map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Always [`CONG_MAP_LEN`].
    pub const fn encoded_len(&self) -> usize {
        CONG_MAP_LEN
    }

    /// Whether `port` is marked congested.
    pub fn get(&self, port: u16) -> bool {
        self.bits[usize::from(port / 8)] & (1 << (port % 8)) != 0
    }

    /// Marks or clears `port`.
    pub fn set(&mut self, port: u16, congested: bool) {
        let b = &mut self.bits[usize::from(port / 8)];
        if congested {
            *b |= 1 << (port % 8);
        } else {
            *b &= !(1 << (port % 8));
        }
    }

    /// Ports marked congested, ascending.
    pub fn congested_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.bits
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != 0)
            .flat_map(|(i, b)| {
                (0..8u16)
                    .filter(move |bit| b & (1 << bit) != 0)
                    .map(move |bit| (i as u16) * 8 + bit)
            })
    }

    /// The 8192-byte payload.
    pub fn encode(&self) -> Bytes {
        Bytes::copy_from_slice(&self.bits[..])
    }

    /// Decodes an 8192-byte payload.
    pub fn decode(buf: &[u8]) -> Result<CongMap, WireError> {
        let b: &[u8; CONG_MAP_LEN] = buf
            .try_into()
            .map_err(|_| WireError::BadCongMapLen(buf.len()))?;
        Ok(CongMap { bits: Box::new(*b) })
    }

    /// Header for a congestion map update: seq 0, ports 0, flags exactly CONG_BITMAP, len 8192.
    pub fn header() -> Header {
        Header {
            len: CONG_MAP_LEN as u32,
            flags: flags::CONG_BITMAP,
            ..Header::default()
        }
    }
}

/// A whole message: header and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The header; `len` must equal `payload.len()`.
    pub header: Header,
    /// The payload.
    pub payload: Bytes,
}

impl Message {
    /// Header plus payload size.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Encodes header (with `h_len` set from the payload) and payload.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        if self.payload.len() > MAX_MSG_LEN {
            return Err(WireError::TooLong(
                u32::try_from(self.payload.len()).unwrap_or(u32::MAX),
            ));
        }
        let mut h = self.header.clone();
        h.len = self.payload.len() as u32;
        let mut out = BytesMut::with_capacity(self.encoded_len());
        h.encode_to(&mut out)?;
        out.put_slice(&self.payload);
        Ok(out.freeze())
    }

    /// Decodes one message from the start of `buf`; returns it and the bytes consumed.
    pub fn decode(buf: &[u8]) -> Result<(Message, usize), WireError> {
        let header = Header::decode(buf)?;
        let total = HEADER_LEN + header.len as usize;
        let payload = buf.get(HEADER_LEN..total).ok_or(WireError::Short {
            need: total,
            have: buf.len(),
        })?;
        Ok((
            Message {
                payload: Bytes::copy_from_slice(payload),
                header,
            },
            total,
        ))
    }
}

#[cfg(test)]
mod tests {
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
    fn rfc1071_known_vector() {
        // RFC 1071 §3 example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        assert_eq!(
            rfc1071(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        assert_eq!(rfc1071(&[0x01]), !0x0100);
    }

    #[test]
    fn extension_parsing_like_linux() {
        // Unknown in-range type (7) is zero-length; parsing continues.
        let mut a = [0u8; 16];
        a[0] = 7;
        a[1] = ext_type::GEN_NUM;
        a[2..6].copy_from_slice(&42u32.to_be_bytes());
        let l = ExtList::decode(&a);
        assert_eq!(l.items, vec![Extension::Unknown(7), Extension::GenNum(42)]);
        // A type >= 16 ends the list.
        let mut a = [0u8; 16];
        a[0] = ext_type::NPATHS;
        a[1..3].copy_from_slice(&8u16.to_be_bytes());
        a[3] = 0x20;
        a[4] = ext_type::GEN_NUM;
        assert_eq!(ExtList::decode(&a).items, vec![Extension::Npaths(8)]);
        // An extension running past the area ends the list.
        let mut a = [0u8; 16];
        a[13] = ext_type::RDMA_DEST;
        a[..13].fill(7); // 13 zero-length unknowns
        let l = ExtList::decode(&a);
        assert_eq!(l.items.len(), 13);
        // Too long to encode.
        let l = ExtList {
            items: vec![Extension::RdmaDest { rkey: 1, offset: 2 }; 2],
        };
        assert!(matches!(l.encode(), Err(WireError::ExtensionsTooLong(18))));
    }

    #[test]
    fn cong_map_bit_layout() {
        let mut m = CongMap::new();
        m.set(0, true);
        m.set(9, true);
        m.set(65535, true);
        let b = m.encode();
        assert_eq!(b.len(), 8192);
        assert_eq!(b[0], 0x01);
        assert_eq!(b[1], 0x02);
        assert_eq!(b[8191], 0x80);
        let d = CongMap::decode(&b).unwrap();
        assert_eq!(d.congested_ports().collect::<Vec<_>>(), vec![0, 9, 65535]);
        m.set(9, false);
        assert!(!m.get(9));
        assert!(CongMap::decode(&b[..100]).is_err());
        let h = CongMap::header();
        let hb = h.encode().unwrap();
        assert_eq!(hb[24], 0x01);
        assert_eq!(&hb[16..20], &8192u32.to_be_bytes());
    }

    #[test]
    fn control_messages() {
        let a = ack_only(77);
        assert!(a.is_ack_only());
        let p = ping(3, 4000);
        assert!(p.is_ping() && !p.is_probe());
        let q = pong(4, 4000, ExtList::new());
        assert_eq!((q.sport, q.dport), (0, 4000));
        let m = Message {
            header: p,
            payload: Bytes::new(),
        };
        let e = m.encode().unwrap();
        assert_eq!(e.len(), 48);
        assert_eq!(Message::decode(&e).unwrap().0, m);
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

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::decode(&b);
            let _ = Message::decode(&b);
            let _ = CongMap::decode(&b);
            if b.len() >= 16 {
                let mut a = [0u8; 16];
                a.copy_from_slice(&b[..16]);
                let l = ExtList::decode(&a);
                // What decodes re-encodes to at most 16 bytes.
                prop_assert!(l.encoded_len() <= EXT_SPACE);
            }
        }

        #[test]
        fn cong_map_roundtrip(ports in proptest::collection::vec(any::<u16>(), 0..50)) {
            let mut m = CongMap::new();
            for p in &ports { m.set(*p, true); }
            let d = CongMap::decode(&m.encode()).unwrap();
            for p in &ports { prop_assert!(d.get(*p)); }
            prop_assert_eq!(d, m);
        }
    }
}
