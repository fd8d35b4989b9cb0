//! The Responder owns its connection's deadlines: the RDMA Reads of a call's Read chunks and
//! the backward-direction calls (RFC 8167). Sans-IO, with an explicit `now`: a driver sleeps
//! until `next_deadline` and calls `handle_timeout`.

use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use oncrpc::{OpaqueAuth, ReplyExpectation};
use rpcrdma::engine::Config;
use rpcrdma::responder::{Action, BackError, Incoming, PendingCall, TimedOut};

fn cfg(back_credits: u32) -> Config {
    Config {
        credits: 8,
        back_credits,
        ..cfg_4k()
    }
}

/// A call whose 5000-byte argument travels in a Read chunk, as the Responder receives it.
fn call_with_read_chunk(h: &mut Harness, xid: u32) -> PendingCall {
    let data: Bytes = (0..5000u32).map(|i| i as u8).collect::<Vec<_>>().into();
    let m = echo_message(
        xid,
        OpaqueAuth::none(),
        reduce(1),
        xid,
        &data,
        &Bytes::new(),
    );
    let reply = ReplyExpectation {
        max_len: Some(5200),
        ddp_items: vec![],
    };
    let a = h.req.submit(out_call(xid, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    let msg = h.to_server.pop_back().expect("the call was sent");
    match h.resp.on_receive(msg) {
        Incoming::NeedReads(p) => p,
        other => panic!("expected Read chunks: {other:?}"),
    }
}

#[test]
fn reads_not_answered_in_time_close_the_connection() {
    let mut h = Harness::new(cfg(2), cfg(2));
    let start = Instant::now();
    h.resp.set_read_timeout(Some(Duration::from_secs(30)));
    assert_eq!(h.resp.next_deadline(), None);
    let p = call_with_read_chunk(&mut h, 5);
    // Nothing is due until the driver says the Reads are posted.
    assert_eq!(h.resp.next_deadline(), None);
    assert!(h.resp.reads_started(&p, start));
    let due = start + Duration::from_secs(30);
    assert_eq!(h.resp.next_deadline(), Some(due));
    assert_eq!(
        h.resp.handle_timeout(due - Duration::from_millis(1)),
        TimedOut::default()
    );
    // The peer never answered: the connection closes (its memory comes back with it).
    let t = h.resp.handle_timeout(due);
    assert_eq!(t.actions, vec![Action::Close]);
    assert!(t.back_calls.is_empty());
    assert_eq!(h.resp.next_deadline(), None);
    assert_eq!(h.resp.handle_timeout(due), TimedOut::default());
    drop(p);
}

#[test]
fn reads_that_complete_or_fail_are_no_longer_due() {
    let mut h = Harness::new(cfg(2), cfg(8));
    let start = Instant::now();
    h.resp.set_read_timeout(Some(Duration::from_secs(1)));
    let p = call_with_read_chunk(&mut h, 6);
    assert!(h.resp.reads_started(&p, start));
    let data = h.pull_reads(&p);
    assert!(matches!(h.resp.complete_reads(p, data), Incoming::Call(_)));
    assert_eq!(h.resp.next_deadline(), None);
    let late = start + Duration::from_secs(5);
    assert_eq!(h.resp.handle_timeout(late), TimedOut::default());
    // A Read that failed: RFC 8166 §4.5.3, fatal to the connection; nothing stays due.
    // (A new connection each time: the Requester has one credit until its first reply.)
    let mut h = Harness::new(cfg(2), cfg(8));
    h.resp.set_read_timeout(Some(Duration::from_secs(1)));
    let q = call_with_read_chunk(&mut h, 7);
    assert!(h.resp.reads_started(&q, start));
    assert_eq!(h.resp.reads_failed(q), vec![Action::Close]);
    assert_eq!(h.resp.next_deadline(), None);
    // Without a read timeout nothing is ever due.
    let mut h = Harness::new(cfg(2), cfg(8));
    let r = call_with_read_chunk(&mut h, 8);
    assert!(h.resp.reads_started(&r, start));
    assert_eq!(h.resp.next_deadline(), None);
}

/// A connection on which the Requester has the server's grant (a first call answered), so
/// that several calls with Read chunks can be pending at once.
fn granted() -> Harness {
    let mut h = Harness::new(cfg(2), cfg(2));
    let m = echo_message(
        1,
        OpaqueAuth::none(),
        xdr::DdpPolicy::Inline,
        1,
        &Bytes::from_static(b"hello"),
        &Bytes::new(),
    );
    let reply = ReplyExpectation {
        max_len: Some(200),
        ddp_items: vec![],
    };
    let a = h.req.submit(out_call(1, ECHO, m, reply), &mut h.creg);
    h.client_actions(a);
    h.run();
    assert!(h.done.remove(&1).unwrap().is_ok());
    h
}

#[test]
fn a_call_waiting_to_start_its_reads_starts_none_once_the_connection_is_closing() {
    // Issue 20: a call that waited (for memory) while the connection's other Reads timed out
    // must not post its Reads afterwards: their waits would outlive the connection, and with
    // them the memory the call holds.
    let mut h = granted();
    let start = Instant::now();
    h.resp.set_read_timeout(Some(Duration::from_secs(30)));
    let p = call_with_read_chunk(&mut h, 5);
    let q = call_with_read_chunk(&mut h, 6);
    assert!(h.resp.reads_started(&p, start));
    assert!(!h.resp.is_closed());
    let due = start + Duration::from_secs(30);
    assert_eq!(h.resp.handle_timeout(due).actions, vec![Action::Close]);
    assert!(h.resp.is_closed());
    // `q` got its memory only now: the Responder says not to post its Reads, and nothing is
    // due on the closing connection.
    assert!(!h.resp.reads_started(&q, due));
    assert_eq!(h.resp.next_deadline(), None);
    assert_eq!(h.resp.reads_failed(q), vec![Action::Close]);
    drop(p);

    // The same after a Read failed (RFC 8166 §4.5.3: the connection closes).
    let mut h = granted();
    let p = call_with_read_chunk(&mut h, 5);
    let q = call_with_read_chunk(&mut h, 6);
    assert!(h.resp.reads_started(&p, start));
    assert_eq!(h.resp.reads_failed(p), vec![Action::Close]);
    assert!(!h.resp.reads_started(&q, start));
}

#[test]
fn a_closed_connection_keeps_no_read_deadline_and_starts_no_reads() {
    // The driver's connection ended (the peer went away) with Reads under way: their waits end
    // with the connection, and nothing stays due.
    let mut h = granted();
    let start = Instant::now();
    h.resp.set_read_timeout(Some(Duration::from_secs(30)));
    let p = call_with_read_chunk(&mut h, 5);
    let q = call_with_read_chunk(&mut h, 6);
    assert!(h.resp.reads_started(&p, start));
    assert!(h.resp.next_deadline().is_some());
    h.resp.connection_closed();
    assert!(h.resp.is_closed());
    assert_eq!(h.resp.next_deadline(), None);
    assert_eq!(
        h.resp.handle_timeout(start + Duration::from_secs(3600)),
        TimedOut::default()
    );
    assert!(!h.resp.reads_started(&q, start));
    assert_eq!(h.resp.next_deadline(), None);
    drop(p);
}

fn back_call_message(xid: u32) -> Bytes {
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
}

#[test]
fn backward_calls_past_their_deadline_are_abandoned_and_free_their_credit() {
    let mut h = Harness::new(cfg(2), cfg(2));
    let start = Instant::now();
    h.resp.enable_backchannel();
    let (d1, d2) = (
        start + Duration::from_secs(1),
        start + Duration::from_secs(2),
    );
    // One backward credit until the client's first backward reply: the second call waits.
    let a = h
        .resp
        .back_call_until(1, back_call_message(1), Some(d1))
        .unwrap();
    assert_eq!(a.len(), 1);
    let a = h
        .resp
        .back_call_until(2, back_call_message(2), Some(d2))
        .unwrap();
    assert!(a.is_empty());
    // A call without a deadline is never due.
    let a = h
        .resp
        .back_call_until(3, back_call_message(3), None)
        .unwrap();
    assert!(a.is_empty());
    assert_eq!(h.resp.back_outstanding(), 1);
    assert_eq!(h.resp.next_deadline(), Some(d1));
    // The first is abandoned; its credit sends the second.
    let t = h.resp.handle_timeout(d1);
    assert_eq!(t.back_calls, vec![1]);
    assert!(
        matches!(
            &t.actions[..],
            [Action::Send {
                invalidate: None,
                ..
            }]
        ),
        "{:?}",
        t.actions
    );
    assert_eq!(h.resp.back_outstanding(), 1);
    assert_eq!(h.resp.next_deadline(), Some(d2));
    // The second: its credit sends the third.
    let t = h.resp.handle_timeout(d2 + Duration::from_secs(1));
    assert_eq!(t.back_calls, vec![2]);
    assert_eq!(t.actions.len(), 1);
    assert_eq!(h.resp.next_deadline(), None);
    // Cancelling a call takes its deadline with it.
    let _ = h
        .resp
        .back_call_until(4, back_call_message(4), Some(d2))
        .unwrap();
    let _ = h.resp.cancel_back(4);
    assert_eq!(h.resp.next_deadline(), None);
}

#[test]
fn a_closed_connection_drops_its_backward_calls_and_accepts_none() {
    let mut h = Harness::new(cfg(2), cfg(2));
    let start = Instant::now();
    h.resp.enable_backchannel();
    let d = start + Duration::from_secs(10);
    // One sent (one backward credit), one queued behind it.
    assert_eq!(
        h.resp
            .back_call_until(1, back_call_message(1), Some(d))
            .unwrap()
            .len(),
        1
    );
    assert!(
        h.resp
            .back_call_until(2, back_call_message(2), Some(d))
            .unwrap()
            .is_empty()
    );
    assert_eq!(h.resp.next_deadline(), Some(d));
    h.resp.connection_closed();
    // Nothing left due (the driver tells their callers), nothing outstanding, nothing more.
    assert_eq!(h.resp.next_deadline(), None);
    assert_eq!(h.resp.back_outstanding(), 0);
    assert_eq!(
        h.resp.back_call_until(3, back_call_message(3), Some(d)),
        Err(BackError::Closed)
    );
    assert_eq!(
        h.resp.back_call(4, back_call_message(4)),
        Err(BackError::Closed)
    );
    assert_eq!(h.resp.poll_back(), Vec::new());
}
