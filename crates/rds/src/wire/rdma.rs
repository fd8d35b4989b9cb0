//! RDS over RDMA on the wire: the 32-byte IPv4 connection private data ([`ConnData`]), and the
//! cutting of messages into Sends of the header plus at most 4096 payload bytes
//! ([`Splitter`], [`Fragmenter`], [`Reassembler`]). The driver is [`crate::rdma`].

use std::net::Ipv4Addr;

use bytes::{Bytes, BytesMut};

use crate::error::WireError;

use super::{FRAG_SIZE, HEADER_LEN, Header, HeaderView, MAX_MSG_LEN};

/// Length of the IPv4 connection private data.
pub const CONN_DATA_LEN: usize = 32;
/// Supported-minor-versions mask we advertise (3.0 and 3.1).
pub const MINOR_MASK: u16 = 0x3;

/// The IPv4 connection private data (facts: saddr @0, daddr @4, major @8, minor @9,
/// minor_mask be16 @10, tos @12, ack_seq be64 @16, credit be32 @24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// Sender's RDS address.
    pub saddr: Ipv4Addr,
    /// Receiver's RDS address.
    pub daddr: Ipv4Addr,
    /// Protocol major version.
    pub major: u8,
    /// Protocol minor version.
    pub minor: u8,
    /// Minor versions supported (bit n = 3.n).
    pub minor_mask: u16,
    /// Type of service.
    pub tos: u8,
    /// Last sequence number received on this path (initial ack).
    pub ack_seq: u64,
    /// Initial credits (receive buffers posted); 0 = no flow control.
    pub credit: u32,
}

impl ConnData {
    /// Encoded length.
    pub const fn encoded_len(&self) -> usize {
        CONN_DATA_LEN
    }

    /// Encodes the 32 bytes.
    pub fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut b = [0u8; CONN_DATA_LEN];
        b[0..4].copy_from_slice(&self.saddr.octets());
        b[4..8].copy_from_slice(&self.daddr.octets());
        b[8] = self.major;
        b[9] = self.minor;
        b[10..12].copy_from_slice(&self.minor_mask.to_be_bytes());
        b[12] = self.tos;
        b[16..24].copy_from_slice(&self.ack_seq.to_be_bytes());
        b[24..28].copy_from_slice(&self.credit.to_be_bytes());
        b
    }

    /// Decodes; needs at least 32 bytes (extra bytes, as rdma_cm pads, are ignored).
    pub fn decode(b: &[u8]) -> Result<ConnData, WireError> {
        let Some(b) = b.get(..CONN_DATA_LEN) else {
            return Err(WireError::Short {
                need: CONN_DATA_LEN,
                have: b.len(),
            });
        };
        let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[16..24]);
        Ok(ConnData {
            saddr: Ipv4Addr::from(be32(0)),
            daddr: Ipv4Addr::from(be32(4)),
            major: b[8],
            minor: b[9],
            minor_mask: u16::from_be_bytes([b[10], b[11]]),
            tos: b[12],
            ack_seq: u64::from_be_bytes(seq),
            credit: be32(24),
        })
    }

    /// The version the acceptor runs for this request: 3.1 when the request is 3.x with minor 1
    /// offered (in `minor` or `minor_mask`); `None` = reject (facts: other versions are
    /// rejected; we do not speak 4.x).
    pub fn negotiate(&self) -> Option<(u8, u8)> {
        (self.major == 3 && (self.minor == 1 || self.minor_mask & 0x2 != 0)).then_some((3, 1))
    }
}

/// Cuts the engine's transmit stream into messages (header, payload).
#[derive(Debug, Default)]
pub struct Splitter {
    buf: BytesMut,
    /// The payload of the header held in `buf`, kept as pushed (no copy).
    payload: Option<Bytes>,
}

impl Splitter {
    /// Appends stream bytes.
    pub fn push(&mut self, b: &[u8]) {
        if let Some(p) = self.payload.take() {
            self.buf.extend_from_slice(&p);
        }
        self.buf.extend_from_slice(b);
    }

