//! Completion queue handlers (`CompletionQueue::set_handler`): completions handed over in
//! order, in the provider's context, with the queue pair free for new work requests.

use std::sync::{Arc, Mutex};

use crate::common::*;
use bytes::Bytes;
use verbs::{Access, Completion, RecvWr, SendWr, WcOpcode, WcStatus};

/// The server echoes every received message from inside its receive handler: it reposts the
/// buffer and posts a Send, both of which take the queue pair's lock, so this deadlocks if a
/// handler ran under it. The client counts the echoes in its own handler. Over TCP, every
/// echo leaves from the server's receive task at the end of the batch it came in with, never
/// through the writer task.
async fn echo_from_the_handler(kind: Kind) {
    const N: usize = 200;
    const SLOTS: usize = 16;
    let (e, k) = up(kind).await;
    let sbufs: Vec<_> = (0..SLOTS)
        .map(|_| e.s.pd.register_len(64, Access::LOCAL_WRITE).unwrap())
        .collect();
    for (i, b) in sbufs.iter().enumerate() {
        e.s.qp
            .post_recv(RecvWr::new(i as u64, b.sge(0, 64)))
            .unwrap();
    }
    let cbufs: Vec<_> = (0..SLOTS)
        .map(|_| e.c.pd.register_len(64, Access::LOCAL_WRITE).unwrap())
        .collect();
    for (i, b) in cbufs.iter().enumerate() {
        e.c.qp
            .post_recv(RecvWr::new(i as u64, b.sge(0, 64)))
            .unwrap();
    }

    let sqp = e.s.qp.clone();
    let sbufs = Arc::new(sbufs);
    let sb = sbufs.clone();
    assert!(e.s.rcq.set_handler(Box::new(move |c: Completion| {
        // The flush of the posted receives when the test ends.
        if c.status == WcStatus::WrFlushError {
            return;
        }
        assert_eq!((c.opcode, c.status), (WcOpcode::Recv, WcStatus::Success));
        let i = c.wr_id as usize;
        let msg = sb[i].read(0, c.byte_len as usize).unwrap();
        sqp.post_recv(RecvWr::new(c.wr_id, sb[i].sge(0, 64)))
            .unwrap();
        let mut wr = SendWr::send_bytes(0, msg);
        wr.signaled = false;
        sqp.post_send(wr).unwrap();
    })));
    // A second handler is refused.
    assert!(!e.s.rcq.set_handler(Box::new(|_| {})));

    let got: Arc<Mutex<Vec<u32>>> = Arc::default();
    let done = Arc::new(tokio::sync::Notify::new());
    let (cqp, g, d) = (e.c.qp.clone(), got.clone(), done.clone());
    let cbufs = Arc::new(cbufs);
    let cb = cbufs.clone();
    assert!(e.c.rcq.set_handler(Box::new(move |c: Completion| {
        if c.status == WcStatus::WrFlushError {
            return;
        }
        assert_eq!(c.status, WcStatus::Success);
        let i = c.wr_id as usize;
        let msg = cb[i].read(0, c.byte_len as usize).unwrap();
        cqp.post_recv(RecvWr::new(c.wr_id, cb[i].sge(0, 64)))
            .unwrap();
        let mut v = g.lock().unwrap();
        v.push(u32::from_be_bytes(msg[..4].try_into().unwrap()));
        if v.len() == N {
            d.notify_one();
        }
    })));

    // At most SLOTS messages in flight (the receive buffers on each side).
    let mut sent = 0u32;
    while (sent as usize) < N {
        while (sent as usize) < N && sent as usize - got.lock().unwrap().len() < SLOTS {
            let mut wr = SendWr::send_bytes(0, Bytes::copy_from_slice(&sent.to_be_bytes()));
            wr.signaled = false;
            e.c.qp.post_send(wr).unwrap();
            sent += 1;
        }
        tokio::task::yield_now().await;
    }
    done.notified().await;
    let v = got.lock().unwrap().clone();
    // Every echo, once each and in order.
    assert_eq!(v, (0..N as u32).collect::<Vec<_>>());
    // Nothing went to the queue for `next()`.
    assert!(e.c.rcq.try_next().is_none() && e.s.rcq.try_next().is_none());
    if kind == Kind::Tcp {
        let ss = k.s.stats();
        assert_eq!(
            (ss.fpdus_tx, ss.direct_tx_fpdus),
            (N as u64, N as u64),
            "{ss:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_from_the_handler_tcp() {
    within(echo_from_the_handler(Kind::Tcp)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_from_the_handler_mem() {
    within(echo_from_the_handler(Kind::Mem)).await
}

/// Completions queued before the handler is set are handed to it at once, in order; so is a
/// flush (a disconnect) afterwards.
#[tokio::test]
async fn earlier_completions_then_flushes_reach_the_handler() {
    within(async {
        let (e, k) = up(Kind::Tcp).await;
        let rbufs: Vec<_> = (0..3)
            .map(|_| e.s.pd.register_len(16, Access::LOCAL_WRITE).unwrap())
            .collect();
        for (i, b) in rbufs.iter().enumerate() {
            e.s.qp
                .post_recv(RecvWr::new(i as u64, b.sge(0, 16)))
                .unwrap();
        }
        e.c.qp
            .post_send(SendWr::send_bytes(9, Bytes::from_static(b"first")))
            .unwrap();
        // The first is taken from the queue the usual way.
        let c = e.s.rcq.next().await;
        assert_eq!((c.wr_id, c.status), (0, WcStatus::Success));
        e.c.qp
            .post_send(SendWr::send_bytes(10, Bytes::from_static(b"second")))
            .unwrap();
        // Let it land in the queue before the handler exists.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let seen: Arc<Mutex<Vec<(u64, WcStatus)>>> = Arc::default();
        let s2 = seen.clone();
        assert!(e.s.rcq.set_handler(Box::new(move |c: Completion| {
            s2.lock().unwrap().push((c.wr_id, c.status));
        })));
        assert_eq!(*seen.lock().unwrap(), vec![(1, WcStatus::Success)]);
        k.c.disconnect().await;
        k.s.closed().await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while seen.lock().unwrap().len() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(1, WcStatus::Success), (2, WcStatus::WrFlushError)]
        );
    })
    .await
}
