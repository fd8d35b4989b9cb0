//! The rdma-core provider against a real device (kernel siw or rxe, or a NIC).
//!
//! These tests need an RDMA device with an IP address: they use the device named by
//! `OXRDMA_RDMA_TEST_DEVICE` (default: the first one) and the address `OXRDMA_RDMA_TEST_ADDR`
//! (default 127.0.0.1, which works with `rdma link add siw_lo type siw netdev lo`). Where
//! rdma-core, the device or the address is missing they print why and pass without running;
//! `interop/run --only rdma-core` runs them inside the kernel lab's guest over kernel siw.
#![cfg(feature = "rdma-core")]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use verbs::{
    Access, CmEvent, Completion, CompletionQueue, ConnParams, Connection, Device, QpState,
    QueuePair, RdmaCoreConfig, RecvWr, SendOp, SendWr, VerbsError, WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(20);

/// Private data as the ULP sent it: InfiniBand CM pads it with zeros to a fixed size (RoCE,
/// rxe), iWARP's MPA does not.
fn trimmed(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1);
    &b[..end]
}

fn device() -> Option<(Device, IpAddr)> {
    let name = std::env::var("OXRDMA_RDMA_TEST_DEVICE").ok();
    let ip: IpAddr = std::env::var("OXRDMA_RDMA_TEST_ADDR")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or([127, 0, 0, 1].into());
    match Device::rdma_core(RdmaCoreConfig {
        device: name,
        ..Default::default()
    }) {
        Ok(d) => Some((d, ip)),
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

struct End {
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
}

fn end(dev: &Device) -> End {
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(), dev.create_cq());
    let qp = dev.create_qp(&pd, &scq, &rcq);
    End { qp, scq, rcq }
}

async fn next(cq: &CompletionQueue) -> Completion {
    tokio::time::timeout(T, cq.next())
        .await
        .expect("completion within 20 s")
}

/// Listen on the test address; `None` (skip) when the address is not on this device.
async fn listen(dev: &Device, ip: IpAddr) -> Option<verbs::Listener> {
    match dev.listen(SocketAddr::new(ip, 0)).await {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!(
                "skipping: cannot listen on {ip} with {} ({e}); set OXRDMA_RDMA_TEST_ADDR to \
                 an address of the device",
                dev.describe()
            );
            None
        }
    }
}

async fn pair(
    dev: &Device,
    ip: IpAddr,
    a: &End,
    b: &End,
    pa: ConnParams,
    pb: ConnParams,
) -> Option<(Connection, Connection, Bytes)> {
    let mut l = listen(dev, ip).await?;
    let addr = l.local_addr();
    let qpb = b.qp.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await?;
        let pd = req.private_data().clone();
        let c = req.accept(&qpb, pb).await?;
        Ok::<_, VerbsError>((c, pd))
    });
    let ca = tokio::time::timeout(T, dev.connect(&a.qp, addr, pa))
        .await
        .expect("connect within 20 s")
        .expect("connect");
    let (cb, seen) = server.await.unwrap().expect("accept");
    Some((ca, cb, seen))
}

