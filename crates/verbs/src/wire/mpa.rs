//! MPA (RFC 5044) connection setup frames with the enhanced setup of RFC 6581, and FPDU framing.

use bytes::{BufMut, Bytes, BytesMut};

use super::WireError;

/// RFC 5044 §7.1: the Request key.
pub const REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// RFC 5044 §7.1: the Reply key.
pub const REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Key + flags + revision + private-data length.
pub const FRAME_HDR_LEN: usize = 20;
/// RFC 5044 §7.1: private data is at most 512 bytes.
pub const MAX_PRIVATE_DATA: usize = 512;
/// Linux siw caps ULP private data at 256 bytes; we do the same.
pub const MAX_ULP_PRIVATE_DATA: usize = 256;

const FLAG_M: u8 = 0x80;
const FLAG_C: u8 = 0x40;
const FLAG_R: u8 = 0x20;
const FLAG_S: u8 = 0x10;

/// RFC 6581 §3: IRD word flags.
const IRD_PEER_TO_PEER: u16 = 0x8000;
const IRD_ZERO_SEND_RTR: u16 = 0x4000;
/// RFC 6581 §3: ORD word flags.
const ORD_ZERO_WRITE_RTR: u16 = 0x8000;
const ORD_ZERO_READ_RTR: u16 = 0x4000;
const IRD_ORD_MASK: u16 = 0x3fff;

/// Kind of MPA connection-setup frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// MPA Request (initiator → responder).
    Request,
    /// MPA Reply (responder → initiator).
    Reply,
}

/// RFC 6581 enhanced-setup words carried at the head of rev-2 private data when S is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// A flag: peer-to-peer mode, an RTR message is exchanged.
    pub peer_to_peer: bool,
    /// B flag: zero-length Send RTR supported/chosen.
    pub send_rtr: bool,
    /// C flag: zero-length RDMA Write RTR supported/chosen.
    pub write_rtr: bool,
    /// D flag: zero-length RDMA Read RTR supported/chosen.
    pub read_rtr: bool,
}

impl IrdOrd {
    /// Encode the two 16-bit words.
    pub fn encode(&self, out: &mut BytesMut) {
        let mut ird = self.ird & IRD_ORD_MASK;
        if self.peer_to_peer {
            ird |= IRD_PEER_TO_PEER;
        }
        if self.send_rtr {
            ird |= IRD_ZERO_SEND_RTR;
        }
        let mut ord = self.ord & IRD_ORD_MASK;
        if self.write_rtr {
            ord |= ORD_ZERO_WRITE_RTR;
        }
        if self.read_rtr {
            ord |= ORD_ZERO_READ_RTR;
        }
        out.put_u16(ird);
        out.put_u16(ord);
    }

    /// Decode the two 16-bit words.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < 4 {
            return Err(WireError::Truncated {
                need: 4,
                have: b.len(),
            });
        }
        let ird = u16::from_be_bytes([b[0], b[1]]);
        let ord = u16::from_be_bytes([b[2], b[3]]);
        Ok(Self {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & IRD_PEER_TO_PEER != 0,
            send_rtr: ird & IRD_ZERO_SEND_RTR != 0,
            write_rtr: ord & ORD_ZERO_WRITE_RTR != 0,
            read_rtr: ord & ORD_ZERO_READ_RTR != 0,
        })
    }
}

/// An MPA Request or Reply frame (RFC 5044 §7.1, RFC 6581 §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: markers requested.
    pub markers: bool,
    /// C: CRC requested.
    pub crc: bool,
    /// R: rejected (Reply only).
    pub reject: bool,
    /// Revision (1 or 2).
    pub revision: u8,
    /// S + IRD/ORD words (rev 2 only).
    pub enhanced: Option<IrdOrd>,
    /// ULP private data (after the IRD/ORD words when present).
    pub private_data: Bytes,
}

