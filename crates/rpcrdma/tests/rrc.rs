//! Responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02, on version 2 as
//! `rpcrdma::rrc` reads it): the Requester and the Responder back to back, in memory, the
//! Responder's memory in a `MemRegistrar` whose counters say what is still registered.

use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use oncrpc::{OpaqueAuth, ReplyExpectation, RpcError};
use rpcrdma::engine::Config;
use rpcrdma::header::{Chunks, ReadChunk, Segment};
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, ErrorBody2, Header2};
use rpcrdma::requester::Action as RqAction;
use rpcrdma::responder::Incoming;
use rpcrdma::rrc::{PullDone, PullStatus, ReplyMode, RrcConfig};
use rpcrdma::version::{Version, VersionPolicy};
use xdr::DdpPolicy;

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn rrc(mode: ReplyMode) -> RrcConfig {
    RrcConfig {
        enabled: true,
        reply_mode: mode,
        ..RrcConfig::default()
    }
}

fn client(mode: Option<ReplyMode>) -> Config {
    Config {
        version_policy: VersionPolicy::V2,
        credits: 8,
        rrc: mode.map(rrc).unwrap_or_default(),
        ..cfg_4k()
    }
}

fn server(on: bool) -> Config {
    Config {
        max_version: Version::V2,
        credits: 8,
        rrc: RrcConfig {
            enabled: on,
            ..RrcConfig::default()
        },
        ..cfg_4k()
    }
}

fn expect(data: usize, extra: usize) -> ReplyExpectation {
    ReplyExpectation {
        max_len: Some(64 + data + extra),
        ddp_items: vec![data],
    }
}

/// Submit an ECHO call of `data` (DDP-eligible) and `extra` (not) bytes.
fn submit(h: &mut Harness, xid: u32, data: usize, extra: usize, reply: ReplyExpectation) {
    let d = pattern(data, xid as u8);
    let x = pattern(extra, !(xid as u8));
    let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &x);
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
}

/// The call's result, checked bit for bit against what ECHO returns.
fn result_of(h: &mut Harness, xid: u32, data: usize, extra: usize) -> Result<(), RpcError> {
    let got = h.done.remove(&xid).expect("call completed")?;
    let want = echo_results_bytes(
        xid,
        &pattern(data, xid as u8),
        &pattern(extra, !(xid as u8)),
    );
    assert_eq!(got.len(), want.len(), "xid {xid}: length");
    assert!(got == want, "xid {xid}: {data}+{extra} bytes not bit-exact");
    Ok(())
}

fn call(h: &mut Harness, xid: u32, data: usize, extra: usize) -> Result<(), RpcError> {
    submit(h, xid, data, extra, expect(data, extra));
    h.run();
    result_of(h, xid, data, extra)
}

/// A connection whose first call settled version 2 and exchanged both RDMA2_CONNPROPs.
fn connected(client_mode: Option<ReplyMode>, server_on: bool) -> Harness {
    let mut h = Harness::new(client(client_mode), server(server_on));
    call(&mut h, 1, 8, 8).expect("first call");
    h
}

fn live(h: &Harness) -> (u64, u64, usize) {
    let r = h.sreg.lock();
    (r.registered, r.invalidated, r.live())
}

/// The last message the Responder sent, decoded.
fn last_reply(h: &Harness) -> Header2 {
    Header2::decode(h.server_sends.last().expect("a reply"))
        .expect("version 2")
        .0
}

#[test]
fn the_capability_is_agreed_only_when_both_announce_it() {
    let h = connected(Some(ReplyMode::ReadChunk), true);
    assert!(h.req.rrc_agreed());
    assert!(h.resp.v2_properties().rrc_agreed());
    for (c, s) in [
        (None, true),
        (Some(ReplyMode::ReadChunk), false),
        (None, false),
    ] {
        let h = connected(c, s);
        assert!(!h.req.rrc_agreed(), "client {c:?} server {s}");
        assert!(!h.resp.v2_properties().rrc_agreed());
    }
}