/// Every opcode, zero-length operations, private data both ways, unsignaled WRs, remote
/// invalidation, and what the QP and CM report at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_opcode_over_a_real_device() {
    let Some((dev, ip)) = device() else { return };
    eprintln!("device: {}", dev.describe());
    let (a, b) = (end(&dev), end(&dev));
    let pd_a = a.qp.pd().clone();
    let pd_b = b.qp.pd().clone();
    // Receives before connecting (kept until the QP exists).
    let rbuf = pd_b.register_len(64 * 1024, Access::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        b.qp.post_recv(RecvWr::new(100 + i, rbuf.sge(i * 8192, 8192)))
            .unwrap();
    }
    let pa = ConnParams {
        private_data: Bytes::from_static(b"hello from the initiator"),
        ird: 8,
        ord: 8,
        ..Default::default()
    };
    let pb = ConnParams {
        private_data: Bytes::from_static(b"and back from the responder"),
        ird: 8,
        ord: 8,
        ..Default::default()
    };
    let Some((ca, cb, seen)) = pair(&dev, ip, &a, &b, pa, pb).await else {
        return;
    };
    assert_eq!(trimmed(&seen), b"hello from the initiator");
    assert_eq!(
        trimmed(ca.peer_private_data()),
        b"and back from the responder"
    );
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(ca.next_event().await, Some(CmEvent::Established));
    assert!(
        ca.ord() >= 1 && cb.ird() >= 1,
        "ORD {} IRD {}",
        ca.ord(),
        cb.ird()
    );

    // Send from registered memory.
    let src = pd_a
        .register(b"send payload".to_vec(), Access::LOCAL_WRITE)
        .unwrap();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![src.sge(0, 12)]))
        .unwrap();
    let c = next(&a.scq).await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (1, WcOpcode::Send, WcStatus::Success)
    );
    let r = next(&b.rcq).await;
    assert_eq!(
        (r.wr_id, r.opcode, r.status, r.byte_len),
        (100, WcOpcode::Recv, WcStatus::Success, 12)
    );
    assert_eq!(&rbuf.read(0, 12).unwrap()[..], b"send payload");

    // Zero-length Send; then an inline-bytes Send larger than any inline limit.
    a.qp.post_send(SendWr::new(2, SendOp::Send, vec![]))
        .unwrap();
    assert_eq!(next(&a.scq).await.status, WcStatus::Success);
    let r = next(&b.rcq).await;
    assert_eq!((r.wr_id, r.byte_len), (101, 0));
    let big = Bytes::from((0..5000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    a.qp.post_send(SendWr::send_bytes(3, big.clone())).unwrap();
    assert_eq!(next(&a.scq).await.wr_id, 3);
    let r = next(&b.rcq).await;
    assert_eq!((r.wr_id, r.byte_len), (102, 5000));
    assert_eq!(rbuf.read(2 * 8192, 5000).unwrap(), big);

    // RDMA Write into B's region, and a zero-length Write; unsignaled WRs do not complete.
    let target = pd_b
        .register_len(
            1 << 20,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 253) as u8).collect();
    let wsrc = pd_a.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    let mut w = SendWr::new(
        4,
        SendOp::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        },
        vec![wsrc.sge(0, 1 << 20)],
    );
    w.signaled = false;
    a.qp.post_send(w).unwrap();
    a.qp.post_send(SendWr::new(
        5,
        SendOp::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        },
        vec![],
    ))
    .unwrap();
    let c = next(&a.scq).await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (5, WcOpcode::RdmaWrite, WcStatus::Success)
    );
    // Fence: a Send after the Writes arrives after them (RC ordering).
    a.qp.post_send(SendWr::new(6, SendOp::Send, vec![]))
        .unwrap();
    assert_eq!(next(&a.scq).await.wr_id, 6);
    assert_eq!(next(&b.rcq).await.wr_id, 103);
    assert!(
        target.with_bytes(|b| b == &data[..]),
        "RDMA Write placed 1 MiB"
    );

    // RDMA Read of B's region back into A.
    let sink = pd_a.register_len(1 << 20, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(SendWr::new(
        7,
        SendOp::RdmaRead {
            remote_addr: target.addr() + 4096,
            rkey: target.rkey(),
        },
        vec![sink.sge(0, (1 << 20) - 4096)],
    ))
    .unwrap();
    let c = next(&a.scq).await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.byte_len),
        (7, WcOpcode::RdmaRead, WcStatus::Success, (1 << 20) - 4096)
    );
    assert_eq!(&sink.read(0, (1 << 20) - 4096).unwrap()[..], &data[4096..]);

    // Send with Invalidate of B's region (iWARP: any STag may be invalidated remotely; IB only
    // allows it for memory windows and fast-registration MRs), then a Read of the dead STag
    // fails. On IB the Read uses an rkey that was never valid.
    let iwarp = dev.rdma_core_info().is_some_and(|i| i.iwarp);
    let mut left = 4;
    let probe_rkey = if iwarp {
        let inval = target.rkey();
        a.qp.post_send(SendWr::new(8, SendOp::SendWithInvalidate(inval), vec![]))
            .unwrap();
        assert_eq!(next(&a.scq).await.status, WcStatus::Success);
        let r = next(&b.rcq).await;
        assert_eq!((r.wr_id, r.status), (104, WcStatus::Success));
        match r.invalidated_rkey {
            Some(k) => assert_eq!(k, inval),
            // Kernel siw reports the invalidated STag to kernel consumers only (its user-space
            // CQEs carry no flag); the failing Read below still proves the invalidation.
            None => eprintln!("note: the device does not report remote invalidation to user space"),
        }
        left = 3;
        inval
    } else {
        eprintln!("note: InfiniBand transport: no remote invalidation of a plain MR");
        target.rkey() ^ 0x00ff_ff00
    };
    a.qp.post_send(SendWr::new(
        9,
        SendOp::RdmaRead {
            remote_addr: target.addr(),
            rkey: probe_rkey,
        },
        vec![sink.sge(0, 64)],
    ))
    .unwrap();
    let c = next(&a.scq).await;
    assert_eq!((c.wr_id, c.opcode), (9, WcOpcode::RdmaRead));
    assert_ne!(
        c.status,
        WcStatus::Success,
        "a Read of a dead STag must fail"
    );
    eprintln!("Read of the dead STag: {:?}", c.status);
    assert_eq!(a.qp.state(), QpState::Error);
    // Ending the connection flushes B's unused receives, and B learns of it.
    ca.disconnect().await;
    let mut flushed = 0;
    while let Ok(r) = tokio::time::timeout(Duration::from_secs(10), b.rcq.next()).await {
        assert_eq!(r.status, WcStatus::WrFlushError, "{r:?}");
        flushed += 1;
        if flushed == left {
            break;
        }
    }
    assert_eq!(flushed, left, "B's unused receives flush");
    tokio::time::timeout(T, cb.closed())
        .await
        .expect("B sees the disconnect");
    assert_eq!(b.qp.state(), QpState::Error);
}

