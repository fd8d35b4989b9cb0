//! What a completed Send means when the connection closes right after it (a server closing a
//! connection once its replies are done): every Send whose completion was delivered — or, once
//! `QueuePair::send_queue_idle` says so, every Send posted — reaches the peer before the
//! close. The soft-iWARP engine completes a Send when its last segment is handed to the
//! connection's transmit queue, so the close path must write that queue out before the FIN.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use verbs::{Access, RecvWr, SendWr, WcStatus};

const N: usize = 64;
const LEN: usize = 64 << 10;

fn message(i: usize) -> Bytes {
    (0..LEN)
        .map(|j| (j as u8).wrapping_mul(17) ^ (i as u8))
        .collect::<Vec<_>>()
        .into()
}

/// Post `N` Sends of 64 KiB and close the connection at once when `wait_idle` says:
/// from the completion handler of the last Send (it runs as the engine hands the Send's last
/// segment to the transmit queue, before the queue is written), or once the send queue is
/// idle. The peer must receive every message intact.
async fn close_after_sends(kind: Kind, wait_idle: bool) {
    let (e, k) = up(kind).await;
    let conn = Arc::new(k.c);
    let bufs: Vec<_> = (0..N)
        .map(|i| {
            let mr = e.s.pd.register_len(LEN, Access::LOCAL_WRITE).unwrap();
            e.s.qp
                .post_recv(RecvWr::new(i as u64, mr.sge(0, LEN as u32)))
                .unwrap();
            mr
        })
        .collect();
    let completed = Arc::new(AtomicUsize::new(0));
    let queued_at_close = Arc::new(AtomicBool::new(false));
    if !wait_idle {
        let (conn, completed, qp, queued) = (
            conn.clone(),
            completed.clone(),
            e.c.qp.clone(),
            queued_at_close.clone(),
        );
        assert!(e.c.scq.set_handler(Box::new(move |c| {
            assert_eq!(c.status, WcStatus::Success);
            if completed.fetch_add(1, Ordering::AcqRel) + 1 == N {
                // Closed at once: the QP goes to error, and the stream closes after what
                // was queued.
                // The last Send's bytes are still queued (what the test is about).
                queued.store(!qp.send_queue_idle(), Ordering::Release);
                conn.abort();
            }
        })));
    }
    for i in 0..N {
        e.c.qp
            .post_send(SendWr::send_bytes(i as u64, message(i)))
            .unwrap();
    }
    if wait_idle {
        while !e.c.qp.send_queue_idle() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        conn.abort();
    }
    for (i, buf) in bufs.iter().enumerate() {
        let r = e.s.rcq.next().await;
        assert_eq!(
            (r.wr_id, r.status, r.byte_len as usize),
            (i as u64, WcStatus::Success, LEN),
            "{kind:?}: message {i} of {N} lost at the close"
        );
        assert!(
            buf.read(0, LEN).unwrap() == message(i),
            "message {i} intact"
        );
    }
    if !wait_idle {
        assert_eq!(completed.load(Ordering::Acquire), N);
        assert!(
            queued_at_close.load(Ordering::Acquire),
            "the close came while bytes were queued"
        );
    }
    // The peer can take the last bytes in before the writer that wrote them marks the queue
    // idle: the queue must drain, not be idle at the instant the last message arrives (under
    // load that instant came first about once in 100 runs).
    let waited = std::time::Instant::now();
    while !e.c.qp.send_queue_idle() {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "something is left 5 s after the close"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_sends_reach_the_peer_before_the_close_tcp() {
    within(close_after_sends(Kind::Tcp, false)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_sends_reach_the_peer_before_the_close_mem() {
    within(close_after_sends(Kind::Mem, false)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_send_queue_means_everything_reaches_the_peer_tcp() {
    within(close_after_sends(Kind::Tcp, true)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_send_queue_means_everything_reaches_the_peer_mem() {
    within(close_after_sends(Kind::Mem, true)).await
}
