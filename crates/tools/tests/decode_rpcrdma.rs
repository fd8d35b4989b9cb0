//! `tools::decode::rpcrdma` on every RPC-over-RDMA message type, built with the `rpcrdma`
//! encoders: version 1 RDMA_MSG/NOMSG/MSGP/DONE/ERROR and version 2 MSG, NOMSG, ERROR (each
//! error), OPTIONAL and the four property messages.

use bytes::Bytes;
use rpcrdma::header::{Body, Chunks, ErrorBody, Header, ReadSegment, Segment};
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2, Optional};
use rpcrdma::props::{
    BackwardSupport, ConnProp, PropSet, PropSubset, PropVal, ReqProp, ResProp, UpdProp,
};
use tools::decode::rpcrdma::{decode_header, rebuild_payload};

fn seg(handle: u32, length: u32) -> Segment {
    Segment {
        handle,
        length,
        offset: 0x1000,
    }
}

fn chunks() -> Chunks {
    Chunks {
        reads: vec![ReadSegment {
            position: 8,
            target: seg(1, 10),
        }],
        writes: vec![vec![seg(2, 4096), seg(3, 4096)]],
        reply: Some(vec![seg(4, 1024)]),
    }
}

#[test]
fn version_1_message_types() {
    let cases = [
        (Body::Msg(chunks()), "RDMA_MSG"),
        (Body::NoMsg(chunks()), "RDMA_NOMSG"),
        (
            Body::MsgP {
                align: 4,
                thresh: 8,
                chunks: Chunks::default(),
            },
            "RDMA_MSGP",
        ),
        (Body::Done, "RDMA_DONE"),
        (
            Body::Error(ErrorBody::Vers { low: 1, high: 1 }),
            "RDMA_ERROR",
        ),
        (Body::Error(ErrorBody::Chunk), "RDMA_ERROR"),
    ];
    for (body, name) in cases {
        let h = Header::new(0x77, 32, body.clone());
        let i = decode_header(&h.to_bytes());
        assert_eq!((i.vers, i.xid, i.credits, i.proc_name), (1, 0x77, 32, name));
        assert!(i.malformed.is_none());
        if let Body::Msg(_) | Body::NoMsg(_) = body {
            assert_eq!(i.reads.len(), 1);
            assert_eq!(i.reads[0].position, 8);
            assert_eq!(i.writes.len(), 1);
            assert_eq!(i.writes[0].len(), 2);
            assert_eq!(i.reply_chunk.as_ref().map(Vec::len), Some(1));
        }
    }
    let e = decode_header(
        &Header::new(1, 1, Body::Error(ErrorBody::Vers { low: 1, high: 2 })).to_bytes(),
    );
    assert_eq!(e.error.as_deref(), Some("ERR_VERS 1-2"));
    // Truncated: what came before is kept, and why it stopped.
    let b = Header::new(9, 1, Body::Msg(chunks())).to_bytes();
    let t = decode_header(&b[..30]);
    assert_eq!(t.xid, 9);
    assert!(t.malformed.is_some());
}

#[test]
fn version_2_message_types() {
    let lists = ChunkLists {
        direction: Direction::Call,
        inv_handle: 4,
        chunks: chunks(),
    };
    let set = PropSet(vec![
        PropVal::rbsiz(8192),
        PropVal::brs(BackwardSupport::General),
    ]);
    let cases = [
        (Body2::Msg(lists.clone()), "RDMA2_MSG"),
        (Body2::NoMsg(lists), "RDMA2_NOMSG"),
        (
            Body2::Optional(Optional {
                direction: Direction::Reply,
                opttype: 0xffff_ff01,
                optinfo: Bytes::from_static(b"abcd"),
            }),
            "RDMA2_OPTIONAL",
        ),
        (
            Body2::ConnProp(ConnProp {
                start: set.clone(),
                nochg: PropSubset::from_positions([1]),
            }),
            "RDMA2_CONNPROP",
        ),
        (
            Body2::ReqProp(ReqProp { want: set.clone() }),
            "RDMA2_REQPROP",
        ),
        (
            Body2::ResProp(ResProp {
                done: PropSubset::from_positions([0]),
                rejected: PropSubset::from_positions([1]),
                other: PropSet::default(),
            }),
            "RDMA2_RESPROP",
        ),
        (Body2::UpdProp(UpdProp { now: set }), "RDMA2_UPDPROP"),
    ];
    for (body, name) in cases {
        let i = decode_header(&Header2::new(5, 16, body).to_bytes());
        assert_eq!(
            (i.vers, i.xid, i.credits, i.proc_name),
            (2, 5, 16, name),
            "{i:?}"
        );
        assert!(i.malformed.is_none(), "{i:?}");
        match name {
            "RDMA2_MSG" | "RDMA2_NOMSG" => {
                assert_eq!((i.direction, i.inv_handle), (Some("call"), Some(4)));
                assert_eq!(i.writes[0].len(), 2);
            }
            "RDMA2_OPTIONAL" => assert_eq!(i.opttype, Some(0xffff_ff01)),
            "RDMA2_CONNPROP" => {
                assert_eq!(i.properties, ["RBSIZ=8192", "BRS=General", "nochg={1}"])
            }
            "RDMA2_RESPROP" => assert_eq!(i.properties, ["done={0}", "rejected={1}"]),
            _ => assert!(i.properties.iter().any(|p| p == "RBSIZ=8192")),
        }
    }
    let errors = [
        (ErrorBody2::Vers { low: 1, high: 2 }, "ERR_VERS 1-2"),
        (ErrorBody2::BadXdr, "ERR_BAD_XDR"),
        (ErrorBody2::InvalProc, "ERR_INVAL_PROC"),
        (
            ErrorBody2::ReadChunks { max_chunks: 2 },
            "ERR_READ_CHUNKS max=2",
        ),
        (
            ErrorBody2::WriteChunks { max_chunks: 3 },
            "ERR_WRITE_CHUNKS max=3",
        ),
        (
            ErrorBody2::Segments { max_segments: 4 },
            "ERR_SEGMENTS max=4",
        ),
        (
            ErrorBody2::WriteResource {
                chunk_index: 1,
                length_needed: 9,
            },
            "ERR_WRITE_RESOURCE chunk=1 needed=9",
        ),
        (
            ErrorBody2::ReplyResource { length_needed: 7 },
            "ERR_REPLY_RESOURCE needed=7",
        ),
        (ErrorBody2::InvalOption, "ERR_INVAL_OPTION"),
        (ErrorBody2::System, "ERR_SYSTEM"),
    ];
    for (e, text) in errors {
        let i = decode_header(&Header2::new(6, 1, Body2::Error(e)).to_bytes());
        assert_eq!(
            (i.proc_name, i.error.as_deref()),
            ("RDMA2_ERROR", Some(text))
        );
    }
}

#[test]
fn payload_is_rebuilt_around_read_chunks() {
    // Four inline bytes, an 10-byte item at position 4 (12 with its pad), two more bytes.
    let i = decode_header(
        &Header::new(
            1,
            1,
            Body::Msg(Chunks {
                reads: vec![ReadSegment {
                    position: 4,
                    target: seg(1, 10),
                }],
                ..Chunks::default()
            }),
        )
        .to_bytes(),
    );
    let p = rebuild_payload(b"abcdef", &i.reads);
    assert_eq!(p.len(), 4 + 12 + 2);
    assert_eq!(&p[..4], b"abcd");
    assert_eq!(&p[16..], b"ef");
    assert!(p[4..16].iter().all(|b| *b == 0));
}
