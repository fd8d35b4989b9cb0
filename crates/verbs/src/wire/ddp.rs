//! DDP segment headers (RFC 5041 §4) with the RDMAP control field (RFC 5040 §4), the RDMA Read
//! Request header (RFC 5040 §4.4) and the Terminate header (RFC 5040 §4.8).

use bytes::{BufMut, BytesMut};

use super::WireError;

/// RFC 5041 §4.2: tagged header length.
pub const TAGGED_HDR_LEN: usize = 14;
/// RFC 5041 §4.3: untagged header length.
pub const UNTAGGED_HDR_LEN: usize = 18;
/// RFC 5040 §4.4: Read Request header length.
pub const READ_REQ_LEN: usize = 28;

const T_FLAG: u8 = 0x80;
const L_FLAG: u8 = 0x40;
const DDP_VERSION: u8 = 1;
const RDMAP_VERSION: u8 = 1;

/// Untagged queue numbers (RFC 5040 §5.1).
pub const QN_SEND: u32 = 0;
/// Queue for RDMA Read Requests.
pub const QN_READ_REQ: u32 = 1;
/// Queue for Terminate messages.
pub const QN_TERMINATE: u32 = 2;

/// RDMAP opcodes (RFC 5040 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (QN 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (QN 2).
    Terminate = 7,
}

impl Opcode {
    /// From the low 4 bits of the RDMAP control byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Write,
            1 => Self::ReadRequest,
            2 => Self::ReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSe,
            6 => Self::SendSeInvalidate,
            7 => Self::Terminate,
            _ => return None,
        })
    }

    /// RFC 5040 §4.3: Write and Read Response use the tagged model.
    pub fn is_tagged(self) -> bool {
        matches!(self, Self::Write | Self::ReadResponse)
    }

    /// Any of the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendInvalidate | Self::SendSe | Self::SendSeInvalidate
        )
    }
}

