//! Deterministic tests of the Requester and Responder engines back to back.

use std::sync::Arc;

use crate::common::*;
use bytes::{Bytes, BytesMut};
use oncrpc::{AcceptStat, OpaqueAuth, ReplyExpectation, RpcError};
use rpcrdma::engine::Config;
use rpcrdma::header::{Body, Chunks, ErrorBody, Header, ReadSegment, Segment};
use rpcrdma::responder::{BackError, Incoming};
use xdr::DdpPolicy;

fn cfg(credits: u32) -> Config {
    Config {
        credits,
        ..cfg_4k()
    }
}

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn echo(
    h: &mut Harness,
    xid: u32,
    data: usize,
    extra: usize,
    policy: DdpPolicy,
    reply: ReplyExpectation,
) -> Bytes {
    let d = pattern(data, xid as u8);
    let x = pattern(extra, 7);
    let m = echo_message(xid, OpaqueAuth::none(), policy, xid, &d, &x);
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    let got = h
        .done
        .remove(&xid)
        .expect("call completed")
        .expect("call succeeded");
    assert_eq!(got, echo_results_bytes(xid, &d, &x), "xid {xid}");
    got
}

fn expect(data: usize, extra: usize, ddp: bool) -> ReplyExpectation {
    ReplyExpectation {
        max_len: Some(64 + data + extra),
        ddp_items: if ddp { vec![data] } else { vec![] },
    }
}

