//! The iwpeer wire format (interop/README.md, the same as `interop/guest/iwpeer.c`): the 32-byte
//! big-endian control header that opens every Send, its message types and NAK codes, and the
//! payload pattern both sides write and check. Checked decoder that never panics, plain struct
//! with `encode` / `decode` / `encoded_len`.

/// Magic of every control header: "IWP1".
pub const MAGIC: u32 = 0x4957_5031;
/// Length of the control header that opens every Send.
pub const HDR_LEN: usize = 32;

/// The iwpeer ops, numbered as on the wire (`op` field and HELLO mask bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// DATA as a plain Send.
    Send = 1,
    /// DATA as a Send with Invalidate of a fresh peer STag.
    Sendinv = 2,
    /// RDMA Write to the peer's buffer, then WROTE.
    Write = 3,
    /// FILL, then RDMA Read of the peer's buffer.
    Read = 4,
}

impl Op {
    /// Every op, in the order a driver runs them.
    pub const ALL: [Op; 4] = [Op::Send, Op::Sendinv, Op::Write, Op::Read];

    /// The op's number on the wire.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The name of op number `code` (`?` for one the protocol does not name).
    pub fn name(code: u8) -> &'static str {
        match code {
            1 => "send",
            2 => "sendinv",
            3 => "write",
            4 => "read",
            _ => "?",
        }
    }
}

/// Control message types (`type` field).
pub mod msg {
    pub const HELLO: u16 = 1;
    pub const DATA: u16 = 2;
    pub const ACK: u16 = 3;
    pub const INVKEY_REQ: u16 = 4;
    pub const INVKEY: u16 = 5;
    pub const WROTE: u16 = 6;
    pub const FILL: u16 = 7;
    pub const FILLED: u16 = 8;
    pub const DONE: u16 = 9;
    pub const NAK: u16 = 10;
}

/// NAK codes (`arg` of a NAK).
pub mod nak {
    pub const BAD_LENGTH: u32 = 1;
    pub const MISMATCH: u32 = 2;
    pub const SEND_WITH_INV: u32 = 3;
    pub const WRONG_STAG: u32 = 5;
    pub const UNKNOWN_TYPE: u32 = 9;

    pub fn name(c: u32) -> &'static str {
        match c {
            BAD_LENGTH => "bad length",
            MISMATCH => "data mismatch",
            SEND_WITH_INV => "plain send arrived with invalidate",
            WRONG_STAG => "wrong STag invalidated",
            UNKNOWN_TYPE => "unknown message type",
            _ => "?",
        }
    }
}

/// HELLO `flags`: the client drives.
pub const DRIVE_CLIENT: u8 = 1;
/// HELLO `flags`: the server drives.
pub const DRIVE_SERVER: u8 = 2;

/// The 32-byte control header (all fields big-endian on the wire).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hdr {
    /// Message type ([`msg`]).
    pub typ: u16,
    /// Op code (0 for control).
    pub op: u8,
    /// HELLO: who drives (bit0 client, bit1 server).
    pub flags: u8,
    /// Iteration (HELLO: iteration count).
    pub iter: u32,
    /// Length (HELLO: buffer size; NAK: offset or value).
    pub len: u32,
    /// Buffer address (HELLO, INVKEY).
    pub addr: u64,
    /// STag (HELLO, INVKEY, DATA of sendinv).
    pub rkey: u32,
    /// HELLO: op mask; NAK: code.
    pub arg: u32,
}

/// Why a received message is not an iwpeer control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HdrError {
    /// Fewer than 32 bytes.
    #[error("message of {0} bytes is shorter than the 32-byte header")]
    Short(usize),
    /// The magic is not "IWP1".
    #[error("bad magic {0:#010x}")]
    Magic(u32),
}

impl Hdr {
    /// Encoded length.
    pub const fn encoded_len() -> usize {
        HDR_LEN
    }

