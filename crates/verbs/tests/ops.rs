//! Every opcode over both providers.

use crate::common::*;
use bytes::Bytes;
use verbs::{Access, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

async fn send_recv(kind: Kind) {
    let (e, _k) = up(kind).await;
    let rbuf = e.s.pd.register_len(4096, Access::LOCAL_WRITE).unwrap();
    e.s.qp.post_recv(RecvWr::new(7, rbuf.sge(0, 4096))).unwrap();
    e.c.qp
        .post_send(SendWr::send_bytes(1, Bytes::from_static(b"hello iwarp")))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.byte_len),
        (1, WcOpcode::Send, WcStatus::Success, 11)
    );
    let r = e.s.rcq.next().await;
    assert_eq!(
        (r.wr_id, r.opcode, r.status, r.byte_len),
        (7, WcOpcode::Recv, WcStatus::Success, 11)
    );
    assert_eq!(&rbuf.read(0, 11).unwrap()[..], b"hello iwarp");
}

#[tokio::test]
async fn send_recv_tcp() {
    within(send_recv(Kind::Tcp)).await
}
#[tokio::test]
async fn send_recv_mem() {
    within(send_recv(Kind::Mem)).await
}

async fn write_read_big(kind: Kind) {
    let (e, k) = up(kind).await;
    let n = (1 << 20) + 3;
    let data = pattern(n, 5);
    let src = e.c.pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    let dst =
        e.s.pd
            .register_len(
                n,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            vec![src.sge(0, n as u32)],
        ))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!(
        (c.opcode, c.status, c.byte_len),
        (WcOpcode::RdmaWrite, WcStatus::Success, n as u32)
    );
    // Read it back into a fresh buffer; the Read completing proves the Write was placed first.
    let back = e.c.pd.register_len(n, Access::LOCAL_WRITE).unwrap();
    e.c.qp
        .post_send(SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            vec![back.sge(0, n as u32)],
        ))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.byte_len),
        (2, WcOpcode::RdmaRead, WcStatus::Success, n as u32)
    );
    assert!(back.read(0, n).unwrap() == data);
    assert!(dst.read(0, n).unwrap() == data);
    let (cs, ss) = (k.c.stats(), k.s.stats());
    // Many FPDUs each way; over TCP without CRC the payload is sent from the region itself.
    assert!(cs.fpdus_tx >= 16 && ss.fpdus_tx >= 16, "{cs:?} {ss:?}");
    if kind == Kind::Tcp {
        assert_eq!(cs.zero_copy_tx_bytes, n as u64, "{cs:?}");
        assert_eq!(ss.zero_copy_tx_bytes, n as u64, "{ss:?}");
    }
}

#[tokio::test]
async fn write_read_1mib_plus_3_tcp() {
    within(write_read_big(Kind::Tcp)).await
}
#[tokio::test]
async fn write_read_1mib_plus_3_mem() {
    within(write_read_big(Kind::Mem)).await
}