#[test]
fn every_size_class_comes_back_bit_exact_through_a_read_chunk() {
    let mut h = connected(Some(ReplyMode::ReadChunk), true);
    let calls0 = h.req.stats().rrc_calls;
    // Inline (tiny, just under the 4096-byte threshold), just over it, a page-sized and a
    // large reply, odd lengths (XDR round-up), up to 3 MiB.
    let sizes: &[(usize, usize)] = &[
        (0, 0),
        (1, 0),
        (0, 3900),
        (4000, 0),
        (4097, 0),
        (0, 4101),
        (8191, 5),
        (65_536, 0),
        (131_073, 999),
        (1 << 20, 0),
        ((1 << 20) + 3, 7),
        // (The call carries the data too: 3 MiB stays under the 4 MiB `max_call_size`.)
        (3 << 20, 1),
    ];
    let mut by_chunk = 0;
    for (i, &(data, extra)) in sizes.iter().enumerate() {
        let xid = 100 + i as u32;
        let before = h.resp.stats().rrc_replies;
        call(&mut h, xid, data, extra).expect("bit-exact reply");
        let rrc = h.resp.stats().rrc_replies > before;
        by_chunk += usize::from(rrc);
        // Replies beyond the inline threshold came as RDMA2_NOMSG with one Position-Zero Read
        // chunk, the others inline.
        let hd = last_reply(&h);
        match &hd.body {
            Body2::NoMsg(l) => {
                assert!(rrc, "xid {xid}");
                let rc = l.chunks.read_chunks();
                assert_eq!(rc.len(), 1);
                assert_eq!(rc[0].position, 0);
                assert!(l.chunks.reply.is_none());
            }
            Body2::Msg(_) => assert!(!rrc, "xid {xid}"),
            other => panic!("xid {xid}: {other:?}"),
        }
        // The chunk is invalidated on the notification: nothing stays registered.
        let (reg, inv, n) = live(&h);
        assert_eq!((reg, n), (inv, 0), "xid {xid}");
    }
    assert_eq!(by_chunk, 8, "the eight replies over 4096 bytes");
    let s = h.req.stats();
    // Every call after the first went with no Write chunk and no Reply chunk.
    assert_eq!(s.rrc_calls - calls0, sizes.len() as u64);
    assert_eq!(s.rrc_pulls, 8);
    assert_eq!(s.rrc_notifications, 8);
    assert_eq!(h.resp.stats().rrc_notified, 8);
    assert_eq!(h.resp.rrc_waiting(), (0, 0));
}

#[test]
fn a_reply_larger_than_its_reply_chunk_comes_as_a_read_chunk_and_write_chunks_are_still_filled() {
    // Write-chunk mode: the requester offers a Write chunk for the data and a Reply chunk
    // sized by its (too small) estimate. reliable-reply-02 §4.1.1: the responder MUST use a
    // Position-Zero Read chunk; §4.1: it still fills the Write chunk.
    let mut h = connected(Some(ReplyMode::WriteChunk), true);
    let (data, extra) = (20_000, 9_000);
    let wc0 = h.req.stats().write_chunk_replies;
    let too_small = ReplyExpectation {
        max_len: Some(64 + data + 100),
        ddp_items: vec![data],
    };
    submit(&mut h, 7, data, extra, too_small);
    h.run();
    result_of(&mut h, 7, data, extra).expect("bit-exact");
    let hd = last_reply(&h);
    let Body2::NoMsg(l) = &hd.body else {
        panic!("{hd:?}")
    };
    assert_eq!(l.chunks.read_chunks().len(), 1);
    assert_eq!(l.chunks.writes.len(), 1);
    assert_eq!(rpcrdma::header::chunk_len(&l.chunks.writes[0]), data as u64);
    assert_eq!(h.req.stats().write_chunk_replies, wc0 + 1);
    assert_eq!(h.resp.stats().rrc_replies, 1);
    assert_eq!(live(&h).2, 0);
}

#[test]
fn a_requester_that_never_notifies_gets_its_chunks_invalidated_after_the_pull_timeout() {
    let mut h = connected(Some(ReplyMode::ReadChunk), true);
    h.drop_notifications = true;
    let t0 = Instant::now();
    for xid in 10..13 {
        call(&mut h, xid, 50_000, 0).expect("delivered");
    }
    // Three chunks registered and still waiting: the counters say so.
    let (reg, inv, n) = live(&h);
    assert_eq!((reg - inv, n), (3, 3));
    assert_eq!(h.resp.rrc_waiting().0, 3);
    let due = h.resp.next_deadline().expect("a pull deadline");
    assert!(due >= t0 + Duration::from_secs(30));
    // Not yet due: nothing happens.
    let early = h.resp.handle_timeout(t0);
    assert!(early.actions.is_empty());
    assert_eq!(live(&h).2, 3);
    // Due: all three invalidated, memory returned.
    let late = h.resp.handle_timeout(due + Duration::from_secs(1));
    assert!(late.actions.is_empty(), "{:?}", late.actions);
    let (reg, inv, n) = live(&h);
    assert_eq!((reg, n), (inv, 0));
    assert_eq!(h.resp.stats().rrc_timed_out, 3);
    assert_eq!(h.resp.rrc_waiting(), (0, 0));
    assert_eq!(h.resp.next_deadline(), None);
    // A notification that comes after all names no waiting chunk: dropped silently.
    let late_note = h.notifications[0].0.clone();
    assert!(matches!(h.resp.on_receive(late_note), Incoming::Nothing));
    assert_eq!(h.resp.stats().rrc_notifications_dropped, 1);
}

