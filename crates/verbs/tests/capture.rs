//! Capture a session covering every RDMAP opcode to pcap and check it with tshark.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use bytes::Bytes;
use verbs::{Access, ConnParams, RecvWr, SendOp, SendWr, WcStatus};

fn tshark(args: &[&str]) -> Option<String> {
    let out = Command::new("tshark").args(args).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn session(dir: &Path, crc: bool) -> std::path::PathBuf {
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
        private_data: Bytes::from_static(b"capture test"),
        ..Default::default()
    };
    let k = connect(&e, pc, ConnParams::default()).await.unwrap();
    let inv1 =
        e.s.pd
            .register_len(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let inv2 =
        e.s.pd
            .register_len(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let target =
        e.s.pd
            .register_len(
                100_000,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    let src =
        e.c.pd
            .register(vec![0x5a; 100_000], Access::LOCAL_WRITE)
            .unwrap();
    let sink = e.c.pd.register_len(100_000, Access::LOCAL_WRITE).unwrap();
    let mut wrs = vec![
        SendWr::send_bytes(1, Bytes::from(vec![1u8; 20_000])),
        SendWr::new(
            2,
            SendOp::SendWithInvalidate(inv1.rkey()),
            vec![src.sge(0, 100)],
        ),
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
    let mut se = SendWr::send_bytes(3, Bytes::from_static(b"solicited"));
    se.solicited = true;
    wrs.insert(2, se);
    let mut se_inv = SendWr::new(
        4,
        SendOp::SendWithInvalidate(inv2.rkey()),
        vec![src.sge(0, 10)],
    );
    se_inv.solicited = true;
    wrs.insert(3, se_inv);
    e.c.qp.post_send_list(wrs).unwrap();
    for _ in 0..6 {
        assert_eq!(e.c.scq.next().await.status, WcStatus::Success);
    }
    // End with a protection error so the capture holds a Terminate.
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

#[tokio::test]
async fn tshark_decodes_every_opcode() {
    if tshark(&["--version"]).is_none() {
        eprintln!("skipping: tshark is not installed");
        return;
    }
    for crc in [false, true] {
        let dir = std::env::temp_dir().join(format!("oxrdma-cap-{}-{crc}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = within(session(&dir, crc)).await;
        let f = file.to_str().unwrap();
        let all = tshark(&["-r", f, "-V"]).unwrap();
        assert!(
            !all.contains("Malformed"),
            "malformed packets (crc {crc}):\n{all}"
        );
        let mal = tshark(&[
            "-r",
            f,
            "-Y",
            "_ws.malformed || _ws.expert.severity >= error",
        ])
        .unwrap();
        assert!(mal.trim().is_empty(), "errors (crc {crc}):\n{mal}");
        let ops = tshark(&["-r", f, "-T", "fields", "-e", "iwarp_rdma.opcode"]).unwrap();
        for op in 0..8 {
            let needle = format!("0x0{op}");
            assert!(
                ops.split_whitespace()
                    .any(|w| w.split(',').any(|x| x == needle)),
                "opcode {op} missing (crc {crc}):\n{ops}"
            );
        }
        let mpa = tshark(&["-r", f, "-Y", "iwarp_mpa.key.req || iwarp_mpa.key.rep"]).unwrap();
        assert_eq!(
            mpa.lines().count(),
            2,
            "MPA Request and Reply each in their own segment:\n{mpa}"
        );
        if std::env::var_os("OXRDMA_KEEP_CAPTURE").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// The TCP payloads of a capture written by the initiator, as (outgoing, incoming) streams.
fn streams(file: &Path) -> (Vec<u8>, Vec<u8>) {
    let b = std::fs::read(file).unwrap();
    assert_eq!(&b[..4], &0xa1b2_c3d4u32.to_le_bytes(), "pcap magic");
    let (mut out, mut inc) = (Vec::new(), Vec::new());
    let mut at = 24;
    let mut client_port = None;
    // Bounded: every record advances `at` by at least its 16-byte header.
    while at + 16 <= b.len() {
        let len = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        let pkt = &b[at + 16..at + 16 + len];
        at += 16 + len;
        // Ethernet 14, IPv4 20, TCP 20: no options are written.
        let src = u16::from_be_bytes([pkt[34], pkt[35]]);
        let payload = &pkt[54..];
        // The first packet is the initiator's SYN.
        let client = *client_port.get_or_insert(src);
        if src == client {
            out.extend_from_slice(payload);
        } else {
            inc.extend_from_slice(payload);
        }
    }
    (out, inc)
}

/// Without tshark: the capture holds both directions of the stream as they were written and
/// read (the tee on the driver's byte stream), from the MPA Request and Reply on.
#[tokio::test]
async fn capture_records_both_directions() {
    for crc in [false, true] {
        let dir = std::env::temp_dir().join(format!("oxrdma-tee-{}-{crc}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = within(session(&dir, crc)).await;
        let (out, inc) = streams(&file);
        assert!(out.starts_with(b"MPA ID Req Frame"), "crc {crc}");
        assert!(inc.starts_with(b"MPA ID Rep Frame"), "crc {crc}");
        // The 100,000-byte RDMA Write and the 20,000-byte Send went out; the Read Response
        // (100,000 bytes of the server's zeroed target) came in.
        let fives = out.iter().filter(|&&x| x == 0x5a).count();
        assert!(
            fives >= 100_000,
            "crc {crc}: {fives} bytes of the Write payload"
        );
        assert!(out.len() > 120_000, "crc {crc}: {} bytes out", out.len());
        assert!(inc.len() > 100_000, "crc {crc}: {} bytes in", inc.len());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