impl MpaFrame {
    /// Encoded size on the wire.
    pub fn encoded_len(&self) -> usize {
        FRAME_HDR_LEN + self.enhanced.map_or(0, |_| 4) + self.private_data.len()
    }

    /// Encode the frame. Fails if the private data is too long.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let pd_len = self.enhanced.map_or(0, |_| 4) + self.private_data.len();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        let mut out = BytesMut::with_capacity(self.encoded_len());
        out.put_slice(match self.kind {
            FrameKind::Request => REQ_KEY,
            FrameKind::Reply => REP_KEY,
        });
        let mut flags = 0;
        if self.markers {
            flags |= FLAG_M;
        }
        if self.crc {
            flags |= FLAG_C;
        }
        if self.reject {
            flags |= FLAG_R;
        }
        if self.enhanced.is_some() {
            flags |= FLAG_S;
        }
        out.put_u8(flags);
        out.put_u8(self.revision);
        out.put_u16(pd_len as u16);
        if let Some(e) = &self.enhanced {
            e.encode(&mut out);
        }
        out.put_slice(&self.private_data);
        Ok(out.freeze())
    }

    /// Decode a frame from the head of `b`. Returns the frame and the bytes consumed,
    /// or `Ok(None)` if more bytes are needed.
    pub fn decode(b: &[u8]) -> Result<Option<(Self, usize)>, WireError> {
        if b.len() < FRAME_HDR_LEN {
            // Check the key prefix early so garbage fails fast.
            let n = b.len().min(16);
            if b[..n] != REQ_KEY[..n] && b[..n] != REP_KEY[..n] {
                return Err(WireError::BadMpaKey);
            }
            return Ok(None);
        }
        let kind = if &b[..16] == REQ_KEY {
            FrameKind::Request
        } else if &b[..16] == REP_KEY {
            FrameKind::Reply
        } else {
            return Err(WireError::BadMpaKey);
        };
        let flags = b[16];
        let revision = b[17];
        let pd_len = u16::from_be_bytes([b[18], b[19]]) as usize;
        if pd_len > MAX_PRIVATE_DATA {
            // RFC 5044 §7.1: Private Data Length of more than 512 is an error.
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        if !(1..=2).contains(&revision) {
            return Err(WireError::BadMpaRevision(revision));
        }
        if b.len() < FRAME_HDR_LEN + pd_len {
            return Ok(None);
        }
        let pd = &b[FRAME_HDR_LEN..FRAME_HDR_LEN + pd_len];
        // RFC 6581 §3: S is meaningful only with revision 2.
        let s = flags & FLAG_S != 0 && revision == 2;
        let (enhanced, ulp) = if s {
            (Some(IrdOrd::decode(pd)?), &pd[4..])
        } else {
            (None, pd)
        };
        Ok(Some((
            Self {
                kind,
                markers: flags & FLAG_M != 0,
                crc: flags & FLAG_C != 0,
                reject: flags & FLAG_R != 0,
                revision,
                enhanced,
                private_data: Bytes::copy_from_slice(ulp),
            },
            FRAME_HDR_LEN + pd_len,
        )))
    }
}

/// A view of the FPDU at the head of a buffer (RFC 5044 §4.1: the 2-byte ULPDU length, the
/// ULPDU, pad to a multiple of 4, CRC-32C), whose tail may not have arrived yet. Used by
/// [`FpduDecoder`] and by the drivers' peeks at what a read brought.
#[derive(Debug, Clone, Copy)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    /// A view without checking that the length field is there (accessors may then panic).
    pub fn new_unchecked(buffer: T) -> Self {
        Fpdu { buffer }
    }

    /// A view of `buffer` once it holds the length field.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < 2 {
            return Err(WireError::Truncated { need: 2, have });
        }
        Ok(Fpdu { buffer })
    }

    /// The ULPDU length field.
    pub fn ulpdu_len(&self) -> usize {
        let b = self.buffer.as_ref();
        usize::from(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Length of the whole FPDU, pad and CRC included.
    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_len())
    }

    /// True once the whole FPDU is in the buffer.
    pub fn is_complete(&self) -> bool {
        self.buffer.as_ref().len() >= self.total_len()
    }

    /// The part of the ULPDU in the buffer (all of it once complete).
    pub fn ulpdu(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[2..b.len().min(2 + self.ulpdu_len())]
    }

    /// The buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// Bytes of FPDU overhead: length field + CRC.