#[test]
fn short_message_both_ways() {
    let mut h = Harness::new(cfg(8), cfg(8));
    echo(&mut h, 1, 10, 10, DdpPolicy::Inline, expect(10, 10, false));
    let s = h.req.stats();
    assert_eq!(
        (s.short, s.chunked, s.long_call, s.long_reply),
        (1, 0, 0, 0)
    );
    // The reply was an RDMA_MSG with empty chunk lists.
    let (rh, _) = Header::decode(&h.server_sends[0]).unwrap();
    assert_eq!(rh.body, Body::Msg(Chunks::default()));
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.4.4.1
//= type=test
//# If a chunk contains a counted array data type, the count of array elements MUST remain in the
//# Payload stream, while the array elements MUST be moved to the chunk.
//= specs/rfc8166.txt#section-3.4.4.4
//= type=test
//# Except in special cases (covered in Section 3.5.3), a chunk MUST contain exactly one XDR data
//# item.
//= specs/rfc8166.txt#section-3.4.4.4
//= type=test
//# When a variable-length XDR data item is reduced, the sender MUST remove XDR roundup padding for
//# that data item from the Payload stream so that data items remaining in the Payload stream begin
//# on four-byte alignment.
//= specs/rfc8166.txt#section-3.4.6.2
//= type=test
//# A Responder MUST NOT write XDR roundup padding into a Write chunk, even if the Requester made
//# space available for it.
//= specs/rfc8166.txt#section-3.4.6.2
//= type=test
//# Therefore, when returning a single variable-length result data item, a returned Write chunk's
//# total length MUST be the same as the encoded length of the result data item.
#[test]
fn chunked_call_and_reply_with_odd_lengths() {
    let mut h = Harness::new(cfg(8), cfg(8));
    for (xid, n) in [(1u32, 4097usize), (2, 4098), (3, 4099), (4, 8192)] {
        echo(&mut h, xid, n, 3, reduce(1), expect(n, 3, true));
    }
    let s = h.req.stats();
    assert_eq!(s.chunked, 4);
    assert_eq!(s.long_call, 0);
    // Every reply carried the data in the Write list; the chunk length is the item's exact
    // length (no pad bytes written, RFC 8166 §3.4.6.2).
    for (send, n) in h.server_sends.iter().zip([4097u32, 4098, 4099, 8192]) {
        let (rh, _) = Header::decode(send).unwrap();
        let Body::Msg(c) = rh.body else {
            panic!("expected RDMA_MSG")
        };
        assert_eq!(c.writes.len(), 1);
        assert_eq!(c.writes[0].iter().map(|s| s.length).sum::<u32>(), n);
    }
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-4.3.2
//= type=test
//# When a Requester provides a Write list, the Responder MUST push data corresponding to
//# DDP-eligible result data items to Requester memory referenced in the Write list.
//= specs/rfc8166.txt#section-3.4.6.2
//= type=test
//# Therefore, when returning a single variable-length result data item, a returned Write chunk's
//# total length MUST be the same as the encoded length of the result data item.
//= specs/rfc8166.txt#section-3.4.6
//= type=test
//# The Responder MUST copy the segment count and all segments from the Requester-provided Write
//# chunk into the RPC Reply message's Transport header.
//= specs/rfc8166.txt#section-4.3.2.2
//= type=test
//# If this is the last or only Write chunk available and it remains unconsumed, the Responder MUST
//# return this Write chunk as an unused Write chunk (see Section 3.4.6).
#[test]
fn small_ddp_items_still_use_the_write_chunk_and_unused_chunks_come_back_empty() {
    let mut h = Harness::new(
        Config {
            max_write_chunks: 2,
            ..cfg(8)
        },
        cfg(8),
    );
    // ECHO has one eligible result item; offering two Write chunks leaves the second unused.
    // The reply might not fit inline whole (the Requester offers no Write chunk for a reply that
    // does), though this one is short.
    let two = ReplyExpectation {
        max_len: Some(5000),
        ddp_items: vec![100, 100],
    };
    echo(&mut h, 9, 99, 5, reduce(1), two);
    let (rh, _) = Header::decode(&h.server_sends[0]).unwrap();
    let Body::Msg(c) = rh.body else { panic!() };
    assert_eq!(c.writes.len(), 2);
    // RFC 8166 §4.3.2: a small eligible item still goes through the Write chunk; its length
    // is exact (no pad bytes, §3.4.6.2).
    assert_eq!(c.writes[0].iter().map(|s| s.length).sum::<u32>(), 99);
    // RFC 8166 §4.3.2.2: an unused Write chunk comes back with every segment length zero,
    // and the number of segments is unchanged (§3.4.6).
    assert_eq!(c.writes[1].len(), 1);
    assert!(c.writes[1].iter().all(|s| s.length == 0));
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.3.1
//= type=test
//# The granted value MUST NOT be zero, since such a value would result in deadlock.
#[test]
fn zero_grants_are_never_sent_or_honoured() {
    // A Responder configured with zero credits still grants one (RFC 8166 §3.3.1).
    let mut h = Harness::new(cfg(8), cfg(0));
    echo(&mut h, 1, 1, 1, DdpPolicy::Inline, expect(1, 1, false));
    let (rh, _) = Header::decode(&h.server_sends[0]).unwrap();
    assert_eq!(rh.credits, 1);
    // A Requester that receives a zero grant keeps one credit and makes progress.
    let mut h = Harness::new(cfg(8), cfg(8));
    let m = echo_message(
        2,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        2,
        &Bytes::new(),
        &Bytes::new(),
    );
    let a = h
        .req
        .submit(out_call(2, ECHO, m, expect(0, 0, false)), &mut h.creg);
    h.client_actions(a);
    let m = echo_message(
        3,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        3,
        &Bytes::new(),
        &Bytes::new(),
    );
    let a = h
        .req
        .submit(out_call(3, ECHO, m, expect(0, 0, false)), &mut h.creg);
    h.client_actions(a);
    assert_eq!(h.to_server.len(), 1);
    h.to_server.clear();
    let a = h.req.on_receive(raw(&[2, 1, 0, 4, 2]), None, &mut h.creg);
    h.client_actions(a);
    assert_eq!(h.req.limit(), 1);
    assert_eq!(
        h.to_server.len(),
        1,
        "the next call goes out on the one remaining credit"
    );
}

/// The same chunked calls when the driver pulls the Read chunk into a buffer that already holds
/// the rest of the call: the service sees the same arguments (the echo comes back intact), and
/// a framed buffer of the wrong size is refused with RDMA_ERR_CHUNK instead of being used.
#[test]
fn chunked_calls_pulled_into_a_framed_buffer() {
    let mut h = Harness::new(cfg(8), cfg(8));
    h.framed = true;
    for (xid, n) in [(1u32, 4097usize), (2, 4098), (3, 4099), (4, 8192)] {
        echo(&mut h, xid, n, 3, reduce(1), expect(n, 3, true));
    }
    assert_eq!((h.req.stats().chunked, h.framed_calls), (4, 4));
    assert_eq!(h.creg.live(), 0);

    // A buffer one byte short: not a call.
    let d = pattern(5000, 9);
    let m = echo_message(9, OpaqueAuth::none(), reduce(1), 9, &d, &Bytes::new());
    let a = h
        .req
        .submit(out_call(9, ECHO, m, expect(5000, 0, true)), &mut h.creg);
    h.client_actions(a);
    let msg = h.to_server.pop_front().unwrap();
    let Incoming::NeedReads(p) = h.resp.on_receive(msg) else {
        panic!("expected a Read chunk to pull")
    };
    let (at, pre, post) = p.frame().unwrap();
    assert_eq!(at, pre.len());
    let mut v = pre.to_vec();
    v.extend_from_slice(&d[..4999]);
    v.extend_from_slice(post);
    let before = h.resp.stats().err_chunk;
    let inc = h.resp.complete_reads_framed(p, Bytes::from(v), 5000);
    assert!(matches!(inc, Incoming::Respond(_)));
    assert_eq!(h.resp.stats().err_chunk, before + 1);
}

//= specs/rfc8166.txt#section-3.4.5
//= type=test
//# The Position value MUST be computed from the beginning of the unreduced Payload stream, which
//# begins at Position zero.
//= specs/rfc8166.txt#section-3.4.4.4
//= type=test
//# Except in special cases (covered in Section 3.5.3), a chunk MUST contain exactly one XDR data
//# item.
#[test]
fn several_write_chunks_and_read_chunks() {
    let mut h = Harness::new(
        Config {
            max_read_chunks: 2,
            max_write_chunks: 2,
            ..cfg(8)
        },
        cfg(8),
    );
    let a = pattern(5001, 1);
    let b = pattern(6003, 2);
    // The binding's chunk limits (one Read chunk, two Write chunks) refuse two Read chunks
    // with RDMA_ERR_CHUNK ...
    let m = pair_message(1, reduce(2), &a, &b);
    let reply = ReplyExpectation {
        max_len: Some(12_000),
        ddp_items: vec![5001, 6003],
    };
    let call = out_call(1, PAIR, m, reply.clone());
    let act = h.req.submit(call, &mut h.creg);
    h.client_actions(act);
    h.run();
    let e = h.done.remove(&1).unwrap().unwrap_err();
    assert!(matches!(e, RpcError::RdmaErrChunk), "{e}");
    assert_eq!(h.resp.stats().err_chunk, 1);
    // ... and the call arguments go inline when sent with one Read chunk: then the reply uses
    // two Write chunks filled in order.
    let m = pair_message(2, reduce(1), &a, &b);
    let act = h.req.submit(out_call(2, PAIR, m, reply), &mut h.creg);
    h.client_actions(act);
    h.run();
    let got = h.done.remove(&2).unwrap().unwrap();
    let mut e = xdr::Encoder::new();
    e.put_opaque(&a);
    e.put_opaque(&b);
    assert_eq!(got, e.into_bytes());
    let (rh, _) = Header::decode(h.server_sends.last().unwrap()).unwrap();
    let Body::Msg(c) = rh.body else { panic!() };
    assert_eq!(c.writes.len(), 2);
    assert_eq!(c.writes[0][0].length, 5001);
    assert_eq!(c.writes[1][0].length, 6003);
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.5.3
//= type=test
//# If there are no DDP- eligible data items in the Payload stream, or the Payload stream is still
//# too large after it has been reduced, the RDMA transport MUST use RDMA Read or Write operations
//# to convey the Payload stream itself.
//= specs/rfc8166.txt#section-3.5.3
//= type=test
//# If a Reply chunk was provided and the reduced Payload stream is larger than the reply inline
//# threshold, the Responder MUST use the Requester-provided Reply chunk for the reply.
//= specs/rfc8166.txt#section-4.3.3
//= type=test
//# A Requester MUST provide a Reply chunk whenever the maximum possible size of the RPC Reply
//# message's Transport and Payload streams is larger than the inline threshold for messages from
//# Responder to Requester.
#[test]
fn long_call_long_reply_and_both() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Long Call: a big non-DDP item -> Position-Zero Read chunk, RDMA_NOMSG.
    echo(
        &mut h,
        1,
        10,
        6000,
        reduce(1),
        ReplyExpectation {
            max_len: Some(6100),
            ddp_items: vec![],
        },
    );
    assert_eq!(h.req.stats().long_call, 1);
    // Long Reply only: small call, reply needs the Reply chunk (RDMA_NOMSG reply).
    echo(
        &mut h,
        2,
        10,
        3000,
        DdpPolicy::Inline,
        expect(10, 3000, false),
    );
    // Both at once, plus a Read chunk and a Write chunk (the Read chunk's Position is
    // relative to the Payload stream carried in the Position-Zero chunk).
    echo(&mut h, 3, 9001, 5003, reduce(1), expect(9001, 5003, true));
    let s = h.req.stats();
    assert_eq!(s.long_call, 3 - 1, "calls 1 and 3 were long");
    assert!(s.long_reply >= 2);
    let nomsg = h
        .server_sends
        .iter()
        .filter(|b| matches!(Header::decode(b).unwrap().0.body, Body::NoMsg(_)))
        .count();
    assert_eq!(nomsg, 2, "replies 2 and 3 went through the Reply chunk");
    assert_eq!(h.creg.live(), 0);
}

/// RFC 8166 §3.3.3: "In the absence of such a mechanism, senders and receives MUST assume the
/// inline thresholds are 1024 bytes." Without RFC 8797 private data from the peer, neither
/// engine sends more than 1024 bytes: a 1540-byte call becomes a Long Call, a 1540-byte reply
/// goes through the Reply chunk. With the peer's 4096 advertised, the same messages travel
/// inline (so the test tells the two apart).
//= specs/rfc8166.txt#section-3.3.3
//= type=test
//# In the absence of such a mechanism, senders and receives MUST assume the inline thresholds are
//# 1024 bytes.
//= specs/rfc8166.txt#section-3.5.3
//= type=test
//# Every RDMA read segment in this chunk MUST contain zero in its Position field.
#[test]
fn senders_assume_1024_bytes_without_private_data() {
    use rpcrdma::engine::{MemRegistrar, Params};
    use rpcrdma::privdata::PrivateData;
    assert_eq!(
        Params::default().inline_send,
        1024,
        "before any negotiation"
    );
    let without: Params = cfg_4k().negotiate(None).into();
    let with: Params = cfg_4k()
        .negotiate(Some(PrivateData::new(4096, true)))
        .into();
    assert_eq!((without.inline_send, with.inline_send), (1024, 4096));
    let data = pattern(10, 1);
    let extra = pattern(1500, 2);
    let message = || echo_message(7, OpaqueAuth::none(), DdpPolicy::Inline, 7, &data, &extra);
    // The Requester as sender. Its own receive buffers are 1024 bytes, so it also offers a
    // Reply chunk for the 1500-byte reply (used below).
    let client = Config {
        inline_recv: 1024,
        ..cfg(8)
    };
    let sent = |params: Params| {
        let mut reg = MemRegistrar::new(1);
        let mut q = rpcrdma::requester::Requester::new(client.clone(), ulbs());
        assert!(q.on_connect(params, &mut reg).is_empty());
        let reply = expect(10, 1500, false);
        match q
            .submit(out_call(7, ECHO, message(), reply), &mut reg)
            .pop()
        {
            Some(rpcrdma::requester::Action::Send { data, .. }) => data,
            other => panic!("expected a Send: {other:?}"),
        }
    };
    let call = sent(Params {
        inline_recv: 1024,
        reply_inline: 1024,
        ..without
    });
    assert!(call.len() <= 1024, "{} bytes", call.len());
    let (hd, _) = Header::decode(&call).unwrap();
    let Body::NoMsg(chunks) = &hd.body else {
        panic!("expected a Long Call (RDMA_NOMSG): {:?}", hd.body)
    };
    assert!(chunks.reads.iter().all(|r| r.position == 0) && !chunks.reads.is_empty());
    assert!(
        chunks.reply.is_some(),
        "a Reply chunk for the 1500-byte reply"
    );
    let short = sent(Params {
        inline_recv: 1024,
        reply_inline: 1024,
        ..with
    });
    assert!(short.len() > 1024);
    assert!(matches!(
        Header::decode(&short).unwrap().0.body,
        Body::Msg(_)
    ));
    // The Responder as sender, answering the call that travelled inline (with its Reply
    // chunk).
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let replies = |params: Params| {
        let mut r = rpcrdma::responder::Responder::new(
            cfg(8),
            params,
            ulbs(),
            std::collections::HashSet::new(),
        );
        let Incoming::Call(c) = r.on_receive(short.clone()) else {
            panic!("the call was not delivered")
        };
        let reply =
            rt.block_on(dispatcher().dispatch(c.message, oncrpc::CallContext::local(), c.policy));
        r.reply(c.token, reply)
    };
    let last_send = |actions: Vec<rpcrdma::responder::Action>| {
        let writes = actions
            .iter()
            .filter(|a| matches!(a, rpcrdma::responder::Action::Write { .. }))
            .count();
        match actions.into_iter().last() {
            Some(rpcrdma::responder::Action::Send { data, .. }) => (writes, data),
            other => panic!("expected a Send last: {other:?}"),
        }
    };
    let (writes, long) = last_send(replies(without));
    assert!(long.len() <= 1024, "{} bytes", long.len());
    assert!(matches!(
        Header::decode(&long).unwrap().0.body,
        Body::NoMsg(_)
    ));
    assert!(writes >= 1, "the reply went into the Reply chunk");
    let (writes, inline) = last_send(replies(with));
    assert!(inline.len() > 1024);
    assert!(matches!(
        Header::decode(&inline).unwrap().0.body,
        Body::Msg(_)
    ));
    assert_eq!(writes, 0);
}

/// The call a Requester's `actions` Send, which must be an RDMA_MSG: the message, its chunks and
/// the length of its transport header.
fn sent_msg(actions: &[rpcrdma::requester::Action]) -> (Bytes, Chunks, usize) {
    let call = actions
        .iter()
        .find_map(|a| match a {
            rpcrdma::requester::Action::Send { data, .. } => Some(data.clone()),
            _ => None,
        })
        .expect("the call was sent");
    let (ch, hlen) = Header::decode(&call).unwrap();
    let Body::Msg(c) = ch.body else {
        panic!("expected RDMA_MSG call")
    };
    (call, c, hlen)
}

/// The Reply chunk decision counts the reduced reply: a big DDP-eligible result that goes in a
/// Write chunk does not also need a Reply chunk when the rest fits inline (RFC 8166 §4.3.3 with
/// §4.3.2; Linux's client does the same, and Linux nfsd 6.1 misreports the Reply chunk length
/// when both are offered).
//= specs/rfc8166.txt#section-4.3.3
//= type=test
//# A Requester MUST provide a Reply chunk whenever the maximum possible size of the RPC Reply
//# message's Transport and Payload streams is larger than the inline threshold for messages from
//# Responder to Requester.
#[test]
fn write_chunk_alone_when_the_reduced_reply_fits_inline() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Results too long for the reply to fit inline whole (below that no Write chunk is offered:
    // `a_call_and_reply_that_fit_inline_go_whole`), with the rest of the reply short.
    for (xid, n) in [(1u32, 4040usize), (2, 8191), (3, 65536)] {
        let d = pattern(n, xid as u8);
        let x = pattern(40, 7);
        let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &x);
        let a = h
            .req
            .submit(out_call(xid, ECHO, m, expect(n, 40, true)), &mut h.creg);
        let (_, c, _) = sent_msg(&a);
        assert_eq!(c.writes.len(), 1, "xid {xid}: one Write chunk");
        assert!(c.reply.is_none(), "xid {xid}: no Reply chunk beside it");
        h.client_actions(a);
        h.run();
        let got = h.done.remove(&xid).expect("completed").expect("succeeded");
        assert_eq!(got, echo_results_bytes(xid, &d, &x), "xid {xid}");
    }
    // A reply whose non-DDP part alone exceeds the threshold still gets its Reply chunk.
    echo(&mut h, 4, 100, 6000, reduce(1), expect(100, 6000, true));
    let s = h.req.stats();
    assert_eq!((s.write_chunk_calls, s.long_reply), (4, 1));
    assert_eq!(h.creg.live(), 0);
}

/// RFC 8166 §3.4.3: reduction is the sender's choice. A call whose whole Payload stream fits the
/// server's inline threshold goes whole, though its encoder reduced an argument (no Read chunk
/// to register and pull), and a call whose largest reply fits ours offers no Write chunk (the
/// result comes back inline), as Linux's client does in version 1. Longer ones use chunks.
#[test]
fn a_call_and_reply_that_fit_inline_go_whole() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let d = pattern(3000, 9);
    let m = echo_message(1, OpaqueAuth::none(), reduce(1), 1, &d, &Bytes::new());
    assert_eq!(m.reduced.len(), 1, "the encoder reduced the argument");
    let a = h
        .req
        .submit(out_call(1, ECHO, m, expect(3000, 0, true)), &mut h.creg);
    let (call, c, hlen) = sent_msg(&a);
    assert!(
        c.reads.is_empty() && c.writes.is_empty() && c.reply.is_none(),
        "{c:?}"
    );
    assert!(call.len() - hlen > 3000, "the argument is in the Send");
    assert_eq!(h.creg.live(), 0, "nothing registered");
    h.client_actions(a);
    h.run();
    let got = h.done.remove(&1).expect("completed").expect("succeeded");
    assert_eq!(got, echo_results_bytes(1, &d, &[]));
    let s = h.req.stats();
    assert_eq!(
        (s.inline_unreduced, s.chunked, s.write_chunk_calls),
        (1, 0, 0)
    );
    // Past the threshold: a Read chunk and a Write chunk.
    echo(&mut h, 2, 5000, 0, reduce(1), expect(5000, 0, true));
    let s = h.req.stats();
    assert_eq!(
        (s.inline_unreduced, s.chunked, s.write_chunk_calls),
        (1, 1, 1)
    );
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn send_with_invalidate_when_one_handle() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Only a Reply chunk is registered (the reply might be long, it is not): one handle, so
    // the reply uses Send With Invalidate.
    let big = ReplyExpectation {
        max_len: Some(5000),
        ddp_items: vec![],
    };
    echo(&mut h, 1, 10, 10, DdpPolicy::Inline, big.clone());
    assert_eq!(h.creg.remote_invalidated, 1);
    // Without the peer's permission it never does.
    let mut h = Harness::new(
        Config {
            accept_remote_invalidate: false,
            ..cfg(8)
        },
        cfg(8),
    );
    echo(&mut h, 1, 10, 10, DdpPolicy::Inline, big);
    assert_eq!(h.creg.remote_invalidated, 0);
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.3.1
//= type=test
//# A Requester MUST NOT send unacknowledged requests in excess of the Responder's granted credit
//# limit.
//= specs/rfc8166.txt#section-3.3.3
//= type=test
//# A Responder MAY exceed this basic level of configuration, but a Requester MUST NOT assume more
//# than one credit is available and MUST receive a valid reply from the Responder carrying the
//# actual number of available credits, prior to sending its next request.
#[test]
fn credits_thousand_calls_32_credits() {
    let mut h = Harness::new(cfg(128), cfg(32));
    h.batch = 64;
    let n = 1000u32;
    for xid in 1..=n {
        let d = pattern((xid as usize * 13) % 3000, 1);
        let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &Bytes::new());
        let a = h.req.submit(
            out_call(xid, ECHO, m, expect(d.len(), 0, true)),
            &mut h.creg,
        );
        h.client_actions(a);
        // RFC 8166 §3.3.3: one credit until the first reply.
        if xid == 2 {
            assert_eq!(h.to_server.len(), 1);
        }
    }
    h.run();
    assert_eq!(h.done.len(), n as usize);
    assert!(h.done.values().all(|r| r.is_ok()));
    let s = h.req.stats();
    assert_eq!(s.over_limit, 0);
    assert_eq!(
        s.max_outstanding, 32,
        "the grant of 32 is used, never exceeded"
    );
    assert_eq!(s.limit_at_max, 32);
    let r = h.resp.stats();
    assert_eq!(r.over_credit, 0);
    assert!(r.max_in_progress <= 32 && r.max_in_progress >= 2);
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.3.1
//= type=test
//# A Requester MUST NOT send unacknowledged requests in excess of the Responder's granted credit
//# limit.
#[test]
fn requester_never_exceeds_its_own_request() {
    let mut h = Harness::new(cfg(4), cfg(64));
    h.batch = 64;
    for xid in 1..=50u32 {
        let m = echo_message(
            xid,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            xid,
            &Bytes::new(),
            &Bytes::new(),
        );
        let a = h
            .req
            .submit(out_call(xid, ECHO, m, expect(0, 0, false)), &mut h.creg);
        h.client_actions(a);
    }
    h.run();
    assert_eq!(h.done.len(), 50);
    assert_eq!(h.req.stats().max_outstanding, 4);
}

fn raw(words: &[u32]) -> Bytes {
    words
        .iter()
        .flat_map(|w| w.to_be_bytes())
        .collect::<Vec<_>>()
        .into()
}

fn only_send(inc: Incoming) -> Bytes {
    match inc {
        Incoming::Respond(mut a) => match a.pop() {
            Some(rpcrdma::responder::Action::Send { data, invalidate }) => {
                assert_eq!(invalidate, None);
                data
            }
            other => panic!("expected a Send, got {other:?}"),
        },
        other => panic!("expected a response, got {other:?}"),
    }
}

//= specs/rfc8166.txt#section-4.5.1
//= type=test
//# When a Responder detects an RPC-over-RDMA header version that it does not support (currently
//# this document defines only version 1), it MUST reply with an RDMA_ERROR procedure and set the
//# rdma_err value to ERR_VERS, also providing the low and high inclusive version numbers it does,
//# in fact, support.
//= specs/rfc8166.txt#section-4.5.2
//= type=test
//# If the rdma_vers field contains a recognized value, but an XDR parsing error occurs, the
//# Responder MUST reply with an RDMA_ERROR procedure and set the rdma_err value to ERR_CHUNK.
//= specs/rfc8166.txt#section-4.5
//= type=test
//# If other errors are detected in the RPC-over-RDMA header of an RPC Call message, a Responder
//# MUST send an RDMA_ERROR message back to the Requester.
//= specs/rfc8166.txt#section-4.2.4
//= type=test
//# A Responder MUST silently discard RDMA_ERROR procedures.
//= specs/rfc8166.txt#section-3.4.5
//= type=test
//# The value in this field MUST be a multiple of four.
//= specs/rfc8166.txt#section-4.2.1
//= type=test
//# This XID MUST be the same as the XID in the RPC message.
//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_xid field MUST contain the same XID that was in the rdma_xid field in the failing
//# request;
//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_vers field MUST contain the same version that was in the rdma_vers field in the
//# failing request;
//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_proc field MUST contain the value RDMA_ERROR; and
//= specs/rfc8166.txt#section-4.5
//= type=test
//# A receiver MUST silently discard an RDMA_ERROR procedure that it cannot decode.
#[test]
fn responder_error_paths() {
    // A version 1 server (max_version 1), as Linux: version 2 -> ERR_VERS low = high = 1,
    // XID and version copied (RFC 8166 §4.5.1).
    let mut v1 = Harness::new(
        cfg(8),
        Config {
            max_version: rpcrdma::version::Version::V1,
            ..cfg(16)
        },
    );
    let b = only_send(v1.resp.on_receive(raw(&[77, 2, 1, 0, 0, 0, 0])));
    assert_eq!(b, raw(&[77, 2, 16, 4, 1, 1, 1]));
    let mut h = Harness::new(cfg(8), cfg(16));
    // A version 2 server reads the same bytes as a truncated version 2 RDMA2_MSG: BAD_XDR
    // (cel-05 §7.2.4), and a version it does not speak gets ERR_VERS [1, 2].
    let b = only_send(h.resp.on_receive(raw(&[77, 2, 1, 0, 0, 0, 0])));
    assert_eq!(b, raw(&[77, 2, 16, 4, 2]));
    let b = only_send(h.resp.on_receive(raw(&[77, 3, 1, 0, 0, 0, 0])));
    assert_eq!(b, raw(&[77, 3, 16, 4, 1, 1, 2]));
    // RFC 8166 §4.5.2: unknown proc, RDMA_NOMSG without chunks, a Read list cut short ->
    // ERR_CHUNK (each at least the 28-byte minimum).
    for m in [
        raw(&[78, 1, 1, 9, 0, 0, 0]),
        raw(&[78, 1, 1, 1, 0, 0, 0]),
        raw(&[78, 1, 1, 0, 1, 0, 0]),
    ] {
        assert_eq!(only_send(h.resp.on_receive(m)), raw(&[78, 1, 16, 4, 2]));
    }
    // RFC 8166 §4.5: shorter than 28 bytes -> dropped without a word, whatever it claims.
    for m in [
        raw(&[78, 1, 1, 9]),
        raw(&[78, 1, 1, 0, 1, 0]),
        raw(&[78, 7, 1, 0, 0, 0]),
    ] {
        assert!(matches!(h.resp.on_receive(m), Incoming::Nothing));
    }
    // RFC 8166 §4.6.1: RDMA_MSGP -> ERR_CHUNK; §4.6.2: RDMA_DONE dropped silently.
    assert_eq!(
        only_send(h.resp.on_receive(raw(&[79, 1, 1, 2, 4, 1024, 0, 0, 0]))),
        raw(&[79, 1, 16, 4, 2])
    );
    assert!(matches!(
        h.resp.on_receive(raw(&[80, 1, 1, 3, 0, 0, 0])),
        Incoming::Nothing
    ));
    // RFC 8166 §4.5: malformed RDMA_ERRORs (and well-formed ones) are dropped silently.
    assert!(matches!(
        h.resp.on_receive(raw(&[81, 1, 1, 4, 7])),
        Incoming::Nothing
    ));
    assert!(matches!(
        h.resp.on_receive(raw(&[81, 1, 1, 4, 2])),
        Incoming::Nothing
    ));
    assert!(matches!(h.resp.on_receive(raw(&[1])), Incoming::Nothing));
    // RFC 8166 §3.4.5: a Position that is not a multiple of four -> ERR_CHUNK.
    let mut c = Chunks::default();
    c.reads.push(ReadSegment {
        position: 30,
        target: Segment {
            handle: 1,
            length: 4,
            offset: 0,
        },
    });
    let hd = Header::new(82, 1, Body::Msg(c)).to_bytes();
    assert_eq!(only_send(h.resp.on_receive(hd)), raw(&[82, 1, 16, 4, 2]));
    // RFC 8166 §4.5.2: rdma_xid differing from the RPC XID -> ERR_CHUNK.
    let m = echo_message(
        99,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        1,
        &Bytes::new(),
        &Bytes::new(),
    );
    let mut b = BytesMut::new();
    Header::new(83, 1, Body::Msg(Chunks::default())).encode(&mut b);
    b.extend_from_slice(&m.to_bytes());
    assert_eq!(
        only_send(h.resp.on_receive(b.freeze())),
        raw(&[83, 1, 16, 4, 2])
    );
    assert!(h.resp.stats().err_chunk >= 6);
}

//= specs/rfc8166.txt#section-6.1
//= type=test
//# The Responder MUST NOT process this RPC Call message and MUST report the violation as described
//# in Section 4.5.2.
//= specs/rfc8166.txt#section-4.5.2
//= type=test
//# When a Responder receives a valid RPC-over-RDMA header but the Responder's ULP implementation
//# cannot parse the RPC arguments in the RPC Call message, the Responder SHOULD return an RPC Reply
//# message with status GARBAGE_ARGS, using an RDMA_MSG procedure.
#[test]
fn ineligible_read_chunk_gets_garbage_args() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Reduce the "extra" item, which the binding does not mark DDP-eligible.
    let hdr = oncrpc::CallHeader {
        xid: 5,
        prog: PROG,
        vers: VERS,
        proc_: ECHO,
        cred: OpaqueAuth::none(),
        verf: OpaqueAuth::none(),
    };
    let mut e = xdr::Encoder::new().with_policy(reduce(1));
    hdr.encode(&mut e);
    e.put_u32(1);
    e.put_opaque(b"small");
    // Longer than the 4 KiB inline threshold, so the call is not sent whole (RFC 8166 §3.4.3).
    e.put_ddp_opaque(pattern(6000, 3));
    let a = h.req.submit(
        out_call(5, ECHO, e.finish(), expect(10, 6000, false)),
        &mut h.creg,
    );
    h.client_actions(a);
    h.run();
    let err = h.done.remove(&5).unwrap().unwrap_err();
    assert!(
        matches!(err, RpcError::Accepted(AcceptStat::GarbageArgs)),
        "{err}"
    );
    assert_eq!(h.resp.stats().garbage_args, 1);
    // The GARBAGE_ARGS reply is an RDMA_MSG (RFC 8166 §4.5.2).
    let (rh, _) = Header::decode(h.server_sends.last().unwrap()).unwrap();
    assert!(matches!(rh.body, Body::Msg(_)));
    assert_eq!(h.creg.live(), 0);
}

/// A client-side binding for a program the server has none for (client and server disagree).
struct ClientOnlyBinding(u32);

impl rpcrdma::ulb::UpperLayerBinding for ClientOnlyBinding {
    fn program(&self) -> u32 {
        self.0
    }
    fn call_ddp_items(
        &self,
        _vers: u32,
        _proc_: u32,
        _args: &[u8],
    ) -> Result<Vec<std::ops::Range<usize>>, rpcrdma::ulb::UlbError> {
        Ok(Vec::new())
    }
    fn max_reply_size(&self, _vers: u32, _proc_: u32, _args: &[u8]) -> Option<usize> {
        None
    }
}

//= specs/rfc8166.txt#section-6.1
//= type=test
//# The Responder MUST NOT process this RPC Call message and MUST report the violation as described
//# in Section 4.5.2.
#[test]
fn program_without_binding_gets_garbage_args_for_chunks() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Only the client has a binding for 100003 (its Requester refuses unbound programs).
    let b: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(ClientOnlyBinding(100_003));
    h.req = rpcrdma::requester::Requester::new(
        cfg(8),
        Arc::new(std::iter::once((100_003, b)).collect()),
    );
    let params = h.params;
    assert!(h.req.on_connect(params, &mut h.creg).is_empty());
    let hdr = oncrpc::CallHeader {
        xid: 6,
        prog: 100_003,
        vers: 3,
        proc_: 1,
        cred: OpaqueAuth::none(),
        verf: OpaqueAuth::none(),
    };
    let mut e = xdr::Encoder::new().with_policy(reduce(1));
    hdr.encode(&mut e);
    // Longer than the 4 KiB inline threshold, so the call is not sent whole.
    e.put_ddp_opaque(pattern(6000, 3));
    let mut c = out_call(6, 1, e.finish(), expect(10, 0, false));
    c.prog = 100_003;
    let a = h.req.submit(c, &mut h.creg);
    h.client_actions(a);
    h.run();
    assert!(matches!(
        h.done.remove(&6).unwrap(),
        Err(RpcError::Accepted(AcceptStat::GarbageArgs))
    ));
}

