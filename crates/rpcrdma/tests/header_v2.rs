//! The version 2 header codec: every procedure and error body round-trips, and every failure
//! maps to the error cel-05 §7.2.4 prescribes. Property-based: any header decodes to what was
//! encoded, and no input panics the decoder.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use rpcrdma::header::{Chunks, DecodeLimits, ReadSegment, Segment};
use rpcrdma::header_v2::*;
use rpcrdma::props::*;

fn seg(handle: u32, length: u32, offset: u64) -> Segment {
    Segment {
        handle,
        length,
        offset,
    }
}

fn sample_chunks() -> Chunks {
    Chunks {
        reads: vec![ReadSegment {
            position: 0,
            target: seg(0x1111_2201, 4096, 0xdead_0000),
        }],
        writes: vec![vec![seg(0x3333_4401, 8192, 0x10)], vec![]],
        reply: Some(vec![
            seg(0x5555_6601, 1024, 0x20),
            seg(0x5555_6602, 12, 0x30),
        ]),
    }
}

fn roundtrip(h: &Header2) {
    let b = h.to_bytes();
    assert_eq!(b.len(), h.encoded_len(), "{h:?}");
    let (back, len) = Header2::decode(&b).expect("decodes");
    assert_eq!(len, b.len());
    assert_eq!(&back, h);
}

#[test]
fn every_procedure_roundtrips() {
    let lists = ChunkLists {
        direction: Direction::Call,
        inv_handle: 0x5555_6601,
        chunks: sample_chunks(),
    };
    let props = PropSet(vec![
        PropVal::rbsiz(65536),
        PropVal::brs(BackwardSupport::General),
    ]);
    let bodies = vec![
        Body2::Msg(lists.clone()),
        Body2::Msg(ChunkLists::new(Direction::Reply, Chunks::default())),
        Body2::NoMsg(lists),
        Body2::Optional(Optional {
            direction: Direction::Call,
            opttype: 0xFFFF_FF01,
            optinfo: Bytes::from_static(b"xid!!"),
        }),
        Body2::ConnProp(ConnProp {
            start: props.clone(),
            nochg: PropSubset::from_positions([1]),
        }),
        Body2::ReqProp(ReqProp {
            want: props.clone(),
        }),
        Body2::ResProp(ResProp {
            done: PropSubset::from_positions([0]),
            rejected: PropSubset::from_positions([1]),
            other: PropSet::default(),
        }),
        Body2::UpdProp(UpdProp { now: props }),
    ];
    for body in bodies {
        roundtrip(&Header2::new(7, 32, body));
    }
}

#[test]
fn every_error_body_roundtrips_with_its_code() {
    let cases = [
        (ErrorBody2::Vers { low: 1, high: 2 }, 1),
        (ErrorBody2::BadXdr, 2),
        (ErrorBody2::InvalProc, 3),
        (ErrorBody2::ReadChunks { max_chunks: 0 }, 4),
        (ErrorBody2::WriteChunks { max_chunks: 3 }, 5),
        (ErrorBody2::Segments { max_segments: 16 }, 6),
        (
            ErrorBody2::WriteResource {
                chunk_index: 1,
                length_needed: 65536,
            },
            7,
        ),
        (
            ErrorBody2::ReplyResource {
                length_needed: 9000,
            },
            8,
        ),
        (ErrorBody2::InvalOption, 9),
        (ErrorBody2::System, 10),
    ];
    for (body, code) in cases {
        assert_eq!(body.code(), code);
        let h = Header2::new(9, 1, Body2::Error(body));
        roundtrip(&h);
        let b = h.to_bytes();
        assert_eq!(&b[12..20], &[0, 0, 0, 4, 0, 0, 0, code as u8]);
        assert_eq!(h.body.direction(), Some(Direction::Reply));
    }
}

