//! Property tests for the MPA/DDP/RDMAP decoders and the receive path.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use verbs::engine::RxHarness;
use verbs::wire::ddp::{BufferModel, DdpHeader, Opcode, ReadRequest, Terminate};
use verbs::wire::mpa::{self, FpduDecoder, FrameKind, IrdOrd, MpaFrame};

fn opcode() -> impl Strategy<Value = Opcode> {
    (0u8..8).prop_map(|v| Opcode::from_u8(v).unwrap())
}

fn header() -> impl Strategy<Value = DdpHeader> {
    (
        opcode(),
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        any::<[u32; 3]>(),
    )
        .prop_map(|(op, last, a, to, u)| {
            let model = if op.is_tagged() {
                BufferModel::Tagged { stag: a, to }
            } else {
                BufferModel::Untagged {
                    inv_stag: a,
                    qn: u[0],
                    msn: u[1],
                    mo: u[2],
                }
            };
            DdpHeader {
                last,
                opcode: op,
                model,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn ddp_header_round_trip(h in header()) {
        let mut b = BytesMut::new();
        h.encode(&mut b);
        prop_assert_eq!(b.len(), h.encoded_len());
        let (g, n) = DdpHeader::decode(&b).unwrap();
        prop_assert_eq!(n, b.len());
        prop_assert_eq!(g, h);
    }

    #[test]
    fn read_request_round_trip(a in any::<u32>(), b in any::<u64>(), c in any::<u32>(), d in any::<u32>(), e in any::<u64>()) {
        let r = ReadRequest { sink_stag: a, sink_to: b, size: c, src_stag: d, src_to: e };
        let mut out = BytesMut::new();
        r.encode(&mut out);
        prop_assert_eq!(out.len(), r.encoded_len());
        prop_assert_eq!(ReadRequest::decode(&out).unwrap(), r);
    }

    #[test]
    fn terminate_round_trip(layer in 0u8..3, etype in 0u8..16, code in any::<u8>(), m in proptest::option::of(any::<u16>()),
                            d in proptest::option::of(header()), r in proptest::option::of(any::<[u8; 28]>())) {
        let ddp_hdr = d.map(|h| { let mut b = BytesMut::new(); h.encode(&mut b); b.to_vec() });
        let t = Terminate { layer, etype, code, ddp_seg_len: m, ddp_hdr, rdma_hdr: r.map(|x| x.to_vec()) };
        let mut out = BytesMut::new();
        t.encode(&mut out);
        prop_assert_eq!(out.len(), t.encoded_len());
        prop_assert_eq!(Terminate::decode(&out).unwrap(), t);
    }

    #[test]
    fn mpa_frame_round_trip(req in any::<bool>(), crc in any::<bool>(), rej in any::<bool>(), rev2 in any::<bool>(),
                            words in any::<(u16, u16, [bool; 4])>(), pd in proptest::collection::vec(any::<u8>(), 0..256)) {
        let enhanced = rev2.then_some(IrdOrd {
            ird: words.0 & 0x3fff, ord: words.1 & 0x3fff,
            peer_to_peer: words.2[0], send_rtr: words.2[1], write_rtr: words.2[2], read_rtr: words.2[3],
        });
        let f = MpaFrame {
            kind: if req { FrameKind::Request } else { FrameKind::Reply },
            markers: false, crc, reject: rej, revision: if rev2 { 2 } else { 1 }, enhanced, private_data: Bytes::from(pd),
        };
        let b = f.encode().unwrap();
        let (g, n) = MpaFrame::decode(&b).unwrap().unwrap();
        prop_assert_eq!(n, b.len());
        prop_assert_eq!(g, f);
    }

    #[test]
    fn fpdu_round_trip_any_split(ulpdus in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8),
                                 crc in any::<bool>(), split in 1usize..64) {
        let mut stream = BytesMut::new();
        for u in &ulpdus {
            mpa::encode_fpdu(u, crc, &mut stream);
            prop_assert_eq!(stream.len() % 4, 0);
        }
        let mut d = FpduDecoder::new(crc);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in stream.chunks(split) {
            buf.extend_from_slice(chunk);
            while let Some(u) = d.decode(&mut buf).unwrap() {
                out.push(u.to_vec());
            }
        }
        prop_assert_eq!(out, ulpdus);
    }

    #[test]
    fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = DdpHeader::decode(&b);
        let _ = ReadRequest::decode(&b);
        let _ = Terminate::decode(&b);
        let _ = MpaFrame::decode(&b);
        let _ = IrdOrd::decode(&b);
        let mut buf = BytesMut::from(&b[..]);
        let _ = FpduDecoder::new(true).decode(&mut buf);
    }

    #[test]
    fn receive_path_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..96), 0..12),
                                 crc in any::<bool>(), rtr in any::<bool>(), direct in any::<bool>()) {
        let mut h = RxHarness::new(crc, rtr);
        if direct {
            h = h.with_direct_placement();
        }
        for c in &chunks {
            h.feed(c);
        }
    }

    /// Well-formed FPDUs with random DDP headers reach the engine (not just the framing).
    #[test]
    fn engine_never_panics_on_framed_segments(hs in proptest::collection::vec((header(), proptest::collection::vec(any::<u8>(), 0..64)), 1..10)) {
        let mut h = RxHarness::new(false, false).with_direct_placement();
        for (hd, payload) in hs {
            let mut u = BytesMut::new();
            hd.encode(&mut u);
            u.extend_from_slice(&payload);
            let mut f = BytesMut::new();
            mpa::encode_fpdu(&u, false, &mut f);
            h.feed(&f);
        }
    }
}
