//! The Requester and the Responder back to back in RPC-over-RDMA version 2 (cel-05): every
//! message form, the version probe and its fallback against a version-1-only Responder
//! (cel-05 §8.2), remote invalidation offered through rdma_inv_handle and used, and a
//! version 1 Requester against the version 2 Responder.

use crate::common::*;
use bytes::Bytes;
use oncrpc::{OpaqueAuth, ReplyExpectation, RpcError};
use rpcrdma::engine::Config;
use rpcrdma::header_v2::{Body2, Direction, Header2, peek_version};
use rpcrdma::version::{Reason, Version, VersionPolicy};
use xdr::DdpPolicy;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn client(policy: VersionPolicy) -> Config {
    Config {
        version_policy: policy,
        credits: 8,
        ..cfg_4k()
    }
}

fn server(max: Version) -> Config {
    Config {
        max_version: max,
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

fn call(
    h: &mut Harness,
    xid: u32,
    data: usize,
    extra: usize,
    policy: DdpPolicy,
    reply: ReplyExpectation,
) -> Result<Bytes, RpcError> {
    let d = pattern(data, xid as u8);
    let x = pattern(extra, 3);
    let m = echo_message(xid, OpaqueAuth::none(), policy, xid, &d, &x);
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    let got = h.done.remove(&xid).expect("call completed")?;
    assert_eq!(got, echo_results_bytes(xid, &d, &x), "xid {xid}");
    Ok(got)
}

fn versions_sent(h: &Harness) -> Vec<u32> {
    h.server_sends
        .iter()
        .filter_map(|b| peek_version(b).map(|(_, v)| v))
        .collect()
}

#[test]
fn every_message_form_in_version_2() {
    let mut h = Harness::new(client(VersionPolicy::V2), server(Version::V2));
    // Short; Chunked with a Read chunk and a Write chunk; Long Call; Long Reply; both.
    call(
        &mut h,
        1,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    call(&mut h, 2, 9000, 10, reduce(1), expect(9000, 10, true)).unwrap();
    call(&mut h, 3, 10, 6000, reduce(1), expect(10, 6000, false)).unwrap();
    call(
        &mut h,
        4,
        10,
        3000,
        DdpPolicy::Inline,
        expect(10, 3000, false),
    )
    .unwrap();
    call(&mut h, 5, 9001, 5003, reduce(1), expect(9001, 5003, true)).unwrap();
    assert_eq!(h.req.version(), Version::V2);
    assert_eq!(h.resp.version(), Some(Version::V2));
    // The Responder's first Send is its RDMA2_CONNPROP (just before the first reply); every
    // other one is a version 2 reply.
    for (n, b) in h.server_sends.iter().enumerate() {
        let (hdr, _) = Header2::decode(b).expect("a version 2 message");
        match hdr.body {
            Body2::ConnProp(_) if n == 0 => {}
            Body2::Msg(l) | Body2::NoMsg(l) => assert_eq!(l.direction, Direction::Reply),
            other => panic!("unexpected {other:?}"),
        }
    }
    let s = h.req.stats();
    assert!(s.long_call >= 2 && s.long_reply >= 2 && s.write_chunk_calls >= 2);
    assert_eq!(h.creg.live(), 0, "every registration fenced");
}

#[test]
fn remote_invalidation_is_offered_and_used() {
    let mut h = Harness::new(client(VersionPolicy::V2), server(Version::V2));
    // A Write chunk: the Requester offers its handle; the Responder invalidates it with the
    // reply's Send.
    call(&mut h, 1, 9000, 10, reduce(1), expect(9000, 10, true)).unwrap();
    let (hdr, _) = Header2::decode(h.server_sends.last().unwrap()).unwrap();
    let Body2::Msg(l) = hdr.body else {
        panic!("expected RDMA2_MSG")
    };
    let write_handle = l.chunks.writes[0][0].handle;
    assert_eq!(
        h.invalidated,
        vec![write_handle],
        "the reply invalidated the Write chunk"
    );
    assert_eq!(h.creg.live(), 0);
    // Declined: a Requester that does not accept Send With Invalidate offers zero, and the
    // reply is a plain Send.
    let mut h = Harness::new(
        Config {
            accept_remote_invalidate: false,
            ..client(VersionPolicy::V2)
        },
        server(Version::V2),
    );
    call(&mut h, 2, 9000, 10, reduce(1), expect(9000, 10, true)).unwrap();
    assert!(h.invalidated.is_empty(), "no handle offered, plain Send");
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn the_probe_falls_back_to_version_1_on_the_same_connection() {
    let mut h = Harness::new(client(VersionPolicy::Auto), server(Version::V1));
    // The first call goes in version 2, gets ERR_VERS [1, 1] and is sent again in version 1
    // with the same XID; the caller sees one successful call.
    call(
        &mut h,
        7,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    assert_eq!(h.req.version(), Version::V1);
    assert_eq!(
        h.req.version_reason(),
        Some(Reason::ErrVers { low: 1, high: 1 })
    );
    assert!(h.req.learned_v1_only());
    assert_eq!(h.req.stats().version_fallbacks, 1);
    assert_eq!(
        versions_sent(&h),
        vec![2, 1],
        "ERR_VERS echoes 2, then a version 1 reply"
    );
    // Later calls are version 1 from the start.
    call(&mut h, 8, 9000, 10, reduce(1), expect(9000, 10, true)).unwrap();
    assert_eq!(h.req.stats().version_fallbacks, 1);
    assert_eq!(h.creg.live(), 0);
}

#[test]
fn a_remembered_version_1_server_is_not_probed_again() {
    let mut h = Harness::new(client(VersionPolicy::Auto), server(Version::V1));
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    h.req.set_peer_v1_only(true);
    let params = h.params;
    let a = h.req.on_connect(params, &mut h.creg);
    h.client_actions(a);
    call(
        &mut h,
        1,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    assert_eq!(h.req.version_reason(), Some(Reason::Remembered));
    assert_eq!(h.req.stats().version_fallbacks, 0);
    assert_eq!(versions_sent(&h), vec![1]);
}

/// The Requester keeps the memory of version-1-only servers itself (cel-05 §8.2): what one
/// connection learns, the next connection to the same server reads on connect.
#[test]
fn the_requester_remembers_a_version_1_server_across_connections() {
    let memory = rpcrdma::version::SharedVersionMemory::default();
    let server_addr: std::net::SocketAddr = "127.0.0.1:20049".parse().unwrap();
    let mut h = Harness::new(client(VersionPolicy::Auto), server(Version::V1));
    h.req.remember_versions_in(server_addr, memory.clone());
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    let params = h.params;
    let a = h.req.on_connect(params, &mut h.creg);
    h.client_actions(a);
    assert!(memory.lock().is_empty(), "nothing learnt yet");
    call(
        &mut h,
        7,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    assert!(
        memory
            .lock()
            .is_v1_only(server_addr.ip(), server_addr.port())
    );
    // The next connection does not probe.
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    let a = h.req.on_connect(params, &mut h.creg);
    h.client_actions(a);
    assert_eq!(h.req.version_reason(), Some(Reason::Remembered));
    call(
        &mut h,
        8,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    assert_eq!(versions_sent(&h), vec![2, 1, 1]);
    assert_eq!(h.req.stats().version_fallbacks, 1);
    assert_eq!(memory.lock().len(), 1);
}

#[test]
fn version_2_only_fails_against_a_version_1_server_and_auto_settles_on_2() {
    let mut h = Harness::new(client(VersionPolicy::V2), server(Version::V1));
    let r = call(
        &mut h,
        1,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    );
    assert!(
        matches!(r, Err(RpcError::Transport(ref m)) if m.contains("RDMA2_ERR_VERS")),
        "{r:?}"
    );
    assert_eq!(h.creg.live(), 0);
    let mut h = Harness::new(client(VersionPolicy::Auto), server(Version::V2));
    call(
        &mut h,
        2,
        100,
        10,
        DdpPolicy::Inline,
        expect(100, 10, false),
    )
    .unwrap();
    assert_eq!(h.req.version_reason(), Some(Reason::ServerAnsweredV2));
}

#[test]
fn a_version_1_requester_is_served_in_version_1_by_the_version_2_responder() {
    let mut h = Harness::new(client(VersionPolicy::V1), server(Version::V2));
    call(&mut h, 1, 9000, 10, reduce(1), expect(9000, 10, true)).unwrap();
    call(&mut h, 2, 10, 6000, reduce(1), expect(10, 6000, false)).unwrap();
    assert_eq!(h.resp.version(), Some(Version::V1));
    assert!(versions_sent(&h).iter().all(|&v| v == 1));
}

#[test]
fn the_probe_is_one_message_of_at_most_1_kb() {
    // A call that would fit a 4 KiB threshold goes as a Long Call while probing (§8: "this
    // initial message can be no larger than ... 1024 bytes"), and nothing else is sent until
    // the answer.
    let mut h = Harness::new(client(VersionPolicy::Auto), server(Version::V2));
    let d = pattern(2000, 1);
    for xid in 1..=3 {
        let m = echo_message(
            xid,
            OpaqueAuth::none(),
            DdpPolicy::Inline,
            xid,
            &d,
            &Bytes::new(),
        );
        let a = h
            .req
            .submit(out_call(xid, ECHO, m, expect(2000, 0, false)), &mut h.creg);
        h.client_actions(a);
    }
    assert_eq!(h.to_server.len(), 1, "one message until the first reply");
    assert!(h.to_server[0].len() <= 1024);
    h.run();
    for xid in 1..=3 {
        assert!(h.done.remove(&xid).unwrap().is_ok());
    }
    assert_eq!(h.req.stats().long_call, 1, "only the probe was a Long Call");
}

/// The ECHO reply's length with `data` inline: the accepted reply header (24 bytes), then
/// `opaque data<>`, `uint32 tag`, `opaque extra<>`.
fn echo_reply_len(data: usize, extra: usize) -> usize {
    24 + 4 + xdr::padded(data) + 4 + 4 + xdr::padded(extra)
}

#[test]
fn a_reply_just_under_the_inline_threshold_comes_back_in_either_version() {
    // RFC 8166 §4.3.3: a Requester MUST provide a Reply chunk whenever the largest reply,
    // transport header included, is larger than the inline threshold. The header of a reply
    // without chunks is 28 bytes in version 1 and 36 in version 2 (cel-05 §6.3: the
    // direction and rdma_inv_handle words follow the three lists' fixed part). Replies whose
    // largest size falls within those 8 bytes below the 4 KiB threshold must come back: inline
    // where they fit, by a Reply chunk where they do not.
    for v in [Version::V1, Version::V2] {
        let policy = if v == Version::V2 {
            VersionPolicy::V2
        } else {
            VersionPolicy::V1
        };
        let mut h = Harness::new(client(policy), server(Version::V2));
        let mut xid = 1;
        for len in (4048..=4076).step_by(4) {
            let extra = len - echo_reply_len(12, 0);
            assert_eq!(echo_reply_len(12, extra), len);
            for ddp in [false, true] {
                let reply = ReplyExpectation {
                    max_len: Some(len),
                    ddp_items: if ddp { vec![12] } else { vec![] },
                };
                let got = call(&mut h, xid, 12, extra, DdpPolicy::Inline, reply);
                assert!(
                    got.is_ok(),
                    "version {v:?}, largest reply {len} bytes, DDP item {ddp}: {got:?}"
                );
                xid += 1;
            }
        }
        assert_eq!(h.req.version(), v);
        let s = h.req.stats();
        // Version 1 replies of up to 4068 bytes fit the threshold with their 28-byte header,
        // version 2's of up to 4060 with their 36-byte one; the longer ones take a Reply chunk
        // (2 lengths x 2 forms in version 1, 4 x 2 in version 2). A Write chunk is registered
        // only for those of them with a DDP-eligible item, never for a reply that fits whole.
        let expected_long = if v == Version::V2 { 8 } else { 4 };
        assert_eq!(s.long_reply, expected_long, "version {v:?}: {s:?}");
        assert_eq!(
            s.write_chunk_calls,
            expected_long / 2,
            "version {v:?}: {s:?}"
        );
        assert_eq!(h.creg.live(), 0, "every registration fenced");
    }
}