//= specs/rfc8166.txt#section-4.5
//= type=test
//# If errors are detected in the RPC-over-RDMA header of an RPC Reply message, a Requester MUST
//# silently discard the message.
//= specs/rfc8166.txt#section-4.5
//= type=test
//# A receiver MUST silently discard an RDMA_ERROR procedure that it cannot decode.
#[test]
fn requester_handles_rdma_error_and_unknown_xids() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let m = echo_message(
        3,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        1,
        &Bytes::new(),
        &Bytes::new(),
    );
    let a = h
        .req
        .submit(out_call(3, ECHO, m, expect(0, 0, false)), &mut h.creg);
    h.client_actions(a);
    h.to_server.clear();
    // A reply for an XID never sent is dropped.
    let a = h.req.on_receive(raw(&[999, 1, 8, 4, 2]), None, &mut h.creg);
    assert!(a.is_empty());
    // A malformed reply is dropped.
    assert!(
        h.req
            .on_receive(raw(&[3, 1, 8, 4, 9]), None, &mut h.creg)
            .is_empty()
    );
    // RDMA_ERROR / ERR_VERS completes the call with an error.
    let a = h.req.on_receive(
        Header::new(3, 8, Body::Error(ErrorBody::Vers { low: 1, high: 1 })).to_bytes(),
        None,
        &mut h.creg,
    );
    h.client_actions(a);
    assert!(
        matches!(h.done.remove(&3), Some(Err(RpcError::Transport(s))) if s.contains("ERR_VERS"))
    );
    assert_eq!(h.creg.live(), 0);
}