pub const FPDU_OVERHEAD: usize = 2 + 4;

/// Pad needed after a ULPDU of `ulpdu_len` bytes (RFC 5044 §4.1: length field + ULPDU + pad ≡ 0 mod 4).
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((2 + ulpdu_len) % 4)) % 4
}

/// Total FPDU size for a ULPDU.
pub fn fpdu_len(ulpdu_len: usize) -> usize {
    2 + ulpdu_len + pad_len(ulpdu_len) + 4
}

/// The CRC-32C of an FPDU as it goes on the wire (RFC 5044 §4.1 covers length, ULPDU and pad).
///
/// (Facts file, checked with tshark:) the CRC-32C value is stored least-significant byte first,
/// the same byte order as iSCSI's digest.
pub fn crc_bytes(parts: &[&[u8]]) -> [u8; 4] {
    let mut c = 0u32;
    for p in parts {
        c = crc32c::crc32c_append(c, p);
    }
    c.to_le_bytes()
}

/// Build the FPDU prefix (length) and trailer (pad + CRC) for a ULPDU given as slices.
/// Returns (prefix, trailer).
pub fn frame_parts(ulpdu: &[&[u8]], crc: bool) -> ([u8; 2], ([u8; 8], usize)) {
    let len: usize = ulpdu.iter().map(|p| p.len()).sum();
    debug_assert!(len <= u16::MAX as usize);
    let prefix = (len as u16).to_be_bytes();
    let pad = pad_len(len);
    let mut trailer = [0u8; 8];
    if crc {
        let mut c = crc32c::crc32c_append(0, &prefix);
        for p in ulpdu {
            c = crc32c::crc32c_append(c, p);
        }
        c = crc32c::crc32c_append(c, &[0u8; 3][..pad]);
        trailer[pad..pad + 4].copy_from_slice(&c.to_le_bytes());
    }
    (prefix, (trailer, pad + 4))
}

/// Encode a whole FPDU into a buffer (used by tests and the fuzz target).
pub fn encode_fpdu(ulpdu: &[u8], crc: bool, out: &mut BytesMut) {
    let (prefix, (trailer, tl)) = frame_parts(&[ulpdu], crc);
    out.put_slice(&prefix);
    out.put_slice(ulpdu);
    out.put_slice(&trailer[..tl]);
}

/// Streaming FPDU decoder: feed it bytes, take ULPDUs out. Accepts FPDUs of any size.
#[derive(Debug)]
pub struct FpduDecoder {
    crc: bool,
}

impl FpduDecoder {
    /// New decoder; `crc` says whether CRC-32C was negotiated.
    pub fn new(crc: bool) -> Self {
        Self { crc }
    }