/// A region over bytes the caller keeps (`register_bytes`, the source of an RPC-over-RDMA Read
/// chunk): the peer reads them as registered, and a write the region is later allowed to take
/// lands in a copy of its own, never in the caller's bytes.
async fn read_from_shared_bytes(kind: Kind) {
    let (e, k) = up(kind).await;
    let n = 300_001;
    let data = Bytes::from(pattern(n, 11));
    let src =
        e.s.pd
            .register_bytes(data.clone(), Access::REMOTE_READ)
            .unwrap();
    let back = e.c.pd.register_len(n, Access::LOCAL_WRITE).unwrap();
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: src.addr(),
                rkey: src.rkey(),
            },
            vec![back.sge(0, n as u32)],
        ))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.byte_len),
        (1, WcOpcode::RdmaRead, WcStatus::Success, n as u32)
    );
    assert!(back.read(0, n).unwrap() == data);
    if kind == Kind::Tcp {
        // The Read Responses left from the shared bytes themselves.
        assert_eq!(
            k.s.stats().zero_copy_tx_bytes,
            n as u64,
            "{:?}",
            k.s.stats()
        );
    }
    // A write the region is allowed to take (refusal without the rights: errors.rs) is
    // placed in the region's own copy.
    let (e, _k) = up(kind).await;
    let src =
        e.s.pd
            .register_bytes(data.clone(), Access::REMOTE_READ)
            .unwrap();
    let rkey = src.reregister(Some(
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    ));
    let ones =
        e.c.pd
            .register(vec![0xffu8; 64], Access::LOCAL_WRITE)
            .unwrap();
    e.c.qp
        .post_send(SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: src.addr() + 100,
                rkey,
            },
            vec![ones.sge(0, 64)],
        ))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success), "{c:?}");
    let placed = {
        // The Write completes at the requester; the responder may still be placing it.
        let t0 = std::time::Instant::now();
        loop {
            let got = src.read(100, 64).unwrap();
            if got[..] == [0xffu8; 64][..] || t0.elapsed() > std::time::Duration::from_secs(5) {
                break got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    assert_eq!(&placed[..], &[0xffu8; 64][..]);
    assert!(src.read(0, 100).unwrap() == data.slice(..100));
    assert!(
        data[..] == pattern(n, 11)[..],
        "the caller's bytes were written"
    );
    // A local write takes the same path.
    src.write(0, b"local").unwrap();
    assert_eq!(&src.read(0, 5).unwrap()[..], b"local");
    assert!(
        data[..] == pattern(n, 11)[..],
        "the caller's bytes were written"
    );
}

#[tokio::test]
async fn read_from_shared_bytes_tcp() {
    within(read_from_shared_bytes(Kind::Tcp)).await
}
#[tokio::test]
async fn read_from_shared_bytes_mem() {
    within(read_from_shared_bytes(Kind::Mem)).await
}

async fn zero_length_ops(kind: Kind) {
    let (e, _k) = up(kind).await;
    let rbuf = e.s.pd.register_len(16, Access::LOCAL_WRITE).unwrap();
    e.s.qp.post_recv(RecvWr::new(9, rbuf.sge(0, 16))).unwrap();
    // Zero-length Write with a bogus STag: siw skips the STag check.
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0xdead_beef,
            },
            vec![],
        ))
        .unwrap();
    // Zero-length Read gets a zero-length response.
    e.c.qp
        .post_send(SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0x1234_5678,
            },
            vec![],
        ))
        .unwrap();
    // Zero-length Send consumes a receive.
    e.c.qp
        .post_send(SendWr::new(3, SendOp::Send, vec![]))
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let c = e.c.scq.next().await;
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.byte_len, 0);
        got.push((c.wr_id, c.opcode));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            (1, WcOpcode::RdmaWrite),
            (2, WcOpcode::RdmaRead),
            (3, WcOpcode::Send)
        ]
    );
    let r = e.s.rcq.next().await;
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, WcStatus::Success, 0));
    assert_eq!(e.c.qp.state(), verbs::QpState::Rts);
}

#[tokio::test]
async fn zero_length_ops_tcp() {
    within(zero_length_ops(Kind::Tcp)).await
}
#[tokio::test]
async fn zero_length_ops_mem() {
    within(zero_length_ops(Kind::Mem)).await
}

async fn send_with_invalidate_and_se(kind: Kind) {
    let (e, _k) = up(kind).await;
    // The server advertises a region; the client invalidates it remotely with its Send.
    let target =
        e.s.pd
            .register_len(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let rbuf = e.s.pd.register_len(1 << 18, Access::LOCAL_WRITE).unwrap();
    for i in 0..2 {
        e.s.qp
            .post_recv(RecvWr::new(100 + i, rbuf.sge(i * (1 << 17), 1 << 17)))
            .unwrap();
    }
    // Multi-FPDU Send with Invalidate, gathered from two SGEs.
    let a = pattern(70_000, 1);
    let src = e.c.pd.register(a.clone(), Access::LOCAL_WRITE).unwrap();
    let wr = SendWr::new(
        1,
        SendOp::SendWithInvalidate(target.rkey()),
        vec![src.sge(0, 30_000), src.sge(30_000, 40_000)],
    );
    e.c.qp.post_send(wr).unwrap();
    let mut se = SendWr::send_bytes(2, Bytes::from_static(b"solicited"));
    se.solicited = true;
    e.c.qp.post_send(se).unwrap();
    let r = e.s.rcq.next().await;
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (100, WcStatus::Success, 70_000)
    );
    assert_eq!(r.invalidated_rkey, Some(target.rkey()));
    assert!(!target.is_valid());
    assert!(rbuf.read(0, 70_000).unwrap() == a);
    let r = e.s.rcq.next().await;
    assert_eq!(
        (r.wr_id, r.byte_len, r.solicited, r.invalidated_rkey),
        (101, 9, true, None)
    );
    assert_eq!(e.c.scq.next().await.wr_id, 1);
    assert_eq!(e.c.scq.next().await.wr_id, 2);
}