/// The Requester owns every call's deadline: a driver sleeps until `next_deadline` and hands
/// it `now`. Deadlines expire in their order, whether the call was sent or still waits for a
/// credit (RFC 8166 §3.3.3: one credit until the first reply); calls without one never do.
#[test]
fn deadlines_are_the_requesters_and_expire_in_order() {
    use std::time::Duration;
    let mut h = Harness::new(cfg(8), cfg(8));
    let start = std::time::Instant::now();
    assert_eq!(h.req.next_deadline(), None);
    for (xid, deadline) in [
        (11, Some(start + Duration::from_secs(3))),
        (12, Some(start + Duration::from_secs(1))),
        (13, None),
    ] {
        let m = echo_message(
            xid,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            4,
            &Bytes::new(),
            &Bytes::new(),
        );
        let mut c = out_call(xid, ECHO, m, expect(0, 0, false));
        c.deadline = deadline;
        let a = h.req.submit(c, &mut h.creg);
        h.client_actions(a);
    }
    // One credit: only the first call went out.
    assert_eq!(h.to_server.len(), 1);
    assert_eq!(h.req.next_deadline(), Some(start + Duration::from_secs(1)));
    // Just before the earliest deadline nothing expires.
    let early = start + Duration::from_millis(999);
    assert!(h.req.poll_timeouts(early, &mut h.creg).is_empty());
    // The queued call expires first, without ever being sent.
    let a = h
        .req
        .poll_timeouts(start + Duration::from_secs(1), &mut h.creg);
    h.client_actions(a);
    assert!(matches!(h.done.remove(&12), Some(Err(RpcError::Timeout))));
    assert_eq!(h.to_server.len(), 1);
    assert_eq!(h.req.next_deadline(), Some(start + Duration::from_secs(3)));
    // Then the sent one; the call without a deadline stays pending.
    let a = h
        .req
        .poll_timeouts(start + Duration::from_secs(5), &mut h.creg);
    h.client_actions(a);
    assert!(matches!(h.done.remove(&11), Some(Err(RpcError::Timeout))));
    assert_eq!(h.req.next_deadline(), None);
    assert_eq!(h.req.pending(), 1);
    assert!(!h.done.contains_key(&13));
    assert_eq!(h.req.stats().cancelled, 2);
}

