//! Version 2 (cel-05) between the Requester and the Responder back to back, beyond the message
//! forms: the transport property exchange (§6.3) and the inline threshold it raises, property
//! lists with unknown and malformed properties, each new error produced by the Responder and
//! handled by the Requester (§7.2.4, with its SHOULD retries), and the backward direction with
//! the direction field both ways (§7.2.2).

use std::ops::Range;
use std::sync::Arc;

use crate::common::*;
use bytes::{Bytes, BytesMut};
use oncrpc::{AcceptStat, OpaqueAuth, ReplyExpectation, RpcError};
use rpcrdma::engine::Config;
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2, peek_version};
use rpcrdma::props::{BackwardSupport, ConnProp, PropSet, PropSubset, PropVal, ReqProp};
use rpcrdma::ulb::{Bindings, ChunkLimits, UlbError, UpperLayerBinding};
use rpcrdma::version::{Version, VersionPolicy};
use xdr::DdpPolicy;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn client() -> Config {
    Config {
        version_policy: VersionPolicy::V2,
        credits: 8,
        ..cfg_4k()
    }
}

fn server() -> Config {
    Config {
        max_version: Version::V2,
        credits: 8,
        ..cfg_4k()
    }
}

fn expect(data: usize, extra: usize, ddp: bool) -> ReplyExpectation {
    ReplyExpectation {
        max_len: Some(64 + data + extra),
        ddp_items: if ddp { vec![data] } else { vec![] },
    }
}

/// Submit an ECHO call and run the pair until nothing moves; the call's result.
fn call(
    h: &mut Harness,
    xid: u32,
    data: usize,
    policy: DdpPolicy,
    reply: ReplyExpectation,
) -> Result<Bytes, RpcError> {
    let d = pattern(data, xid as u8);
    let m = echo_message(xid, OpaqueAuth::none(), policy, xid, &d, &Bytes::new());
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    let got = h.done.remove(&xid).expect("call completed")?;
    assert_eq!(got, echo_results_bytes(xid, &d, &[]), "xid {xid}");
    Ok(got)
}

/// The echo binding with other chunk limits.
#[derive(Debug)]
struct Limited(ChunkLimits);

impl UpperLayerBinding for Limited {
    fn program(&self) -> u32 {
        EchoUlb.program()
    }
    fn call_ddp_items(&self, v: u32, p: u32, args: &[u8]) -> Result<Vec<Range<usize>>, UlbError> {
        EchoUlb.call_ddp_items(v, p, args)
    }
    fn max_reply_size(&self, v: u32, p: u32, args: &[u8]) -> Option<usize> {
        EchoUlb.max_reply_size(v, p, args)
    }
    fn chunk_limits(&self) -> ChunkLimits {
        self.0
    }
    fn covers_version(&self, v: u32) -> bool {
        EchoUlb.covers_version(v)
    }
    fn reply_ddp_positions(
        &self,
        v: u32,
        p: u32,
        results: &[u8],
        written: &[usize],
    ) -> Result<Vec<usize>, UlbError> {
        EchoUlb.reply_ddp_positions(v, p, results, written)
    }
}

/// A harness whose Responder applies `lim` to the echo program.
fn limited(lim: ChunkLimits, client: Config) -> Harness {
    let mut h = Harness::new(client, server());
    let mut m: Bindings = Bindings::default();
    m.insert(PROG, Arc::new(Limited(lim)));
    h.resp =
        rpcrdma::responder::Responder::new(server(), h.params, Arc::new(m), Default::default());
    h
}

/// The version 2 errors the Responder sent, in order.
fn errors_sent(h: &Harness) -> Vec<ErrorBody2> {
    h.server_sends
        .iter()
        .filter_map(|b| match Header2::decode(b) {
            Ok((
                Header2 {
                    body: Body2::Error(e),
                    ..
                },
                _,
            )) => Some(e),
            _ => None,
        })
        .collect()
}

