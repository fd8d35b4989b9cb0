//! RPC-over-RDMA connection private data (RFC 8797).
//!
//! Eight bytes carried in the RDMA-CM / MPA connect request and reply:
//! `magic (be32) | version (u8) | flags (u8) | send size (u8) | receive size (u8)`.
//! Sizes travel as `(size >> 10) - 1`, so one byte covers 1 KiB to 256 KiB (RFC 8797 §4).

/// RFC 8797 §4: the format identifier.
pub const MAGIC: u32 = 0xf6ab_0e18;
/// RFC 8797 §4: the only format version.
pub const VERSION: u8 = 1;
/// RFC 8797 §4: flag bit 0, "Remote Invalidation": the sender may receive Send With Invalidate.
pub const FLAG_REMOTE_INVALIDATE: u8 = 1;
/// Encoded length.
pub const LEN: usize = 8;
/// The inline threshold a peer assumes without private data (RFC 8166 §3.3.3, RFC 8797 §4).
//= specs/rfc8166.txt#section-3.3.3
//# In the absence of such a mechanism, senders and receives MUST assume the inline thresholds are
//# 1024 bytes.
pub const DEFAULT_INLINE: u32 = 1024;
/// The largest size the one-byte encoding can express.
pub const MAX_SIZE: u32 = 256 * 1024;

/// The decoded private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    /// The sender of this message accepts Send With Invalidate (RFC 8797 §4 flag bit 0).
    pub remote_invalidate: bool,
    /// The largest message the sender will send (its inline send size).
    pub send_size: u32,
    /// The largest message the sender can receive (its inline receive size).
    pub recv_size: u32,
}

/// `(size >> 10) - 1`, clamped to what one byte can carry (RFC 8797 §4).
pub fn encode_size(size: u32) -> u8 {
    let k = (size >> 10).clamp(1, 256);
    u8::try_from(k - 1).unwrap_or(u8::MAX)
}

/// `(byte + 1) << 10` (RFC 8797 §4).
pub fn decode_size(b: u8) -> u32 {
    (u32::from(b) + 1) << 10
}

impl PrivateData {
    /// Private data advertising the same inline size both ways.
    pub fn new(inline: u32, remote_invalidate: bool) -> Self {
        PrivateData {
            remote_invalidate,
            send_size: inline,
            recv_size: inline,
        }
    }

    /// The eight bytes on the wire.
    pub fn encode(&self) -> [u8; LEN] {
        let m = MAGIC.to_be_bytes();
        [
            m[0],
            m[1],
            m[2],
            m[3],
            VERSION,
            if self.remote_invalidate {
                FLAG_REMOTE_INVALIDATE
            } else {
                0
            },
            encode_size(self.send_size),
            encode_size(self.recv_size),
        ]
    }

    /// Decode private data. `None` when it is absent, too short, carries another magic or an
    /// unknown version: the receiver then falls back to 1024-byte inline thresholds and no
    /// remote invalidation (RFC 8797 §5). Trailing bytes (padding added by a CM) are ignored.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let h = b.get(..LEN)?;
        if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) != MAGIC || h[4] != VERSION {
            return None;
        }
        Some(PrivateData {
            remote_invalidate: h[5] & FLAG_REMOTE_INVALIDATE != 0,
            send_size: decode_size(h[6]),
            recv_size: decode_size(h[7]),
        })
    }
}

/// The thresholds a connection uses once private data has been exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Largest message this end sends with RDMA Send (the peer's receive buffer size).
    pub send_inline: u32,
    /// Largest message this end receives (its posted receive buffers).
    pub recv_inline: u32,
    /// Largest message the peer sends us inline: our receive size, capped by the peer's send
    /// size (RFC 8797 §4.2; 1024 without private data). A reply that may be longer needs a
    /// Reply chunk even when our buffers could hold it.
    pub peer_send_inline: u32,
    /// The peer accepts Send With Invalidate from us.
    pub peer_remote_invalidate: bool,
}

impl Negotiated {
    /// Combine our own sizes with what the peer advertised (or did not).
    /// RFC 8797 §5: without private data both directions use 1024 bytes.
    pub fn new(own_send: u32, own_recv: u32, peer: Option<PrivateData>) -> Self {
        match peer {
            Some(p) => Negotiated {
                send_inline: own_send.min(p.recv_size),
                recv_inline: own_recv.max(DEFAULT_INLINE),
                peer_send_inline: own_recv.max(DEFAULT_INLINE).min(p.send_size),
                peer_remote_invalidate: p.remote_invalidate,
            },
            None => Negotiated {
                send_inline: own_send.min(DEFAULT_INLINE),
                recv_inline: own_recv.max(DEFAULT_INLINE),
                peer_send_inline: DEFAULT_INLINE,
                peer_remote_invalidate: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux (rpc_rdma.h) sends 4096-byte thresholds as 3, with remote invalidation allowed.
    #[test]
    fn linux_4096() {
        let p = PrivateData::new(4096, true);
        assert_eq!(p.encode(), [0xf6, 0xab, 0x0e, 0x18, 1, 1, 3, 3]);
        assert_eq!(PrivateData::decode(&p.encode()), Some(p));
        let mut long = p.encode().to_vec();
        long.extend([0; 8]);
        assert_eq!(PrivateData::decode(&long), Some(p));
    }

    #[test]
    fn rejects_foreign_data() {
        assert_eq!(PrivateData::decode(&[]), None);
        assert_eq!(
            PrivateData::decode(&[0xf6, 0xab, 0x0e, 0x18, 1, 0, 3]),
            None
        );
        assert_eq!(
            PrivateData::decode(&[0xf6, 0xab, 0x0e, 0x19, 1, 0, 3, 3]),
            None
        );
        assert_eq!(
            PrivateData::decode(&[0xf6, 0xab, 0x0e, 0x18, 2, 0, 3, 3]),
            None
        );
    }

    #[test]
    fn size_encoding_bounds() {
        assert_eq!(encode_size(1024), 0);
        assert_eq!(encode_size(100), 0);
        assert_eq!(encode_size(MAX_SIZE), 255);
        assert_eq!(encode_size(u32::MAX), 255);
        assert_eq!(encode_size(4096 + 1000), 3);
        for b in 0..=255u8 {
            assert_eq!(encode_size(decode_size(b)), b);
        }
    }

    //= specs/rfc8166.txt#section-3.3.3
    //= type=test
    //# In the absence of such a mechanism, senders and receives MUST assume the inline thresholds
    //# are 1024 bytes.
    #[test]
    fn negotiation() {
        let n = Negotiated::new(4096, 4096, Some(PrivateData::new(4096, true)));
        assert_eq!(n.send_inline, 4096);
        assert!(n.peer_remote_invalidate);
        assert_eq!(n.peer_send_inline, 4096);
        let n = Negotiated::new(4096, 4096, None);
        assert_eq!(n.send_inline, 1024);
        assert_eq!((n.recv_inline, n.peer_send_inline), (4096, 1024));
        assert!(!n.peer_remote_invalidate);
        let n = Negotiated::new(8192, 8192, Some(PrivateData::new(2048, false)));
        assert_eq!(n.send_inline, 2048);
        assert_eq!((n.recv_inline, n.peer_send_inline), (8192, 2048));
    }
}
