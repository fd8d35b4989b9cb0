//! `oxrdma decode --json` against `tshark -T json`, field by field, on version 1 captures made
//! in the test: our server's own captures (the soft-iWARP tee) of the conformance suite's
//! traffic, which holds every version 1 message form (RDMA_MSG, RDMA_NOMSG with a
//! Position-Zero Read chunk, Write chunks, Reply chunks, RDMA_ERROR, malformed headers) and
//! RDMA Read Requests, Read Responses and Writes.
//!
//! Compared, wherever tshark decodes them (skipped, with the reason printed, without tshark):
//! - MPA Request/Reply: which one, revision, private data length, CRC, marker and reject flags;
//! - RDMAP, per message (tshark's DDP segment with the Last flag): opcode, QN and MSN
//!   (untagged), STag and the first segment's tagged offset (tagged), and a Read Request's
//!   sink STag and TO, size, source STag and TO;
//! - RPC-over-RDMA version 1: XID, version, credits, message type, the Read/Write/Reply counts,
//!   every segment's position, handle, length and offset, and Write chunk segment counts;
//! - RPC: XID and procedure where tshark decoded the RPC.
//!
//! The JSON on our side is `serde_json::to_value` of the decoded messages, which is what
//! `oxrdma decode --json` prints under "messages".

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use nfs::serve::{ServeConfig, start};
use serde_json::Value;
use tools::conform::{self, ConformConfig, NfsTarget};
use tools::decode;

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Leaf fields of a JSON subtree: name -> values in document order (tshark with
/// `--no-duplicate-keys` turns repeated fields into arrays).
fn leaves(v: &Value, name: &str, out: &mut HashMap<String, Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                leaves(v, k, out);
            }
        }
        Value::Array(a) => {
            for v in a {
                leaves(v, name, out);
            }
        }
        Value::String(s) => out.entry(name.to_string()).or_default().push(s.clone()),
        other => out
            .entry(name.to_string())
            .or_default()
            .push(other.to_string()),
    }
}

/// A layer that may occur once (object) or several times (array) in a frame.
fn instances<'a>(layers: &'a Value, name: &str) -> Vec<&'a Value> {
    match layers.get(name) {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(v) => vec![v],
        None => Vec::new(),
    }
}

