//! The Responder speaking RPC-over-RDMA version 2 (cel-05), driven with hand-built version 2
//! messages: the version lock and answers in the client's version (§8.3), the direction field
//! (§7.2.2), remote invalidation through rdma_inv_handle (§7.2.3), the new errors where their
//! conditions occur (§7.2.4), OPTIONAL and the transport property messages (§5.1, §6.3).

use crate::common::*;
use bytes::{Bytes, BytesMut};
use oncrpc::OpaqueAuth;
use rpcrdma::engine::Config;
use rpcrdma::header::{Chunks, Segment};
use rpcrdma::header_v2::*;
use rpcrdma::props::*;
use rpcrdma::responder::{Action, Incoming, Responder};
use rpcrdma::version::Version;
use xdr::DdpPolicy;

fn responder(cfg: Config) -> Responder {
    let h = Harness::new(Config::default(), cfg);
    h.resp
}

/// A version 2 call: header with `chunks` and `inv`, then the inline ECHO call.
fn v2_call(xid: u32, data: &[u8], chunks: Chunks, inv: u32) -> Bytes {
    let msg = echo_message(
        xid,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        7,
        &Bytes::copy_from_slice(data),
        &Bytes::new(),
    );
    let h = Header2::new(
        xid,
        16,
        Body2::Msg(ChunkLists {
            direction: Direction::Call,
            inv_handle: inv,
            chunks,
        }),
    );
    let mut b = BytesMut::new();
    h.encode(&mut b);
    b.extend_from_slice(&msg.to_bytes());
    b.freeze()
}

/// Run a call through the responder and the echo program; the actions of its reply.
fn serve(r: &mut Responder, msg: Bytes) -> Vec<Action> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    match r.on_receive(msg) {
        Incoming::Call(c) => {
            let reply = rt.block_on(dispatcher().dispatch(
                c.message,
                oncrpc::CallContext::local(),
                c.policy,
            ));
            r.reply(c.token, reply)
        }
        Incoming::Respond(a) => a,
        other => panic!("unexpected {other:?}"),
    }
}

fn last_send(a: &[Action]) -> (Bytes, Option<u32>) {
    match a.last() {
        Some(Action::Send { data, invalidate }) => (data.clone(), *invalidate),
        other => panic!("expected a Send last, got {other:?}"),
    }
}

fn error_of(a: &[Action]) -> ErrorBody2 {
    let (b, inv) = last_send(a);
    assert_eq!(
        inv, None,
        "RDMA2_ERROR never goes with Send With Invalidate"
    );
    match Header2::decode(&b).unwrap().0.body {
        Body2::Error(e) => e,
        other => panic!("expected RDMA2_ERROR, got {other:?}"),
    }
}

fn seg(handle: u32, length: u32) -> Segment {
    Segment {
        handle,
        length,
        offset: 0x1000,
    }
}

#[test]
fn a_version_2_call_is_answered_in_version_2_and_locks_the_connection() {
    let mut r = responder(Config::default());
    let a = serve(&mut r, v2_call(1, b"hello", Chunks::default(), 0));
    let (b, inv) = last_send(&a);
    assert_eq!(inv, None);
    let (h, n) = Header2::decode(&b).unwrap();
    assert_eq!(h.xid, 1);
    match h.body {
        Body2::Msg(l) => {
            assert_eq!(
                l.direction,
                Direction::Reply,
                "§7.2.2: a reply carries REPLY"
            );
            assert_eq!(l.inv_handle, 0);
        }
        other => panic!("expected RDMA2_MSG, got {other:?}"),
    }
    // The RPC reply follows inline (§7.2.1) and carries the echo.
    assert!(b.len() > n);
    assert_eq!(r.version(), Some(Version::V2));
    // Locked: a version 1 message now gets ERR_VERS naming version 2 only.
    let mut v1 = BytesMut::new();
    rpcrdma::header::Header::new(2, 1, rpcrdma::header::Body::Msg(Chunks::default()))
        .encode(&mut v1);
    let (b, _) = last_send(&serve(&mut r, v1.freeze()));
    // rdma_vers copies the refused message's (1); the body is RDMA_ERROR, ERR_VERS, [2, 2].
    assert_eq!(&b[..8], &[0, 0, 0, 2, 0, 0, 0, 1]);
    assert_eq!(&b[12..], &[0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2]);
}