    /// Encode into the wire form.
    pub fn encode(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.typ.to_be_bytes());
        b[6] = self.op;
        b[7] = self.flags;
        b[8..12].copy_from_slice(&self.iter.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_be_bytes());
        b[28..32].copy_from_slice(&self.arg.to_be_bytes());
        b
    }

    /// Decode the header at the start of `b` (checked; never panics).
    pub fn decode(b: &[u8]) -> Result<Hdr, HdrError> {
        let Some(h) = b.get(..HDR_LEN) else {
            return Err(HdrError::Short(b.len()));
        };
        let u32_at = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(HdrError::Magic(magic));
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[16..24]);
        Ok(Hdr {
            typ: u16::from_be_bytes([h[4], h[5]]),
            op: h[6],
            flags: h[7],
            iter: u32_at(8),
            len: u32_at(12),
            addr: u64::from_be_bytes(a),
            rkey: u32_at(24),
            arg: u32_at(28),
        })
    }

    /// A control message of type `typ` with the other fields zero.
    pub fn ctrl(typ: u16, op: u8, iter: u32, len: u32, arg: u32) -> Hdr {
        Hdr {
            typ,
            op,
            iter,
            len,
            arg,
            ..Hdr::default()
        }
    }
}

/// Byte `i` of the payload of op `op` in iteration `iter`: `(i*131 + (i>>8) + iter*17 + op*59
/// + 1) & 0xff`, computed in 64 bits and truncated.
pub fn pattern(op: u8, iter: u32, i: u64) -> u8 {
    i.wrapping_mul(131)
        .wrapping_add(i >> 8)
        .wrapping_add(u64::from(iter).wrapping_mul(17))
        .wrapping_add(u64::from(op) * 59)
        .wrapping_add(1) as u8
}

/// Fill `b` with the pattern of op `op` in iteration `iter`.
pub fn fill(b: &mut [u8], op: u8, iter: u32) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = pattern(op, iter, i as u64);
    }
}

/// First offset where `b` differs from the pattern.
pub fn check(b: &[u8], op: u8, iter: u32) -> Option<usize> {
    b.iter()
        .enumerate()
        .find(|(i, x)| **x != pattern(op, iter, *i as u64))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_big_endian() {
        let h = Hdr {
            typ: msg::INVKEY,
            op: 2,
            flags: 3,
            iter: 0x0102_0304,
            len: 0x0506_0708,
            addr: 0x090a_0b0c_0d0e_0f10,
            rkey: 0x1112_1314,
            arg: 0x1516_1718,
        };
        let b = h.encode();
        assert_eq!(&b[..8], &[0x49, 0x57, 0x50, 0x31, 0, 5, 2, 3]);
        assert_eq!(&b[16..24], &[9, 10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(Hdr::decode(&b), Ok(h));
        assert_eq!(Hdr::encoded_len(), b.len());
    }

    #[test]
    fn header_decoder_rejects_short_and_foreign() {
        assert_eq!(Hdr::decode(&[0; 31]), Err(HdrError::Short(31)));
        assert_eq!(Hdr::decode(&[0; 32]), Err(HdrError::Magic(0)));
        for n in 0..64 {
            let _ = Hdr::decode(&vec![0x49; n]);
        }
    }

    #[test]
    fn pattern_matches_iwpeer() {
        // iwpeer.c: (uint8_t)(i * 131u + (i >> 8) + iter * 17u + op * 59u + 1u)
        assert_eq!(pattern(1, 0, 0), 60);
        assert_eq!(pattern(1, 0, 1), 191);
        assert_eq!(
            pattern(3, 2, 256),
            ((256u64 * 131 + 1 + 34 + 177 + 1) & 0xff) as u8
        );
        let mut b = vec![0u8; 4093];
        fill(&mut b, 4, 7);
        assert_eq!(check(&b, 4, 7), None);
        b[4000] ^= 1;
        assert_eq!(check(&b, 4, 7), Some(4000));
    }
}
