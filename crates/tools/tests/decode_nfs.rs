//! `tools::decode` on captures the project's own capture writer (the soft-iWARP tee) wrote of
//! real NFS traffic over RPC-over-RDMA on loopback: NFSv3 over versions 1 and 2, NFSv4
//! COMPOUNDs, a capture with a segment cut out, and (where tshark is installed) the version 1
//! XIDs compared with Wireshark's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client};
use nfs::nfs3::{CreateHow3, Sattr3};
use nfs::nfs4::args::OpArgs;
use nfs::nfs4::client_codec::encode_compound;
use nfs::nfs4::server::Nfs4Config;
use nfs::nfs4::types::{Bitmap4, Component4};
use nfs::serve::{ServeConfig, start};
use nfs::ulb::NfsBinding;
use oncrpc::client::ReplyExpectation;
use oncrpc::{RpcClient, RpcTransport, TcpClient};
use rpcrdma::version::VersionPolicy;
use rpcrdma::{RdmaClient, TransportConfig};
use tools::decode::model::{Body, RpcRdmaInfo, Upper};
use tools::decode::{self, Decoded, text, timeline};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i * 7 + 3) as u8)
        .collect::<Vec<_>>()
        .into()
}

/// What the NFS client did, to compare the decoded capture with.
struct Session {
    pcap: PathBuf,
    _dir: tempfile::TempDir,
}

/// Decode the session's capture. OXRDMA_DECODE_KEEP=DIR keeps a copy of it under `name` (to try
/// `oxrdma decode` on it).
fn decoded(s: &Session, name: &str) -> Decoded {
    if let Some(keep) = std::env::var_os("OXRDMA_DECODE_KEEP") {
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(&s.pcap, Path::new(&keep).join(name));
    }
    decode::decode_path(&s.pcap).unwrap()
}

/// Serve a directory, and over one captured RPC-over-RDMA connection: NULL, CREATE, a 9000-byte
/// WRITE (Read chunk), COMMIT, READ (Write chunk), READDIRPLUS; with `nfs4`, two COMPOUNDs.
async fn nfs_session(policy: VersionPolicy, nfs4: bool) -> Session {
    nfs_session_with(policy, nfs4, false).await
}