/// The buffer-model part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferModel {
    /// RFC 5041 §4.2: tagged.
    Tagged {
        /// Data sink STag.
        stag: u32,
        /// Tagged offset.
        to: u64,
    },
    /// RFC 5041 §4.3: untagged.
    Untagged {
        /// RsvdULP: the Invalidate STag for Send with Invalidate (RFC 5040 §4.2), zero otherwise.
        inv_stag: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A DDP segment header with its RDMAP control field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpHeader {
    /// L: last segment of the message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// Tagged or untagged fields.
    pub model: BufferModel,
}

impl DdpHeader {
    /// Header length on the wire.
    pub fn encoded_len(&self) -> usize {
        match self.model {
            BufferModel::Tagged { .. } => TAGGED_HDR_LEN,
            BufferModel::Untagged { .. } => UNTAGGED_HDR_LEN,
        }
    }

    /// Append to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let (a, n) = self.to_array();
        out.extend_from_slice(&a[..n]);
    }

    /// Encode into a fixed array; returns the array and the used length. One store per field
    /// and no buffer: every FPDU a queue pair sends starts with one of these.
    pub fn to_array(&self) -> ([u8; UNTAGGED_HDR_LEN], usize) {
        let tagged = matches!(self.model, BufferModel::Tagged { .. });
        let mut b0 = DDP_VERSION;
        if tagged {
            b0 |= T_FLAG;
        }
        if self.last {
            b0 |= L_FLAG;
        }
        let mut a = [0u8; UNTAGGED_HDR_LEN];
        a[0] = b0;
        a[1] = (RDMAP_VERSION << 6) | self.opcode as u8;
        match self.model {
            BufferModel::Tagged { stag, to } => {
                a[2..6].copy_from_slice(&stag.to_be_bytes());
                a[6..14].copy_from_slice(&to.to_be_bytes());
                (a, TAGGED_HDR_LEN)
            }
            BufferModel::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => {
                a[2..6].copy_from_slice(&inv_stag.to_be_bytes());
                a[6..10].copy_from_slice(&qn.to_be_bytes());
                a[10..14].copy_from_slice(&msn.to_be_bytes());
                a[14..18].copy_from_slice(&mo.to_be_bytes());
                (a, UNTAGGED_HDR_LEN)
            }
        }
    }

    /// Decode from the head of a ULPDU. Returns the header and its length.
    pub fn decode(b: &[u8]) -> Result<(Self, usize), WireError> {
        if b.len() < 2 {
            return Err(WireError::Truncated {
                need: 2,
                have: b.len(),
            });
        }
        let seg = Segment::new_unchecked(b);
        let (tagged, last) = (seg.is_tagged(), seg.is_last());
        // RFC 5041 §4.1: DV must be 1.
        if seg.ddp_version() != DDP_VERSION {
            return Err(WireError::BadDdpVersion(seg.ddp_version()));
        }
        // RFC 5040 §4.2: RV must be 1.
        if b[1] >> 6 != RDMAP_VERSION {
            return Err(WireError::BadRdmapVersion(b[1] >> 6));
        }
        let op = b[1] & 0x0f;
        let opcode = Opcode::from_u8(op).ok_or(WireError::BadOpcode(op))?;
        if opcode.is_tagged() != tagged {
            return Err(WireError::BadOpcode(op));
        }
        let need = seg.header_len();
        if b.len() < need {
            return Err(WireError::Truncated {
                need,
                have: b.len(),
            });
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let model = if tagged {
            BufferModel::Tagged {
                stag: u32_at(2),
                to: (u64::from(u32_at(6)) << 32) | u64::from(u32_at(10)),
            }
        } else {
            BufferModel::Untagged {
                inv_stag: u32_at(2),
                qn: u32_at(6),
                msn: u32_at(10),
                mo: u32_at(14),
            }
        };
        Ok((
            Self {
                last,
                opcode,
                model,
            },
            need,
        ))
    }
}

/// A view of the DDP segment at the head of a ULPDU (RFC 5041 §4.1-§4.3): its control byte
/// (T, L, DV) and, once present, its whole header. Used by [`DdpHeader::decode`] and by the
/// drivers' peeks at segments not yet complete.
#[derive(Debug, Clone, Copy)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// A view without checking that the control byte is there (accessors may then panic).
    pub fn new_unchecked(buffer: T) -> Self {
        Segment { buffer }
    }

    /// A view of `buffer` once it holds the DDP control byte.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < 1 {
            return Err(WireError::Truncated { need: 1, have });
        }
        Ok(Segment { buffer })
    }

    /// T: the tagged buffer model (RFC 5041 §4.2).
    pub fn is_tagged(&self) -> bool {
        self.buffer.as_ref()[0] & T_FLAG != 0
    }

    /// L: the last segment of its message (RFC 5041 §4.2).
    pub fn is_last(&self) -> bool {
        self.buffer.as_ref()[0] & L_FLAG != 0
    }

    /// DV, the DDP version (RFC 5041 §4.2: 1).
    pub fn ddp_version(&self) -> u8 {
        self.buffer.as_ref()[0] & 0x03
    }

    /// Length of the header the T flag announces (RDMAP control byte included).
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// The whole header, once it is in the buffer.
    pub fn header(&self) -> Option<&[u8]> {
        self.buffer.as_ref().get(..self.header_len())
    }

    /// The buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// RDMA Read Request header (RFC 5040 §4.4), following the untagged DDP header on QN 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadRequest {
    /// Data sink STag.
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size.
    pub size: u32,
    /// Data source STag.
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Always 28 bytes.
    pub fn encoded_len(&self) -> usize {
        READ_REQ_LEN
    }

    /// Append to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let mut a = [0u8; READ_REQ_LEN];
        a[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        a[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        a[12..16].copy_from_slice(&self.size.to_be_bytes());
        a[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        a[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        out.extend_from_slice(&a);
    }

    /// Decode from the payload of a Read Request message.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < READ_REQ_LEN {
            return Err(WireError::Truncated {
                need: READ_REQ_LEN,
                have: b.len(),
            });
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        Ok(Self {
            sink_stag: u32_at(0),
            sink_to: u64_at(4),
            size: u32_at(12),
            src_stag: u32_at(16),
            src_to: u64_at(20),
        })
    }
}

/// Terminate error layer (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TermLayer {
    /// RDMAP.
    Rdmap = 0,
    /// DDP.
    Ddp = 1,
    /// LLP (MPA / TCP).
    Llp = 2,
}