#[test]
fn timeout_fences_memory_and_keeps_the_credit() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let start = std::time::Instant::now();
    let d = pattern(5000, 1);
    let m = echo_message(4, OpaqueAuth::none(), reduce(1), 4, &d, &Bytes::new());
    let mut c = out_call(4, ECHO, m, expect(5000, 0, true));
    c.deadline = Some(start + std::time::Duration::from_secs(1));
    let a = h.req.submit(c, &mut h.creg);
    h.client_actions(a);
    assert!(h.creg.live() >= 2);
    assert!(h.req.poll_timeouts(start, &mut h.creg).is_empty());
    let a = h
        .req
        .poll_timeouts(start + std::time::Duration::from_secs(2), &mut h.creg);
    h.client_actions(a);
    assert!(matches!(h.done.remove(&4), Some(Err(RpcError::Timeout))));
    // RFC 8166 §4.4.1: invalidated before the RPC completed.
    assert_eq!(h.creg.live(), 0);
    assert_eq!(
        h.req.in_flight(),
        1,
        "the abandoned call still holds its credit"
    );
    // Its late reply (an RDMA Read of fenced memory would fail: the server answers
    // ERR_CHUNK here) frees the credit and completes nothing.
    let a = h.req.on_receive(raw(&[4, 1, 8, 4, 2]), None, &mut h.creg);
    assert!(
        a.iter()
            .all(|x| !matches!(x, rpcrdma::requester::Action::Complete { .. }))
    );
    assert_eq!(h.req.in_flight(), 0);
}