#[tokio::test]
async fn send_with_invalidate_and_se_tcp() {
    within(send_with_invalidate_and_se(Kind::Tcp)).await
}
#[tokio::test]
async fn send_with_invalidate_and_se_mem() {
    within(send_with_invalidate_and_se(Kind::Mem)).await
}

#[tokio::test]
async fn local_invalidate_and_reregister() {
    within(async {
        let (e, _k) = up(Kind::Mem).await;
        let mr =
            e.c.pd
                .register_len(8, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .unwrap();
        let old = mr.rkey();
        let mut wr = SendWr::new(5, SendOp::LocalInvalidate(old), vec![]);
        wr.signaled = true;
        e.c.qp.post_send(wr).unwrap();
        let c = e.c.scq.next().await;
        assert_eq!(
            (c.wr_id, c.opcode, c.status),
            (5, WcOpcode::LocalInvalidate, WcStatus::Success)
        );
        assert!(!mr.is_valid());
        let new = mr.reregister(None);
        assert_ne!(old, new);
        assert_eq!(old >> 8, new >> 8, "the index stays, the key rotates");
        assert!(mr.is_valid());
    })
    .await
}

async fn crc_and_many_fpdus(kind: Kind) {
    let e = ends(kind);
    let p = verbs::ConnParams {
        crc: true,
        ..Default::default()
    };
    let k = connect(&e, p, verbs::ConnParams::default()).await.unwrap();
    assert!(k.c.crc() && k.s.crc(), "responder echoes C");
    let n = 300_001;
    let data = pattern(n, 9);
    let src = e.c.pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    let dst =
        e.s.pd
            .register_len(
                n,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: dst.rkey(),
            },
            vec![src.sge(0, n as u32)],
        ))
        .unwrap();
    let back = e.c.pd.register_len(n, Access::LOCAL_WRITE).unwrap();
    e.c.qp
        .post_send(SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: dst.rkey(),
            },
            vec![back.sge(0, n as u32)],
        ))
        .unwrap();
    assert_eq!(e.c.scq.next().await.status, WcStatus::Success);
    let c = e.c.scq.next().await;
    assert_eq!((c.wr_id, c.status), (2, WcStatus::Success));
    assert!(back.read(0, n).unwrap() == data);
    // With CRC every byte is copied and checked before it is placed.
    assert_eq!(
        k.c.stats().zero_copy_tx_bytes + k.s.stats().direct_rx_bytes,
        0
    );
}

#[tokio::test]
async fn crc_on_tcp() {
    within(crc_and_many_fpdus(Kind::Tcp)).await
}
#[tokio::test]
async fn crc_on_mem() {
    within(crc_and_many_fpdus(Kind::Mem)).await
}

/// Both directions at once, Writes and Reads interleaved with Sends: no deadlock, data intact.
async fn bidirectional(kind: Kind) {
    let (e, _k) = up(kind).await;
    let n = 2 << 20;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (ca, sa) = (pattern(n, 1), pattern(n, 2));
    let c_src = e.c.pd.register(ca.clone(), all).unwrap();
    let s_src = e.s.pd.register(sa.clone(), all).unwrap();
    let c_dst = e.c.pd.register_len(n, all).unwrap();
    let s_dst = e.s.pd.register_len(n, all).unwrap();
    let c_rd = e.c.pd.register_len(n, all).unwrap();
    let s_rd = e.s.pd.register_len(n, all).unwrap();
    let half = (n / 2) as u32;
    for (side, src, dst, rd, peer_src) in [
        (&e.c, &c_src, &s_dst, &c_rd, &s_src),
        (&e.s, &s_src, &c_dst, &s_rd, &c_src),
    ] {
        side.qp
            .post_send_list([
                SendWr::new(
                    1,
                    SendOp::RdmaWrite {
                        remote_addr: 0,
                        rkey: dst.rkey(),
                    },
                    vec![src.sge(0, half)],
                ),
                SendWr::new(
                    2,
                    SendOp::RdmaRead {
                        remote_addr: 0,
                        rkey: peer_src.rkey(),
                    },
                    vec![rd.sge(0, n as u32)],
                ),
                SendWr::new(
                    3,
                    SendOp::RdmaWrite {
                        remote_addr: u64::from(half),
                        rkey: dst.rkey(),
                    },
                    vec![src.sge(u64::from(half), half)],
                ),
                SendWr::new(
                    4,
                    SendOp::RdmaRead {
                        remote_addr: 0,
                        rkey: dst.rkey(),
                    },
                    vec![],
                ),
            ])
            .unwrap();
    }
    for cq in [&e.c.scq, &e.s.scq] {
        let mut ids = Vec::new();
        for _ in 0..4 {
            let c = cq.next().await;
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            ids.push(c.wr_id);
        }
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3, 4]);
    }
    assert!(s_dst.read(0, n).unwrap() == ca && c_dst.read(0, n).unwrap() == sa);
    assert!(c_rd.read(0, n).unwrap() == sa && s_rd.read(0, n).unwrap() == ca);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_tcp() {
    within(bidirectional(Kind::Tcp)).await
}
#[tokio::test]
async fn bidirectional_mem() {
    within(bidirectional(Kind::Mem)).await
}