    /// Appends stream bytes given as a buffer: when they are exactly the payload of the one
    /// header waiting in the splitter (the engine hands out a header, then its payload), they
    /// are kept without copying.
    pub fn push_bytes(&mut self, b: Bytes) {
        if self.payload.is_none()
            && !b.is_empty()
            && self.buf.len() == HEADER_LEN
            && HeaderView::new_checked(&self.buf[..])
                .ok()
                .and_then(|v| Header::from_view(&v).ok())
                .is_some_and(|h| h.len as usize == b.len())
        {
            self.payload = Some(b);
            return;
        }
        self.push(&b);
    }

    /// Next complete message.
    pub fn next_msg(&mut self) -> Result<Option<(Header, Bytes)>, WireError> {
        let Ok(view) = HeaderView::new_checked(&self.buf[..]) else {
            return Ok(None);
        };
        let h = Header::from_view(&view)?;
        let len = h.len as usize;
        if len > MAX_MSG_LEN {
            return Err(WireError::TooLong(h.len));
        }
        if let Some(p) = self.payload.take() {
            // Set only when `buf` is exactly this header and `p` its whole payload.
            self.buf.clear();
            return Ok(Some((h, p)));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let mut m = self.buf.split_to(HEADER_LEN + len);
        let payload = m.split_off(HEADER_LEN).freeze();
        Ok(Some((h, payload)))
    }
}

/// One Send: a header (credit and checksum filled at post time) and ≤ 4096 payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    /// The header (repeated on every fragment).
    pub header: Header,
    /// This fragment's payload.
    pub payload: Bytes,
    /// First fragment of its message (the one that may carry `h_credit`).
    pub first: bool,
    /// RDMA Write (peer rkey, tagged offset, data) to post just before this Send.
    pub write: Option<(u32, u64, Bytes)>,
    /// RDMA Read (peer rkey, tagged offset, length) to complete before this Send is posted.
    pub read: Option<(u32, u64, u32)>,
}

impl Fragment {
    /// Encodes header (with `credit`, checksum recomputed after setting it) and payload.
    pub fn encode(&self, credit: u8) -> Result<Bytes, WireError> {
        let mut h = self.header.clone();
        h.credit = credit;
        // Checksum covers h_credit: computed after setting it.
        let hb = h.encode_with_checksum()?;
        let mut out = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&hb);
        out.extend_from_slice(&self.payload);
        Ok(out.freeze())
    }
}

/// Splits a message into Sends of the header + ≤ 4096 bytes.
#[derive(Debug)]
pub struct Fragmenter;

impl Fragmenter {
    /// The fragments of one message (one header-only fragment when the payload is empty).
    pub fn fragments(h: &Header, payload: &Bytes) -> Vec<Fragment> {
        if payload.is_empty() {
            return vec![Fragment {
                header: h.clone(),
                payload: Bytes::new(),
                first: true,
                write: None,
                read: None,
            }];
        }
        (0..payload.len())
            .step_by(FRAG_SIZE)
            .map(|o| Fragment {
                header: h.clone(),
                payload: payload.slice(o..(o + FRAG_SIZE).min(payload.len())),
                first: o == 0,
                write: None,
                read: None,
            })
            .collect()
    }
}

/// What one received Send produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RxOutput {
    /// Credits granted by the peer (`h_credit`).
    pub credit: u8,
    /// A complete message for the engine (header bytes + payload), if this Send finished one.
    pub message: Option<Bytes>,
}

/// Reassembles fragments (facts: every fragment repeats seq, len and ports; a mismatch drops
/// the connection).
#[derive(Debug, Default)]
pub struct Reassembler {
    cur: Option<(Header, BytesMut)>,
}