#[test]
fn a_connection_lost_in_the_middle_of_a_pull() {
    let mut h = connected(Some(ReplyMode::ReadChunk), true);
    h.hold_pulls = true;
    submit(&mut h, 20, 100_000, 0, expect(100_000, 0));
    h.run();
    assert_eq!(h.pulls.len(), 1, "the pull started");
    assert!(!h.done.contains_key(&20));
    assert_eq!(live(&h).2, 1);
    // The connection breaks: the Responder invalidates the waiting chunk, the Requester
    // forgets the pull and keeps the call for the next connection.
    h.resp.connection_closed();
    assert_eq!(live(&h).2, 0);
    assert_eq!(h.resp.stats().rrc_invalidated_on_close, 1);
    let a = h.req.on_disconnect(&mut h.creg);
    h.client_actions(a);
    // The Reads of the old connection end (in error: the handle is dead) after that.
    let (pull, segs, _) = h.pulls.pop_front().unwrap();
    assert!(
        h.sreg.lock().rdma_read(&segs[0]).is_none(),
        "handle invalidated"
    );
    let a = h.req.pull_done(pull, Err("flushed".into()), &mut h.creg);
    assert!(
        a.is_empty(),
        "nothing for a pull of a gone connection: {a:?}"
    );
    assert!(!h.done.contains_key(&20));
    // Reconnect to a new Responder: the call goes again with its XID and completes once.
    let completed = h.req.stats().completed;
    h.hold_pulls = false;
    let params = h.params;
    h.resp = rpcrdma::responder::Responder::new(
        server(true),
        params,
        ulbs(),
        std::collections::HashSet::new(),
    );
    h.resp.set_registrar(Box::new(h.sreg.clone()));
    let cparams = client(None)
        .negotiate(Some(server(true).private_data()))
        .into();
    let a = h.req.on_connect(cparams, &mut h.creg);
    h.client_actions(a);
    h.run();
    result_of(&mut h, 20, 100_000, 0).expect("delivered after the reconnect");
    assert_eq!(h.req.stats().completed, completed + 1, "exactly once");
    assert_eq!(live(&h).2, 0);
}

#[test]
fn notifications_and_read_chunks_for_unknown_xids() {
    let mut h = connected(Some(ReplyMode::ReadChunk), true);
    // Responder: a notification naming no waiting chunk is dropped without an answer.
    let n = PullDone {
        xid: 0xdead,
        status: PullStatus::Pulled,
    }
    .to_bytes(8);
    assert!(matches!(h.resp.on_receive(n), Incoming::Nothing));
    assert_eq!(h.resp.stats().rrc_notifications_dropped, 1);
    // A malformed one (a status word that means nothing) is BAD_XDR, like other OPTIONALs.
    let mut bad = PullDone {
        xid: 5,
        status: PullStatus::Pulled,
    }
    .to_header(8);
    if let Body2::Optional(o) = &mut bad.body {
        o.optinfo = Bytes::from_static(&[0, 0, 0, 9]);
    }
    match h.resp.on_receive(bad.to_bytes()) {
        Incoming::Respond(a) => {
            let rpcrdma::responder::Action::Send { data, .. } = &a[0] else {
                panic!("{a:?}")
            };
            let (e, _) = Header2::decode(data).unwrap();
            assert_eq!(e.body, Body2::Error(ErrorBody2::BadXdr));
        }
        other => panic!("{other:?}"),
    }
    // Requester: a reply with a Read chunk for an XID it does not wait for is not pulled,
    // and the notification goes at once.
    let mut chunks = Chunks::default();
    let seg = Segment {
        handle: 0x1234,
        length: 8192,
        offset: 0,
    };
    chunks.set_read_chunks(&[ReadChunk {
        position: 0,
        segments: vec![seg],
    }]);
    let mut l = ChunkLists::new(Direction::Reply, chunks);
    l.inv_handle = 0x1234;
    let m = Header2::new(0xbeef, 8, Body2::NoMsg(l)).to_bytes();
    let a = h.req.on_receive(m, None, &mut h.creg);
    let notes: Vec<_> = a
        .iter()
        .filter_map(|x| match x {
            RqAction::Notify { data, invalidate } => Some((data.clone(), *invalidate)),
            RqAction::Pull { .. } => panic!("pulled an unknown XID"),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), 1);
    let (hd, _) = Header2::decode(&notes[0].0).unwrap();
    let Body2::Optional(o) = &hd.body else {
        panic!()
    };
    assert_eq!(
        PullDone::from_optional(hd.xid, o),
        Some(Ok(PullDone {
            xid: 0xbeef,
            status: PullStatus::UnknownXid
        }))
    );
    // Both sides allow remote invalidation: the handle the responder named, and only it.
    assert_eq!(notes[0].1, Some(0x1234));
    assert_eq!(h.req.stats().rrc_unknown_xid, 1);
}