#[test]
fn err_vers_is_byte_identical_to_what_linux_sends_a_version_2_probe() {
    // shared/facts: Linux svcrdma answers [xid, vers, credits, RDMA_ERROR, ERR_VERS, 1, 1].
    let b = error_vers_bytes(0x0102_0304, 2, 0, 1, 1);
    assert_eq!(
        &b[..],
        &[
            1, 2, 3, 4, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1
        ]
    );
    // ... and a version 2 decoder reads it as RDMA2_ERR_VERS.
    let (h, _) = Header2::decode(&b).unwrap();
    assert_eq!(h.body, Body2::Error(ErrorBody2::Vers { low: 1, high: 1 }));
}

fn raw(words: &[u32]) -> Vec<u8> {
    let mut b = BytesMut::new();
    for w in words {
        b.put_u32(*w);
    }
    b.to_vec()
}

#[test]
fn failures_map_to_the_prescribed_errors() {
    let resp = |b: &[u8]| Header2::decode(b).unwrap_err().response();
    let e = |xid, body| ErrorResponse2::Error { xid, body };
    // Too short for an XID: nothing to answer.
    assert_eq!(resp(&[0, 0, 0]), ErrorResponse2::Discard);
    // Another version: ERR_VERS with the version copied.
    assert_eq!(
        resp(&raw(&[5, 3, 1, 0])),
        ErrorResponse2::ErrVers { xid: 5, vers: 3 }
    );
    // §7.2.4 INVAL_PROC for an unknown procedure (2 and 3, version 1's MSGP and DONE, too).
    for p in [2, 3, 10, 0xFFFF_FFFF] {
        assert_eq!(resp(&raw(&[5, 2, 1, p])), e(5, ErrorBody2::InvalProc));
    }
    // BAD_XDR: truncated lists, a bad direction, a bad optional-data flag, NOMSG without chunks.
    assert_eq!(resp(&raw(&[5, 2, 1, 0, 0, 0])), e(5, ErrorBody2::BadXdr));
    assert_eq!(
        resp(&raw(&[5, 2, 1, 0, 2, 0, 0, 0, 0])),
        e(5, ErrorBody2::BadXdr)
    );
    assert_eq!(
        resp(&raw(&[5, 2, 1, 0, 0, 0, 7, 0, 0])),
        e(5, ErrorBody2::BadXdr)
    );
    assert_eq!(
        resp(&raw(&[5, 2, 1, 1, 0, 0, 0, 0, 0])),
        e(5, ErrorBody2::BadXdr)
    );
    // A known property with a bad value (§6.1.1), in CONNPROP: BAD_XDR. An unknown one: fine.
    assert_eq!(
        resp(&raw(&[5, 2, 1, 6, 1, 2, 4, 9, 0])),
        e(5, ErrorBody2::BadXdr)
    );
    assert!(Header2::decode(&raw(&[5, 2, 1, 6, 1, 77, 4, 9, 0])).is_ok());
    // Property data running past the end of the message.
    assert_eq!(
        resp(&raw(&[5, 2, 1, 6, 1, 1, 100, 0])),
        e(5, ErrorBody2::BadXdr)
    );
    // A malformed RDMA2_ERROR is silently discarded.
    assert_eq!(resp(&raw(&[5, 2, 1, 4, 99])), ErrorResponse2::Discard);
    assert_eq!(resp(&raw(&[5, 2, 1, 4, 7, 1])), ErrorResponse2::Discard);
}