/// Terminate control and the optional carried headers (RFC 5040 §4.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    /// Layer (4 bits).
    pub layer: u8,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub code: u8,
    /// M: DDP segment length of the failing segment, if carried.
    pub ddp_seg_len: Option<u16>,
    /// D: the failing DDP header, if carried (14 or 18 bytes).
    pub ddp_hdr: Option<Vec<u8>>,
    /// R: the failing RDMA (Read Request) header, if carried (28 bytes).
    pub rdma_hdr: Option<Vec<u8>>,
}

impl Terminate {
    /// Bytes after the untagged DDP header.
    pub fn encoded_len(&self) -> usize {
        4 + self.ddp_seg_len.map_or(0, |_| 2)
            + self.ddp_hdr.as_ref().map_or(0, Vec::len)
            + self.rdma_hdr.as_ref().map_or(0, Vec::len)
    }

    /// Append to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_u8((self.layer << 4) | (self.etype & 0x0f));
        out.put_u8(self.code);
        let mut hc = 0u8;
        if self.ddp_seg_len.is_some() {
            hc |= 0x80;
        }
        if self.ddp_hdr.is_some() {
            hc |= 0x40;
        }
        if self.rdma_hdr.is_some() {
            hc |= 0x20;
        }
        out.put_u8(hc);
        out.put_u8(0);
        if let Some(l) = self.ddp_seg_len {
            out.put_u16(l);
        }
        if let Some(h) = &self.ddp_hdr {
            out.put_slice(h);
        }
        if let Some(h) = &self.rdma_hdr {
            out.put_slice(h);
        }
    }

    /// Decode the Terminate payload.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < 4 {
            return Err(WireError::Truncated {
                need: 4,
                have: b.len(),
            });
        }
        let hc = b[2];
        let mut off = 4;
        let mut take = |n: usize| -> Result<&[u8], WireError> {
            if b.len() < off + n {
                return Err(WireError::Truncated {
                    need: off + n,
                    have: b.len(),
                });
            }
            let s = &b[off..off + n];
            off += n;
            Ok(s)
        };
        let ddp_seg_len = if hc & 0x80 != 0 {
            let s = take(2)?;
            Some(u16::from_be_bytes([s[0], s[1]]))
        } else {
            None
        };
        let ddp_hdr = if hc & 0x40 != 0 {
            // The tagged bit of the carried header says how long it is.
            let first = take(1)?[0];
            let n = if first & T_FLAG != 0 {
                TAGGED_HDR_LEN
            } else {
                UNTAGGED_HDR_LEN
            };
            let rest = take(n - 1)?;
            let mut v = Vec::with_capacity(n);
            v.push(first);
            v.extend_from_slice(rest);
            Some(v)
        } else {
            None
        };
        let rdma_hdr = if hc & 0x20 != 0 {
            Some(take(READ_REQ_LEN)?.to_vec())
        } else {
            None
        };
        Ok(Self {
            layer: b[0] >> 4,
            etype: b[0] & 0x0f,
            code: b[1],
            ddp_seg_len,
            ddp_hdr,
            rdma_hdr,
        })
    }
}