#[test]
fn a_pull_that_fails_ends_the_call_and_still_notifies() {
    let mut h = connected(Some(ReplyMode::ReadChunk), true);
    h.hold_pulls = true;
    submit(&mut h, 30, 40_000, 0, expect(40_000, 0));
    h.run();
    let (pull, _, _) = h.pulls.pop_front().expect("a pull");
    let a = h
        .req
        .pull_done(pull, Err("remote access error".into()), &mut h.creg);
    h.client_actions(a);
    h.run();
    match h.done.remove(&30) {
        Some(Err(RpcError::Transport(m))) => assert!(m.contains("failed"), "{m}"),
        other => panic!("{other:?}"),
    }
    let (data, _) = h.notifications.last().unwrap().clone();
    let (hd, _) = Header2::decode(&data).unwrap();
    let Body2::Optional(o) = &hd.body else {
        panic!()
    };
    assert_eq!(
        PullDone::from_optional(hd.xid, o).unwrap().unwrap().status,
        PullStatus::Failed
    );
    assert_eq!(h.req.stats().rrc_pull_failed, 1);
    assert_eq!(h.resp.stats().rrc_notified, 1);
    assert_eq!(live(&h).2, 0);
    // A short pull (fewer bytes than the chunk) fails the same way.
    submit(&mut h, 31, 40_000, 0, expect(40_000, 0));
    h.run();
    let (pull, _, _) = h.pulls.pop_front().expect("a pull");
    let a = h
        .req
        .pull_done(pull, Ok(Bytes::from_static(b"short")), &mut h.creg);
    h.client_actions(a);
    h.run();
    assert!(matches!(
        h.done.remove(&31),
        Some(Err(RpcError::Transport(_)))
    ));
    assert_eq!(live(&h).2, 0);
    // The connection goes on.
    h.hold_pulls = false;
    call(&mut h, 32, 40_000, 0).expect("next call");
}