/// A listener's reject reaches the initiator with its private data, and the initiator's QP
/// can connect again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_carries_private_data_and_the_qp_can_retry() {
    let Some((dev, ip)) = device() else { return };
    let Some(mut l) = listen(&dev, ip).await else {
        return;
    };
    let addr = l.local_addr();
    let a = end(&dev);
    let b = end(&dev);
    let qpb = b.qp.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await.unwrap();
        assert_eq!(trimmed(req.private_data()), b"first");
        req.reject(b"not now").await.unwrap();
        let req = l.accept().await.unwrap();
        assert_eq!(trimmed(req.private_data()), b"second");
        req.accept(&qpb, ConnParams::default()).await.unwrap()
    });
    let first = dev
        .connect(
            &a.qp,
            addr,
            ConnParams {
                private_data: Bytes::from_static(b"first"),
                ..Default::default()
            },
        )
        .await;
    match first {
        Err(VerbsError::Rejected(pd)) => assert_eq!(trimmed(&pd), b"not now"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    let c = dev
        .connect(
            &a.qp,
            addr,
            ConnParams {
                private_data: Bytes::from_static(b"second"),
                ..Default::default()
            },
        )
        .await
        .expect("second connect");
    let sc = server.await.unwrap();
    // A Send both ways proves the QPs work.
    let pd_b = b.qp.pd().clone();
    let rb = pd_b.register_len(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(RecvWr::new(1, rb.sge(0, 64))).unwrap();
    a.qp.post_send(SendWr::send_bytes(2, Bytes::from_static(b"ping")))
        .unwrap();
    assert_eq!(next(&a.scq).await.status, WcStatus::Success);
    assert_eq!(next(&b.rcq).await.byte_len, 4);
    c.disconnect().await;
    tokio::time::timeout(T, sc.closed())
        .await
        .expect("peer sees the disconnect");
    let _ = &a.rcq;
}

/// More WRs than the send queue holds: the rest wait in software and all complete in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_send_queue_overflows_into_software() {
    let Some((dev, ip)) = device() else { return };
    let (a, b) = (end(&dev), end(&dev));
    let pd_a = a.qp.pd().clone();
    let pd_b = b.qp.pd().clone();
    let target = pd_b
        .register_len(4096 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let Some((ca, _cb, _)) = pair(
        &dev,
        ip,
        &a,
        &b,
        ConnParams::default(),
        ConnParams::default(),
    )
    .await
    else {
        return;
    };
    let src = pd_a
        .register(vec![0x5a; 4096], Access::LOCAL_WRITE)
        .unwrap();
    let n = 3000u64; // > the default send-queue depth of 1024
    for i in 0..n {
        let mut w = SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: target.addr() + (i % 64) * 4096,
                rkey: target.rkey(),
            },
            vec![src.sge(0, 4096)],
        );
        w.signaled = i % 10 == 9 || i == n - 1;
        a.qp.post_send(w).unwrap();
    }
    let mut seen = Vec::new();
    while seen.last() != Some(&(n - 1)) {
        let c = next(&a.scq).await;
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        seen.push(c.wr_id);
    }
    let want: Vec<u64> = (0..n).filter(|i| i % 10 == 9 || *i == n - 1).collect();
    assert_eq!(seen, want);
    assert!(target.with_bytes(|b| b.iter().all(|x| *x == 0x5a)));
    ca.disconnect().await;
}