#[test]
fn limits_give_the_specific_errors() {
    let lim = Decode2Limits {
        chunks: DecodeLimits {
            max_read_segments: 1,
            max_write_chunks: 1,
            max_segments: 1,
        },
        ..Default::default()
    };
    let resp = |h: Header2| {
        Header2::decode_with(&h.to_bytes(), &lim)
            .unwrap_err()
            .response()
    };
    let mut c = sample_chunks();
    c.writes.truncate(1);
    c.reply = None;
    c.reads.push(c.reads[0]);
    assert_eq!(
        resp(Header2::new(
            1,
            1,
            Body2::Msg(ChunkLists::new(Direction::Call, c))
        )),
        ErrorResponse2::Error {
            xid: 1,
            body: ErrorBody2::Segments { max_segments: 1 }
        }
    );
    let mut c = sample_chunks();
    c.reads.clear();
    c.reply = None;
    assert_eq!(
        resp(Header2::new(
            2,
            1,
            Body2::Msg(ChunkLists::new(Direction::Call, c))
        )),
        ErrorResponse2::Error {
            xid: 2,
            body: ErrorBody2::WriteChunks { max_chunks: 1 }
        }
    );
    let mut c = sample_chunks();
    c.reads.clear();
    c.writes.clear();
    assert_eq!(
        resp(Header2::new(
            3,
            1,
            Body2::Msg(ChunkLists::new(Direction::Call, c))
        )),
        ErrorResponse2::Error {
            xid: 3,
            body: ErrorBody2::Segments { max_segments: 1 }
        }
    );
}

#[test]
fn remote_invalidation_needs_a_handle_of_the_header() {
    let mut l = ChunkLists::new(Direction::Call, sample_chunks());
    assert_eq!(l.invalidate(), None, "zero offers nothing");
    l.inv_handle = 0x3333_4401;
    assert_eq!(l.invalidate(), Some(0x3333_4401));
    l.inv_handle = 0x1111_2201;
    assert_eq!(l.invalidate(), Some(0x1111_2201));
    // Gap 5: a handle that names no segment means a plain Send, not an error.
    l.inv_handle = 0x7777_7777;
    assert_eq!(l.invalidate(), None);
}

#[test]
fn property_messages_sent_as_optional_opttypes_are_understood() {
    let c = ConnProp {
        start: PropSet(vec![PropVal::rbsiz(8192)]),
        nochg: PropSubset::default(),
    };
    let mut info = BytesMut::new();
    Header2::new(0, 0, Body2::ConnProp(c.clone())).encode(&mut info);
    let o = Optional {
        direction: Direction::Call,
        opttype: 1,
        optinfo: info.freeze().slice(16..),
    };
    assert_eq!(
        o.property_message(&PropLimits::default()).unwrap().unwrap(),
        PropertyMessage::ConnProp(c)
    );
    let other = Optional {
        opttype: 0xFFFF_FF01,
        ..o
    };
    assert!(other.property_message(&PropLimits::default()).is_none());
}

fn arb_segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(h, l, o)| seg(h, l, o))
}

fn arb_chunks() -> impl Strategy<Value = Chunks> {
    (
        prop::collection::vec((any::<u32>(), arb_segment()), 0..4),
        prop::collection::vec(prop::collection::vec(arb_segment(), 0..4), 0..3),
        prop::option::of(prop::collection::vec(arb_segment(), 0..4)),
    )
        .prop_map(|(r, writes, reply)| Chunks {
            reads: r
                .into_iter()
                .map(|(position, target)| ReadSegment { position, target })
                .collect(),
            writes,
            reply,
        })
}

fn arb_propset() -> impl Strategy<Value = PropSet> {
    prop::collection::vec(
        prop_oneof![
            any::<u32>().prop_map(PropVal::rbsiz),
            (0u32..3).prop_map(|v| PropVal {
                which: PROPID_BRS,
                data: Bytes::copy_from_slice(&v.to_be_bytes())
            }),
            (3u32.., prop::collection::vec(any::<u8>(), 0..9)).prop_map(|(which, d)| PropVal {
                which,
                data: Bytes::from(d)
            }),
        ],
        0..5,
    )
    .prop_map(PropSet)
}

fn arb_subset() -> impl Strategy<Value = PropSubset> {
    prop::collection::vec(any::<u32>(), 0..3).prop_map(PropSubset)
}