    /// Take one ULPDU from the head of `buf` if a whole FPDU is present.
    ///
    /// RFC 5044 §8: a CRC mismatch is fatal for the stream.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        let Some((len, total)) = Self::complete(buf) else {
            return Ok(None);
        };
        self.check(buf.split_to(total).freeze(), len)
    }

    /// [`FpduDecoder::decode`] from bytes already frozen (no copy: the ULPDU shares them).
    pub fn decode_frozen(&mut self, buf: &mut Bytes) -> Result<Option<Bytes>, WireError> {
        let Some((len, total)) = Self::complete(buf) else {
            return Ok(None);
        };
        self.check(buf.split_to(total), len)
    }

    /// ULPDU length and FPDU length of the whole FPDU at the head of `buf`, if it is there.
    fn complete(buf: &[u8]) -> Option<(usize, usize)> {
        let f = Fpdu::new_checked(buf).ok()?;
        f.is_complete().then(|| (f.ulpdu_len(), f.total_len()))
    }

    /// The ULPDU of a whole FPDU, its CRC checked if negotiated.
    fn check(&self, fpdu: Bytes, len: usize) -> Result<Option<Bytes>, WireError> {
        let total = fpdu.len();
        if self.crc {
            let body = total - 4;
            let want = crc_bytes(&[&fpdu[..body]]);
            if fpdu[body..total] != want {
                return Err(WireError::CrcMismatch);
            }
        }
        Ok(Some(fpdu.slice(2..2 + len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fpdu_view_of_a_partial_fpdu() {
        assert!(Fpdu::new_checked(&[0u8][..]).is_err());
        let mut b = BytesMut::new();
        encode_fpdu(b"hello", false, &mut b);
        let part = &b[..4];
        let f = Fpdu::new_checked(part).unwrap();
        assert_eq!((f.ulpdu_len(), f.total_len()), (5, fpdu_len(5)));
        assert!(!f.is_complete());
        assert_eq!(f.ulpdu(), b"he");
        let f = Fpdu::new_checked(&b[..]).unwrap();
        assert!(f.is_complete());
        assert_eq!(f.ulpdu(), b"hello");
    }

    #[test]
    fn decode_frozen_takes_what_decode_takes() {
        for crc in [false, true] {
            let mut stream = BytesMut::new();
            for n in [0usize, 1, 5, 300, 4096] {
                encode_fpdu(&vec![n as u8; n], crc, &mut stream);
            }
            let whole = stream.len();
            // Every cut: the head decoded both ways, then the rest after more bytes came.
            for cut in [0, 3, 9, whole / 2, whole - 1, whole] {
                let (mut a, mut b) = (
                    BytesMut::from(&stream[..cut]),
                    Bytes::copy_from_slice(&stream[..cut]),
                );
                let (mut da, mut db) = (FpduDecoder::new(crc), FpduDecoder::new(crc));
                loop {
                    let (x, y) = (
                        da.decode(&mut a).unwrap(),
                        db.decode_frozen(&mut b).unwrap(),
                    );
                    assert_eq!(x, y, "crc {crc} cut {cut}");
                    assert_eq!(&a[..], &b[..]);
                    if x.is_none() {
                        break;
                    }
                }
            }
            // A damaged CRC fails both ways.
            if crc {
                let mut bad = stream.clone();
                bad[5] ^= 1; // in the first FPDU's CRC
                let mut b = bad.clone().freeze();
                assert!(FpduDecoder::new(true).decode(&mut bad).is_err());
                assert!(FpduDecoder::new(true).decode_frozen(&mut b).is_err());
            }
        }
    }

    #[test]
    fn fpdu_lengths_are_multiples_of_four() {
        for l in 0..64 {
            assert_eq!(fpdu_len(l) % 4, 0);
        }
    }

    #[test]
    fn frame_round_trip() {
        let f = MpaFrame {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 2,
            enhanced: Some(IrdOrd {
                ird: 16,
                ord: 8,
                peer_to_peer: true,
                write_rtr: true,
                ..Default::default()
            }),
            private_data: Bytes::from_static(b"hello"),
        };
        let b = f.encode().unwrap();
        assert_eq!(b.len(), f.encoded_len());
        let (g, n) = MpaFrame::decode(&b).unwrap().unwrap();
        assert_eq!(n, b.len());
        assert_eq!(f, g);
    }

    #[test]
    fn fpdu_crc_round_trip_and_corruption() {
        let mut buf = BytesMut::new();
        encode_fpdu(b"abcdefg", true, &mut buf);
        let mut bad = buf.clone();
        let mut d = FpduDecoder::new(true);
        assert_eq!(&d.decode(&mut buf).unwrap().unwrap()[..], b"abcdefg");
        bad[3] ^= 1;
        assert!(matches!(d.decode(&mut bad), Err(WireError::CrcMismatch)));
    }
}
