//! Connection manager: private data, reject, IRD/ORD, RTR in both roles, MPA revisions.

use crate::common::*;
use bytes::Bytes;
use verbs::{Access, CmEvent, ConnParams, RecvWr, SendOp, SendWr, VerbsError, WcStatus};

#[tokio::test]
async fn private_data_both_ways_and_ird_ord() {
    for kind in KINDS {
        within(async {
            let e = ends(kind);
            let mut l = e.s.dev.listen(any_addr()).await.unwrap();
            let addr = l.local_addr();
            let sqp = e.s.qp.clone();
            let server = tokio::spawn(async move {
                let req = l.accept().await.unwrap();
                assert_eq!(&req.private_data()[..], &[7u8; 32][..]);
                assert_eq!((req.ird(), req.ord()), (Some(4), Some(100)));
                assert_eq!(req.mpa_revision(), 2);
                let p = ConnParams {
                    private_data: Bytes::from_static(&[9; 8]),
                    ird: 8,
                    ord: 128,
                    ..Default::default()
                };
                req.accept(&sqp, p).await.unwrap()
            });
            let p = ConnParams {
                private_data: Bytes::from_static(&[7; 32]),
                ird: 4,
                ord: 100,
                ..Default::default()
            };
            let c = e.c.dev.connect(&e.c.qp, addr, p).await.unwrap();
            let s = server.await.unwrap();
            assert_eq!(&c.peer_private_data()[..], &[9u8; 8][..]);
            assert_eq!(&s.peer_private_data()[..], &[7u8; 32][..]);
            // RFC 6581: ORD never exceeds the peer's IRD.
            assert_eq!((c.ird(), c.ord()), (4, 8));
            assert_eq!((s.ird(), s.ord()), (8, 4));
            assert_eq!(c.peer_ird_ord(), Some((8, 4)));
        })
        .await;
    }
}

#[tokio::test]
async fn reject_with_private_data() {
    for kind in KINDS {
        within(async {
            let e = ends(kind);
            let mut l = e.s.dev.listen(any_addr()).await.unwrap();
            let addr = l.local_addr();
            let server = tokio::spawn(async move {
                let req = l.accept().await.unwrap();
                req.reject(b"go away, busy").await.unwrap();
            });
            let r = e.c.dev.connect(&e.c.qp, addr, ConnParams::default()).await;
            assert_eq!(
                r.unwrap_err(),
                VerbsError::Rejected(Bytes::from_static(b"go away, busy"))
            );
            server.await.unwrap();
        })
        .await;
    }
}

#[tokio::test]
async fn markers_are_refused() {
    within(async {
        let e = ends(Kind::Tcp);
        let _l = e.s.dev.listen(any_addr()).await.unwrap();
        let addr = _l.local_addr();
        let p = ConnParams {
            markers: true,
            ..Default::default()
        };
        let r = e.c.dev.connect(&e.c.qp, addr, p).await;
        assert!(matches!(r, Err(VerbsError::Rejected(_))), "{r:?}");
    })
    .await;
}

#[tokio::test]
async fn limits_are_enforced() {
    within(async {
        let e = ends(Kind::Mem);
        let p = ConnParams {
            private_data: Bytes::from(vec![0; 257]),
            ..Default::default()
        };
        let addr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            e.c.dev.connect(&e.c.qp, addr, p).await,
            Err(VerbsError::InvalidArgument(_))
        ));
        let p = ConnParams {
            ird: 129,
            ..Default::default()
        };
        assert!(matches!(
            e.c.dev.connect(&e.c.qp, addr, p).await,
            Err(VerbsError::InvalidArgument(_))
        ));
    })
    .await;
}

/// Peer-to-peer setup with each RTR kind; the connection then carries a Send and a Read.
#[tokio::test]
async fn rtr_handshake_each_kind() {
    for kind in KINDS {
        for rtr in 0..3 {
            within(async {
                let e = ends(kind);
                let rb = e.s.pd.register_len(64, Access::LOCAL_WRITE).unwrap();
                e.s.qp.post_recv(RecvWr::new(1, rb.sge(0, 64))).unwrap();
                let mut kinds = [false; 3];
                kinds[rtr] = true;
                let pc = ConnParams {
                    peer_to_peer: true,
                    rtr_kinds: kinds,
                    ..Default::default()
                };
                let k = connect(&e, pc, ConnParams::default()).await.unwrap();
                e.c.qp
                    .post_send(SendWr::send_bytes(2, Bytes::from_static(b"after rtr")))
                    .unwrap();
                let r = e.s.rcq.next().await;
                assert_eq!(
                    (r.wr_id, r.status, r.byte_len),
                    (1, WcStatus::Success, 9),
                    "rtr kind {rtr}"
                );
                let src =
                    e.s.pd
                        .register(vec![3u8; 16], Access::LOCAL_WRITE | Access::REMOTE_READ)
                        .unwrap();
                let sink = e.c.pd.register_len(16, Access::LOCAL_WRITE).unwrap();
                e.c.qp
                    .post_send(SendWr::new(
                        3,
                        SendOp::RdmaRead {
                            remote_addr: 0,
                            rkey: src.rkey(),
                        },
                        vec![sink.sge(0, 16)],
                    ))
                    .unwrap();
                let mut ok = 0;
                while ok < 2 {
                    let c = e.c.scq.next().await;
                    assert_eq!(c.status, WcStatus::Success);
                    ok += 1;
                }
                assert_eq!(&sink.read(0, 16).unwrap()[..], &[3u8; 16]);
                k.c.disconnect().await;
                k.s.closed().await;
            })
            .await;
        }
    }
}

