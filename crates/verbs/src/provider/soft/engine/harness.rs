//! [`RxHarness`]: the receive path without a driver, for fuzzing and property tests.

use bytes::BytesMut;
use std::sync::Arc;

use super::{Engine, EngineEvent, EngineParams, QpState, place};
use crate::cq::RecvWr;
use crate::mem::{Access, MrInner, StagTable};
use crate::wire::ddp::{Segment, TAGGED_HDR_LEN, Terminate, term};

/// A self-contained receive path (MPA FPDU decoding + this engine) over a few registered
/// regions, for fuzzing and property tests: feed it arbitrary bytes, it must never panic.
#[derive(Debug)]
pub struct RxHarness {
    engine: Engine,
    dec: crate::wire::mpa::FpduDecoder,
    buf: BytesMut,
    _mrs: Vec<Arc<MrInner>>,
    direct: bool,
}

impl RxHarness {
    /// A running QP (IRD/ORD 4, optional CRC, optionally awaiting an RTR) with receives posted.
    pub fn new(crc: bool, await_rtr: bool) -> Self {
        let table = StagTable::new();
        let mut engine = Engine::new(1, 1, table.clone());
        let mrs: Vec<_> = [
            Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            Access::REMOTE_READ,
        ]
        .into_iter()
        .map(|a| table.insert_fixed(1, 0x100 + a.bits(), vec![0u8; 4096].into_boxed_slice(), a))
        .collect();
        engine.start(EngineParams {
            ird: 4,
            ord: 4,
            max_ulpdu: 1024,
            send_rtr: None,
            await_rtr,
            zero_copy_tx: false,
        });
        for i in 0..4 {
            engine.post_recv(RecvWr::new(
                i,
                crate::Sge {
                    lkey: mrs[0].stag(),
                    addr: 0,
                    length: 1024,
                },
            ));
        }
        Self {
            engine,
            dec: crate::wire::mpa::FpduDecoder::new(crc),
            buf: BytesMut::new(),
            _mrs: mrs,
            direct: false,
        }
    }

    /// Also exercise the driver's direct-placement calls (`direct_target` / `on_placed`) for
    /// tagged segments, as the TCP driver does without CRC.
    pub fn with_direct_placement(mut self) -> Self {
        self.direct = true;
        self
    }

    /// Feed stream bytes; returns the number of segments the engine then wanted to send.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        self.buf.extend_from_slice(data);
        loop {
            if self.engine.closing {
                break;
            }
            match self.dec.decode(&mut self.buf) {
                Ok(Some(u)) => {
                    let tagged = u.len() >= TAGGED_HDR_LEN
                        && Segment::new_checked(&u[..]).is_ok_and(|s| s.is_tagged());
                    let target = if self.direct && tagged {
                        self.engine
                            .direct_target(&u[..TAGGED_HDR_LEN], u.len() - TAGGED_HDR_LEN)
                    } else {
                        None
                    };
                    match target {
                        Some(t) => {
                            place(&t.mr, t.off, &u[TAGGED_HDR_LEN..]);
                            self.engine
                                .on_placed(&u[..TAGGED_HDR_LEN], u.len() - TAGGED_HDR_LEN);
                        }
                        None => self.engine.on_ulpdu(&u),
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    self.engine.on_llp_error(term::MPA_CRC);
                    break;
                }
            }
        }
        let mut n = 0;
        while n < 10_000 && self.engine.poll_transmit().is_some() {
            n += 1;
        }
        // Nobody polls the harness's queues.
        self.engine.outbox.completions.clear();
        n
    }

    /// Feed one ULPDU directly (no MPA framing).
    pub fn feed_ulpdu(&mut self, u: &[u8]) {
        self.engine.on_ulpdu(u);
        self.engine.outbox.completions.clear();
    }

    /// QP state.
    pub fn state(&self) -> QpState {
        self.engine.state
    }

    /// Terminate the engine sent, if any.
    pub fn terminate_sent(&self) -> Option<&Terminate> {
        self.engine.outbox.events.iter().find_map(|e| match e {
            EngineEvent::TerminateSent(t) => Some(t),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::untagged;
    use super::*;
    use crate::wire::ddp::{
        BufferModel, DdpHeader, Opcode, QN_READ_REQ, QN_TERMINATE, ReadRequest,
    };
    use bytes::BufMut;

    fn send(msn: u32, mo: u32, qn: u32, data: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::Send,
            model: BufferModel::Untagged {
                inv_stag: 0,
                qn,
                msn,
                mo,
            },
        }
        .encode(&mut b);
        b.put_slice(data);
        b.to_vec()
    }

    fn rreq(msn: u32, size: u32) -> Vec<u8> {
        let mut b = BytesMut::new();
        untagged(Opcode::ReadRequest, QN_READ_REQ, msn, 0, 0).encode(&mut b);
        ReadRequest {
            size,
            ..Default::default()
        }
        .encode(&mut b);
        b.to_vec()
    }

    fn codes(h: &RxHarness) -> (u8, u8, u8) {
        let t = h.terminate_sent().expect("terminate");
        (t.layer, t.etype, t.code)
    }

    #[test]
    fn read_requests_beyond_ird_terminate() {
        let mut h = RxHarness::new(false, false);
        for msn in 1..=4 {
            h.feed_ulpdu(&rreq(msn, 0));
        }
        assert!(h.terminate_sent().is_none());
        h.feed_ulpdu(&rreq(5, 0));
        assert_eq!(
            codes(&h),
            (1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER)
        );
        assert_eq!(h.state(), QpState::Error);
    }

    #[test]
    fn bad_msn_and_mo_and_qn() {
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(2, 0, 0, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_MSN_RANGE));
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(1, 4, 0, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_INVALID_MO));
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(1, 0, 9, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_INVALID_QN));
    }

    #[test]
    fn unexpected_read_response_and_bad_rtr() {
        let mut h = RxHarness::new(false, false);
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            model: BufferModel::Tagged { stag: 1, to: 0 },
        }
        .encode(&mut b);
        h.feed_ulpdu(&b);
        assert_eq!(codes(&h), (0, 2, term::RDMAP_UNEXPECTED_OPCODE));
        let mut h = RxHarness::new(false, true);
        h.feed_ulpdu(&send(1, 0, 0, b"not an rtr"));
        assert_eq!(codes(&h), (2, 0, term::MPA_INVALID_REQ_REP));
    }

    #[test]
    fn terminate_is_transmitted_on_qn2() {
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(7, 0, 0, b""));
        let s = h.engine.poll_transmit().expect("terminate segment");
        let (d, n) = DdpHeader::decode(&s.hdr).unwrap();
        assert_eq!(d.opcode, Opcode::Terminate);
        assert!(matches!(
            d.model,
            BufferModel::Untagged {
                qn: QN_TERMINATE,
                msn: 1,
                mo: 0,
                ..
            }
        ));
        assert_eq!(
            Terminate::decode(&s.hdr[n..]).unwrap(),
            *h.terminate_sent().unwrap()
        );
        assert!(
            h.engine.poll_transmit().is_none(),
            "nothing after a Terminate"
        );
    }
}
