//! RDS 3.1 wire formats, one job per module:
//! - [`header`]: the 48-byte header as a plain struct ([`Header`]) and as a checked view of the
//!   bytes ([`HeaderView`]) that the decoders and the drivers' peeks share;
//! - [`ext`]: the extension list carried in `h_exthdr`;
//! - [`cong`]: the congestion map;
//! - [`rdma`]: RDS over RDMA's connection private data and message fragments;
//! - here: the constants, the RFC 1071 checksum (the workspace's one implementation, in the
//!   `inet-checksum` crate), the small control messages (ack-only, ping/pong, multipath probe)
//!   and whole messages.
//!
//! Every decoder here is checked: it returns a typed [`WireError`] and never panics, whatever the
//! input.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::WireError;

pub mod cong;
pub mod ext;
pub mod header;
pub mod rdma;

pub use cong::CongMap;
pub use ext::{ExtList, Extension, ext_payload_len, ext_type};
pub use header::{Header, HeaderView};

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

/// RFC 1071 Internet checksum: one's-complement of the one's-complement sum of big-endian
/// 16-bit words (an odd trailing byte is padded with zero). The workspace's one implementation
/// is [`inet_checksum::checksum`]; this names it for RDS.
pub fn rfc1071(data: &[u8]) -> u16 {
    inet_checksum::checksum(0, data)
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
    fn rfc1071_known_vector() {
        // RFC 1071 §3 example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        assert_eq!(
            rfc1071(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        assert_eq!(rfc1071(&[0x01]), !0x0100);
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

    proptest! {
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
    }
}
