//! `tools::decode` on the iWARP layers alone: a soft-iWARP session with every RDMAP opcode
//! (Send, Send with Invalidate, with Solicited Event, both, RDMA Write, Read Request and
//! Response) ending in a Terminate, captured with and without CRCs; then one byte of an FPDU
//! flipped, which the CRC check must report.

use std::path::{Path, PathBuf};

// The verbs tests' helpers (two ends of a soft-iWARP connection on loopback).
use crate::verbs_common::*;
use bytes::Bytes;
use tools::decode::{self, Body};
use verbs::{Access, ConnParams, RecvWr, SendOp, SendWr, WcStatus};

async fn session(dir: &Path, crc: bool) -> PathBuf {
    let e = ends(Kind::Tcp);
    let rb = e.s.pd.register_len(1 << 17, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        e.s.qp
            .post_recv(RecvWr::new(i, rb.sge(i * 32768, 32768)))
            .unwrap();
    }
    let pc = ConnParams {
        crc,
        capture_dir: Some(dir.to_path_buf()),
        private_data: Bytes::from_static(b"decode test"),
        ..Default::default()
    };
    let k = connect(&e, pc, ConnParams::default()).await.unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let inv = e.s.pd.register_len(8, access).unwrap();
    let inv2 = e.s.pd.register_len(8, access).unwrap();
    let target = e.s.pd.register_len(100_000, access).unwrap();
    let src =
        e.c.pd
            .register(vec![0x5a; 100_000], Access::LOCAL_WRITE)
            .unwrap();
    let sink = e.c.pd.register_len(100_000, Access::LOCAL_WRITE).unwrap();
    let mut se = SendWr::send_bytes(3, Bytes::from_static(b"solicited"));
    se.solicited = true;
    let mut se_inv = SendWr::new(
        4,
        SendOp::SendWithInvalidate(inv.rkey()),
        vec![src.sge(0, 10)],
    );
    se_inv.solicited = true;
    let wrs = vec![
        SendWr::send_bytes(1, Bytes::from(vec![1u8; 20_000])),
        SendWr::new(
            2,
            SendOp::SendWithInvalidate(inv2.rkey()),
            vec![src.sge(0, 100)],
        ),
        se,
        se_inv,
        SendWr::new(
            5,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: target.rkey(),
            },
            vec![src.sge(0, 100_000)],
        ),
        SendWr::new(
            6,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: target.rkey(),
            },
            vec![sink.sge(0, 100_000)],
        ),
    ];
    e.c.qp.post_send_list(wrs).unwrap();
    for _ in 0..6 {
        assert_eq!(e.c.scq.next().await.status, WcStatus::Success);
    }
    // A Write past the end of the region: the server answers with a Terminate.
    e.c.qp
        .post_send(SendWr::new(
            7,
            SendOp::RdmaWrite {
                remote_addr: 99_999,
                rkey: target.rkey(),
            },
            vec![src.sge(0, 2)],
        ))
        .unwrap();
    k.c.closed().await;
    k.s.closed().await;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

fn opcodes(d: &decode::Decoded) -> Vec<(&'static str, u64, bool)> {
    d.messages
        .iter()
        .filter_map(|m| match &m.body {
            Body::Rdmap(r) => Some((r.opcode, r.len, r.crc_error)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_opcode_and_the_terminate_decode_with_and_without_crc() {
    for crc in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = within(session(dir.path(), crc)).await;
        let d = decode::decode_path(&path).unwrap();
        let mpa: Vec<_> = d
            .messages
            .iter()
            .filter_map(|m| match &m.body {
                Body::Mpa(i) => Some(i),
                _ => None,
            })
            .collect();
        assert_eq!(mpa.len(), 2);
        assert_eq!(mpa[0].crc, crc);
        assert!(matches!(
            &mpa[0].private,
            Some(decode::model::Private::Other { hex }) if hex == "6465636f64652074657374"
        ));
        let ops = opcodes(&d);
        let names: Vec<&str> = ops.iter().map(|o| o.0).collect();
        for want in [
            "Send",
            "SendInvalidate",
            "SendSE",
            "SendSEInvalidate",
            "Write",
            "ReadRequest",
            "ReadResponse",
            "Terminate",
        ] {
            assert!(names.contains(&want), "crc={crc}: {want} not in {names:?}");
        }
        // Multi-segment messages are reassembled: the 20 000-byte Send, the 100 000-byte Write
        // and Read Response.
        assert!(ops.contains(&("Send", 20_000, false)));
        assert!(ops.contains(&("Write", 100_000, false)));
        assert!(ops.contains(&("ReadResponse", 100_000, false)));
        assert!(ops.iter().all(|o| !o.2), "CRC errors in a clean capture");
        let term = d
            .messages
            .iter()
            .find_map(|m| match &m.body {
                Body::Rdmap(r) => r.terminate.clone(),
                _ => None,
            })
            .unwrap();
        assert_eq!(term.layer, "DDP");
        assert!(term.meaning.contains("base or bounds"), "{term:?}");
        if crc {
            // Flip a byte inside the 20 000-byte Send (frame 6: after the handshake and the
            // two MPA frames): its FPDU's CRC no longer matches.
            let mut pcap = std::fs::read(&path).unwrap();
            let (mut off, mut frame) = (24usize, 1u64);
            while frame < 6 {
                let len = u32::from_le_bytes(pcap[off + 8..off + 12].try_into().unwrap());
                off += 16 + len as usize;
                frame += 1;
            }
            pcap[off + 16 + 54 + 100] ^= 0xff;
            let bad = decode::decode(&pcap).unwrap();
            let ops = opcodes(&bad);
            assert!(ops.contains(&("Send", 20_000, true)), "{ops:?}");
            assert_eq!(ops.iter().filter(|o| o.2).count(), 1, "{ops:?}");
        }
    }
}