#[tokio::test]
async fn mpa_revision_1_peer() {
    within(async {
        let e = ends(Kind::Tcp);
        let mut l = e.s.dev.listen(any_addr()).await.unwrap();
        let addr = l.local_addr();
        let sqp = e.s.qp.clone();
        let server = tokio::spawn(async move {
            let req = l.accept().await.unwrap();
            assert_eq!((req.mpa_revision(), req.ird()), (1, None));
            req.accept(&sqp, ConnParams::default()).await.unwrap()
        });
        let p = ConnParams {
            mpa_revision: 1,
            private_data: Bytes::from_static(b"v1"),
            ..Default::default()
        };
        let c = e.c.dev.connect(&e.c.qp, addr, p).await.unwrap();
        let s = server.await.unwrap();
        assert_eq!(&s.peer_private_data()[..], b"v1");
        assert_eq!(c.peer_ird_ord(), None);
    })
    .await;
}

/// ORD 1: several Reads are queued behind each other and all complete in order.
#[tokio::test]
async fn reads_beyond_ord_wait() {
    for kind in KINDS {
        within(async {
            let e = ends(kind);
            let pc = ConnParams {
                ord: 1,
                ..Default::default()
            };
            let k = connect(&e, pc, ConnParams::default()).await.unwrap();
            assert_eq!(k.c.ord(), 1);
            let src =
                e.s.pd
                    .register(
                        (0..=255u8).collect::<Vec<_>>(),
                        Access::LOCAL_WRITE | Access::REMOTE_READ,
                    )
                    .unwrap();
            let sink = e.c.pd.register_len(256, Access::LOCAL_WRITE).unwrap();
            for i in 0..8u64 {
                e.c.qp
                    .post_send(SendWr::new(
                        i,
                        SendOp::RdmaRead {
                            remote_addr: i * 32,
                            rkey: src.rkey(),
                        },
                        vec![sink.sge(i * 32, 32)],
                    ))
                    .unwrap();
            }
            for i in 0..8u64 {
                let c = e.c.scq.next().await;
                assert_eq!((c.wr_id, c.status), (i, WcStatus::Success));
            }
            assert_eq!(
                &sink.read(0, 256).unwrap()[..],
                &(0..=255u8).collect::<Vec<_>>()[..]
            );
        })
        .await;
    }
}

#[tokio::test]
async fn disconnect_flushes_and_reports() {
    for kind in KINDS {
        within(async {
            let (e, k) = up(kind).await;
            let rb = e.s.pd.register_len(64, Access::LOCAL_WRITE).unwrap();
            for i in 0..3 {
                e.s.qp.post_recv(RecvWr::new(i, rb.sge(0, 64))).unwrap();
            }
            k.c.disconnect().await;
            k.s.closed().await;
            for i in 0..3 {
                let r = e.s.rcq.next().await;
                assert_eq!((r.wr_id, r.status), (i, WcStatus::WrFlushError));
            }
            let mut evs = Vec::new();
            while let Some(ev) = k.s.next_event().await {
                evs.push(ev);
            }
            assert_eq!(evs.first(), Some(&CmEvent::Established));
            assert_eq!(evs.last(), Some(&CmEvent::Disconnected));
        })
        .await;
    }
}

/// siw: a responder waits 5 s for the MPA Request, then drops the connection.
#[tokio::test]
async fn responder_gives_up_without_request() {
    use tokio::io::AsyncReadExt;
    within(async {
        let e = ends(Kind::Tcp);
        let mut l = e.s.dev.listen(any_addr()).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(l.local_addr())
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        let mut rest = Vec::new();
        // The server closes the stream without ever surfacing a request.
        s.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        assert!(
            t0.elapsed() >= std::time::Duration::from_secs(4),
            "closed before the 5 s timer"
        );
        let none = tokio::time::timeout(std::time::Duration::from_millis(50), l.accept()).await;
        assert!(none.is_err(), "no ConnectRequest for a silent peer");
    })
    .await;
}
