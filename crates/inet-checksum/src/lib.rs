//! The Internet checksum (RFC 1071) for oxrdma: the one implementation every crate uses.
//!
//! What it does: the 16-bit one's-complement sum of big-endian 16-bit words ([`sum16`], which
//! can be continued from a partial sum such as a TCP pseudo header's) and its complement, the
//! checksum ([`checksum`]). RDS uses it for `h_csum`, the verbs pcap writer for the IPv4 and
//! TCP checksums of the packets it synthesises.
//!
//! What it does not do: incremental updates (RFC 1624), or any packet layout. It has no
//! dependencies, so any crate of the workspace may use it without changing the layering.

#![forbid(unsafe_code)]

/// The one's-complement sum of `data` read as big-endian 16-bit words, added to `partial` (a
/// previous result of this function, or 0), folded to 16 bits. An odd trailing byte counts as
/// the high byte of a word whose low byte is zero (RFC 1071 §4.1).
pub fn sum16(partial: u32, data: &[u8]) -> u32 {
    let mut acc = u64::from(partial);
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [b] = words.remainder() {
        acc += u64::from(*b) << 8;
    }
    // End-around carry (RFC 1071 §2 (B)): fold until the sum fits in 16 bits.
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    // The loop leaves at most 0xffff.
    acc as u32
}

/// The Internet checksum of `data` continued from `partial` (0 for none): the one's complement
/// of [`sum16`]. A buffer whose checksum field holds this value sums to zero.
pub fn checksum(partial: u32, data: &[u8]) -> u16 {
    // `sum16` returns at most 0xffff.
    !(sum16(partial, data) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum16(0, &data), 0xddf2);
        assert_eq!(checksum(0, &data), !0xddf2);
        assert_eq!(checksum(0, &[0x01]), !0x0100);
        assert_eq!(checksum(0, &[]), 0xffff);
    }

    #[test]
    fn partial_sums_continue() {
        // Summing in two even-length parts equals summing the whole (the pseudo-header use).
        let data: Vec<u8> = (0..=255u8).cycle().take(70_001).collect();
        let whole = checksum(0, &data);
        let partial = sum16(0, &data[..12]);
        assert_eq!(checksum(partial, &data[12..]), whole);
    }

    #[test]
    fn filled_checksum_verifies_to_zero() {
        let mut b = [
            0x45u8, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(0, &b);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(0, &b), 0);
    }

    #[test]
    fn large_input_does_not_overflow() {
        let data = vec![0xffu8; 1 << 20];
        assert_eq!(sum16(0, &data), 0xffff);
        assert_eq!(checksum(0xffff, &data), 0);
    }
}
