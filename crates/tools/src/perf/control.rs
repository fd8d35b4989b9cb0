//! The control exchange of two-process runs: checked decoders that never panic and plain
//! structs with `encode` / `decode` / `encoded_len`.
//!
//! ## Wire format
//! The MPA Request's private data (client → server), 16 bytes, big-endian:
//! `"OXPF" | version 1 (u8) | op (u8: 0 Write, 1 Read, 2 Send) | window (u16) | max size (u32) |
//! zero (u32)`. The MPA Reply's private data (server → client), 32 bytes:
//! `"OXPF" | version 1 (u8) | zero (u8) | raw-TCP port (u16) | rkey (u32) | credits (u32) |
//! addr (u64) | len (u64)`: the server's target region (`max size` bytes, Write/Read target) and,
//! for Send, the number of receives it keeps posted. For every receive it completes the server
//! reposts it and Sends a zero-length credit back; the client keeps `credits` receives posted for
//! those and never has more Sends in flight than credits (iWARP has no RNR retry). The raw-TCP
//! sink on the server's address and that port takes connections that start with the byte count
//! (u64) and answers one byte once it has them all. The server serves one client and returns when
//! it disconnects.

use super::PerfOp;

const MAGIC: &[u8; 4] = b"OXPF";
const VERSION: u8 = 1;
/// Length of the client's control message.
pub const HELLO_LEN: usize = 16;
/// Length of the server's control message.
pub const OFFER_LEN: usize = 32;

/// Client → server control message (MPA Request private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Operation the client will run.
    pub op: PerfOp,
    /// Sends the client keeps in flight (the server posts twice as many receives).
    pub window: u16,
    /// Largest message size.
    pub max_size: u32,
}

/// Server → client control message (MPA Reply private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// Port of the raw-TCP sink on the server's address.
    pub tcp_port: u16,
    /// STag of the target region.
    pub rkey: u32,
    /// Receives the server keeps posted (Send credits).
    pub credits: u32,
    /// Tagged offset of the target region.
    pub addr: u64,
    /// Length of the target region.
    pub len: u64,
}

/// A malformed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Wrong length.
    #[error("perf control message: {got} bytes, expected {want}")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// Not "OXPF" version 1.
    #[error("perf control message: not an oxrdma perf peer (magic/version)")]
    Magic,
    /// Unknown operation code.
    #[error("perf control message: unknown operation {0}")]
    Op(u8),
}

/// `N` bytes at `at` (zeros where `b` is shorter: the callers checked the length first).
fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

impl Hello {
    /// Encoded length.
    pub const fn encoded_len() -> usize {
        HELLO_LEN
    }

    /// Encode into the 16-byte form.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = self.op.code();
        b[6..8].copy_from_slice(&self.window.to_be_bytes());
        b[8..12].copy_from_slice(&self.max_size.to_be_bytes());
        b
    }

    /// Checked decode.
    pub fn decode(b: &[u8]) -> Result<Self, ControlError> {
        if b.len() != HELLO_LEN {
            return Err(ControlError::Length {
                got: b.len(),
                want: HELLO_LEN,
            });
        }
        if &b[..4] != MAGIC || b[4] != VERSION {
            return Err(ControlError::Magic);
        }
        Ok(Self {
            op: PerfOp::from_code(b[5]).ok_or(ControlError::Op(b[5]))?,
            window: u16::from_be_bytes(be(b, 6)),
            max_size: u32::from_be_bytes(be(b, 8)),
        })
    }
}

impl Offer {
    /// Encoded length.
    pub const fn encoded_len() -> usize {
        OFFER_LEN
    }

    /// Encode into the 32-byte form.
    pub fn encode(&self) -> [u8; OFFER_LEN] {
        let mut b = [0u8; OFFER_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&self.tcp_port.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.credits.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..32].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Checked decode.
    pub fn decode(b: &[u8]) -> Result<Self, ControlError> {
        if b.len() != OFFER_LEN {
            return Err(ControlError::Length {
                got: b.len(),
                want: OFFER_LEN,
            });
        }
        if &b[..4] != MAGIC || b[4] != VERSION {
            return Err(ControlError::Magic);
        }
        Ok(Self {
            tcp_port: u16::from_be_bytes(be(b, 6)),
            rkey: u32::from_be_bytes(be(b, 8)),
            credits: u32::from_be_bytes(be(b, 12)),
            addr: u64::from_be_bytes(be(b, 16)),
            len: u64::from_be_bytes(be(b, 24)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_messages_reject_bad_magic_and_op() {
        let h = Hello {
            op: PerfOp::Send,
            window: 16,
            max_size: 1 << 23,
        };
        let mut b = h.encode();
        b[5] = 9;
        assert_eq!(Hello::decode(&b), Err(ControlError::Op(9)));
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), Err(ControlError::Magic));
        assert!(matches!(
            Offer::decode(&h.encode()),
            Err(ControlError::Length { got: 16, want: 32 })
        ));
    }

    proptest! {
        #[test]
        fn control_round_trip(op in 0u8..3, window: u16, max_size: u32, tcp_port: u16,
                              rkey: u32, credits: u32, addr: u64, len: u64) {
            let h = Hello { op: PerfOp::from_code(op).unwrap(), window, max_size };
            prop_assert_eq!(Hello::decode(&h.encode()), Ok(h));
            let o = Offer { tcp_port, rkey, credits, addr, len };
            prop_assert_eq!(Offer::decode(&o.encode()), Ok(o));
        }

        #[test]
        fn control_decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Hello::decode(&b);
            let _ = Offer::decode(&b);
        }
    }
}