/// RFC 8166 §6: "Each RPC Program and Version tuple that utilizes RPC-over-RDMA version 1
/// needs to have a ULB specification." A call of a program without a binding,
/// or of a version the binding does not cover, completes at once with `NoBinding`: nothing is
/// registered or sent, and no credit is used.
#[test]
fn calls_without_a_binding_are_refused_before_sending() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let registered = h.creg.registered;
    for (xid, prog, vers) in [(1u32, PROG + 1, VERS), (2, PROG, VERS + 1)] {
        // A call that would use a Read chunk and a Write chunk if it were sent.
        let mut e = xdr::Encoder::new().with_policy(reduce(1));
        oncrpc::CallHeader {
            xid,
            prog,
            vers,
            proc_: ECHO,
            cred: OpaqueAuth::none(),
            verf: OpaqueAuth::none(),
        }
        .encode(&mut e);
        e.put_u32(xid);
        e.put_ddp_opaque(pattern(5000, 1));
        e.put_opaque(b"");
        let call = rpcrdma::requester::OutCall {
            prog,
            vers,
            ..out_call(xid, ECHO, e.finish(), expect(5000, 0, true))
        };
        let a = h.req.submit(call, &mut h.creg);
        assert!(
            matches!(
                a.as_slice(),
                [rpcrdma::requester::Action::Complete { xid: x, result: Err(RpcError::NoBinding { prog: p, vers: v }) }]
                    if (*x, *p, *v) == (xid, prog, vers)
            ),
            "{a:?}"
        );
    }
    assert!(h.to_server.is_empty(), "nothing was sent");
    assert_eq!(h.creg.registered, registered, "nothing was registered");
    assert_eq!((h.req.pending(), h.req.in_flight()), (0, 0));
    let s = h.req.stats();
    assert_eq!((s.no_binding, s.sent), (2, 0), "{s:?}");
    // The bound program and version still go.
    echo(&mut h, 3, 5000, 3, reduce(1), expect(5000, 3, true));
    assert_eq!(h.req.stats().no_binding, 2);
}

/// A program whose binding makes nothing DDP-eligible (`InlineBinding`, e.g. NFSACL by RFC 8267
/// §5.2) is sent, but gets no Write chunk even when the caller lists DDP-eligible results; the
/// same call under the echo binding gets one.
#[test]
fn inline_binding_is_sent_without_write_chunks() {
    use rpcrdma::engine::{MemRegistrar, Params};
    use rpcrdma::ulb::{InlineBinding, UpperLayerBinding};
    let params: Params = cfg_4k().negotiate(Some(cfg_4k().private_data())).into();
    let inline: Arc<dyn UpperLayerBinding> = Arc::new(InlineBinding::new(PROG, VERS..=VERS));
    let bindings = [
        ("echo", ulbs()),
        (
            "inline",
            Arc::new(std::iter::once((PROG, inline)).collect()),
        ),
    ];
    for (name, b) in bindings {
        let mut reg = MemRegistrar::new(5);
        let mut q = rpcrdma::requester::Requester::new(cfg(8), b);
        assert!(q.on_connect(params, &mut reg).is_empty());
        let d = pattern(2000, 3);
        let m = echo_message(
            1,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            1,
            &d,
            &Bytes::new(),
        );
        let sent = match q
            // The reply might not fit the 4 KiB inline threshold whole, so the echo binding's
            // Requester offers a Write chunk for the result.
            .submit(out_call(1, ECHO, m, expect(2000, 4000, true)), &mut reg)
            .pop()
        {
            Some(rpcrdma::requester::Action::Send { data, .. }) => data,
            other => panic!("{name}: expected a Send: {other:?}"),
        };
        let (hd, _) = Header::decode(&sent).unwrap();
        let Body::Msg(chunks) = hd.body else {
            panic!("{name}: expected RDMA_MSG")
        };
        let expected = usize::from(name == "echo");
        assert_eq!(chunks.writes.len(), expected, "{name}");
        assert_eq!(q.stats().write_chunk_calls, expected as u64, "{name}");
    }
}

/// RFC 8166 §4.4.1: the segments of a canceled RPC are fenced, because "A Responder cannot
/// know that the Requester is no longer waiting for a reply, and it might proceed to read or
/// even update memory that the Requester might have released for other use." The call is
/// cancelled while the server holds it (after its RDMA Read of the Read chunk); the server's RDMA Write into the Write chunk then
/// fails, and the late reply is discarded and counted.
#[test]
fn cancelled_call_fences_every_chunk_and_discards_its_late_reply() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Prime the grant so the cancelled call's credit shows in `in_flight`.
    echo(&mut h, 1, 10, 10, DdpPolicy::Inline, expect(10, 10, false));
    let registered = h.creg.registered;
    let d = pattern(5000, 9);
    let x = pattern(3, 4);
    let m = echo_message(2, OpaqueAuth::none(), reduce(1), 2, &d, &x);
    // A Read chunk (the reduced argument), a Write chunk (the DDP-eligible result) and a
    // Reply chunk (what stays in the reply may exceed the inline threshold).
    let reply = ReplyExpectation {
        max_len: Some(64 + 5000 + 6000),
        ddp_items: vec![5000],
    };
    let a = h.req.submit(out_call(2, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    let sent = h.to_server.pop_front().expect("the call was sent");
    let (hd, _) = Header::decode(&sent).unwrap();
    let Body::Msg(chunks) = &hd.body else {
        panic!("expected RDMA_MSG, got {:?}", hd.body)
    };
    let read_seg = chunks.reads[0].target;
    let write_seg = chunks.writes[0][0];
    let reply_seg = chunks.reply.as_ref().expect("a Reply chunk")[0];
    assert_eq!(h.creg.registered - registered, 3);
    assert_eq!(h.creg.live(), 3);
    // The server reads the Read chunk and starts working on the call.
    let ready = h
        .server_receive(sent)
        .expect("the call reached the program");
    // The caller gives up.
    let a = h.req.cancel(
        2,
        RpcError::Transport("dropped by the caller".into()),
        &mut h.creg,
    );
    h.client_actions(a);
    assert!(matches!(
        h.done.remove(&2),
        Some(Err(RpcError::Transport(_)))
    ));
    // Every registration of the call is invalidated, and the peer can no longer use them.
    assert_eq!(h.creg.live(), 0);
    assert_eq!(h.creg.invalidated, h.creg.registered);
    for s in [read_seg, write_seg, reply_seg] {
        assert_eq!(h.creg.region_of(s.handle), None, "handle {:#x}", s.handle);
    }
    assert_eq!(h.creg.rdma_read(&read_seg), None);
    assert!(!h.creg.rdma_write(&write_seg, b"late"));
    assert_eq!(h.req.pending(), 0, "the XID left the pending table");
    assert_eq!(h.req.in_flight(), 1, "the sent call keeps its credit");
    assert_eq!(h.req.stats().cancelled, 1);
    // The server finishes the call: its RDMA Write is refused (fenced memory) and its late
    // reply completes nothing.
    let result = h.rt.block_on(h.disp.dispatch(
        ready.message,
        oncrpc::CallContext::local(),
        ready.policy,
    ));
    let completed = h.req.stats().completed;
    let mut writes = 0;
    let mut late = Vec::new();
    for a in h.resp.reply(ready.token, result) {
        match a {
            rpcrdma::responder::Action::Write { segment, data } => {
                assert_eq!(segment.handle, write_seg.handle);
                assert!(
                    !h.creg.rdma_write(&segment, &data),
                    "fenced memory was written"
                );
                writes += 1;
            }
            rpcrdma::responder::Action::Send { data, invalidate } => {
                late.extend(h.req.on_receive(data, invalidate, &mut h.creg))
            }
            rpcrdma::responder::Action::Close => panic!("server closed"),
        }
    }
    assert_eq!(writes, 1, "the result went to the Write chunk");
    assert!(
        late.iter()
            .all(|a| !matches!(a, rpcrdma::requester::Action::Complete { .. })),
        "{late:?}"
    );
    h.client_actions(late);
    assert!(h.done.is_empty());
    let s = h.req.stats();
    assert_eq!((s.late_replies, s.completed), (1, completed), "{s:?}");
    assert_eq!(h.req.in_flight(), 0, "the late reply returned the credit");
    // The connection goes on.
    echo(&mut h, 3, 5000, 3, reduce(1), expect(5000, 3, true));
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-3.3.3
//= type=test
//# A Responder MAY exceed this basic level of configuration, but a Requester MUST NOT assume more
//# than one credit is available and MUST receive a valid reply from the Responder carrying the
//# actual number of available credits, prior to sending its next request.
#[test]
fn reconnect_retransmits_with_same_xid_and_one_credit() {
    let mut h = Harness::new(cfg(8), cfg(8));
    h.batch = 64;
    // Get a grant of 8 first.
    echo(&mut h, 100, 1, 1, DdpPolicy::Inline, expect(1, 1, false));
    for xid in 1..=5u32 {
        let d = pattern(4000, 1);
        let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &Bytes::new());
        let a = h
            .req
            .submit(out_call(xid, ECHO, m, expect(4000, 0, true)), &mut h.creg);
        h.client_actions(a);
    }
    assert_eq!(h.to_server.len(), 5);
    // The connection drops: messages in flight are lost, memory is fenced.
    h.to_server.clear();
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    assert_eq!(h.creg.live(), 0);
    let params = h.params;
    let a = h.req.on_connect(params, &mut h.creg);
    h.client_actions(a);
    // Credits reset to one after a reconnect.
    assert_eq!(h.to_server.len(), 1);
    let (hd, _) = Header::decode(&h.to_server[0]).unwrap();
    assert_eq!(hd.xid, 1, "same XID retransmitted");
    h.run();
    for xid in 1..=5u32 {
        assert!(h.done.remove(&xid).unwrap().is_ok());
    }
    assert_eq!(h.creg.live(), 0);
}

//= specs/rfc8166.txt#section-4.5.4
//= type=test
//# If a Responder is unable to construct and transmit an RPC Reply or RPC-over-RDMA error message,
//# the Responder MUST close the connection to signal to the Requester that a reply was lost.
#[test]
fn lost_reply_xid_gets_err_chunk_after_reconnect() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let m = echo_message(
        7,
        OpaqueAuth::none(),
        DdpPolicy::Inline,
        7,
        &Bytes::new(),
        &Bytes::new(),
    );
    let a = h
        .req
        .submit(out_call(7, ECHO, m, expect(0, 0, false)), &mut h.creg);
    h.client_actions(a);
    let msg = h.to_server.pop_front().unwrap();
    let Some(call) = h.server_receive(msg) else {
        panic!()
    };
    // The reply's Send fails (operational error): close, remember the XID.
    let acts = h.resp.reply_failed(call.token.xid);
    assert_eq!(acts, vec![rpcrdma::responder::Action::Close]);
    let lost = h.resp.take_lost();
    // New connection: the retransmission gets RDMA_ERR_CHUNK (RFC 8166 §4.5.3).
    h.resp = rpcrdma::responder::Responder::new(cfg(8), h.params, ulbs(), lost);
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    let params = h.params;
    let a = h.req.on_connect(params, &mut h.creg);
    h.client_actions(a);
    h.run();
    assert!(matches!(
        h.done.remove(&7),
        Some(Err(RpcError::RdmaErrChunk))
    ));
}

