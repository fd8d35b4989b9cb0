//! The RDS extension list (`h_exthdr`), decoded the way Linux reads it.

use crate::error::WireError;

use super::EXT_SPACE;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
