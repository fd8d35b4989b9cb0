//! The responder's verdicts on the driver's ops, sans-IO: given what arrived (the header, the
//! received bytes, the STag the completion says was invalidated, the state of the STag offered
//! for Send with Invalidate), whether to ACK or which NAK to send. The driver in
//! [`peer`](super::peer) does the I/O around them.

use super::hdr::{HDR_LEN, Hdr, Op, check, nak};

/// The STag offered to the peer for its Send with Invalidate (INVKEY), as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The STag.
    pub rkey: u32,
    /// It is still valid (nothing invalidated it).
    pub still_valid: bool,
}

/// The verdict on one DATA message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataVerdict {
    /// `(NAK code, offset or value)`, or `None` to ACK.
    pub nak: Option<(u32, u32)>,
    /// A Send with Invalidate arrived without an invalidated STag (worth saying once).
    pub invalidate_missing: bool,
}

/// Judge a DATA message of `byte_len` bytes whose received bytes are `msg` (header included).
/// `invalidated` is the STag the receive completion carries, `offered` the STag offered for a
/// Send with Invalidate.
pub fn judge_data(
    h: &Hdr,
    byte_len: u32,
    msg: &[u8],
    invalidated: Option<u32>,
    offered: Option<Offered>,
) -> DataVerdict {
    let nak = |code, value| DataVerdict {
        nak: Some((code, value)),
        invalidate_missing: false,
    };
    let want = HDR_LEN as u64 + u64::from(h.len);
    let payload = msg.get(HDR_LEN..HDR_LEN.saturating_add(h.len as usize));
    let payload = match payload {
        Some(p) if u64::from(byte_len) == want => p,
        _ => return nak(nak::BAD_LENGTH, byte_len),
    };
    if let Some(bad) = check(payload, h.op, h.iter) {
        return nak(nak::MISMATCH, bad as u32);
    }
    if h.op == Op::Send.code() {
        if let Some(k) = invalidated {
            return nak(nak::SEND_WITH_INV, k);
        }
    } else if h.op == Op::Sendinv.code() {
        return match invalidated {
            // RFC 5040 §5.3: the named STag is invalidated before the completion is reported;
            // the completion carries it.
            Some(k) if Some(k) != offered.map(|o| o.rkey) => nak(nak::WRONG_STAG, k),
            Some(_) if offered.is_some_and(|o| o.still_valid) => nak(nak::WRONG_STAG, 0),
            Some(_) => DataVerdict::default(),
            None => DataVerdict {
                nak: Some((nak::WRONG_STAG, 0)),
                invalidate_missing: true,
            },
        };
    }
    DataVerdict::default()
}

/// Judge a WROTE: the peer says it RDMA-wrote `h.len` pattern bytes at the start of `target`
/// (our buffer of `bufsz` bytes).
pub fn judge_wrote(h: &Hdr, bufsz: u32, target: &[u8]) -> Option<(u32, u32)> {
    if h.len > bufsz {
        return Some((nak::BAD_LENGTH, h.len));
    }
    match target.get(..h.len as usize) {
        None => Some((nak::BAD_LENGTH, h.len)),
        Some(b) => check(b, h.op, h.iter).map(|bad| (nak::MISMATCH, bad as u32)),
    }
}

/// Judge a FILL: the peer asks for `h.len` pattern bytes in our buffer of `bufsz` bytes.
pub fn judge_fill(h: &Hdr, bufsz: u32) -> Option<(u32, u32)> {
    (h.len > bufsz).then_some((nak::BAD_LENGTH, h.len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iwpeer::hdr::{fill, msg};

    fn data(op: Op, len: u32) -> (Hdr, Vec<u8>) {
        let h = Hdr {
            typ: msg::DATA,
            op: op.code(),
            iter: 3,
            len,
            ..Hdr::default()
        };
        let mut b = vec![0u8; HDR_LEN + len as usize];
        b[..HDR_LEN].copy_from_slice(&h.encode());
        fill(&mut b[HDR_LEN..], h.op, h.iter);
        (h, b)
    }

    #[test]
    fn data_verdicts() {
        let (h, b) = data(Op::Send, 100);
        let n = b.len() as u32;
        assert_eq!(judge_data(&h, n, &b, None, None).nak, None);
        assert_eq!(
            judge_data(&h, n - 1, &b, None, None).nak,
            Some((nak::BAD_LENGTH, n - 1))
        );
        // Shorter than the header says: never slices past what arrived.
        assert_eq!(
            judge_data(&h, n, &b[..40], None, None).nak,
            Some((nak::BAD_LENGTH, n))
        );
        let mut bad = b.clone();
        bad[HDR_LEN + 7] ^= 1;
        assert_eq!(
            judge_data(&h, n, &bad, None, None).nak,
            Some((nak::MISMATCH, 7))
        );
        assert_eq!(
            judge_data(&h, n, &b, Some(9), None).nak,
            Some((nak::SEND_WITH_INV, 9))
        );
        let (h, b) = data(Op::Sendinv, 10);
        let n = b.len() as u32;
        let gone = Some(Offered {
            rkey: 5,
            still_valid: false,
        });
        assert_eq!(judge_data(&h, n, &b, Some(5), gone).nak, None);
        assert_eq!(
            judge_data(&h, n, &b, Some(6), gone).nak,
            Some((nak::WRONG_STAG, 6))
        );
        let valid = Some(Offered {
            rkey: 5,
            still_valid: true,
        });
        assert_eq!(
            judge_data(&h, n, &b, Some(5), valid).nak,
            Some((nak::WRONG_STAG, 0))
        );
        let v = judge_data(&h, n, &b, None, gone);
        assert_eq!(v.nak, Some((nak::WRONG_STAG, 0)));
        assert!(v.invalidate_missing);
    }

    #[test]
    fn wrote_and_fill_verdicts() {
        let h = Hdr {
            typ: msg::WROTE,
            op: Op::Write.code(),
            iter: 1,
            len: 64,
            ..Hdr::default()
        };
        let mut t = vec![0u8; 128];
        fill(&mut t[..64], h.op, h.iter);
        assert_eq!(judge_wrote(&h, 128, &t), None);
        t[10] ^= 0xff;
        assert_eq!(judge_wrote(&h, 128, &t), Some((nak::MISMATCH, 10)));
        assert_eq!(judge_wrote(&h, 32, &t), Some((nak::BAD_LENGTH, 64)));
        assert_eq!(judge_fill(&h, 32), Some((nak::BAD_LENGTH, 64)));
        assert_eq!(judge_fill(&h, 64), None);
    }
}