#[test]
fn properties_are_exchanged_and_rbsiz_raises_the_inline_threshold() {
    // The server's receive buffers are 16 KiB; it says so in RDMA2_CONNPROP before its first
    // reply, and the client says 4 KiB (its own) after that reply.
    let srv = Config {
        inline_recv: 16384,
        ..server()
    };
    let mut h = Harness::new(client(), srv.clone());
    h.resp = rpcrdma::responder::Responder::new(
        srv.clone(),
        srv.negotiate(Some(client().private_data())).into(),
        ulbs(),
        Default::default(),
    );
    assert_eq!(h.req.v2_properties().send_limit(), 4096, "§3.3 until told");
    call(&mut h, 1, 100, DdpPolicy::Inline, expect(100, 0, false)).unwrap();
    let (first, _) = Header2::decode(&h.server_sends[0]).unwrap();
    let Body2::ConnProp(c) = first.body else {
        panic!("the Responder's first Send is its CONNPROP: {first:?}")
    };
    assert_eq!(c.start.0[0], PropVal::rbsiz(16384));
    assert_eq!(h.req.v2_properties().peer_rbsiz, 16384);
    assert!(
        h.resp.v2_properties().peer_announced,
        "the client's CONNPROP arrived"
    );
    assert_eq!(h.resp.v2_properties().peer_rbsiz, 4096);
    // An 8 KiB argument the caller's encoder reduced now fits the server's receive buffers:
    // it goes inline, whole (no Read chunk is registered or pulled).
    let before = h.req.stats().chunked;
    call(&mut h, 2, 8192, reduce(1), expect(8192, 0, false)).unwrap();
    assert_eq!(h.req.stats().inline_unreduced, 1);
    assert_eq!(h.req.stats().chunked, before, "no Read chunk");
    // Beyond RBSIZ the Read chunk is used as before.
    call(&mut h, 3, 20000, reduce(1), expect(20000, 0, false)).unwrap();
    assert_eq!(h.req.stats().chunked, before + 1);
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn version_1_requesters_and_responders_exchange_no_properties() {
    let mut h = Harness::new(
        Config {
            version_policy: VersionPolicy::V1,
            ..client()
        },
        server(),
    );
    call(&mut h, 1, 8192, reduce(1), expect(8192, 0, false)).unwrap();
    assert!(
        h.server_sends
            .iter()
            .all(|b| peek_version(b).unwrap().1 == 1)
    );
    assert_eq!(h.req.stats().inline_unreduced, 0, "version 1 unchanged");
    assert!(!h.resp.v2_properties().peer_announced);
}

/// Deliver one version 2 message from the "server" to the Requester.
fn to_requester(h: &mut Harness, m: Header2) -> Vec<rpcrdma::requester::Action> {
    h.req.on_receive(m.to_bytes(), None, &mut h.creg)
}

#[test]
fn the_requester_takes_unknown_properties_and_drops_malformed_lists() {
    let mut h = Harness::new(client(), server());
    call(&mut h, 1, 10, DdpPolicy::Inline, expect(10, 0, false)).unwrap();
    // Unknown (experimental range, cel-05 §6.4.2) beside a known one: ignored, RBSIZ taken.
    let unknown = PropVal {
        which: 0xFFFF_FF07,
        data: Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8]),
    };
    let c = ConnProp {
        start: PropSet(vec![unknown.clone(), PropVal::rbsiz(65536)]),
        nochg: PropSubset::default(),
    };
    let a = to_requester(&mut h, Header2::new(0, 8, Body2::ConnProp(c)));
    assert!(a.is_empty());
    assert_eq!(h.req.v2_properties().peer_rbsiz, 65536);
    // Malformed: RBSIZ with a 2-byte value (§6.1.1) is refused by the decoder; a Requester
    // sends no error (§7.2.4), the message is dropped and nothing changes.
    let bad = ConnProp {
        start: PropSet(vec![PropVal {
            which: rpcrdma::props::PROPID_RBSIZ,
            data: Bytes::from_static(&[0, 1]),
        }]),
        nochg: PropSubset::default(),
    };
    let dropped = h.req.stats().dropped;
    let a = to_requester(&mut h, Header2::new(0, 8, Body2::ConnProp(bad)));
    assert!(a.is_empty());
    assert_eq!(h.req.stats().dropped, dropped + 1);
    assert_eq!(h.req.v2_properties().peer_rbsiz, 65536);
    // A list whose count runs past the message: dropped too.
    let mut raw = BytesMut::new();
    Header2::new(0, 8, Body2::UpdProp(Default::default())).encode(&mut raw);
    raw.truncate(16);
    raw.extend_from_slice(&1000u32.to_be_bytes());
    let a = h.req.on_receive(raw.freeze(), None, &mut h.creg);
    assert!(a.is_empty());
    assert_eq!(h.req.stats().dropped, dropped + 2);
    // REQPROP from the server: RDMA2_RESPROP under its XID; our values are fixed, so a
    // change is rejected and the value in effect is "done" (§6.3.3).
    let req = ReqProp {
        want: PropSet(vec![
            PropVal::rbsiz(8192),
            PropVal::rbsiz(4096),
            unknown,
            PropVal::brs(BackwardSupport::Inline),
        ]),
    };
    let a = to_requester(&mut h, Header2::new(77, 8, Body2::ReqProp(req)));
    let [rpcrdma::requester::Action::Send { xid: 77, data }] = a.as_slice() else {
        panic!("one RESPROP: {a:?}")
    };
    let (r, _) = Header2::decode(data).unwrap();
    let Body2::ResProp(res) = r.body else {
        panic!("{r:?}")
    };
    assert_eq!(res.done.positions().collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(res.rejected.positions().collect::<Vec<_>>(), vec![0, 2]);
    assert!(
        res.other.0.is_empty(),
        "§6.3.3: nothing unrequested in rdma_other"
    );
}