/// Small reads force the direct-placement path (payload read from the socket into the region)
/// for Writes and Read Responses.
#[tokio::test]
async fn direct_placement_small_reads() {
    within(direct_placement(4096, 50)).await
}

/// With the default large reads (256 KiB), the segments of a 1 MiB Write or Read Response
/// after the first read's worth are placed directly too: each direct read also takes the next
/// segment's header. (Before that, a stream that was all in the socket when the reader came
/// placed nothing directly: 32 KiB FPDUs fill 256 KiB reads exactly.)
#[tokio::test]
async fn direct_placement_chains_through_a_stream() {
    within(direct_placement(
        verbs::SoftIwarpConfig::default().rx_chunk,
        60,
    ))
    .await
}

/// A 1 MiB + 3 RDMA Write then RDMA Read over TCP with `rx_chunk`-byte reads; more than
/// `min_pct` % of the payload bytes must have been placed straight from the socket.
async fn direct_placement(rx_chunk: usize, min_pct: u64) {
    {
        let cfg = verbs::SoftIwarpConfig {
            rx_chunk,
            ..Default::default()
        };
        let dev = || verbs::Device::open(verbs::Provider::SoftIwarp(cfg.clone()));
        let (dc, ds) = (dev(), dev());
        let (pc, ps) = (dc.alloc_pd(), ds.alloc_pd());
        let (c_cq, s_cq) = (dc.create_cq(), ds.create_cq());
        let qc = dc.create_qp(&pc, &c_cq, &c_cq);
        let qs = ds.create_qp(&ps, &s_cq, &s_cq);
        let mut l = ds.listen(any_addr()).await.unwrap();
        let addr = l.local_addr();
        let qs2 = qs.clone();
        let srv = tokio::spawn(async move {
            l.accept()
                .await
                .unwrap()
                .accept(&qs2, Default::default())
                .await
                .unwrap()
        });
        let kc = dc.connect(&qc, addr, Default::default()).await.unwrap();
        let ks = srv.await.unwrap();
        let n = (1 << 20) + 3;
        let data = pattern(n, 7);
        let src = pc.register(data.clone(), Access::LOCAL_WRITE).unwrap();
        let dst = ps
            .register_len(
                n,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let back = pc.register_len(n, Access::LOCAL_WRITE).unwrap();
        qc.post_send_list([
            SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, n as u32)],
            ),
            SendWr::new(
                2,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: dst.rkey(),
                },
                vec![back.sge(0, n as u32)],
            ),
        ])
        .unwrap();
        assert_eq!(c_cq.next().await.status, WcStatus::Success);
        let c = c_cq.next().await;
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (2, WcStatus::Success, n as u32)
        );
        assert!(dst.read(0, n).unwrap() == data && back.read(0, n).unwrap() == data);
        let (cs, ss) = (kc.stats(), ks.stats());
        let min = n as u64 * min_pct / 100;
        assert!(ss.direct_rx_bytes > min, "{ss:?}");
        assert!(cs.direct_rx_bytes > min, "{cs:?}");
    }
}

