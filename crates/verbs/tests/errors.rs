//! Remote access violations and protocol errors: Terminate, no placement, flush, teardown.

use crate::common::*;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use verbs::wire::ddp::{BufferModel, DdpHeader, Opcode, Terminate};
use verbs::wire::mpa;
use verbs::{Access, CmEvent, Connection, QpState, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

async fn terminate_of(c: &Connection, sent: bool) -> Terminate {
    loop {
        match c.next_event().await {
            Some(CmEvent::TerminateSent(t)) if sent => return t,
            Some(CmEvent::TerminateReceived(t)) if !sent => return t,
            Some(_) => continue,
            None => panic!("no terminate event"),
        }
    }
}

async fn wait_disconnected(c: &Connection) {
    c.closed().await;
}

/// Drive a remote-write violation and check the whole teardown.
async fn write_violation(
    kind: Kind,
    mk: impl Fn(&Ends) -> (verbs::MemoryRegion, u64, usize),
    want: (u8, u8, u8),
) {
    let (e, k) = up(kind).await;
    let (dst, to, len) = mk(&e);
    // A receive posted on the target gets flushed.
    let rb = e.s.pd.register_len(64, Access::LOCAL_WRITE).unwrap();
    e.s.qp.post_recv(RecvWr::new(77, rb.sge(0, 64))).unwrap();
    let src =
        e.c.pd
            .register(vec![0xAB; len], Access::LOCAL_WRITE)
            .unwrap();
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: to,
                rkey: dst.rkey(),
            },
            vec![src.sge(0, len as u32)],
        ))
        .unwrap();
    let ts = terminate_of(&k.s, true).await;
    let tr = terminate_of(&k.c, false).await;
    assert_eq!((ts.layer, ts.etype, ts.code), want, "sent {ts:?}");
    assert_eq!(ts, tr, "the peer decodes what was sent");
    let dh = tr.ddp_hdr.as_deref().expect("failing DDP header carried");
    let (h, _) = DdpHeader::decode(dh).unwrap();
    assert_eq!(h.opcode, Opcode::Write);
    assert!(matches!(h.model, BufferModel::Tagged { .. }));
    // No data placed.
    dst.with_bytes(|b| assert!(b.iter().all(|x| *x == 0), "data was placed"));
    // The target's receive is flushed; the QPs are in error; the connection ends on both sides.
    let r = e.s.rcq.next().await;
    assert_eq!((r.wr_id, r.status), (77, WcStatus::WrFlushError));
    // The Write itself completed when sent (iWARP); a later WR is flushed.
    let c = e.c.scq.next().await;
    assert_eq!((c.wr_id, c.opcode), (1, WcOpcode::RdmaWrite));
    wait_disconnected(&k.c).await;
    wait_disconnected(&k.s).await;
    e.c.qp
        .post_send(SendWr::send_bytes(2, Bytes::from_static(b"x")))
        .unwrap();
    let c = e.c.scq.next().await;
    assert_eq!((c.wr_id, c.status), (2, WcStatus::WrFlushError));
    assert_eq!(e.c.qp.state(), QpState::Error);
    assert_eq!(e.s.qp.state(), QpState::Error);
}

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

#[tokio::test]
async fn write_out_of_range_to() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| (e.s.pd.register_len(100, RW).unwrap(), 50, 51),
            (1, 1, 1),
        ))
        .await;
    }
}

/// Large enough for the driver's direct-placement path to be consulted first.
#[tokio::test]
async fn large_write_out_of_range_to() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| (e.s.pd.register_len(50_000, RW).unwrap(), 40_000, 100_000),
            (1, 1, 1),
        ))
        .await;
    }
}

#[tokio::test]
async fn write_wrong_pd() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| (e.s.dev.alloc_pd().register_len(100, RW).unwrap(), 0, 10),
            (1, 1, 2),
        ))
        .await;
    }
}

#[tokio::test]
async fn write_invalidated_stag() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| {
                let m = e.s.pd.register_len(100, RW).unwrap();
                m.invalidate();
                (m, 0, 10)
            },
            (1, 1, 0),
        ))
        .await;
    }
}

#[tokio::test]
async fn write_to_read_only_memory() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| {
                (
                    e.s.pd
                        .register_len(100, Access::LOCAL_WRITE | Access::REMOTE_READ)
                        .unwrap(),
                    0,
                    10,
                )
            },
            (0, 1, 2),
        ))
        .await;
    }
}

#[tokio::test]
async fn write_to_shared_read_only_bytes() {
    for kind in KINDS {
        within(write_violation(
            kind,
            |e| {
                (
                    e.s.pd
                        .register_bytes(Bytes::from(vec![0u8; 100]), Access::REMOTE_READ)
                        .unwrap(),
                    0,
                    10,
                )
            },
            (0, 1, 2),
        ))
        .await;
    }
}

