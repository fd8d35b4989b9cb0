//! The RDS congestion map: one bit per port.

use bytes::Bytes;

use crate::error::WireError;

use super::{CONG_MAP_LEN, Header, flags};

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
    ///
    /// Walks the map as the spec's 1024 little-endian 64-bit words, skipping clear ones, so an
    /// all-clear map (the usual case, and what `rds info` shows per connection) costs 1024
    /// tests rather than 8192.
    pub fn congested_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.bits
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(w, c)| {
                let mut le = [0u8; 8];
                le.copy_from_slice(c);
                let word = u64::from_le_bytes(le);
                (word != 0).then_some((w, word))
            })
            .flat_map(|(w, word)| {
                let mut rest = word;
                std::iter::from_fn(move || {
                    if rest == 0 {
                        return None;
                    }
                    let bit = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    // w < 1024 and bit < 64: the port fits in 16 bits.
                    Some((w * 64 + bit) as u16)
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
        #[test]
        fn cong_map_roundtrip(ports in proptest::collection::vec(any::<u16>(), 0..50)) {
            let mut m = CongMap::new();
            for p in &ports { m.set(*p, true); }
            let d = CongMap::decode(&m.encode()).unwrap();
            for p in &ports { prop_assert!(d.get(*p)); }
            prop_assert_eq!(&d, &m);
            // Exactly the ports set, ascending, each once.
            let mut want: Vec<u16> = ports.clone();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(d.congested_ports().collect::<Vec<_>>(), want);
        }
    }
}