#[test]
fn a_version_1_client_sees_a_version_1_server() {
    let mut h = Harness::new(Config::default(), Config::default());
    // The ordinary version 1 path, back to back, unchanged.
    let m = echo_message(
        5,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        5,
        &Bytes::from_static(b"v1"),
        &Bytes::new(),
    );
    let a = h.req.submit(
        out_call(5, ECHO, m, oncrpc::ReplyExpectation::default()),
        &mut h.creg,
    );
    h.client_actions(a);
    h.run();
    assert!(h.done.remove(&5).unwrap().is_ok());
    assert_eq!(h.resp.version(), Some(Version::V1));
    // A version 2 message on that connection: ERR_VERS [1, 1], as Linux answers.
    let (b, _) = last_send(&serve(&mut h.resp, v2_call(6, b"x", Chunks::default(), 0)));
    assert_eq!(
        &b[..],
        &[
            0, 0, 0, 6, 0, 0, 0, 2, 0, 0, 0, 64, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1
        ][..]
    );
}

#[test]
fn rdma_inv_handle_chooses_send_with_invalidate() {
    let mut r = responder(Config::default());
    let reply = Chunks {
        reply: Some(vec![seg(0xAB01, 4096)]),
        ..Chunks::default()
    };
    // §7.2.3: a handle of the call -> Send With Invalidate with it.
    let (_, inv) = last_send(&serve(&mut r, v2_call(1, b"a", reply.clone(), 0xAB01)));
    assert_eq!(inv, Some(0xAB01));
    // Zero -> a plain Send.
    let (_, inv) = last_send(&serve(&mut r, v2_call(2, b"a", reply.clone(), 0)));
    assert_eq!(inv, None);
    // A handle that names no segment of the call -> a plain Send (gap 5), not an error.
    let (b, inv) = last_send(&serve(&mut r, v2_call(3, b"a", reply, 0x7777)));
    assert_eq!(inv, None);
    assert!(matches!(Header2::decode(&b).unwrap().0.body, Body2::Msg(_)));
}

#[test]
fn reply_and_write_resource_errors_say_what_is_needed() {
    let mut r = responder(Config::default());
    // A 10 KB reply, 4 KiB inline threshold, no Reply chunk: RDMA2_ERR_REPLY_RESOURCE with
    // the bytes needed (§7.2.4).
    let big = vec![3u8; 10_000];
    match error_of(&serve(&mut r, v2_call(1, &big, Chunks::default(), 0))) {
        ErrorBody2::ReplyResource { length_needed } => {
            assert!(length_needed as usize > 10_000, "{length_needed}")
        }
        other => panic!("expected REPLY_RESOURCE, got {other:?}"),
    }
    // A Reply chunk too short: the same error.
    let short = Chunks {
        reply: Some(vec![seg(0x10, 1000)]),
        ..Chunks::default()
    };
    assert!(matches!(
        error_of(&serve(&mut r, v2_call(2, &big, short, 0))),
        ErrorBody2::ReplyResource { .. }
    ));
    // The echo's data item goes to Write chunk 1, which is too short for it:
    // RDMA2_ERR_WRITE_RESOURCE { chunk_index: 1, length_needed: the item's length }.
    let small = Chunks {
        writes: vec![vec![seg(0x20, 100)]],
        ..Chunks::default()
    };
    let item = vec![9u8; 3000];
    assert_eq!(
        error_of(&serve(&mut r, v2_call(3, &item, small, 0))),
        ErrorBody2::WriteResource {
            chunk_index: 1,
            length_needed: 3000
        }
    );
}

