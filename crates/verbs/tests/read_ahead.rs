//! Reading ahead inside an RDMA Read's sink: a hand-written MPA peer answers a Read with
//! segments cut as it likes (not the lengths the reader guesses) and with a Send between two of
//! them. Every byte must land where its segment says, the Send must arrive whole, and the
//! reader's guesses that held must have been placed straight from the socket.

use crate::common::*;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use verbs::wire::ddp::{BufferModel, DdpHeader, Opcode, QN_READ_REQ, QN_SEND, ReadRequest};
use verbs::wire::mpa;
use verbs::{Access, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

/// What the peer puts in its answer to the Read, in order.
#[derive(Clone, Copy)]
enum Piece {
    /// A Read Response segment of this many payload bytes.
    Seg(usize),
    /// A Send of this many bytes.
    Send(usize),
    /// Write what came before, and wait until the listener has received its Send.
    Pause,
}

/// Connects a hand-written initiator (no CRC, no markers) to a soft-iWARP listener configured
/// with `cfg`; returns the listener's side, its connection and the peer's socket.
async fn raw_peer(cfg: verbs::SoftIwarpConfig) -> (Side, verbs::Connection, TcpStream, BytesMut) {
    let s = Side::new(verbs::Device::open(verbs::Provider::SoftIwarp(cfg)));
    let mut l = s.dev.listen(any_addr()).await.unwrap();
    let addr = l.local_addr();
    let qp = s.qp.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await.unwrap();
        req.accept(&qp, verbs::ConnParams::default()).await.unwrap()
    });
    let (t, buf, rep) = raw_mpa_initiator(addr, false).await;
    assert!(!rep.crc && !rep.reject);
    let conn = server.await.unwrap();
    (s, conn, t, buf)
}

/// The listener RDMA-Reads `len` bytes from the peer, which answers with `pieces` in one write;
/// checks what landed and returns the listener's connection statistics.
async fn read_answered_with(
    cfg: verbs::SoftIwarpConfig,
    len: usize,
    pieces: &[Piece],
) -> verbs::ConnStats {
    let (s, conn, mut t, mut buf) = raw_peer(cfg).await;
    let sink = s.pd.register_len(len + 8192, Access::LOCAL_WRITE).unwrap();
    let rbuf = s.pd.register_len(1 << 17, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(RecvWr::new(9, rbuf.sge(0, 1 << 17)))
        .unwrap();
    s.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: 0x1000,
            rkey: 0x4242,
        },
        vec![sink.sge(4096, len as u32)],
    ))
    .unwrap();
    // The peer takes the Read Request.
    let mut dec = mpa::FpduDecoder::new(false);
    let rr = loop {
        if let Some(u) = dec.decode(&mut buf).unwrap() {
            let (h, n) = DdpHeader::decode(&u).unwrap();
            match h.model {
                BufferModel::Untagged { qn, .. } if qn == QN_READ_REQ => {
                    break ReadRequest::decode(&u[n..]).unwrap();
                }
                _ => continue,
            }
        }
        assert!(t.read_buf(&mut buf).await.unwrap() > 0, "listener closed");
    };
    assert_eq!(
        (rr.src_stag, rr.src_to, rr.size),
        (0x4242, 0x1000, len as u32)
    );
    // Its answer, all in one write so that the reader finds it in the socket.
    let data = pattern(len, 13);
    let mut out = BytesMut::new();
    let (mut at, mut msn) = (0usize, 1u32);
    let mut sent: Option<Vec<u8>> = None;
    for &p in pieces {
        let mut u = BytesMut::new();
        match p {
            Piece::Seg(n) => {
                DdpHeader {
                    last: at + n == len,
                    opcode: Opcode::ReadResponse,
                    model: BufferModel::Tagged {
                        stag: rr.sink_stag,
                        to: rr.sink_to + at as u64,
                    },
                }
                .encode(&mut u);
                u.extend_from_slice(&data[at..at + n]);
                at += n;
            }
            Piece::Pause => {
                t.write_all(&out).await.unwrap();
                out.clear();
                let m = sent.take().expect("a Send before a pause");
                check_send(&s, &rbuf, &m).await;
                s.qp.post_recv(RecvWr::new(9, rbuf.sge(0, 1 << 17)))
                    .unwrap();
                continue;
            }
            Piece::Send(n) => {
                DdpHeader {
                    last: true,
                    opcode: Opcode::Send,
                    model: BufferModel::Untagged {
                        inv_stag: 0,
                        qn: QN_SEND,
                        msn,
                        mo: 0,
                    },
                }
                .encode(&mut u);
                let m: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
                u.extend_from_slice(&m);
                sent = Some(m);
                msn += 1;
            }
        }
        mpa::encode_fpdu(&u, false, &mut out);
    }
    assert_eq!(at, len, "the pieces cover the Read");
    t.write_all(&out).await.unwrap();
    let c = s.scq.next().await;
    assert_eq!(
        (c.wr_id, c.opcode, c.status, c.byte_len),
        (1, WcOpcode::RdmaRead, WcStatus::Success, len as u32)
    );
    assert!(
        sink.read(4096, len).unwrap() == data,
        "the Read's bytes as sent"
    );
    if let Some(m) = sent {
        check_send(&s, &rbuf, &m).await;
    }
    let st = conn.stats();
    drop(t);
    st
}