/// Request/response traffic over TCP leaves from the posting context (like siw's
/// `siw_post_send`), while a burst of posts with nothing arriving in between goes through the
/// writer task; either way every message arrives once and in order.
#[tokio::test]
async fn ping_pong_sends_directly_and_bursts_through_the_writer() {
    within(async {
        let (e, k) = up(Kind::Tcp).await;
        const ROUNDS: u64 = 200;
        const BURST: u64 = 300;
        let sbuf = e.s.pd.register_len(64 * 512, Access::LOCAL_WRITE).unwrap();
        let cbuf = e.c.pd.register_len(64, Access::LOCAL_WRITE).unwrap();
        for i in 0..512u64 {
            e.s.qp
                .post_recv(RecvWr::new(i, sbuf.sge(64 * i, 64)))
                .unwrap();
        }
        // Ping-pong: the client sends, the server answers each message it receives.
        for i in 0..ROUNDS {
            e.c.qp
                .post_recv(RecvWr::new(1000 + i, cbuf.sge(0, 64)))
                .unwrap();
            let msg = format!("ping {i}");
            e.c.qp
                .post_send(SendWr::send_bytes(i, Bytes::from(msg.clone())))
                .unwrap();
            let r = e.s.rcq.next().await;
            assert_eq!((r.wr_id, r.status), (i, WcStatus::Success));
            assert_eq!(
                sbuf.read(64 * i as usize, r.byte_len as usize).unwrap(),
                msg.as_bytes()
            );
            e.s.qp
                .post_send(SendWr::send_bytes(i, Bytes::from(format!("pong {i}"))))
                .unwrap();
            let r = e.c.rcq.next().await;
            assert_eq!((r.wr_id, r.status), (1000 + i, WcStatus::Success));
            assert_eq!(
                cbuf.read(0, r.byte_len as usize).unwrap(),
                format!("pong {i}").as_bytes()
            );
        }
        let (cs, ss) = (k.c.stats(), k.s.stats());
        // Every pong follows an arrival; every ping after the first follows the pong's arrival.
        assert!(ss.direct_tx_fpdus >= ROUNDS - 1, "{ss:?}");
        assert!(cs.direct_tx_fpdus >= ROUNDS - 1, "{cs:?}");
        // A burst with nothing arriving: at most the first post goes directly.
        let before = k.c.stats();
        for i in 0..BURST {
            e.c.qp
                .post_send(SendWr::send_bytes(
                    ROUNDS + i,
                    Bytes::from(format!("burst {i}")),
                ))
                .unwrap();
        }
        for i in 0..BURST {
            let r = e.s.rcq.next().await;
            assert_eq!((r.wr_id, r.status), (ROUNDS + i, WcStatus::Success));
            assert_eq!(
                sbuf.read(64 * (ROUNDS + i) as usize, r.byte_len as usize)
                    .unwrap(),
                format!("burst {i}").as_bytes()
            );
        }
        let after = k.c.stats();
        assert_eq!(after.fpdus_tx - before.fpdus_tx, BURST, "{after:?}");
        assert!(
            after.direct_tx_fpdus - before.direct_tx_fpdus <= 1,
            "{before:?} {after:?}"
        );
    })
    .await
}

/// The `oxrdma perf write` pattern: 64 KiB RDMA Writes kept 128 deep, with a zero-length RDMA
/// Read after every 40 as a placement fence. Every WR completes successfully, the Writes in order.
/// 128 × 64 KiB posted at once is more than the transmit path takes in one go (~2 MiB): the
/// rest must follow without another post (a stall here once ended in a flush).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_writes_with_zero_length_read_fences() {
    // Several connections: whether a stall shows depends on how the two workers interleave.
    for _ in 0..8 {
        within(deep_writes_once()).await
    }
}

async fn deep_writes_once() {
    {
        let (e, _k) = up(Kind::Tcp).await;
        const SIZE: usize = 65536;
        const ITERS: u64 = 400;
        let src =
            e.c.pd
                .register(pattern(SIZE, 3), Access::LOCAL_WRITE)
                .unwrap();
        let dst =
            e.s.pd
                .register_len(
                    SIZE,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
                )
                .unwrap();
        let write = |id: u64| {
            SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr(),
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, SIZE as u32)],
            )
        };
        let fence = |id: u64| {
            SendWr::new(
                id,
                SendOp::RdmaRead {
                    remote_addr: dst.addr(),
                    rkey: dst.rkey(),
                },
                vec![],
            )
        };
        let (mut posted, mut done, mut fences) = (0u64, 0u64, 0u64);
        let mut next_write = 0u64;
        while done < ITERS || fences > 0 {
            while posted < ITERS && posted - done < 128 {
                e.c.qp.post_send(write(posted)).unwrap();
                posted += 1;
                if posted % 40 == 0 {
                    e.c.qp.post_send(fence(1 << 63 | posted)).unwrap();
                    fences += 1;
                }
            }
            let c = e.c.scq.next().await;
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.wr_id >= 1 << 63 {
                assert_eq!(c.opcode, WcOpcode::RdmaRead);
                // The fence completes once its response came back: after every Write posted
                // before it completed (later Writes may complete first, as with siw).
                assert!(c.wr_id & !(1 << 63) <= next_write, "{c:?}");
                fences -= 1;
            } else {
                assert_eq!(c.wr_id, next_write, "{c:?}");
                next_write += 1;
                done += 1;
            }
        }
        assert!(dst.read(0, SIZE).unwrap() == pattern(SIZE, 3));
    }
}