impl Reassembler {
    /// One received Send. Errors mean the connection must be dropped.
    pub fn on_send(&mut self, data: &[u8]) -> Result<RxOutput, WireError> {
        // Header::from_view verifies a nonzero h_csum (facts "Checksum").
        let view = HeaderView::new_checked(data)?;
        let h = Header::from_view(&view)?;
        let payload = view.payload();
        if payload.len() > FRAG_SIZE {
            return Err(WireError::TooLong(payload.len() as u32));
        }
        if h.len as usize > MAX_MSG_LEN {
            return Err(WireError::TooLong(h.len));
        }
        let credit = h.credit;
        if self.cur.is_some() && h.is_ack_only() && payload.is_empty() {
            // A credit update / ack between two fragments of a message: handled on its own.
            let mut hh = h;
            hh.credit = 0;
            hh.csum = 0;
            return Ok(RxOutput {
                credit,
                message: Some(Bytes::copy_from_slice(&hh.encode()?)),
            });
        }
        match self.cur.as_mut() {
            None => {
                let total = h.len as usize;
                if payload.len() > total || (payload.is_empty() && total != 0) {
                    return Err(WireError::FragmentMismatch);
                }
                let mut hh = h;
                // The engine sees the message as sent, without the transport's credit.
                hh.credit = 0;
                hh.csum = 0;
                let mut buf = BytesMut::with_capacity(HEADER_LEN + total);
                buf.extend_from_slice(&hh.encode()?);
                buf.extend_from_slice(payload);
                if buf.len() == HEADER_LEN + total {
                    return Ok(RxOutput {
                        credit,
                        message: Some(buf.freeze()),
                    });
                }
                self.cur = Some((hh, buf));
                Ok(RxOutput {
                    credit,
                    message: None,
                })
            }
            Some((first, buf)) => {
                if h.seq != first.seq
                    || h.len != first.len
                    || h.sport != first.sport
                    || h.dport != first.dport
                    || payload.is_empty()
                {
                    return Err(WireError::FragmentMismatch);
                }
                let total = HEADER_LEN + first.len as usize;
                if buf.len() + payload.len() > total {
                    return Err(WireError::FragmentMismatch);
                }
                buf.extend_from_slice(payload);
                if buf.len() == total {
                    let (_, b) = self.cur.take().ok_or(WireError::FragmentMismatch)?;
                    return Ok(RxOutput {
                        credit,
                        message: Some(b.freeze()),
                    });
                }
                Ok(RxOutput {
                    credit,
                    message: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_roundtrip_and_negotiation() {
        let d = ConnData {
            saddr: Ipv4Addr::new(10, 0, 0, 1),
            daddr: Ipv4Addr::new(10, 0, 0, 2),
            major: 3,
            minor: 1,
            minor_mask: MINOR_MASK,
            tos: 0,
            ack_seq: 0x0102_0304_0506_0708,
            credit: 64,
        };
        let b = d.encode();
        assert_eq!(&b[0..4], &[10, 0, 0, 1]);
        assert_eq!(&b[10..12], &[0, 3]);
        assert_eq!(&b[16..24], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[24..28], &[0, 0, 0, 64]);
        assert_eq!(ConnData::decode(&b), Ok(d));
        assert!(ConnData::decode(&b[..31]).is_err());
        assert_eq!(d.negotiate(), Some((3, 1)));
        let v4 = ConnData {
            major: 4,
            minor: 1,
            ..d
        };
        assert_eq!(v4.negotiate(), None);
    }

    #[test]
    fn fragments_roundtrip_with_checksums_and_credit() {
        let h = Header {
            seq: 9,
            len: 10_000,
            sport: 5,
            dport: 6,
            ..Header::default()
        };
        let p = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let fr = Fragmenter::fragments(&h, &p);
        assert_eq!(fr.len(), 3);
        let mut r = Reassembler::default();
        let mut got = None;
        for (n, f) in fr.iter().enumerate() {
            let b = f.encode(if f.first { 7 } else { 0 }).unwrap();
            assert!(b.len() <= HEADER_LEN + FRAG_SIZE);
            assert_ne!(
                HeaderView::new_checked(&b[..]).unwrap().csum(),
                0,
                "checksum on"
            );
            let out = r.on_send(&b).unwrap();
            assert_eq!(out.credit, if n == 0 { 7 } else { 0 });
            got = out.message.or(got);
        }
        let m = got.unwrap();
        assert_eq!(&m[HEADER_LEN..], &p[..]);
        assert_eq!(Header::decode(&m).unwrap().seq, 9);
    }

    #[test]
    fn fragment_mismatch_and_bad_checksum_are_errors() {
        let h = Header {
            seq: 1,
            len: 5000,
            sport: 5,
            dport: 6,
            ..Header::default()
        };
        let p = Bytes::from(vec![1u8; 5000]);
        let fr = Fragmenter::fragments(&h, &p);
        let mut r = Reassembler::default();
        r.on_send(&fr[0].encode(0).unwrap()).unwrap();
        let mut bad = fr[1].clone();
        bad.header.seq = 2;
        assert_eq!(
            r.on_send(&bad.encode(0).unwrap()),
            Err(WireError::FragmentMismatch)
        );
        let mut b = fr[0].encode(0).unwrap().to_vec();
        b[0] ^= 1;
        assert!(matches!(
            Reassembler::default().on_send(&b),
            Err(WireError::BadChecksum(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn conn_data_decoder_never_panics_and_roundtrips(b in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            if let Ok(d) = ConnData::decode(&b) {
                proptest::prop_assert_eq!(ConnData::decode(&d.encode()), Ok(d));
            }
        }

        #[test]
        fn reassembler_never_panics(sends in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..200), 0..8)) {
            let mut r = Reassembler::default();
            for s in &sends {
                if let Ok(out) = r.on_send(s) && let Some(m) = out.message {
                    let h = Header::decode(&m).unwrap();
                    proptest::prop_assert_eq!(m.len(), HEADER_LEN + h.len as usize);
                }
            }
        }

        #[test]
        fn splitter_gives_the_same_messages_copied_or_not(lens in proptest::collection::vec(0usize..9000, 1..6), cut in 1usize..100) {
            let mut stream = Vec::new();
            let mut pieces: Vec<Bytes> = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                let h = Header { seq: i as u64 + 1, len: *len as u32, sport: 3, dport: 4, ..Header::default() };
                let hb = Bytes::copy_from_slice(&h.encode().unwrap());
                let p = Bytes::from(vec![i as u8; *len]);
                stream.extend_from_slice(&hb);
                stream.extend_from_slice(&p);
                pieces.push(hb);
                if !p.is_empty() {
                    pieces.push(p);
                }
            }
            // As the engine hands them out (header, payload), and as arbitrary slices.
            let (mut a, mut b) = (Splitter::default(), Splitter::default());
            let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
            for p in pieces {
                a.push_bytes(p);
                while let Some(m) = a.next_msg().unwrap() { got_a.push(m); }
            }
            for c in stream.chunks(cut) {
                b.push_bytes(Bytes::copy_from_slice(c));
                while let Some(m) = b.next_msg().unwrap() { got_b.push(m); }
            }
            proptest::prop_assert_eq!(got_a.len(), lens.len());
            proptest::prop_assert_eq!(got_a, got_b);
        }

        #[test]
        fn any_message_fragments_and_reassembles(len in 0usize..20_000, seq in 1u64..1000, credit in 0u8..=255) {
            let h = Header { seq, len: len as u32, sport: 7, dport: 9, ..Header::default() };
            let p = Bytes::from(vec![0xa5u8; len]);
            let mut r = Reassembler::default();
            let mut got = None;
            for f in Fragmenter::fragments(&h, &p) {
                let b = f.encode(if f.first { credit } else { 0 }).unwrap();
                proptest::prop_assert!(b.len() <= HEADER_LEN + FRAG_SIZE);
                got = r.on_send(&b).unwrap().message.or(got);
            }
            let m = got.unwrap();
            proptest::prop_assert_eq!(&m[HEADER_LEN..], &p[..]);
        }
    }
}