/// RFC 8166 §4.5.4 / §4.5.3: a reply whose Send fails always closes the connection; only an
/// RDMA operational error makes its XID lost (answered with RDMA_ERR_CHUNK on the next
/// connection). A Send flushed by a connection that broke without one is executed again.
//= specs/rfc8166.txt#section-4.5.4
//= type=test
//# If a Responder is unable to construct and transmit an RPC Reply or RPC-over-RDMA error message,
//# the Responder MUST close the connection to signal to the Requester that a reply was lost.
#[test]
fn send_failed_closes_and_remembers_only_operational_errors() {
    use rpcrdma::responder::Action;
    for (op_error, remembered) in [(false, vec![]), (true, vec![21])] {
        let mut h = Harness::new(cfg(8), cfg(8));
        let m = echo_message(
            21,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            7,
            &Bytes::new(),
            &Bytes::new(),
        );
        let a = h
            .req
            .submit(out_call(21, ECHO, m, expect(0, 0, false)), &mut h.creg);
        h.client_actions(a);
        let msg = h.to_server.pop_front().unwrap();
        let Some(call) = h.server_receive(msg) else {
            panic!()
        };
        assert_eq!(
            h.resp.send_failed(Some(call.token.xid), op_error),
            vec![Action::Close]
        );
        // A Send that was not a reply: the connection closes, nothing more is remembered.
        assert_eq!(h.resp.send_failed(None, true), vec![Action::Close]);
        let lost = h.resp.take_lost();
        assert_eq!(
            lost,
            remembered
                .into_iter()
                .collect::<std::collections::HashSet<u32>>()
        );
    }
}

fn gss_integrity() -> OpaqueAuth {
    let mut e = xdr::Encoder::new();
    e.put_u32(1); // version
    e.put_u32(0); // RPCSEC_GSS_DATA
    e.put_u32(1); // seq
    e.put_u32(2); // rpc_gss_svc_integrity
    e.put_opaque(b"ctx");
    OpaqueAuth {
        flavor: 6,
        body: e.into_bytes(),
    }
}

//= specs/rfc8166.txt#section-8.2.2.3
//= type=test
//# Therefore, a sender MUST NOT reduce a Payload stream when RPCSEC_GSS integrity or encryption
//# services are in use.
//= specs/rfc8166.txt#section-3.5.3
//= type=test
//# Every RDMA read segment in this chunk MUST contain zero in its Position field.
#[test]
fn rpcsec_gss_integrity_is_never_reduced() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let d = pattern(6000, 5);
    // The caller encodes inline (no reduction) and marks the call.
    let m = echo_message(
        11,
        gss_integrity(),
        DdpPolicy::Inline,
        11,
        &d,
        &Bytes::new(),
    );
    let mut c = out_call(11, ECHO, m, expect(6000, 0, true));
    c.no_reduction = true;
    let a = h.req.submit(c, &mut h.creg);
    h.client_actions(a);
    // Long Call through a Position-Zero Read chunk, with a Reply chunk and no Write list.
    let (hd, _) = Header::decode(&h.to_server[0]).unwrap();
    let Body::NoMsg(ch) = &hd.body else {
        panic!("{hd:?}")
    };
    assert!(
        ch.reads
            .iter()
            .all(|r| r.target.length > 0 && r.position == 0)
    );
    assert!(ch.writes.is_empty());
    assert!(ch.reply.is_some());
    h.run();
    assert_eq!(
        h.done.remove(&11).unwrap().unwrap(),
        echo_results_bytes(11, &d, &[])
    );
    let (rh, _) = Header::decode(h.server_sends.last().unwrap()).unwrap();
    assert!(
        matches!(rh.body, Body::NoMsg(_)),
        "reply through the Reply chunk, not reduced"
    );
}