/// The listener reads from an initiator that serves RDMA Reads but issues none (ORD 0, as
/// Linux's NFS/RDMA client connects): the listener's own ORD comes from the initiator's IRD,
/// which the rdma_cm reports from the listener's side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_reads_from_an_initiator_with_no_read_depth() {
    let Some((dev, ip)) = device() else { return };
    let (a, b) = (end(&dev), end(&dev));
    let pa = ConnParams {
        ird: 16,
        ord: 0,
        ..Default::default()
    };
    let pb = ConnParams {
        ird: 0,
        ord: 16,
        ..Default::default()
    };
    let Some((ca, cb, _)) = pair(&dev, ip, &a, &b, pa, pb).await else {
        return;
    };
    assert!(
        cb.ord() >= 1,
        "listener ORD {} (initiator IRD 16)",
        cb.ord()
    );
    assert!(ca.ird() >= 1, "initiator IRD {}", ca.ird());
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    let src =
        a.qp.pd()
            .register(data.clone(), Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let sink =
        b.qp.pd()
            .register_len(data.len(), Access::LOCAL_WRITE)
            .unwrap();
    // Several Reads outstanding at once, as an NFS WRITE's Read chunk produces.
    let part = data.len() / 4;
    for i in 0..4u64 {
        b.qp.post_send(SendWr::new(
            i,
            SendOp::RdmaRead {
                remote_addr: src.addr() + i * part as u64,
                rkey: src.rkey(),
            },
            vec![sink.sge(i * part as u64, part as u32)],
        ))
        .expect("post an RDMA Read from the listener");
    }
    for i in 0..4u64 {
        let c = next(&b.scq).await;
        assert_eq!(
            (c.wr_id, c.opcode, c.status, c.byte_len),
            (i, WcOpcode::RdmaRead, WcStatus::Success, part as u32)
        );
    }
    assert_eq!(&sink.read(0, data.len()).unwrap()[..], &data[..]);
    ca.disconnect().await;
    tokio::time::timeout(T, cb.closed())
        .await
        .expect("listener sees the disconnect");
    let (_, _) = (&a.rcq, &b.rcq);
}

/// Many owned-bytes Sends in flight at once, each bigger than the device's inline data: they
/// are copied into the QP's bounce slots, and once those are all in use, registered one by one.
/// Every message must arrive with its own bytes (a slot reused too early would show another's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_sends_beyond_the_bounce_slots_keep_their_bytes() {
    let Some((dev, ip)) = device() else { return };
    let (a, b) = (end(&dev), end(&dev));
    const N: u64 = 300;
    const LEN: usize = 6000;
    let ring =
        b.qp.pd()
            .register_len(8192 * N as usize, Access::LOCAL_WRITE)
            .unwrap();
    for i in 0..N {
        b.qp.post_recv(RecvWr::new(i, ring.sge(i * 8192, 8192)))
            .unwrap();
    }
    let Some((ca, _cb, _)) = pair(
        &dev,
        ip,
        &a,
        &b,
        ConnParams::default(),
        ConnParams::default(),
    )
    .await
    else {
        return;
    };
    let msg = |i: u64| -> Vec<u8> { (0..LEN).map(|k| (k as u64 * 7 + i) as u8).collect() };
    for i in 0..N {
        let mut w = SendWr::send_bytes(i, Bytes::from(msg(i)));
        w.signaled = i == N - 1;
        a.qp.post_send(w).unwrap();
    }
    assert_eq!(next(&a.scq).await.wr_id, N - 1);
    for i in 0..N {
        let c = next(&b.rcq).await;
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (i, WcStatus::Success, LEN as u32)
        );
        assert_eq!(
            &ring.read(i as usize * 8192, LEN).unwrap()[..],
            &msg(i)[..],
            "message {i}"
        );
    }
    ca.disconnect().await;
}