async fn check_send(s: &Side, rbuf: &verbs::MemoryRegion, m: &[u8]) {
    let r = s.rcq.next().await;
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (9, WcStatus::Success, m.len() as u32)
    );
    assert!(rbuf.read(0, m.len()).unwrap() == m, "the Send as sent");
}

/// Segments of the lengths the reader guesses: the whole Read after the first read is placed
/// straight from the socket.
#[tokio::test]
async fn a_read_cut_as_guessed_is_placed_from_the_socket() {
    within(async {
        let cfg = verbs::SoftIwarpConfig {
            rx_chunk: 4096,
            ..Default::default()
        };
        let len = 16 * 60_000 + 1234;
        let mut pieces = vec![Piece::Seg(60_000); 16];
        pieces.push(Piece::Seg(1234));
        let st = read_answered_with(cfg, len, &pieces).await;
        assert!(st.direct_rx_bytes as usize > len * 9 / 10, "{st:?}");
        // Loopback took the whole answer in one write: most of it was in the socket when the
        // first direct read came, and came with it.
        assert!(st.read_ahead_rx_bytes as usize > len / 2, "{st:?}");
    })
    .await
}

/// Segments of varying lengths, and a Send in the middle: the guesses that fail are taken the
/// normal way, and nothing is lost or misplaced.
#[tokio::test]
async fn a_read_cut_otherwise_and_interrupted_by_a_send_lands_whole() {
    for rx_chunk in [4096, verbs::SoftIwarpConfig::default().rx_chunk] {
        within(async {
            let cfg = verbs::SoftIwarpConfig {
                rx_chunk,
                ..Default::default()
            };
            use Piece::*;
            let pieces = [
                Seg(50_000),
                Seg(50_000),
                Seg(20_001),
                Seg(65_000),
                Seg(65_000),
                Send(3000),
                Seg(65_000),
                Seg(9_000),
                Seg(9_000),
                Seg(65_001),
                Seg(30_000),
                Seg(40_000),
                Seg(65_000),
                Seg(65_000),
                Seg(65_000),
                Seg(1),
            ];
            let len = pieces
                .iter()
                .map(|p| match p {
                    Seg(n) => *n,
                    Send(_) | Pause => 0,
                })
                .sum();
            let st = read_answered_with(cfg, len, &pieces).await;
            assert!(st.direct_rx_bytes > 0, "{st:?}");
        })
        .await
    }
}

/// A Read's response that comes when the reader has nothing else to do: the reader, knowing
/// the Read waits for it, reads its first header alone, and every payload byte of the Read is
/// placed straight from the socket (with the default 256 KiB reads, the first of them would
/// otherwise go through the reader's buffer).
#[tokio::test]
async fn a_response_to_an_idle_reader_is_placed_whole_from_the_socket() {
    within(async {
        let len = 16 * 65_000;
        let mut pieces = vec![Piece::Send(100), Piece::Pause];
        pieces.extend(std::iter::repeat_n(Piece::Seg(65_000), 16));
        let st = read_answered_with(Default::default(), len, &pieces).await;
        assert_eq!(st.direct_rx_bytes as usize, len, "{st:?}");
        assert!(st.read_ahead_rx_bytes as usize > len / 2, "{st:?}");
    })
    .await
}