fn arb_body() -> impl Strategy<Value = Body2> {
    let dir = prop_oneof![Just(Direction::Call), Just(Direction::Reply)];
    prop_oneof![
        (dir.clone(), any::<u32>(), arb_chunks()).prop_map(|(direction, inv_handle, chunks)| {
            Body2::Msg(ChunkLists {
                direction,
                inv_handle,
                chunks,
            })
        }),
        (dir.clone(), any::<u32>(), arb_chunks())
            .prop_filter("NOMSG needs a chunk", |(_, _, c)| !c.is_empty())
            .prop_map(|(direction, inv_handle, chunks)| Body2::NoMsg(ChunkLists {
                direction,
                inv_handle,
                chunks
            })),
        (dir, any::<u32>(), prop::collection::vec(any::<u8>(), 0..40)).prop_map(
            |(direction, opttype, d)| Body2::Optional(Optional {
                direction,
                opttype,
                optinfo: Bytes::from(d)
            })
        ),
        (arb_propset(), arb_subset())
            .prop_map(|(start, nochg)| Body2::ConnProp(ConnProp { start, nochg })),
        arb_propset().prop_map(|want| Body2::ReqProp(ReqProp { want })),
        (arb_subset(), arb_subset(), arb_propset()).prop_map(|(done, rejected, other)| {
            Body2::ResProp(ResProp {
                done,
                rejected,
                other,
            })
        }),
        arb_propset().prop_map(|now| Body2::UpdProp(UpdProp { now })),
        (any::<u32>(), any::<u32>()).prop_map(|(a, b)| Body2::Error(ErrorBody2::WriteResource {
            chunk_index: a,
            length_needed: b
        })),
    ]
}

proptest! {
    #[test]
    fn any_header_roundtrips(xid in any::<u32>(), credits in any::<u32>(), body in arb_body()) {
        let h = Header2::new(xid, credits, body);
        let b = h.to_bytes();
        prop_assert_eq!(b.len(), h.encoded_len());
        let (back, len) = Header2::decode(&b).unwrap();
        prop_assert_eq!(len, b.len());
        prop_assert_eq!(back, h);
    }

    #[test]
    fn no_input_panics_and_errors_have_a_response(data in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = Header2::decode(&data) {
            let _ = e.response();
        }
    }

    #[test]
    fn version_2_prefix_with_random_body_never_panics(
        xid in any::<u32>(), proc_ in 0u32..12, rest in prop::collection::vec(any::<u32>(), 0..40)
    ) {
        let mut words = vec![xid, 2, 1, proc_];
        // Keep most discriminants small so decoding gets deep into the body.
        words.extend(rest.into_iter().map(|w| if w % 3 == 0 { w } else { w % 3 }));
        let b = raw(&words);
        match Header2::decode(&b) {
            Ok((h, len)) => {
                prop_assert!(len <= b.len());
                prop_assert_eq!(h.xid, xid);
            }
            Err(e) => {
                prop_assert_ne!(e.response(), ErrorResponse2::ErrVers { xid, vers: 2 });
            }
        }
    }
}

#[test]
fn non_zero_xdr_padding_is_tolerated_and_re_encoded_as_zeros() {
    // Found by the rpcrdma_header_v2 fuzz target: an UPDPROP whose 2-byte property value is
    // followed by padding bytes 00 01. Decoders here, like Linux's, accept it (RFC 4506 §3 says
    // the sender zeroes padding; nothing says the receiver must check); the encoder writes zeros.
    let wire = [
        0, 0, 0, 11, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 1, 255, 255, 255, 16, 0, 0, 0, 2,
        0, 0, 0, 1,
    ];
    let (h, n) = Header2::decode(&wire).unwrap();
    assert_eq!(n, wire.len());
    let again = h.to_bytes();
    assert_eq!(&again[..28], &wire[..28]);
    assert_eq!(&again[28..], &[0, 0, 0, 0]);
    assert_eq!(Header2::decode(&again).unwrap().0, h);
}