#[test]
fn read_chunks_is_produced_and_the_call_resent_with_a_position_zero_chunk() {
    // A Responder that reads no Read chunks at non-zero Positions (gap 6: a Position-Zero
    // one is always accepted).
    let lim = ChunkLimits {
        max_read_chunks: 0,
        max_write_chunks: 2,
        ..ChunkLimits::default()
    };
    let mut h = limited(lim, client());
    call(&mut h, 1, 9000, reduce(1), expect(9000, 0, false)).unwrap();
    assert_eq!(
        errors_sent(&h),
        vec![ErrorBody2::ReadChunks { max_chunks: 0 }]
    );
    let s = h.req.stats();
    assert_eq!(
        (s.reshaped, s.long_call),
        (1, 1),
        "resent once as a Long Call"
    );
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn write_chunks_is_produced_and_the_call_resent_with_a_reply_chunk() {
    let lim = ChunkLimits {
        max_write_chunks: 1,
        ..ChunkLimits::default()
    };
    let mut h = limited(
        lim,
        Config {
            max_write_chunks: 2,
            ..client()
        },
    );
    let d = pattern(9000, 1);
    let m = echo_message(
        1,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        1,
        &d,
        &Bytes::new(),
    );
    let reply = ReplyExpectation {
        max_len: Some(64 + 9000),
        ddp_items: vec![9000, 100],
    };
    let a = h.req.submit(out_call(1, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    let got = h.done.remove(&1).unwrap().unwrap();
    assert_eq!(got, echo_results_bytes(1, &d, &[]));
    assert_eq!(
        errors_sent(&h),
        vec![ErrorBody2::WriteChunks { max_chunks: 1 }]
    );
    assert_eq!(h.req.stats().reshaped, 1);
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn a_responder_without_write_chunks_answers_reply_resource_and_segments_end_the_call() {
    // §7.2.4: "If the responder implementation cannot handle any Write chunks for a request,
    // it MUST return a response of RDMA2_ERR_REPLY_RESOURCE".
    let lim = ChunkLimits {
        max_write_chunks: 0,
        ..ChunkLimits::default()
    };
    let mut h = limited(lim, client());
    let r = call(&mut h, 1, 9000, reduce(1), expect(9000, 0, true));
    assert!(
        matches!(r, Err(RpcError::RdmaErrChunk)),
        "left to the binding (gap 7): {r:?}"
    );
    let [ErrorBody2::ReplyResource { length_needed }] = errors_sent(&h)[..] else {
        panic!("{:?}", errors_sent(&h))
    };
    assert!(length_needed >= 9000);
    // SEGMENTS: more segments in a chunk than the Responder processes; the call ends.
    let lim = ChunkLimits {
        max_segments: 0,
        ..ChunkLimits::default()
    };
    let mut h = limited(lim, client());
    let r = call(&mut h, 2, 9000, reduce(1), expect(9000, 0, true));
    assert!(
        matches!(r, Err(RpcError::Transport(ref m)) if m.contains("Segments")),
        "{r:?}"
    );
    assert_eq!(
        errors_sent(&h),
        vec![ErrorBody2::Segments { max_segments: 0 }]
    );
    assert_eq!(h.creg.live(), 0);
}

/// Submit a call, hold its Send back from the server, and answer it with `err` instead.
fn answer_with(h: &mut Harness, xid: u32, data: usize, extra: usize, err: ErrorBody2) {
    let d = pattern(data, 1);
    let x = pattern(extra, 2);
    let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &x);
    let a = h.req.submit(
        out_call(xid, ECHO, m, expect(data, extra, false)),
        &mut h.creg,
    );
    h.client_actions(a);
    assert_eq!(h.to_server.len(), 1);
    h.to_server.clear();
    let a = to_requester(h, Header2::new(xid, 8, Body2::Error(err)));
    h.client_actions(a);
    h.run();
}

#[test]
fn the_requester_ends_calls_on_errors_that_allow_no_retry() {
    let mut h = Harness::new(client(), server());
    call(&mut h, 1, 10, DdpPolicy::Inline, expect(10, 0, false)).unwrap();
    // READ_CHUNKS for a call that already used a Position-Zero Read chunk: "MUST terminate".
    answer_with(
        &mut h,
        2,
        10,
        6000,
        ErrorBody2::ReadChunks { max_chunks: 0 },
    );
    assert!(matches!(
        h.done.remove(&2),
        Some(Err(RpcError::Transport(_)))
    ));
    // SYSTEM: "MUST terminate the RPC transaction".
    answer_with(&mut h, 3, 10, 10, ErrorBody2::System);
    assert!(matches!(h.done.remove(&3), Some(Err(RpcError::Transport(m))) if m.contains("System")));
    // BAD_XDR is version 1's ERR_CHUNK; INVAL_PROC and INVAL_OPTION end the call.
    answer_with(&mut h, 4, 10, 10, ErrorBody2::BadXdr);
    assert!(matches!(
        h.done.remove(&4),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    answer_with(&mut h, 5, 10, 10, ErrorBody2::InvalProc);
    assert!(matches!(
        h.done.remove(&5),
        Some(Err(RpcError::Transport(_)))
    ));
    answer_with(&mut h, 6, 10, 10, ErrorBody2::InvalOption);
    assert!(matches!(
        h.done.remove(&6),
        Some(Err(RpcError::Transport(_)))
    ));
    // WRITE_RESOURCE: to the binding, like a short Reply chunk (gap 7).
    answer_with(
        &mut h,
        7,
        10,
        10,
        ErrorBody2::WriteResource {
            chunk_index: 1,
            length_needed: 100,
        },
    );
    assert!(matches!(
        h.done.remove(&7),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    assert_eq!(h.req.stats().reshaped, 0);
    assert_eq!(h.creg.live(), 0, "every call's memory fenced");
    // The connection goes on.
    call(&mut h, 8, 9000, reduce(1), expect(9000, 0, true)).unwrap();
}

#[test]
fn the_backward_direction_in_version_2() {
    let mut h = Harness::new(
        client(),
        Config {
            back_credits: 2,
            ..server()
        },
    );
    call(&mut h, 1, 10, DdpPolicy::Inline, expect(10, 0, false)).unwrap();
    h.resp.enable_backchannel();
    let back = |xid: u32| {
        let hdr = oncrpc::CallHeader {
            xid,
            prog: 0x4000_0000,
            vers: 1,
            proc_: 0,
            cred: OpaqueAuth::none(),
            verf: OpaqueAuth::none(),
        };
        let mut e = xdr::Encoder::new();
        hdr.encode(&mut e);
        e.into_bytes()
    };
    for xid in [1u32, 2, 3] {
        // XID 1 exists forward too: the directions have their own XIDs.
        let a = h.resp.back_call(xid, back(xid)).unwrap();
        h.server_actions(a);
        h.run();
        for (x, msg) in std::mem::take(&mut h.back_calls) {
            assert!(matches!(
                oncrpc::MessageHeader::decode_message(&msg).unwrap().0,
                oncrpc::MessageHeader::Call(_)
            ));
            let r = oncrpc::service::accepted(x, AcceptStat::Success, None);
            let a = h.req.back_reply(x, r.message.to_bytes()).unwrap();
            // §7.2.2: the client's backward reply says REPLY.
            let rpcrdma::requester::Action::Send { data, .. } = &a else {
                panic!("{a:?}")
            };
            let (hd, _) = Header2::decode(data).unwrap();
            assert!(matches!(
                hd.body,
                Body2::Msg(ChunkLists {
                    direction: Direction::Reply,
                    ..
                })
            ));
            h.client_actions(vec![a]);
        }
        h.run();
    }
    assert_eq!(
        h.back_replies.iter().map(|(x, _)| *x).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // §7.2.2: the server's backward calls say CALL, in version 2.
    let calls = h
        .server_sends
        .iter()
        .filter_map(|b| Header2::decode(b).ok())
        .filter(|(hd, _)| {
            matches!(
                hd.body,
                Body2::Msg(ChunkLists {
                    direction: Direction::Call,
                    ..
                })
            )
        })
        .count();
    assert_eq!(calls, 3);
    // A forward call still works after them.
    call(&mut h, 9, 9000, reduce(1), expect(9000, 0, true)).unwrap();
}
