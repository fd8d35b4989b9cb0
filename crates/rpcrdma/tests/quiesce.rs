//! Quiescing a Responder before a clean close (`Responder::quiesce`), sans-IO, the Requester
//! and the Responder back to back in memory: new calls are dropped unanswered and counted,
//! calls already accepted (executing, or still having their Read chunks pulled) are answered,
//! and a reply sent as a responder-provided Read chunk is waited for until its client says it
//! pulled it.

use crate::common::*;
use bytes::Bytes;
use oncrpc::{OpaqueAuth, ReplyExpectation};
use rpcrdma::engine::Config;
use rpcrdma::responder::{BackError, Incoming, Unfinished};
use rpcrdma::rrc::{ReplyMode, RrcConfig};
use rpcrdma::version::{Version, VersionPolicy};

fn data(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

/// Submit an ECHO call of `n` DDP-eligible bytes (a Read chunk beyond the inline threshold)
/// and hand it to the Responder: what it made of it.
fn arrive(h: &mut Harness, xid: u32, n: usize) -> Incoming {
    let d = data(n, xid as u8);
    let m = echo_message(xid, OpaqueAuth::none(), reduce(1), xid, &d, &Bytes::new());
    let reply = ReplyExpectation {
        max_len: Some(n + 256),
        ddp_items: vec![n],
    };
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    let msg = h.to_server.pop_back().expect("the call was sent");
    h.resp.on_receive(msg)
}

fn result_ok(h: &mut Harness, xid: u32, n: usize) {
    let got = h
        .done
        .remove(&xid)
        .unwrap_or_else(|| panic!("xid {xid} answered"))
        .unwrap_or_else(|e| panic!("xid {xid}: {e}"));
    assert!(
        got == echo_results_bytes(xid, &data(n, xid as u8), &[]),
        "xid {xid}: not bit-exact"
    );
}

/// A connection whose first call was answered (the Requester has the whole grant).
fn granted(client: Config, server: Config) -> Harness {
    let mut h = Harness::new(client, server);
    let Incoming::Call(c) = arrive(&mut h, 1, 8) else {
        panic!("an inline call is ready at once");
    };
    h.serve(c);
    h.run();
    result_ok(&mut h, 1, 8);
    h
}

#[test]
fn new_calls_are_dropped_and_counted_and_accepted_ones_answered() {
    let cfg = Config {
        credits: 8,
        ..Config::default()
    };
    let mut h = granted(cfg.clone(), cfg);
    // Accepted before the quiesce: two calls executing, one whose Read chunk is being pulled.
    let mut ready = Vec::new();
    for xid in [10, 11] {
        match arrive(&mut h, xid, 16) {
            Incoming::Call(c) => ready.push(c),
            other => panic!("xid {xid}: {other:?}"),
        }
    }
    let Incoming::NeedReads(pulling) = arrive(&mut h, 12, 20_000) else {
        panic!("20,000 bytes travel in a Read chunk");
    };
    let before = Unfinished {
        pulling: 1,
        executing: 2,
        ..Unfinished::default()
    };
    assert_eq!(h.resp.unfinished(), before);

    h.resp.quiesce();
    assert!(h.resp.is_quiescing());
    // New calls, inline or with Read chunks: dropped, no reply, nothing left to finish.
    for (xid, n) in [(20, 16), (21, 20_000)] {
        assert!(
            matches!(arrive(&mut h, xid, n), Incoming::Nothing),
            "xid {xid}"
        );
    }
    assert_eq!(h.resp.stats().quiesce_dropped, 2);
    assert_eq!(h.resp.unfinished(), before);
    // No backward call starts on a connection about to close.
    h.resp.enable_backchannel();
    assert_eq!(
        h.resp.back_call(1, Bytes::from_static(&[0; 40])),
        Err(BackError::Closed)
    );

    // The pull completes: the call goes on to execute.
    let bytes = h.pull_reads(&pulling);
    match h.resp.complete_reads(pulling, bytes) {
        Incoming::Call(c) => ready.push(c),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.resp.unfinished(),
        Unfinished {
            executing: 3,
            ..Unfinished::default()
        }
    );
    for c in ready {
        h.serve(c);
    }
    assert!(h.resp.unfinished().is_empty());
    h.run();
    for (xid, n) in [(10, 16), (11, 16), (12, 20_000)] {
        result_ok(&mut h, xid, n);
    }
    assert!(!h.done.contains_key(&20) && !h.done.contains_key(&21));
    assert_eq!(h.resp.stats().quiesce_dropped, 2);
}

#[test]
fn a_reply_sent_as_a_read_chunk_is_waited_for_until_its_pull_is_notified() {
    let client = Config {
        version_policy: VersionPolicy::V2,
        credits: 8,
        rrc: RrcConfig {
            enabled: true,
            reply_mode: ReplyMode::ReadChunk,
            ..RrcConfig::default()
        },
        ..Config::default()
    };
    let server = Config {
        max_version: Version::V2,
        credits: 8,
        rrc: RrcConfig {
            enabled: true,
            ..RrcConfig::default()
        },
        ..Config::default()
    };
    let mut h = granted(client, server);
    h.hold_pulls = true;
    // A reply too large for the inline threshold, offered no chunk for it: the Responder
    // sends it as a Position-Zero Read chunk, which the client pulls.
    let n = 100_000;
    let d = data(n, 30);
    let m = echo_message(
        30,
        OpaqueAuth::none(),
        xdr::DdpPolicy::Inline,
        30,
        &d,
        &Bytes::new(),
    );
    let reply = ReplyExpectation {
        max_len: Some(n + 256),
        ddp_items: vec![],
    };
    let a = h.req.submit(out_call(30, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    assert_eq!(h.pulls.len(), 1, "the client pulls the reply");
    h.resp.quiesce();
    // The call was answered, but the reply is not at the client yet: not done.
    assert_eq!(
        h.resp.unfinished(),
        Unfinished {
            rrc_waiting: 1,
            ..Unfinished::default()
        }
    );
    // The pull, then its notification, which a quiescing Responder still takes.
    h.perform_pull();
    h.run();
    assert!(h.resp.unfinished().is_empty());
    assert_eq!(h.resp.stats().rrc_notified, 1);
    let got = h.done.remove(&30).expect("answered").expect("delivered");
    assert!(got == echo_results_bytes(30, &d, &[]));
}
