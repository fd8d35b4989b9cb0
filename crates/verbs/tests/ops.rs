//! Every opcode over both providers.

mod common;

use bytes::Bytes;
use common::*;
use verbs::{Access, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn send_recv(kind: Kind) {
    let (e, _k) = up(kind).await;
    let rbuf = e.s.pd.register_len(4096, Access::LOCAL_WRITE).unwrap();
    e.s.qp
        .post_recv(RecvWr {
            wr_id: 7,
            sgl: vec![rbuf.sge(0, 4096)],
        })
        .unwrap();
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
    let (e, _k) = up(kind).await;
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
}

#[tokio::test]
async fn write_read_1mib_plus_3_tcp() {
    within(write_read_big(Kind::Tcp)).await
}
#[tokio::test]
async fn write_read_1mib_plus_3_mem() {
    within(write_read_big(Kind::Mem)).await
}