/// Terminate codes (RFC 5040 §4.8, RFC 5041 §7, RFC 5044 §8; IANA "RDDP" registry).
pub mod term {
    /// RDMAP error types.
    pub const RDMAP_ETYPE_CATASTROPHIC: u8 = 0;
    /// Remote protection error.
    pub const RDMAP_ETYPE_REMOTE_PROTECTION: u8 = 1;
    /// Remote operation error.
    pub const RDMAP_ETYPE_REMOTE_OPERATION: u8 = 2;
    /// RDMAP: invalid STag.
    pub const RDMAP_INVALID_STAG: u8 = 0x00;
    /// RDMAP: base or bounds violation.
    pub const RDMAP_BASE_BOUNDS: u8 = 0x01;
    /// RDMAP: access rights violation.
    pub const RDMAP_ACCESS_RIGHTS: u8 = 0x02;
    /// RDMAP: STag not associated with RDMAP stream.
    pub const RDMAP_STAG_NOT_ASSOC: u8 = 0x03;
    /// RDMAP: invalid RDMAP version.
    pub const RDMAP_VERSION: u8 = 0x05;
    /// RDMAP: unexpected opcode.
    pub const RDMAP_UNEXPECTED_OPCODE: u8 = 0x06;
    /// RDMAP: catastrophic error localised to the stream.
    pub const RDMAP_CATASTROPHIC_STREAM: u8 = 0x07;
    /// RDMAP: STag cannot be invalidated.
    pub const RDMAP_CANNOT_INVALIDATE: u8 = 0x09;
    /// DDP error types.
    pub const DDP_ETYPE_CATASTROPHIC: u8 = 0;
    /// Tagged buffer error.
    pub const DDP_ETYPE_TAGGED: u8 = 1;
    /// Untagged buffer error.
    pub const DDP_ETYPE_UNTAGGED: u8 = 2;
    /// DDP tagged: invalid STag.
    pub const DDP_T_INVALID_STAG: u8 = 0x00;
    /// DDP tagged: base or bounds violation.
    pub const DDP_T_BASE_BOUNDS: u8 = 0x01;
    /// DDP tagged: STag not associated with DDP stream.
    pub const DDP_T_STAG_NOT_ASSOC: u8 = 0x02;
    /// DDP tagged: TO wrap.
    pub const DDP_T_TO_WRAP: u8 = 0x03;
    /// DDP tagged: invalid DDP version.
    pub const DDP_T_VERSION: u8 = 0x04;
    /// DDP untagged: invalid QN.
    pub const DDP_U_INVALID_QN: u8 = 0x01;
    /// DDP untagged: invalid MSN, no buffer available.
    pub const DDP_U_NO_BUFFER: u8 = 0x02;
    /// DDP untagged: invalid MSN, MSN range not valid.
    pub const DDP_U_MSN_RANGE: u8 = 0x03;
    /// DDP untagged: invalid MO.
    pub const DDP_U_INVALID_MO: u8 = 0x04;
    /// DDP untagged: message too long for the buffer.
    pub const DDP_U_TOO_LONG: u8 = 0x05;
    /// DDP untagged: invalid DDP version.
    pub const DDP_U_VERSION: u8 = 0x06;
    /// LLP (MPA) error type.
    pub const LLP_ETYPE_MPA: u8 = 0;
    /// MPA: CRC error.
    pub const MPA_CRC: u8 = 0x02;
    /// MPA: invalid request/reply.
    pub const MPA_INVALID_REQ_REP: u8 = 0x04;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_view_agrees_with_the_decoder() {
        assert!(Segment::new_checked(&[][..]).is_err());
        let h = DdpHeader {
            last: false,
            opcode: Opcode::Write,
            model: BufferModel::Tagged { stag: 7, to: 9 },
        };
        let mut b = BytesMut::new();
        h.encode(&mut b);
        let seg = Segment::new_checked(&b[..1]).unwrap();
        assert!(seg.is_tagged() && !seg.is_last());
        assert_eq!((seg.ddp_version(), seg.header_len()), (1, TAGGED_HDR_LEN));
        assert!(seg.header().is_none());
        let seg = Segment::new_checked(&b[..]).unwrap();
        assert_eq!(seg.header(), Some(&b[..TAGGED_HDR_LEN]));
        assert_eq!(DdpHeader::decode(&b).unwrap(), (h, seg.header_len()));
    }

    #[test]
    fn control_bytes_match_the_facts() {
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::Send,
            model: BufferModel::Untagged {
                inv_stag: 0,
                qn: 0,
                msn: 1,
                mo: 0,
            },
        }
        .encode(&mut b);
        assert_eq!(&b[..2], &[0x41, 0x43]);
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::Write,
            model: BufferModel::Tagged { stag: 1, to: 2 },
        }
        .encode(&mut b);
        assert_eq!(&b[..2], &[0xC1, 0x40]);
        let (h, n) = DdpHeader::decode(&b).unwrap();
        assert_eq!(n, 14);
        assert_eq!(h.model, BufferModel::Tagged { stag: 1, to: 2 });
    }
}