#[test]
fn backchannel_interleaved_with_forward_calls() {
    let mut h = Harness::new(
        cfg(8),
        Config {
            back_credits: 2,
            ..cfg(8)
        },
    );
    let call = |xid: u32| {
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
    // RFC 8167 §6: no backward call before the Upper Layer says the peer is ready.
    assert_eq!(h.resp.back_call(1, call(1)), Err(BackError::NotReady));
    h.resp.enable_backchannel();
    let mut sent_back = 0;
    for i in 0..10u32 {
        // Forward call.
        let m = echo_message(
            1000 + i,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            i,
            &Bytes::new(),
            &Bytes::new(),
        );
        let a = h.req.submit(
            out_call(1000 + i, ECHO, m, expect(0, 0, false)),
            &mut h.creg,
        );
        h.client_actions(a);
        // Backward call with an XID that also exists forward: independent XID spaces.
        let a = h.resp.back_call(1000 + i, call(1000 + i)).unwrap();
        sent_back += a.len();
        h.server_actions(a);
        // Only one backward credit until the client's first backward reply.
        assert!(h.resp.back_outstanding() <= 2);
        h.run();
        // The client's callback service answers every backward call.
        for (xid, msg) in std::mem::take(&mut h.back_calls) {
            let (hd, _) = oncrpc::MessageHeader::decode_message(&msg).unwrap();
            assert!(matches!(hd, oncrpc::MessageHeader::Call(_)));
            let r = oncrpc::service::accepted(xid, AcceptStat::Success, None);
            let a = h.req.back_reply(xid, r.message.to_bytes()).unwrap();
            h.client_actions(vec![a]);
        }
        h.run();
    }
    assert_eq!(h.back_replies.len(), 10);
    assert!(sent_back >= 1);
    for i in 0..10u32 {
        assert!(h.done.remove(&(1000 + i)).unwrap().is_ok());
    }
    assert!(h.resp.stats().back_max_outstanding <= 2);
    // Reverse calls are RDMA_MSG, version one, empty chunk lists, non-zero credits, with
    // the RPC CALL carrying the same XID right after the header (RFC 8167 §5.1, §4.1).
    let mut seen = 0;
    for s in &h.server_sends {
        let (hd, n) = Header::decode(s).unwrap();
        assert!(hd.credits >= 1);
        if let Ok((oncrpc::MessageHeader::Call(c), _)) =
            oncrpc::MessageHeader::decode_message(&s.slice(n..))
        {
            assert_eq!(hd.body, Body::Msg(Chunks::default()));
            assert_eq!((hd.vers, c.xid), (1, hd.xid));
            seen += 1;
        }
    }
    assert_eq!(seen, 10);
    // Backward replies from the client: the same rules, with a REPLY (RFC 8167 §5.2).
    let r = oncrpc::service::accepted(42, AcceptStat::Success, None);
    let Some(rpcrdma::requester::Action::Send { data, .. }) =
        h.req.back_reply(42, r.message.to_bytes())
    else {
        panic!()
    };
    let (hd, n) = Header::decode(&data).unwrap();
    assert_eq!(
        (hd.xid, hd.vers, hd.body),
        (42, 1, Body::Msg(Chunks::default()))
    );
    assert!(hd.credits >= 1);
    assert!(
        matches!(oncrpc::MessageHeader::decode_message(&data.slice(n..)).unwrap().0, oncrpc::MessageHeader::Reply(r) if r.xid() == 42)
    );
}

/// A registrar whose invalidations fail.
struct StuckRegistrar(rpcrdma::engine::MemRegistrar);

impl rpcrdma::engine::Registrar for StuckRegistrar {
    fn register_source(
        &mut self,
        data: Bytes,
    ) -> Result<rpcrdma::engine::Region, rpcrdma::engine::RegError> {
        self.0.register_source(data)
    }
    fn register_sink(
        &mut self,
        len: usize,
    ) -> Result<rpcrdma::engine::Region, rpcrdma::engine::RegError> {
        self.0.register_sink(len)
    }
    fn sink_contents(&mut self, id: u64, len: usize) -> Result<Bytes, rpcrdma::engine::RegError> {
        self.0.sink_contents(id, len)
    }
    fn invalidate(&mut self, _id: u64, _remote: bool) -> Result<(), rpcrdma::engine::RegError> {
        Err(rpcrdma::engine::RegError::Invalidate("device error".into()))
    }
}

//= specs/rfc8166.txt#section-4.5.4
//= type=test
//# After a Requester has received a reply, if it is unable to invalidate a memory region due to an
//# unrecoverable problem, the Requester MUST close the connection to protect that memory from
//# Responder access before the associated RPC transaction is complete.
#[test]
fn failed_invalidation_closes_the_connection_before_completion() {
    let mut reg = StuckRegistrar(rpcrdma::engine::MemRegistrar::new(3));
    let mut q = rpcrdma::requester::Requester::new(cfg(8), ulbs());
    let _ = q.on_connect(rpcrdma::engine::Params::default(), &mut reg);
    let d = pattern(3000, 1);
    let m = echo_message(8, OpaqueAuth::none(), reduce(1), 8, &d, &Bytes::new());
    let a = q.submit(out_call(8, ECHO, m, expect(3000, 0, true)), &mut reg);
    assert_eq!(a.len(), 1);
    let out = q.on_receive(raw(&[8, 1, 8, 4, 2]), None, &mut reg);
    let close = out
        .iter()
        .position(|a| matches!(a, rpcrdma::requester::Action::Close));
    let done = out
        .iter()
        .position(|a| matches!(a, rpcrdma::requester::Action::Complete { .. }));
    // RFC 8166 §4.5.4: the connection is closed to fence the memory before the RPC completes.
    assert!(close.unwrap() < done.unwrap());
}

//= specs/rfc8166.txt#section-3.4.5.2
//= type=test
//# o If the sender chooses not to include roundup padding in the chunk, the chunk's total length
//# MUST be the same as the encoded length of the data item.
#[test]
fn read_chunk_length_must_match_the_byte_count() {
    let mut h = Harness::new(cfg(8), cfg(8));
    // Longer than the 4 KiB inline threshold, so the call is not sent whole.
    let d = pattern(6000, 2);
    let mut m = echo_message(12, OpaqueAuth::none(), reduce(1), 12, &d, &Bytes::new());
    // The stream says 6000 bytes, the Read chunk carries 5999 (RFC 8166 §3.4.4.1).
    m.reduced[0].data = m.reduced[0].data.slice(..5999);
    let a = h
        .req
        .submit(out_call(12, ECHO, m, expect(6000, 0, true)), &mut h.creg);
    h.client_actions(a);
    h.run();
    assert!(matches!(
        h.done.remove(&12),
        Some(Err(RpcError::Accepted(AcceptStat::GarbageArgs)))
    ));
    assert_eq!(h.resp.stats().garbage_args, 1);
}

//= specs/rfc8166.txt#section-3.4.5.2
//= type=test
//# o If the Requester chooses to include roundup padding in a Read chunk, the chunk's total length
//# MUST be the sum of the encoded length of the data item and the length of the roundup padding.
#[test]
fn read_chunk_with_round_up_included_is_accepted() {
    let mut h = Harness::new(cfg(8), cfg(8));
    let d = pattern(3001, 2);
    let mut m = echo_message(13, OpaqueAuth::none(), reduce(1), 13, &d, &Bytes::new());
    // This requester sends the XDR pad in the Read chunk (RFC 8166 §3.4.5.2: it SHOULD NOT, so
    // it may).
    let mut padded = m.reduced[0].data.to_vec();
    padded.extend([0, 0, 0]);
    m.reduced[0].data = Bytes::from(padded);
    let a = h
        .req
        .submit(out_call(13, ECHO, m, expect(3001, 0, true)), &mut h.creg);
    h.client_actions(a);
    h.run();
    assert_eq!(
        h.done.remove(&13).unwrap().unwrap(),
        echo_results_bytes(13, &d, &[])
    );
}

/// RFC 8797 §4.2 / RFC 8166 §3.3.2: a reply comes inline only if it fits both our receive
/// buffers and the Responder's send size. Our buffers are 4096 bytes; a peer that sent no
/// private data sends at most 1024, so a 1500-byte reply needs a Reply chunk from us, while a
/// peer that advertised 4096 sends it inline.
//= specs/rfc8166.txt#section-4.3.3
//= type=test
//# A Requester MUST provide a Reply chunk whenever the maximum possible size of the RPC Reply
//# message's Transport and Payload streams is larger than the inline threshold for messages from
//# Responder to Requester.
#[test]
fn reply_chunk_when_the_peer_sends_less_than_we_receive() {
    use rpcrdma::engine::{MemRegistrar, Params};
    use rpcrdma::privdata::PrivateData;
    let data = pattern(10, 1);
    let extra = pattern(1500, 2);
    let client = cfg(8);
    assert_eq!(client.inline_recv, 4096);
    let reply_chunk = |peer: Option<PrivateData>| {
        let params: Params = client.negotiate(peer).into();
        let mut reg = MemRegistrar::new(1);
        let mut q = rpcrdma::requester::Requester::new(client.clone(), ulbs());
        assert!(q.on_connect(params, &mut reg).is_empty());
        let message = echo_message(7, OpaqueAuth::none(), DdpPolicy::Inline, 7, &data, &extra);
        let Some(rpcrdma::requester::Action::Send { data, .. }) = q
            .submit(
                out_call(7, ECHO, message, expect(10, 1500, false)),
                &mut reg,
            )
            .pop()
        else {
            panic!("expected a Send")
        };
        let (h, _) = Header::decode(&data).unwrap();
        match h.body {
            Body::Msg(c) | Body::NoMsg(c) => c.reply.is_some(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(
        reply_chunk(None),
        "no private data: the peer sends 1024 at most"
    );
    assert!(
        reply_chunk(Some(PrivateData::new(1024, true))),
        "the peer advertised 1024"
    );
    assert!(
        !reply_chunk(Some(PrivateData::new(4096, true))),
        "the peer sends 4096: inline"
    );
}