/// [`nfs_session`]; with `long`, 60 more files first (so that READDIRPLUS answers with a Long
/// Reply) and a third COMPOUND of 5 KB (a Long Call through a Position-Zero Read chunk).
async fn nfs_session_with(policy: VersionPolicy, nfs4: bool, long: bool) -> Session {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let caps = dir.path().join("caps");
    std::fs::create_dir_all(&export).unwrap();
    let mut cfg = ServeConfig::new(&export);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    if nfs4 {
        cfg.nfs4 = Some(Nfs4Config::default().with_grace(Duration::ZERO));
    }
    // 4 KiB receive buffers on both sides (Linux's inline threshold; the default is 8 KiB):
    // the session's calls and replies are sized to take every message form against it.
    let mut server_tc = TransportConfig::default();
    server_tc.rpc.inline_recv = 4096;
    cfg.rdma_config = Some(server_tc);
    let served = start(cfg).await.unwrap();
    let tcp: Arc<dyn RpcTransport> =
        Arc::new(TcpClient::connect(served.nfs_addr.unwrap()).await.unwrap());
    let root = MountClient::new(tcp).mnt("/").await.unwrap();
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let mut tc = TransportConfig {
        capture_dir: Some(caps.clone()),
        reconnect_attempts: 0,
        ..TransportConfig::default()
    };
    tc.rpc.version_policy = policy;
    tc.rpc.inline_recv = 4096;
    let rdma = Arc::new(
        RdmaClient::connect_with(served.rdma_addr.unwrap(), tc, vec![ulb], None)
            .await
            .unwrap(),
    );
    let c = Nfs3Client::new(rdma.clone()).with_auth_sys(0, 0, vec![]);
    c.null().await.unwrap();
    let fh = c
        .create(&root, b"f", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let data = pattern(9000);
    c.write_all(&fh, &data, 1 << 20).await.unwrap();
    assert_eq!(c.read_all(&fh, 1 << 20).await.unwrap(), data);
    let more = if long { 60 } else { 0 };
    for i in 0..more {
        let name = format!("file-with-a-longish-name-{i:03}");
        c.create(
            &root,
            name.as_bytes(),
            CreateHow3::Unchecked(Sattr3::default()),
        )
        .await
        .unwrap();
    }
    assert_eq!(c.readdirplus_all(&root).await.unwrap().len(), 3 + more);
    if nfs4 {
        let v4 = RpcClient::new(rdma.clone(), 100003, 4);
        for ops in [
            vec![
                OpArgs::Putrootfh,
                OpArgs::Getattr(Bitmap4(vec![0x0000_0002])),
            ],
            vec![
                OpArgs::Putrootfh,
                OpArgs::Lookup(Component4::from_slice(b"f")),
                OpArgs::Getfh,
            ],
        ]
        .into_iter()
        .chain(long.then(|| {
            let mut ops = vec![OpArgs::Putrootfh];
            ops.extend((0..20).map(|_| OpArgs::Lookup(Component4::from_slice(&[b'x'; 255]))));
            ops
        })) {
            let args = encode_compound(b"decode", 1, &ops);
            v4.call(1, move |e| e.put_raw(&args), ReplyExpectation::default())
                .await
                .unwrap();
        }
    }
    rdma.disconnect().await;
    drop(c);
    drop(rdma);
    served.shutdown().await;
    let files: Vec<PathBuf> = std::fs::read_dir(&caps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    Session {
        pcap: files[0].clone(),
        _dir: dir,
    }
}

fn rpcrdma(d: &Decoded) -> Vec<&RpcRdmaInfo> {
    d.messages.iter().filter_map(text::rpcrdma_of).collect()
}

/// The NFS procedures of the calls, in order.
fn call_names(d: &Decoded) -> Vec<String> {
    rpcrdma(d)
        .iter()
        .filter_map(|r| r.rpc.as_ref())
        .filter(|c| c.kind == "call")
        .filter_map(|c| c.proc_name.clone())
        .collect()
}

fn check_nfs3(d: &Decoded, vers: u32) {
    assert!(
        d.frames.frames > 10 && d.frames.malformed == 0,
        "{:?}",
        d.frames
    );
    assert_eq!(d.streams.len(), 1);
    assert_eq!(d.streams[0].protocol, "iwarp");
    // The MPA Request and Reply with RFC 8797 private data.
    let mpa: Vec<_> = d
        .messages
        .iter()
        .filter_map(|m| match &m.body {
            Body::Mpa(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(mpa.len(), 2);
    assert_eq!((mpa[0].kind, mpa[1].kind), ("request", "reply"));
    assert!(
        mpa.iter()
            .all(|m| matches!(m.private, Some(decode::model::Private::Rpcrdma { .. })))
    );
    // No gaps, no errors.
    assert!(
        d.messages
            .iter()
            .all(|m| !matches!(m.body, Body::Gap { .. } | Body::Error { .. })),
        "unexpected gap or error"
    );
    let names = call_names(d);
    for want in [
        "NFSv3 NULL",
        "NFSv3 CREATE",
        "NFSv3 WRITE",
        "NFSv3 COMMIT",
        "NFSv3 READ",
        "NFSv3 READDIRPLUS",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // Every header is of the version in use (a version 2 probe may be answered in either).
    let hdrs = rpcrdma(d);
    assert!(hdrs.iter().all(|r| r.malformed.is_none()));
    let msgs: Vec<_> = hdrs
        .iter()
        .filter(|r| r.proc_name.contains("MSG"))
        .collect();
    assert!(
        msgs.iter().all(|r| r.vers == vers),
        "version {vers} expected"
    );
    // The WRITE offered a Read chunk at a non-zero position; the READ a Write chunk.
    let by_proc = |p: &str| {
        hdrs.iter()
            .find(|r| r.rpc.as_ref().and_then(|c| c.proc_name.as_deref()) == Some(p))
            .copied()
            .unwrap_or_else(|| panic!("{p}"))
    };
    let w = by_proc("NFSv3 WRITE");
    assert_eq!(w.reads.len(), 1);
    assert!(w.reads[0].position > 0);
    let wn = w.rpc.as_ref().unwrap().nfs.as_ref().unwrap();
    assert_eq!((wn.offset, wn.count), (Some(0), Some(9000)));
    let r = by_proc("NFSv3 READ");
    assert_eq!(r.writes.len(), 1);
    assert_eq!(wn.fh, r.rpc.as_ref().unwrap().nfs.as_ref().unwrap().fh);
    // Each call has exactly one reply with its XID, and the timeline ties the chunks' RDMA
    // operations to them.
    let (rpcs, lat) = timeline::build(&d.messages);
    assert!(
        rpcs.iter().all(|t| t.reply_frame.is_some()),
        "unanswered call"
    );
    let write = rpcs
        .iter()
        .find(|t| t.proc_name.as_deref() == Some("NFSv3 WRITE"))
        .unwrap();
    assert!(write.rdma.iter().any(|o| o.op == "ReadRequest"));
    assert_eq!(
        write
            .rdma
            .iter()
            .filter(|o| o.op == "ReadResponse")
            .map(|o| o.len)
            .sum::<u64>(),
        9000
    );
    let read = rpcs
        .iter()
        .find(|t| t.proc_name.as_deref() == Some("NFSv3 READ"))
        .unwrap();
    assert!(read.rdma.iter().any(|o| o.op == "Write" && o.len == 9000));
    assert!(
        lat.iter()
            .any(|l| l.proc_name == "NFSv3 READ" && l.count == 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_over_rpcrdma_v1_decodes() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session(VersionPolicy::V1, false),
    )
    .await
    .expect("session timed out");
    let d = decoded(&s, "nfs3-v1.pcap");
    check_nfs3(&d, 1);
    tshark_cross_check(&s.pcap, &d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_over_rpcrdma_v2_decodes() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session(VersionPolicy::V2, false),
    )
    .await
    .expect("session timed out");
    let d = decoded(&s, "nfs3-v2.pcap");
    check_nfs3(&d, 2);
    let hdrs = rpcrdma(&d);
    assert!(hdrs.iter().any(|r| r.proc_name == "RDMA2_MSG"));
    assert!(
        hdrs.iter()
            .filter(|r| r.proc_name == "RDMA2_MSG")
            .all(|r| r.direction.is_some() && r.inv_handle.is_some())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs4_compound_operations_decode() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session(VersionPolicy::V1, true),
    )
    .await
    .expect("session timed out");
    let d = decoded(&s, "nfs4.pcap");
    tshark_cross_check(&s.pcap, &d);
    let compounds: Vec<_> = rpcrdma(&d)
        .into_iter()
        .filter_map(|r| r.rpc.as_ref())
        .filter(|c| c.proc_name.as_deref() == Some("NFSv4 COMPOUND"))
        .collect();
    // Two calls and two replies.
    assert_eq!(compounds.len(), 4, "{compounds:?}");
    let ops = |i: usize| -> Vec<String> {
        compounds[i]
            .nfs
            .as_ref()
            .unwrap()
            .ops
            .iter()
            .map(|o| o.op.clone())
            .collect()
    };
    assert_eq!(ops(0), ["PUTROOTFH", "GETATTR"]);
    assert_eq!(compounds[1].kind, "reply");
    assert!(compounds[1].nfs.as_ref().unwrap().status.is_some());
    assert_eq!(ops(2), ["PUTROOTFH", "LOOKUP", "GETFH"]);
    assert_eq!(
        compounds[2].nfs.as_ref().unwrap().ops[1].name.as_deref(),
        Some("f")
    );
    assert_eq!(compounds[0].xid, compounds[1].xid);
    // The procedure filter finds operations inside COMPOUNDs.
    let f = decode::Filter {
        proc_: Some("lookup".into()),
        ..Default::default()
    };
    assert_eq!(d.messages.iter().filter(|m| f.matches(m)).count(), 1);
}

/// Drop the pcap record `n` (0-based, after the 24-byte global header).
fn drop_record(pcap: &[u8], n: usize) -> Vec<u8> {
    let mut out = pcap[..24].to_vec();
    let mut off = 24;
    let mut i = 0;
    while off + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[off + 8..off + 12].try_into().unwrap()) as usize;
        let end = off + 16 + len;
        if i != n {
            out.extend_from_slice(&pcap[off..end]);
        }
        off = end;
        i += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_segment_is_reported_and_decoding_goes_on() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session(VersionPolicy::V1, false),
    )
    .await
    .expect("session timed out");
    let pcap = std::fs::read(&s.pcap).unwrap();
    let whole = decode::decode(&pcap).unwrap();
    // Cut the segment that carried the WRITE call.
    let frame = whole
        .messages
        .iter()
        .find(|m| {
            text::rpcrdma_of(m)
                .and_then(|r| r.rpc.as_ref())
                .and_then(|c| c.proc_name.as_deref())
                == Some("NFSv3 WRITE")
        })
        .unwrap()
        .frame;
    let cut = drop_record(&pcap, frame as usize - 1);
    let d = decode::decode(&cut).unwrap();
    let gap = d
        .messages
        .iter()
        .position(|m| matches!(m.body, Body::Gap { .. }))
        .expect("no gap reported");
    let after = &d.messages[gap..];
    assert!(
        after.iter().any(|m| matches!(m.body, Body::Resync { .. })),
        "no resync after the gap"
    );
    // The calls after the cut still decode.
    let names: Vec<String> = after
        .iter()
        .filter_map(text::rpcrdma_of)
        .filter_map(|r| r.rpc.as_ref())
        .filter_map(|c| c.proc_name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "NFSv3 READ"), "{names:?}");
    assert!(names.iter().any(|n| n == "NFSv3 READDIRPLUS"), "{names:?}");
    // The WRITE call went with the cut segment: it is not among the decoded calls.
    assert!(!call_names(&d).iter().any(|n| n == "NFSv3 WRITE"));
}

/// Swap pcap records `a` and `b` (0-based).
fn swap_records(pcap: &[u8], a: usize, b: usize) -> Vec<u8> {
    let mut recs = Vec::new();
    let mut off = 24;
    while off + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[off + 8..off + 12].try_into().unwrap()) as usize;
        recs.push(&pcap[off..off + 16 + len]);
        off += 16 + len;
    }
    recs.swap(a, b);
    let mut out = pcap[..24].to_vec();
    for r in recs {
        out.extend_from_slice(r);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_recorded_before_its_call_is_still_named() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session(VersionPolicy::V1, false),
    )
    .await
    .expect("session timed out");
    let pcap = std::fs::read(&s.pcap).unwrap();
    let d = decode::decode(&pcap).unwrap();
    // The CREATE call and its reply, each alone in its frame: record them the other way round.
    let frame_of = |kind: &str| {
        d.messages
            .iter()
            .find(|m| {
                text::rpcrdma_of(m)
                    .and_then(|r| r.rpc.as_ref())
                    .is_some_and(|c| {
                        c.proc_name.as_deref() == Some("NFSv3 CREATE") && c.kind == kind
                    })
            })
            .unwrap()
            .frame as usize
    };
    let (call, reply) = (frame_of("call"), frame_of("reply"));
    let swapped = decode::decode(&swap_records(&pcap, call - 1, reply - 1)).unwrap();
    let create: Vec<_> = rpcrdma(&swapped)
        .into_iter()
        .filter_map(|r| r.rpc.as_ref())
        .filter(|c| c.proc_name.as_deref() == Some("NFSv3 CREATE"))
        .map(|c| c.kind)
        .collect();
    assert_eq!(create, ["reply", "call"]);
    let (rpcs, _) = timeline::build(&swapped.messages);
    let t = rpcs
        .iter()
        .find(|t| t.proc_name.as_deref() == Some("NFSv3 CREATE"))
        .unwrap();
    assert_eq!(t.reply_frame, Some(call as u64));
}

/// Every RPC-over-RDMA field tshark also decodes, per frame, must have our value: XID,
/// version, credits, message type, Read segment / Write chunk / Reply chunk counts, the first
/// Read position, and the RPC procedure where tshark decoded the RPC (version 1 only: tshark
/// decodes nothing else).
fn tshark_cross_check(pcap: &Path, d: &Decoded) {
    let fields = [
        "frame.number",
        "rpcordma.xid",
        "rpcordma.version",
        "rpcordma.flow_control",
        "rpcordma.msg_type",
        "rpcordma.reads_count",
        "rpcordma.writes_count",
        "rpcordma.reply_count",
        "rpcordma.position",
        "rpc.procedure",
    ];
    let mut cmd = std::process::Command::new("tshark");
    cmd.arg("-r")
        .arg(pcap)
        .args(["-Y", "rpcordma", "-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = match cmd.output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!("tshark failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            println!("SKIP tshark cross-check: tshark is not installed");
            return;
        }
    };
    let theirs: Vec<Vec<String>> = out
        .lines()
        .map(|l| {
            l.split('\t')
                .map(|f| f.split(',').next().unwrap_or("").to_string())
                .collect()
        })
        .collect();
    let proc_num = |n: &str| match n {
        "RDMA_MSG" => 0,
        "RDMA_NOMSG" => 1,
        "RDMA_MSGP" => 2,
        "RDMA_DONE" => 3,
        _ => 4,
    };
    let ours: Vec<Vec<String>> = d
        .messages
        .iter()
        .filter_map(|m| match &m.body {
            Body::Rdmap(r) => match &r.upper {
                Some(Upper::Rpcrdma(h)) if h.vers == 1 => Some((m.frame, h)),
                _ => None,
            },
            _ => None,
        })
        .map(|(frame, h)| {
            let nreads: usize = h.reads.iter().map(|c| c.segments.len()).sum();
            vec![
                frame.to_string(),
                format!("{:#010x}", h.xid),
                h.vers.to_string(),
                h.credits.to_string(),
                proc_num(h.proc_name).to_string(),
                nreads.to_string(),
                h.writes.len().to_string(),
                usize::from(h.reply_chunk.is_some()).to_string(),
                h.reads
                    .first()
                    .map(|c| c.position.to_string())
                    .unwrap_or_default(),
                h.rpc
                    .as_ref()
                    .and_then(|c| c.proc_num)
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    assert!(!theirs.is_empty(), "tshark decoded no RPC-over-RDMA");
    assert_eq!(
        ours.len(),
        theirs.len(),
        "frames decoded: {ours:?} vs {theirs:?}"
    );
    for (o, t) in ours.iter().zip(&theirs) {
        for (i, f) in fields.iter().enumerate() {
            // tshark leaves the procedure out where it did not decode the RPC.
            if t[i].is_empty() && *f == "rpc.procedure" {
                continue;
            }
            assert_eq!(
                o[i], t[i],
                "{f} of frame {}: ours {o:?}, tshark {t:?}",
                o[0]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_and_long_replies_decode_from_chunk_data() {
    let s = tokio::time::timeout(
        Duration::from_secs(60),
        nfs_session_with(VersionPolicy::V1, true, true),
    )
    .await
    .expect("session timed out");
    let d = decoded(&s, "nfs-long.pcap");
    tshark_cross_check(&s.pcap, &d);
    let hdrs = rpcrdma(&d);
    // The 5 KB COMPOUND went as RDMA_NOMSG with a Position-Zero Read chunk; its RPC message
    // was decoded from the RDMA Read Response data.
    let long_call = hdrs
        .iter()
        .find(|r| r.rpc_from == Some("read chunk"))
        .expect("no Long Call decoded");
    assert_eq!(long_call.proc_name, "RDMA_NOMSG");
    assert_eq!(long_call.reads[0].position, 0);
    let rpc = long_call.rpc.as_ref().unwrap();
    assert_eq!(rpc.proc_name.as_deref(), Some("NFSv4 COMPOUND"));
    assert_eq!(rpc.nfs.as_ref().unwrap().ops.len(), 21);
    // The READDIRPLUS of 63 entries came back as RDMA_NOMSG through the Reply chunk, written
    // before the Send.
    let long_reply = hdrs
        .iter()
        .find(|r| r.rpc_from == Some("reply chunk"))
        .expect("no Long Reply decoded");
    let rpc = long_reply.rpc.as_ref().unwrap();
    assert_eq!(rpc.kind, "reply");
    assert_eq!(rpc.proc_name.as_deref(), Some("NFSv3 READDIRPLUS"));
    assert_eq!(rpc.nfs.as_ref().unwrap().status, Some(0));
    let (rpcs, _) = timeline::build(&d.messages);
    let t = rpcs
        .iter()
        .find(|t| t.xid == long_reply.xid)
        .expect("no timeline for the Long Reply");
    assert!(t.rdma.iter().any(|o| o.op == "Write" && o.chunk == "reply"));
}

/// The same traffic captured by the kernel instead of our tee: `dumpcap` (Wireshark's capture
/// tool, as tcpdump would) on the loopback interface writes pcapng with real TCP segments
/// (ACKs, coalesced and split writes). Skipped, with the reason printed, without dumpcap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_pcapng_capture_of_the_loopback_decodes() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    let mut cfg = ServeConfig::new(&export);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    let served = start(cfg).await.unwrap();
    let port = served.rdma_addr.unwrap().port();
    // UDP datagrams to this socket tell when dumpcap really captures.
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let probe_port = probe.local_addr().unwrap().port();
    let file = dir.path().join("lo.pcapng");
    let filter = format!("tcp port {port} or udp port {probe_port}");
    let child = Command::new("dumpcap")
        .args(["-i", "lo", "-q", "-f", &filter, "-w"])
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("SKIP kernel capture: dumpcap is not installed");
        served.shutdown().await;
        return;
    };
    // dumpcap says "Capturing on ..." once it captures.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let started = tokio::task::spawn_blocking(move || {
        while err.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("Capturing on") {
                return Ok(err);
            }
            line.clear();
        }
        Err(line)
    })
    .await
    .unwrap();
    let Ok(_stderr) = started else {
        println!("SKIP kernel capture: dumpcap could not capture on lo");
        let _ = child.kill();
        served.shutdown().await;
        return;
    };
    // "Capturing on" comes before the capture does: probe until a datagram is in the file
    // (bounded).
    let mut capturing = false;
    for _ in 0..100 {
        let _ = probe.send_to(b"probe", probe.local_addr().unwrap());
        if decode::decode_path(&file).is_ok_and(|d| d.frames.not_tcp > 0) {
            capturing = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(capturing, "dumpcap never captured the probe datagrams");
    let tcp: Arc<dyn RpcTransport> =
        Arc::new(TcpClient::connect(served.nfs_addr.unwrap()).await.unwrap());
    let root = MountClient::new(tcp).mnt("/").await.unwrap();
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let tc = TransportConfig {
        reconnect_attempts: 0,
        ..TransportConfig::default()
    };
    let rdma = Arc::new(
        RdmaClient::connect_with(served.rdma_addr.unwrap(), tc, vec![ulb], None)
            .await
            .unwrap(),
    );
    let c = Nfs3Client::new(rdma.clone()).with_auth_sys(0, 0, vec![]);
    c.null().await.unwrap();
    let fh = c
        .create(&root, b"k", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let data = pattern(100_000);
    c.write_all(&fh, &data, 1 << 20).await.unwrap();
    assert_eq!(c.read_all(&fh, 1 << 20).await.unwrap(), data);
    rdma.disconnect().await;
    served.shutdown().await;
    // dumpcap reads the kernel's buffer in batches and writes them as it goes: wait (bounded)
    // until the file holds the connection's end, then SIGINT makes it finish the file.
    let ended = |d: &Decoded| {
        d.messages
            .iter()
            .filter_map(text::rpcrdma_of)
            .filter_map(|r| r.rpc.as_ref())
            .any(|c| c.kind == "reply" && c.proc_name.as_deref() == Some("NFSv3 READ"))
    };
    for _ in 0..100 {
        if decode::decode_path(&file).is_ok_and(|d| ended(&d)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    if let Some(keep) = std::env::var_os("OXRDMA_DECODE_KEEP") {
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(&file, Path::new(&keep).join("lo.pcapng"));
    }
    let d = decode::decode_path(&file).unwrap();
    let iwarp: Vec<_> = d.streams.iter().filter(|s| s.protocol == "iwarp").collect();
    assert_eq!(iwarp.len(), 1, "{:?}", d.streams);
    assert!(d.messages.iter().all(|m| !matches!(
        m.body,
        Body::Gap { .. } | Body::Error { .. } | Body::Resync { .. }
    )));
    let names = call_names(&d);
    for want in ["NFSv3 NULL", "NFSv3 CREATE", "NFSv3 WRITE", "NFSv3 READ"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    let (rpcs, _) = timeline::build(&d.messages);
    assert!(rpcs.iter().all(|t| t.elapsed_us.is_some_and(|e| e >= 0.0)));
    let read = rpcs
        .iter()
        .find(|t| t.proc_name.as_deref() == Some("NFSv3 READ"))
        .unwrap();
    assert_eq!(
        read.rdma
            .iter()
            .filter(|o| o.op == "Write")
            .map(|o| o.len)
            .sum::<u64>(),
        100_000
    );
    tshark_cross_check(&file, &d);
}