#[test]
fn malformed_and_unknown_messages_get_the_prescribed_errors() {
    let mut r = responder(Config::default());
    let words = |w: &[u32]| -> Bytes {
        w.iter()
            .flat_map(|x| x.to_be_bytes())
            .collect::<Vec<u8>>()
            .into()
    };
    // §7.2.4: an unknown rdma_proc -> INVAL_PROC; unparseable -> BAD_XDR.
    let a = serve(&mut r, words(&[9, 2, 1, 77]));
    assert_eq!(error_of(&a), ErrorBody2::InvalProc);
    let a = serve(&mut r, words(&[9, 2, 1, 0, 0, 0, 1]));
    assert_eq!(error_of(&a), ErrorBody2::BadXdr);
    // §7.2.2: a CALL-direction RDMA2_MSG whose payload is not a CALL -> BAD_XDR.
    let mut b = BytesMut::new();
    Header2::new(
        10,
        1,
        Body2::Msg(ChunkLists::new(Direction::Call, Chunks::default())),
    )
    .encode(&mut b);
    b.extend_from_slice(&words(&[10, 1, 0, 0, 0, 0]));
    assert_eq!(error_of(&serve(&mut r, b.freeze())), ErrorBody2::BadXdr);
    // §5.1: an OPTIONAL of an unknown type -> INVAL_OPTION; in the REPLY direction, nothing
    // (gap 2).
    let opt = |dir| {
        Header2::new(
            11,
            1,
            Body2::Optional(Optional {
                direction: dir,
                opttype: 0xFFFF_FF42,
                optinfo: Bytes::from_static(b"??"),
            }),
        )
        .to_bytes()
    };
    assert_eq!(
        error_of(&serve(&mut r, opt(Direction::Call))),
        ErrorBody2::InvalOption
    );
    assert!(matches!(
        r.on_receive(opt(Direction::Reply)),
        Incoming::Nothing
    ));
    // §7.2.4: errors never flow from requester to responder: dropped.
    let e = Header2::new(12, 1, Body2::Error(ErrorBody2::System)).to_bytes();
    assert!(matches!(r.on_receive(e), Incoming::Nothing));
}

#[test]
fn transport_properties_raise_the_send_limit_and_requests_get_a_response() {
    let mut r = responder(Config::default());
    let big = vec![5u8; 20_000];
    // Before the peer says anything: §3.3, 4096 bytes -> the reply needs a Reply chunk.
    assert!(matches!(
        error_of(&serve(&mut r, v2_call(1, &big, Chunks::default(), 0))),
        ErrorBody2::ReplyResource { .. }
    ));
    // The peer announces 64 KiB receive buffers (§6.3.1): the same reply now goes inline.
    let cp = Header2::new(
        0,
        1,
        Body2::ConnProp(ConnProp {
            start: PropSet(vec![
                PropVal::rbsiz(65536),
                PropVal {
                    which: 0xFFFF_FF99,
                    data: Bytes::from_static(b"unknown, ignored"),
                },
            ]),
            nochg: PropSubset::default(),
        }),
    )
    .to_bytes();
    assert!(matches!(r.on_receive(cp), Incoming::Nothing));
    assert_eq!(r.v2_properties().send_limit(), 65536);
    let (b, _) = last_send(&serve(&mut r, v2_call(2, &big, Chunks::default(), 0)));
    assert!(matches!(Header2::decode(&b).unwrap().0.body, Body2::Msg(_)));
    assert!(b.len() > 20_000);
    // A request to change our properties is answered under its XID, every change refused
    // (our receive buffers keep their size) except asking for the value in effect.
    let want = PropSet(vec![
        PropVal::rbsiz(1 << 20),
        PropVal::rbsiz(r.v2_properties().local_rbsiz),
    ]);
    let rq = Header2::new(33, 1, Body2::ReqProp(ReqProp { want })).to_bytes();
    let (b, _) = last_send(&serve(&mut r, rq));
    let (h, _) = Header2::decode(&b).unwrap();
    assert_eq!(h.xid, 33);
    match h.body {
        Body2::ResProp(res) => {
            assert_eq!(res.rejected.positions().collect::<Vec<_>>(), vec![0]);
            assert_eq!(res.done.positions().collect::<Vec<_>>(), vec![1]);
        }
        other => panic!("expected RDMA2_RESPROP, got {other:?}"),
    }
}

#[test]
fn a_version_1_only_responder_refuses_version_2_as_linux_does() {
    let mut r = responder(Config {
        max_version: Version::V1,
        ..Config::default()
    });
    let (b, _) = last_send(&serve(&mut r, v2_call(4, b"x", Chunks::default(), 0)));
    // [xid, vers, credits, RDMA_ERROR, ERR_VERS, 1, 1]: byte-identical to Linux svcrdma.
    assert_eq!(&b[4..8], &[0, 0, 0, 2]);
    assert_eq!(&b[12..], &[0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
    assert_eq!(r.version(), None);
}
