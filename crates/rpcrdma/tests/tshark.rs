//! Capture an RPC-over-RDMA session on soft-iWARP and check that Wireshark's `rpcordma`
//! dissector decodes every message form we send: RDMA_MSG (Short, and Chunked with a Read
//! chunk and a Write list), RDMA_NOMSG with a Position-Zero Read chunk (Long Call), and
//! RDMA_NOMSG replies through the Reply chunk (Long Reply), with no malformed packets and no
//! expert errors. Skipped, with the reason printed, when tshark is not installed.
//!
//! What Wireshark does (epan/dissectors/packet-rpcrdma.c, as observed): on iWARP its heuristic
//! looks at Send and Send with Invalidate only, decodes version 1, accepts RDMA_MSG only when
//! the RPC XID equals the RPC-over-RDMA XID, and indexes chunk segments by their handle
//! (R_key) to find the RDMA Read / Write data. Every segment we advertise has its own STag.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use oncrpc::{CallRequest, ReplyExpectation, RpcTransport};
use rpcrdma::ulb::UpperLayerBinding;
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

fn tshark(args: &[&str]) -> Option<String> {
    let out = Command::new("tshark").args(args).output().ok()?;
    if !out.status.success() {
        panic!(
            "tshark {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn pattern(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

fn echo(tag: u32, data: Bytes, extra: Bytes, ddp: bool) -> CallRequest {
    let reply = ReplyExpectation {
        max_len: Some(64 + data.len() + extra.len()),
        ddp_items: if ddp { vec![data.len()] } else { vec![] },
    };
    CallRequest::new(PROG, VERS, ECHO, move |e| {
        e.put_u32(tag);
        e.put_ddp_opaque(data.clone());
        e.put_opaque_bytes(extra.clone());
    })
    .with_reply(reply)
    .with_timeout(Duration::from_secs(20))
}

/// One connection carrying every message form; returns the server-side capture file.
async fn session(dir: &Path) -> PathBuf {
    let ulbs = || -> Vec<Arc<dyn UpperLayerBinding>> { vec![Arc::new(EchoUlb)] };
    let scfg = TransportConfig {
        capture_dir: Some(dir.to_path_buf()),
        rpc: cfg_4k(),
        ..TransportConfig::default()
    };
    let srv = RdmaServer::bind("127.0.0.1:0".parse().unwrap(), dispatcher(), ulbs(), scfg)
        .await
        .unwrap();
    let ccfg = TransportConfig {
        reconnect_attempts: 0,
        rpc: cfg_4k(),
        ..TransportConfig::default()
    };
    let cl = RdmaClient::connect_with(srv.local_addr(), ccfg, ulbs(), None)
        .await
        .unwrap();
    // (data, extra, data is DDP-eligible):
    //   Short: RDMA_MSG both ways.
    //   Chunked: a Read chunk at a non-zero position; the reply's data in a Write chunk.
    //   Long Call + Long Reply: 6001 non-DDP bytes go through a Position-Zero Read chunk
    //   (RDMA_NOMSG) and come back through the Reply chunk (RDMA_NOMSG).
    let cases = [(12usize, 4usize, false), (5000, 3, true), (20, 6001, false)];
    for (i, (d, x, ddp)) in cases.into_iter().enumerate() {
        let (data, extra) = (pattern(d, i as u8), pattern(x, 7));
        let got = cl
            .call(echo(i as u32, data.clone(), extra.clone(), ddp))
            .await
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(got, echo_results_bytes(i as u32, &data, &extra), "case {i}");
    }
    let s = cl.stats();
    assert!(
        s.short >= 1 && s.chunked >= 1 && s.long_call >= 1 && s.long_reply >= 1,
        "{s:?}"
    );
    // Close from the server side: its capture is complete once the connection is closed.
    for c in srv.connections() {
        c.disconnect().await;
    }
    drop(cl);
    drop(srv);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

/// One decoded RPC-over-RDMA message (`tshark -T fields`).
#[derive(Debug)]
struct Row {
    src_port: u16,
    msg_type: u32,
    reads: u32,
    writes: u32,
    replies: u32,
    positions: Vec<u32>,
}

fn rows(file: &str) -> Vec<Row> {
    let out = tshark(&[
        "-r",
        file,
        "-Y",
        "rpcordma",
        "-T",
        "fields",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
        "-e",
        "tcp.srcport",
        "-e",
        "rpcordma.msg_type",
        "-e",
        "rpcordma.reads_count",
        "-e",
        "rpcordma.writes_count",
        "-e",
        "rpcordma.reply_count",
        "-e",
        "rpcordma.position",
    ])
    .unwrap();
    let num = |s: &str| -> Vec<u32> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().unwrap_or_else(|_| panic!("{x:?} in {s:?}")))
            .collect()
    };
    let first = |s: &str| num(s).first().copied().unwrap_or(0);
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(f.len() >= 6, "{l:?}");
            Row {
                src_port: first(f[0]) as u16,
                msg_type: first(f[1]),
                reads: first(f[2]),
                writes: first(f[3]),
                replies: first(f[4]),
                positions: num(f[5]),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tshark_decodes_every_message_form() {
    if Command::new("tshark").arg("--version").output().is_err() {
        println!("SKIP: tshark is not installed (apt-get install tshark)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("oxrdma-rpcrdma-cap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = tokio::time::timeout(Duration::from_secs(60), session(&dir))
        .await
        .expect("session within 60 s");
    let f = file.to_str().unwrap();

    let all = tshark(&["-r", f, "-V"]).unwrap();
    assert!(!all.contains("Malformed"), "malformed packets:\n{all}");
    let bad = tshark(&[
        "-r",
        f,
        "-Y",
        "_ws.malformed || _ws.expert.severity >= error",
    ])
    .unwrap();
    assert!(bad.trim().is_empty(), "expert errors:\n{bad}");

    let rows = rows(f);
    println!("{rows:#?}");
    // The server's port is the source of replies; the client's port the source of calls.
    let server_port = file
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('-').nth(1))
        .and_then(|p| p.parse::<u16>().ok())
        .expect("capture name oxrdma-LOCAL-PEER-server.pcap");
    let (calls, replies): (Vec<&Row>, Vec<&Row>) =
        rows.iter().partition(|r| r.src_port != server_port);
    const MSG: u32 = 0;
    const NOMSG: u32 = 1;
    // Short call: RDMA_MSG with no chunks.
    assert!(
        calls
            .iter()
            .any(|r| r.msg_type == MSG && r.reads == 0 && r.writes == 0),
        "no Short RDMA_MSG call: {calls:#?}"
    );
    // Chunked call: RDMA_MSG, a Read chunk at a non-zero position, and a Write list.
    assert!(
        calls.iter().any(|r| r.msg_type == MSG
            && r.reads >= 1
            && r.positions.iter().all(|p| *p > 0)
            && r.writes >= 1),
        "no Chunked RDMA_MSG call with a Read chunk and a Write list: {calls:#?}"
    );
    // Long Call: RDMA_NOMSG whose Read list has a Position-Zero chunk, offering a Reply chunk.
    assert!(
        calls
            .iter()
            .any(|r| r.msg_type == NOMSG && r.positions.contains(&0) && r.replies >= 1),
        "no Long Call (RDMA_NOMSG, Position-Zero Read chunk, Reply chunk): {calls:#?}"
    );
    // Replies: a Short one, one returning its Write list (chunked reply), and a Long Reply
    // (RDMA_NOMSG with the Reply chunk filled in).
    assert!(
        replies
            .iter()
            .any(|r| r.msg_type == MSG && r.writes == 0 && r.replies == 0),
        "no Short reply: {replies:#?}"
    );
    assert!(
        replies.iter().any(|r| r.msg_type == MSG && r.writes >= 1),
        "no RDMA_MSG reply with a Write list: {replies:#?}"
    );
    assert!(
        replies
            .iter()
            .any(|r| r.msg_type == NOMSG && r.replies >= 1),
        "no Long Reply (RDMA_NOMSG with a Reply chunk): {replies:#?}"
    );
    // Wireshark found the chunk data by handle and reassembled it: the Chunked call's Read
    // chunk and the Long Call's Position-Zero Read chunk (both from RDMA Read Responses), and
    // the Long Reply's Reply chunk (from RDMA Writes).
    let reassembled = tshark(&[
        "-r",
        f,
        "-Y",
        "rpcordma.reassembled.length",
        "-T",
        "fields",
        "-e",
        "frame.number",
    ])
    .unwrap();
    assert!(
        reassembled.lines().count() >= 3,
        "chunk reassembly in fewer than 3 frames: {reassembled:?}"
    );
    if std::env::var_os("OXRDMA_KEEP_CAPTURE").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("capture kept at {f}");
    }
}