fn hex(v: u64, width: usize) -> String {
    format!("{v:#0w$x}", w = width + 2)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const OPCODES: [&str; 8] = [
    "Write",
    "ReadRequest",
    "ReadResponse",
    "Send",
    "SendInvalidate",
    "SendSE",
    "SendSEInvalidate",
    "Terminate",
];

/// Compare one capture; returns how many fields were compared.
fn compare(pcap: &Path) -> Option<usize> {
    let out = std::process::Command::new("tshark")
        .arg("-2")
        .arg("-r")
        .arg(pcap)
        .args(["-T", "json", "--no-duplicate-keys"])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("tshark failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => return None,
    };
    let theirs: Value = serde_json::from_slice(&out).expect("tshark JSON");
    let d = decode::decode_path(pcap).unwrap();
    let ours = serde_json::to_value(&d.messages).unwrap();
    let ours = ours.as_array().unwrap();
    let mut by_frame: HashMap<u64, Vec<&Value>> = HashMap::new();
    for m in ours {
        by_frame.entry(u(&m["frame"])).or_default().push(m);
    }
    let compared = std::cell::Cell::new(0usize);
    let check = |what: &str, frame: u64, o: String, t: &str| {
        assert_eq!(
            o,
            t,
            "{}: frame {frame}, {what}: ours {o:?}, tshark {t:?}",
            pcap.display()
        );
        compared.set(compared.get() + 1);
    };
    // First tagged offset of the message in progress, per (source port, STag).
    let mut first_to: HashMap<(String, String), String> = HashMap::new();
    for f in theirs.as_array().unwrap() {
        let layers = &f["_source"]["layers"];
        let frame: u64 = layers["frame"]["frame.number"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let src_port = layers["tcp"]["tcp.srcport"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let here = by_frame.get(&frame).cloned().unwrap_or_default();
        // MPA Request / Reply.
        for mpa in instances(layers, "iwarp_mpa") {
            let mut l = HashMap::new();
            leaves(mpa, "", &mut l);
            let kind = if l.contains_key("iwarp_mpa.key.req") {
                "request"
            } else if l.contains_key("iwarp_mpa.key.rep") {
                "reply"
            } else {
                continue;
            };
            let o = here
                .iter()
                .find(|m| m["layer"] == "mpa" && m["kind"] == kind)
                .unwrap_or_else(|| panic!("frame {frame}: no MPA {kind} of ours"));
            let flag = |b: &Value| if b.as_bool().unwrap() { "1" } else { "0" };
            check(
                "MPA rev",
                frame,
                o["revision"].to_string(),
                &l["iwarp_mpa.rev"][0],
            );
            check(
                "MPA pdlength",
                frame,
                o["private_data_len"].to_string(),
                &l["iwarp_mpa.pdlength"][0],
            );
            check(
                "MPA C",
                frame,
                flag(&o["crc"]).into(),
                &l["iwarp_mpa.crc_flag"][0],
            );
            check(
                "MPA M",
                frame,
                flag(&o["markers"]).into(),
                &l["iwarp_mpa.marker_flag"][0],
            );
            check(
                "MPA R",
                frame,
                flag(&o["reject"]).into(),
                &l["iwarp_mpa.rej_flag"][0],
            );
        }
        // RDMAP messages ending in this frame, in order.
        let mut ours_rdmap = here.iter().filter(|m| m["layer"] == "rdmap");
        for seg in instances(layers, "iwarp_ddp_rdmap") {
            let mut l = HashMap::new();
            leaves(seg, "", &mut l);
            let tagged = l["iwarp_ddp.tagged_flag"][0] == "1";
            if tagged {
                let key = (src_port.clone(), l["iwarp_ddp.stag"][0].clone());
                first_to
                    .entry(key)
                    .or_insert_with(|| l["iwarp_ddp.tagged_offset"][0].clone());
            }
            if l["iwarp_ddp.last_flag"][0] != "1" {
                continue;
            }
            let o = ours_rdmap
                .next()
                .unwrap_or_else(|| panic!("frame {frame}: tshark has more RDMAP messages"));
            let op = u64::from_str_radix(l["iwarp_rdma.opcode"][0].trim_start_matches("0x"), 16)
                .unwrap();
            check(
                "RDMAP opcode",
                frame,
                o["opcode"].as_str().unwrap().into(),
                OPCODES[op as usize],
            );
            if tagged {
                let stag = l["iwarp_ddp.stag"][0].clone();
                check("DDP STag", frame, hex(u(&o["stag"]), 8), &stag);
                let to = first_to.remove(&(src_port.clone(), stag)).unwrap();
                check("DDP TO", frame, hex(u(&o["to"]), 16), &to);
            } else {
                check("DDP QN", frame, o["qn"].to_string(), &l["iwarp_ddp.qn"][0]);
                check(
                    "DDP MSN",
                    frame,
                    o["msn"].to_string(),
                    &l["iwarp_ddp.msn"][0],
                );
            }
            if let Some(rr) = o["read"].as_object() {
                check(
                    "RR sink STag",
                    frame,
                    hex(u(&rr["sink_stag"]), 8),
                    &l["iwarp_rdma.sinkstag"][0],
                );
                check(
                    "RR sink TO",
                    frame,
                    hex(u(&rr["sink_to"]), 16),
                    &l["iwarp_rdma.sinkto"][0],
                );
                check(
                    "RR size",
                    frame,
                    rr["size"].to_string(),
                    &l["iwarp_rdma.rdmardsz"][0],
                );
                check(
                    "RR src STag",
                    frame,
                    hex(u(&rr["src_stag"]), 8),
                    &l["iwarp_rdma.srcstag"][0],
                );
                check(
                    "RR src TO",
                    frame,
                    hex(u(&rr["src_to"]), 16),
                    &l["iwarp_rdma.srcto"][0],
                );
            }
        }
        // RPC-over-RDMA version 1 headers decoded in this frame.
        let ours_rpcrdma: Vec<&Value> = here
            .iter()
            .filter(|m| m["upper"]["proto"] == "rpcrdma" && m["upper"]["vers"] == 1)
            .map(|m| &m["upper"])
            .collect();
        let theirs_rpcrdma = instances(layers, "rpcordma");
        // tshark decodes what its heuristics take for RPC-over-RDMA; ours marks malformed
        // headers and tshark may skip them: pair them by XID.
        for t in theirs_rpcrdma {
            let mut l = HashMap::new();
            leaves(t, "", &mut l);
            let Some(xid) = l.get("rpcordma.xid").map(|v| v[0].clone()) else {
                continue;
            };
            let o = ours_rpcrdma
                .iter()
                .find(|h| hex(u(&h["xid"]), 8) == xid)
                .unwrap_or_else(|| {
                    panic!("frame {frame}: tshark's rpcordma XID {xid} is not ours")
                });
            check(
                "rpcordma version",
                frame,
                o["vers"].to_string(),
                &l["rpcordma.version"][0],
            );
            check(
                "rpcordma credits",
                frame,
                o["credits"].to_string(),
                &l["rpcordma.flow_control"][0],
            );
            let proc_num = match o["proc_name"].as_str().unwrap() {
                "RDMA_MSG" => "0",
                "RDMA_NOMSG" => "1",
                "RDMA_MSGP" => "2",
                "RDMA_DONE" => "3",
                "RDMA_ERROR" => "4",
                other => other,
            };
            check(
                "rpcordma msg_type",
                frame,
                proc_num.into(),
                &l["rpcordma.msg_type"][0],
            );
            if !o["malformed"].is_null() {
                continue;
            }
            let reads = o["reads"].as_array().unwrap();
            let writes = o["writes"].as_array().unwrap();
            let reply = o["reply_chunk"].as_array();
            let nreads: usize = reads
                .iter()
                .map(|c| c["segments"].as_array().unwrap().len())
                .sum();
            if let Some(v) = l.get("rpcordma.reads_count") {
                check("reads_count", frame, nreads.to_string(), &v[0]);
            }
            if let Some(v) = l.get("rpcordma.writes_count") {
                check("writes_count", frame, writes.len().to_string(), &v[0]);
            }
            if let Some(v) = l.get("rpcordma.reply_count") {
                check(
                    "reply_count",
                    frame,
                    usize::from(reply.is_some()).to_string(),
                    &v[0],
                );
            }
            // Segments in header order: Read list, Write list, Reply chunk.
            let mut segs: Vec<&Value> = Vec::new();
            let mut positions = Vec::new();
            for c in reads {
                for s in c["segments"].as_array().unwrap() {
                    positions.push(c["position"].to_string());
                    segs.push(s);
                }
            }
            let mut counts = Vec::new();
            for w in writes {
                counts.push(w.as_array().unwrap().len().to_string());
                segs.extend(w.as_array().unwrap());
            }
            if let Some(r) = reply {
                counts.push(r.len().to_string());
                segs.extend(r);
            }
            let empty = Vec::new();
            let get = |k: &str| l.get(k).unwrap_or(&empty).clone();
            assert_eq!(
                positions,
                get("rpcordma.position"),
                "frame {frame} positions"
            );
            assert_eq!(
                counts,
                get("rpcordma.segment_count"),
                "frame {frame} segment counts"
            );
            // tshark's JSON nests the Reply chunk's segments apart from the Write list's, so
            // its arrays can come in another order: compare (handle, length, offset) triples.
            let mut ours_segs: Vec<(String, String, String)> = segs
                .iter()
                .map(|s| {
                    (
                        hex(u(&s["handle"]), 8),
                        s["length"].to_string(),
                        hex(u(&s["offset"]), 16),
                    )
                })
                .collect();
            let (th, tl, to) = (
                get("rpcordma.rdma_handle"),
                get("rpcordma.rdma_length"),
                get("rpcordma.rdma_offset"),
            );
            assert!(
                th.len() == tl.len() && tl.len() == to.len(),
                "frame {frame}"
            );
            let mut their_segs: Vec<(String, String, String)> = th
                .into_iter()
                .zip(tl)
                .zip(to)
                .map(|((h, l), o)| (h, l, o))
                .collect();
            ours_segs.sort();
            their_segs.sort();
            assert_eq!(ours_segs, their_segs, "frame {frame} segments");
            compared.set(compared.get() + 2 + positions.len() + counts.len() + 3 * segs.len());
            // The RPC under it, where tshark decoded one in this frame.
            if let (Some(rpc), Some(txid)) =
                (o["rpc"].as_object(), layers["rpc"]["rpc.xid"].as_str())
                && hex(u(&rpc["xid"]), 8) == txid
            {
                if let (Some(p), Some(tp)) = (
                    rpc["proc_num"].as_u64(),
                    layers["rpc"]["rpc.procedure"].as_str(),
                ) {
                    check("rpc.procedure", frame, p.to_string(), tp);
                }
                compared.set(compared.get() + 1);
            }
        }
    }
    Some(compared.get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_agrees_with_tshark_field_by_field_on_version_1() {
    if std::process::Command::new("tshark")
        .arg("-v")
        .output()
        .is_err()
    {
        println!("SKIP decode vs tshark: tshark is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let caps = dir.path().join("caps");
    std::fs::create_dir_all(&export).unwrap();
    std::fs::write(export.join("f.dat"), vec![0x42; 20_000]).unwrap();
    let mut cfg = ServeConfig::new(&export);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    cfg.rdma_config = Some(rpcrdma::TransportConfig {
        capture_dir: Some(caps.clone()),
        ..rpcrdma::TransportConfig::default()
    });
    let served = start(cfg).await.unwrap();
    let mut c = ConformConfig::new(served.rdma_addr.unwrap());
    c.wait = Duration::from_secs(5);
    c.only = vec!["v1-".into(), "nfs-".into()];
    c.nfs = Some(NfsTarget {
        mount: served.nfs_addr.unwrap(),
        export: "/".into(),
        file: Some("f.dat".into()),
    });
    let results = conform::run(verbs::Device::soft_iwarp(), c).await.unwrap();
    served.shutdown().await;
    assert!(results.iter().all(|r| r.outcome == conform::Outcome::Pass));
    // The capture writer finishes each file when its connection closes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut files: Vec<_> = std::fs::read_dir(&caps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "{} captures", files.len());
    let mut total = 0;
    for f in &files {
        total += compare(f).expect("tshark ran a moment ago");
    }
    println!(
        "{} captures, {total} fields compared, all equal",
        files.len()
    );
    assert!(total > 300, "only {total} fields compared");
}

/// The same comparison on the captures in `OXRDMA_TSHARK_PCAPS` (a directory, e.g. the lab's
/// `conform/oxrdma-pcap`, our requester against kernel nfsd); skipped when it is not set.
#[test]
fn decode_agrees_with_tshark_on_the_captures_given() {
    let Some(dir) = std::env::var_os("OXRDMA_TSHARK_PCAPS") else {
        println!("SKIP: OXRDMA_TSHARK_PCAPS is not set");
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap" || e == "pcapng"))
        .collect();
    files.sort();
    let mut total = 0;
    for f in &files {
        let Some(n) = compare(f) else {
            println!("SKIP: tshark is not installed");
            return;
        };
        total += n;
    }
    println!(
        "{} captures, {total} fields compared, all equal",
        files.len()
    );
}