#[test]
fn without_the_capability_the_permanent_errors_of_today() {
    // Version 2, the server without the capability; the client in read-chunk mode never
    // sees it agreed, so it keeps offering Reply chunks: a large reply works as before.
    let mut h = connected(Some(ReplyMode::ReadChunk), false);
    call(&mut h, 40, 50_000, 9_000).expect("Write and Reply chunks as before");
    assert_eq!(h.req.stats().rrc_calls, 0);
    // A Reply chunk too small: REPLY_RESOURCE (cel-05 §7.2.4; reliable-reply-02 §4.1.1's
    // "appropriate permanent transport error").
    let small = ReplyExpectation {
        max_len: Some(64 + 100),
        ddp_items: vec![],
    };
    submit(&mut h, 41, 0, 20_000, small.clone());
    h.run();
    assert!(matches!(
        h.done.remove(&41),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    let hd = last_reply(&h);
    assert!(matches!(
        hd.body,
        Body2::Error(ErrorBody2::ReplyResource { .. })
    ));
    assert_eq!(h.resp.stats().rrc_replies, 0);
    assert_eq!(live(&h).0, 0, "nothing registered");
    // The server has it, the client did not announce it: the same error, no Read chunk.
    let mut h = connected(None, true);
    submit(&mut h, 42, 0, 20_000, small.clone());
    h.run();
    assert!(matches!(
        h.done.remove(&42),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    assert_eq!(h.resp.stats().rrc_replies, 0);
    // Version 1 with the capability configured on both sides: ERR_CHUNK, as RFC 8166 has it.
    let c1 = Config {
        version_policy: VersionPolicy::V1,
        ..client(Some(ReplyMode::ReadChunk))
    };
    let mut h = Harness::new(c1, server(true));
    submit(&mut h, 43, 0, 20_000, small);
    h.run();
    assert!(matches!(
        h.done.remove(&43),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    assert_eq!(h.resp.stats().err_chunk, 1);
    assert_eq!(h.resp.stats().rrc_replies, 0);
    assert_eq!(h.resp.version(), Some(Version::V1));
}

#[test]
fn without_the_capability_connprop_and_receives_are_unchanged() {
    let plain = rpcrdma::version::V2Properties::new(4096, rpcrdma::props::BackwardSupport::Inline);
    let c = plain.connprop();
    assert_eq!(c.start.0.len(), 2);
    assert_eq!(Header2::new(1, 1, Body2::ConnProp(c)).encoded_len(), 52);
    let with = plain.clone().with_rrc(true).connprop();
    assert_eq!(with.start.0.len(), 3);
    assert_eq!(
        Header2::new(1, 1, Body2::ConnProp(with.clone())).encoded_len(),
        64
    );
    assert_eq!(with.start.0[2].which, rpcrdma::rrc::PROPID_RRC);
    let off = rpcrdma::responder::Responder::new(
        server(false),
        Default::default(),
        ulbs(),
        Default::default(),
    );
    let on = rpcrdma::responder::Responder::new(
        server(true),
        Default::default(),
        ulbs(),
        Default::default(),
    );
    assert_eq!(off.receives_needed(), 8 + 2 + 1);
    assert_eq!(on.receives_needed(), 8 + 2 + 1 + 64);
}

#[test]
fn a_requester_without_the_capability_notifies_and_ends_the_call() {
    // A server that (wrongly) sends a Read chunk to a client that never announced them.
    let mut h = connected(None, true);
    submit(&mut h, 50, 0, 20_000, expect(0, 20_000));
    let sent = h.to_server.pop_front().expect("the call");
    let _ = h.server_receive(sent);
    let mut chunks = Chunks::default();
    chunks.set_read_chunks(&[ReadChunk {
        position: 0,
        segments: vec![Segment {
            handle: 9,
            length: 30_000,
            offset: 0,
        }],
    }]);
    let m = Header2::new(
        50,
        8,
        Body2::NoMsg(ChunkLists::new(Direction::Reply, chunks)),
    )
    .to_bytes();
    let a = h.req.on_receive(m, None, &mut h.creg);
    let mut notified = None;
    let mut ended = false;
    for x in &a {
        match x {
            RqAction::Notify { data, invalidate } => {
                let (hd, _) = Header2::decode(data).unwrap();
                let Body2::Optional(o) = &hd.body else {
                    panic!()
                };
                notified = Some(PullDone::from_optional(hd.xid, o).unwrap().unwrap());
                // No handle offered: a plain Send.
                assert_eq!(*invalidate, None);
            }
            RqAction::Complete { xid: 50, result } => ended = result.is_err(),
            RqAction::Pull { .. } => panic!("pulled"),
            _ => {}
        }
    }
    assert_eq!(
        notified,
        Some(PullDone {
            xid: 50,
            status: PullStatus::Unsupported
        })
    );
    assert!(ended);
    assert_eq!(h.req.stats().rrc_unsupported, 1);
}

#[test]
fn send_with_invalidate_only_where_both_sides_allow_it() {
    for (c_inv, s_inv) in [(true, true), (true, false), (false, true)] {
        let c = Config {
            accept_remote_invalidate: c_inv,
            ..client(Some(ReplyMode::ReadChunk))
        };
        let s = Config {
            accept_remote_invalidate: s_inv,
            ..server(true)
        };
        let mut h = Harness::new(c, s);
        call(&mut h, 1, 8, 8).unwrap();
        call(&mut h, 2, 30_000, 0).unwrap();
        let (_, inv) = h.notifications.last().unwrap().clone();
        let both = c_inv && s_inv;
        assert_eq!(inv.is_some(), both, "client {c_inv} server {s_inv}");
        let r = h.sreg.lock();
        assert_eq!(r.remote_invalidated, u64::from(both));
        assert_eq!(r.live(), 0);
        assert_eq!(h.resp.stats().rrc_remote_invalidated, u64::from(both));
    }
}

#[test]
fn the_tables_bound_holds_replies_back_without_growing_or_deadlocking() {
    let s = Config {
        rrc: RrcConfig {
            enabled: true,
            max_chunks: 2,
            max_bytes: 1 << 20,
            ..RrcConfig::default()
        },
        ..server(true)
    };
    let mut h = Harness::new(client(Some(ReplyMode::ReadChunk)), s);
    call(&mut h, 1, 8, 8).unwrap();
    h.hold_pulls = true;
    for xid in 60..66 {
        submit(&mut h, xid, 100_000, 0, expect(100_000, 0));
    }
    h.run();
    // Two chunks out, four replies held back: the table never holds more than two.
    assert_eq!(h.resp.rrc_waiting().0, 2);
    assert_eq!(h.resp.rrc_parked(), 4);
    assert_eq!(live(&h).2, 2);
    let mut max_live = 2;
    while !h.pulls.is_empty() {
        h.perform_pull();
        h.run();
        max_live = max_live.max(live(&h).2);
        assert!(h.resp.rrc_waiting().1 <= 1 << 20);
    }
    assert_eq!(max_live, 2);
    for xid in 60..66 {
        result_of(&mut h, xid, 100_000, 0).expect("every reply delivered");
    }
    assert_eq!(h.resp.stats().rrc_parked, 4);
    assert_eq!(live(&h).2, 0);
    // A requester that never notifies cannot wedge it either: the pull deadlines free the
    // slots, and the held replies go.
    h.hold_pulls = false;
    h.drop_notifications = true;
    for xid in 70..74 {
        submit(&mut h, xid, 100_000, 0, expect(100_000, 0));
    }
    h.run();
    assert_eq!(h.resp.rrc_parked(), 2);
    let mut now = Instant::now();
    for _ in 0..2 {
        now += Duration::from_secs(31);
        let t = h.resp.handle_timeout(now);
        h.server_actions(t.actions);
        h.run();
    }
    for xid in 70..74 {
        result_of(&mut h, xid, 100_000, 0).expect("delivered after the deadlines");
    }
    now += Duration::from_secs(31);
    let t = h.resp.handle_timeout(now);
    assert!(t.actions.is_empty());
    assert_eq!(live(&h).2, 0);
    // A reply larger than the byte bound alone: REPLY_RESOURCE, nothing registered.
    let before = live(&h).0;
    submit(&mut h, 80, (1 << 20) + 4, 0, expect((1 << 20) + 4, 0));
    h.run();
    assert!(matches!(
        h.done.remove(&80),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    assert_eq!(live(&h).0, before);
}

#[test]
fn write_chunk_mode_keeps_todays_messages_when_the_capability_is_agreed() {
    // Agreed, but the client asks for Write and Reply chunks: replies that fit them use them.
    let mut h = connected(Some(ReplyMode::WriteChunk), true);
    call(&mut h, 90, 200_000, 0).unwrap();
    call(&mut h, 91, 0, 30_000).unwrap();
    assert_eq!(h.resp.stats().rrc_replies, 0);
    assert_eq!(h.req.stats().rrc_calls, 0);
    assert_eq!(h.sreg.lock().registered, 0);
    let _ = DdpPolicy::Inline;
}

#[test]
fn send_only_needs_the_server_s_read_chunks() {
    // Send-only (draft §5.3.1): no Reply chunk even though the server did not announce the
    // capability; its large reply is REPLY_RESOURCE (draft §6). With the server's
    // capability, the same call succeeds through a Read chunk.
    let mut h = connected(Some(ReplyMode::SendOnly), false);
    submit(&mut h, 2, 0, 30_000, expect(0, 30_000));
    h.run();
    assert!(matches!(
        h.done.remove(&2),
        Some(Err(RpcError::RdmaErrChunk))
    ));
    assert_eq!(h.req.stats().rrc_calls, 1);
    let mut h = connected(Some(ReplyMode::SendOnly), true);
    call(&mut h, 2, 0, 30_000).expect("through a Read chunk");
    assert_eq!(h.resp.stats().rrc_replies, 1);
}