async fn read_violation(kind: Kind, dereg: bool, want: (u8, u8, u8)) {
    let (e, k) = up(kind).await;
    let src =
        e.s.pd
            .register_len(100, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let rkey = src.rkey();
    let len = if dereg {
        drop(src);
        10
    } else {
        std::mem::forget(src);
        101
    };
    let sink = e.c.pd.register_len(200, Access::LOCAL_WRITE).unwrap();
    e.c.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey,
            },
            vec![sink.sge(0, len)],
        ))
        .unwrap();
    let ts = terminate_of(&k.s, true).await;
    assert_eq!((ts.layer, ts.etype, ts.code), want);
    assert!(ts.rdma_hdr.is_some(), "Read Request header carried");
    let c = e.c.scq.next().await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (1, WcOpcode::RdmaRead, WcStatus::RemoteAccessError)
    );
    sink.with_bytes(|b| assert!(b.iter().all(|x| *x == 0)));
    wait_disconnected(&k.c).await;
    wait_disconnected(&k.s).await;
}

#[tokio::test]
async fn read_out_of_range() {
    for kind in KINDS {
        within(read_violation(kind, false, (0, 1, 1))).await;
    }
}

#[tokio::test]
async fn read_deregistered_stag() {
    for kind in KINDS {
        within(read_violation(kind, true, (0, 1, 0))).await;
    }
}

#[tokio::test]
async fn send_without_receive_buffer() {
    for kind in KINDS {
        within(async {
            let (e, k) = up(kind).await;
            e.c.qp
                .post_send(SendWr::send_bytes(1, Bytes::from_static(b"nobody listens")))
                .unwrap();
            let t = terminate_of(&k.s, true).await;
            // RFC 5041 §7.2: DDP, untagged buffer error, invalid MSN - no buffer available.
            assert_eq!((t.layer, t.etype, t.code), (1, 2, 2));
            assert_eq!(terminate_of(&k.c, false).await, t);
            wait_disconnected(&k.s).await;
        })
        .await;
    }
}

#[tokio::test]
async fn receive_buffer_too_small() {
    within(async {
        let (e, k) = up(Kind::Mem).await;
        let rb = e.s.pd.register_len(4, Access::LOCAL_WRITE).unwrap();
        e.s.qp.post_recv(RecvWr::new(3, rb.sge(0, 4))).unwrap();
        e.c.qp
            .post_send(SendWr::send_bytes(1, Bytes::from_static(b"too long")))
            .unwrap();
        let t = terminate_of(&k.s, true).await;
        assert_eq!((t.layer, t.etype, t.code), (1, 2, 5));
        let r = e.s.rcq.next().await;
        assert_eq!((r.wr_id, r.status), (3, WcStatus::LocalLengthError));
        rb.with_bytes(|b| assert_eq!(b, &[0, 0, 0, 0]));
    })
    .await;
}

#[tokio::test]
async fn local_protection_error_on_bad_lkey() {
    within(async {
        let (e, _k) = up(Kind::Mem).await;
        e.c.qp
            .post_send(SendWr::new(
                1,
                SendOp::Send,
                vec![verbs::Sge {
                    lkey: 0x1234_5600,
                    addr: 0,
                    length: 4,
                }],
            ))
            .unwrap();
        let c = e.c.scq.next().await;
        assert_eq!((c.wr_id, c.status), (1, WcStatus::LocalProtectionError));
        assert_eq!(e.c.qp.state(), QpState::Error);
    })
    .await;
}

/// A hand-written MPA peer sends an FPDU with a bad CRC: the QP terminates at the LLP layer.
#[tokio::test]
async fn crc_error_terminates() {
    within(async {
        let e = ends(Kind::Tcp);
        let mut l = e.s.dev.listen(any_addr()).await.unwrap();
        let addr = l.local_addr();
        let sqp = e.s.qp.clone();
        let server = tokio::spawn(async move {
            let req = l.accept().await.unwrap();
            assert!(req.crc());
            req.accept(&sqp, verbs::ConnParams::default())
                .await
                .unwrap()
        });
        let (mut s, _, rep) = raw_mpa_initiator(addr, true).await;
        assert!(rep.crc && !rep.reject);
        let conn = server.await.unwrap();
        let mut f = BytesMut::new();
        let mut u = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::Send,
            model: BufferModel::Untagged {
                inv_stag: 0,
                qn: 0,
                msn: 1,
                mo: 0,
            },
        }
        .encode(&mut u);
        mpa::encode_fpdu(&u, true, &mut f);
        let n = f.len();
        f[n - 1] ^= 0xff;
        s.write_all(&f).await.unwrap();
        let t = terminate_of(&conn, true).await;
        assert_eq!((t.layer, t.etype, t.code), (2, 0, 2));
        // The Terminate arrives on the raw socket, then FIN.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        let mut rb = BytesMut::from(&rest[..]);
        let mut d = mpa::FpduDecoder::new(true);
        let ulpdu = d.decode(&mut rb).unwrap().expect("terminate FPDU");
        let (h, hl) = DdpHeader::decode(&ulpdu).unwrap();
        assert_eq!(h.opcode, Opcode::Terminate);
        assert_eq!(Terminate::decode(&ulpdu[hl..]).unwrap(), t);
    })
    .await;
}
