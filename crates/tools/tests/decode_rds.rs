//! `tools::decode` on RDS over TCP: the test builds RDS messages with the `rds::wire` encoders
//! (a multipath probe and its pong, a ping and pong, a congestion map, data with extension
//! headers, a message larger than one segment), writes them with the project's capture writer
//! (`verbs::capture::Capture`) as a connection to port 16385, and checks that the decoded
//! sequence is what it sent; then cuts a segment and checks the gap and the resync. Also the
//! decoder's robustness properties: no panic on any input, and the same messages whatever the
//! segmentation.

use std::net::SocketAddr;

use bytes::Bytes;
use proptest::prelude::*;
use rds::wire::{
    CongMap, ExtList, Extension, Header, Message as RdsMessage, flags, ping, pong, probe,
};
use tools::decode::model::{Body, RdsInfo};
use tools::decode::{self, tcp::Side};
use verbs::capture::{Capture, Dir};

fn msg(h: Header, payload: &[u8]) -> Vec<u8> {
    RdsMessage {
        header: h,
        payload: Bytes::copy_from_slice(payload),
    }
    .encode()
    .unwrap()
    .to_vec()
}

/// What the decoder must say of a message: kind, seq, sport, dport, len.
type Expect = (&'static str, u64, u16, u16, u32);

/// The messages of one RDS-over-TCP connection: (direction, bytes, what the decoder must say:
/// kind, seq, sport, dport, len).
fn script() -> Vec<(Dir, Vec<u8>, Expect)> {
    let mut cong = CongMap::new();
    cong.set(7, true);
    cong.set(4001, true);
    let data_hdr = Header {
        seq: 2,
        sport: 4000,
        dport: 4001,
        flags: flags::ACK_REQUIRED,
        ext: ExtList {
            items: vec![Extension::RdmaBytes {
                bytes: 8192,
                flags: 1,
            }],
        },
        ..Header::default()
    };
    let big_hdr = Header {
        seq: 3,
        sport: 4000,
        dport: 4001,
        ..Header::default()
    };
    let pong_ext = ExtList {
        items: vec![Extension::Npaths(8), Extension::GenNum(0x1234)],
    };
    vec![
        (
            Dir::Out,
            msg(probe(1, 8, 0xabcd), b""),
            ("probe", 1, 1, 0, 0),
        ),
        (
            Dir::In,
            msg(pong(1, 1, pong_ext), b""),
            ("pong", 1, 0, 1, 0),
        ),
        (
            Dir::Out,
            msg(CongMap::header(), &cong.encode()),
            ("cong_map", 0, 0, 0, 8192),
        ),
        (
            Dir::Out,
            msg(data_hdr, &[7u8; 100]),
            ("data", 2, 4000, 4001, 100),
        ),
        (Dir::Out, msg(ping(5, 4000), b""), ("ping", 5, 4000, 0, 0)),
        (
            Dir::In,
            msg(pong(2, 4000, ExtList::new()), b""),
            ("pong", 2, 0, 4000, 0),
        ),
        (
            Dir::Out,
            msg(big_hdr, &[9u8; 100_000]),
            ("data", 3, 4000, 4001, 100_000),
        ),
        (
            Dir::In,
            msg(
                Header {
                    seq: 3,
                    sport: 4001,
                    dport: 4000,
                    ..Header::default()
                },
                b"answer",
            ),
            ("data", 3, 4001, 4000, 6),
        ),
        (
            Dir::Out,
            msg(
                Header {
                    seq: 4,
                    sport: 4000,
                    dport: 4001,
                    ..Header::default()
                },
                b"tail",
            ),
            ("data", 4, 4000, 4001, 4),
        ),
        (Dir::Out, msg(ping(6, 4000), b""), ("ping", 6, 4000, 0, 0)),
    ]
}

fn write_capture(dir: &std::path::Path) -> std::path::PathBuf {
    let local: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    let peer: SocketAddr = "127.0.0.1:16385".parse().unwrap();
    let mut c = Capture::create(dir, local, peer, true).unwrap();
    for (d, bytes, _) in script() {
        c.record(d, &bytes).unwrap();
    }
    c.close().unwrap();
    // OXRDMA_DECODE_KEEP=DIR keeps a copy (for `oxrdma decode` and the fuzz corpus).
    if let Some(keep) = std::env::var_os("OXRDMA_DECODE_KEEP") {
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(c.path(), std::path::Path::new(&keep).join("rds-tcp.pcap"));
    }
    c.path().to_path_buf()
}

fn rds_of(m: &decode::Message) -> Option<&RdsInfo> {
    match &m.body {
        Body::RdsTcp(r) => Some(r),
        _ => None,
    }
}

#[test]
fn rds_over_tcp_decodes_what_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_capture(dir.path());
    let d = decode::decode_path(&path).unwrap();
    assert_eq!(d.streams.len(), 1);
    assert_eq!(d.streams[0].protocol, "rds_tcp");
    let got: Vec<(Side, Expect)> = d
        .messages
        .iter()
        .filter_map(|m| rds_of(m).map(|r| (m.side, (r.kind, r.seq, r.sport, r.dport, r.len))))
        .collect();
    let want: Vec<(Side, Expect)> = script()
        .into_iter()
        .map(|(dir, _, w)| {
            let side = match dir {
                Dir::Out => Side::Client,
                Dir::In => Side::Server,
            };
            (side, w)
        })
        .collect();
    assert_eq!(got, want);
    let all: Vec<&RdsInfo> = d.messages.iter().filter_map(rds_of).collect();
    assert_eq!(all[0].extensions, ["NPATHS(8)", "GEN_NUM(0xabcd)"]);
    assert_eq!(all[1].extensions, ["NPATHS(8)", "GEN_NUM(0x1234)"]);
    assert_eq!(all[2].congested_ports.as_deref(), Some(&[7u16, 4001][..]));
    assert_eq!(all[3].extensions, ["RDMA_BYTES(8192,flags=1)"]);
    assert_eq!(all[3].flags, flags::ACK_REQUIRED);
}

#[test]
fn rds_gap_is_reported_and_decoding_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_capture(dir.path());
    let pcap = std::fs::read(path).unwrap();
    // Records: 24-byte header, then 16-byte record headers. Cut the second segment of the
    // 100 000-byte message (frames: 3 handshake, 6 messages, then the big one in two).
    let mut out = pcap[..24].to_vec();
    let (mut off, mut i) = (24, 0);
    while off + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[off + 8..off + 12].try_into().unwrap()) as usize;
        if i != 10 {
            out.extend_from_slice(&pcap[off..off + 16 + len]);
        }
        off += 16 + len;
        i += 1;
    }
    let d = decode::decode(&out).unwrap();
    let kinds: Vec<String> = d
        .messages
        .iter()
        .filter(|m| m.side == Side::Client)
        .map(|m| match &m.body {
            Body::RdsTcp(r) => format!("{}:{}", r.kind, r.seq),
            Body::Gap { missing } => format!("gap:{missing}"),
            Body::Resync { .. } => "resync".to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    // The big message is lost with its second segment; the decoder finds the next header
    // (confirmed by the one after it) and goes on.
    assert_eq!(
        kinds,
        [
            "probe:1",
            "cong_map:0",
            "data:2",
            "ping:5",
            &format!("gap:{}", 48 + 100_000 - 65495),
            "resync",
            "data:4",
            "ping:6"
        ]
    );
    // The other direction is untouched.
    assert_eq!(
        d.messages
            .iter()
            .filter(|m| m.side == Side::Server && rds_of(m).is_some())
            .count(),
        3
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever bytes a capture holds, decoding it returns (an error or messages), never panics.
    #[test]
    fn any_file_decodes_without_panic(b in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode::decode(&b);
        let mut pcap = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        pcap.extend_from_slice(&[0, 0, 4, 0, 1, 0, 0, 0]);
        pcap.extend_from_slice(&b);
        let _ = decode::decode(&pcap);
    }

    /// Random streams on either protocol's port never panic the stream decoders.
    #[test]
    fn any_stream_decodes_without_panic(
        c in proptest::collection::vec(any::<u8>(), 0..4096),
        s in proptest::collection::vec(any::<u8>(), 0..4096),
        piece in 1usize..600,
    ) {
        let _ = decode::decode_stream(&c, &s, 16385, piece);
        let _ = decode::decode_stream(&c, &s, 20049, piece);
        let mut mpa = verbs::wire::mpa::REQ_KEY.to_vec();
        mpa.extend_from_slice(&c);
        let _ = decode::decode_stream(&mpa, &s, 20049, piece);
    }

    /// The RDS stream decodes to the same messages however TCP cut it.
    #[test]
    fn segmentation_does_not_change_rds_messages(piece in 1usize..5000) {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        for (d, bytes, _) in script() {
            match d {
                Dir::Out => c.extend_from_slice(&bytes),
                Dir::In => s.extend_from_slice(&bytes),
            }
        }
        let bodies = |p| -> Vec<(Side, Body)> {
            let mut v: Vec<(Side, Body)> = decode::decode_stream(&c, &s, 16385, p)
                .into_iter()
                .map(|m| (m.side, m.body))
                .collect();
            // Each side's order is the stream's; the interleaving of the two is not.
            v.sort_by_key(|(side, _)| side.index());
            v
        };
        prop_assert_eq!(bodies(piece), bodies(1 << 20));
    }
}

/// RDS over iWARP: two RDS stacks on soft-iWARP (127.0.0.1 and 127.0.0.2), one capturing;
/// "hello" one way and a 10 000-byte message (three fragments) the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rds_over_iwarp_decodes_what_was_sent() {
    use rds::{RdmaConfig, RdsStack, StackConfig, Transport};
    use std::net::{Ipv4Addr, SocketAddrV4};
    use verbs::{Device, Provider, SoftIwarpConfig};
    let (a_ip, b_ip) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::open(Provider::SoftIwarp(SoftIwarpConfig {
        capture_dir: Some(dir.path().to_path_buf()),
        ..SoftIwarpConfig::default()
    }));
    let stacks = async {
        for _ in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap_or(0);
            let rc = RdmaConfig {
                device: Some(dev.clone()),
                port,
                ..RdmaConfig::default()
            };
            let cfg = |ip| {
                let mut c = StackConfig::new(ip);
                c.transport = Transport::Rdma(rc.clone());
                c
            };
            let Ok(a) = RdsStack::start(cfg(a_ip)).await else {
                continue;
            };
            match RdsStack::start(cfg(b_ip)).await {
                Ok(b) => return (a, b),
                Err(_) => a.shutdown(),
            }
        }
        panic!("no free port");
    };
    let (a, b) = stacks.await;
    let (sa, sb) = (a.bind(4000).unwrap(), b.bind(4001).unwrap());
    let (da, db) = (SocketAddrV4::new(a_ip, 4000), SocketAddrV4::new(b_ip, 4001));
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        sa.send_to(db, Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(&sb.recv_from().await.unwrap().0[..], b"hello");
        sb.send_to(da, Bytes::from(vec![5u8; 10_000]))
            .await
            .unwrap();
        assert_eq!(sa.recv_from().await.unwrap().0.len(), 10_000);
    })
    .await
    .expect("RDS over iWARP timed out");
    a.shutdown();
    b.shutdown();
    // Both ends capture; the initiator's file (127.0.0.1 connects) is enough. Wait for the
    // stacks to close their connections (bounded: the FINs are the writer's last records).
    let mut found = None;
    for _ in 0..100 {
        let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with("client.pcap"))
            .collect();
        if let Some(f) = files.first() {
            let d = decode::decode_path(f).unwrap();
            let datas = d
                .messages
                .iter()
                .filter_map(|m| match &m.body {
                    Body::Rdmap(r) => match &r.upper {
                        Some(tools::decode::model::Upper::Rds(i)) if i.kind == "data" => Some(i),
                        _ => None,
                    },
                    _ => None,
                })
                .count();
            if datas >= 4 {
                found = Some(d);
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let d = found.expect("no complete capture of the RDS connection");
    let mpa: Vec<_> = d
        .messages
        .iter()
        .filter_map(|m| match &m.body {
            Body::Mpa(i) => Some(i),
            _ => None,
        })
        .collect();
    assert!(
        mpa.iter()
            .all(|m| matches!(m.private, Some(tools::decode::model::Private::Rds { .. })))
    );
    let frags: Vec<(u16, u16, u32, Option<u32>)> = d
        .messages
        .iter()
        .filter_map(|m| match &m.body {
            Body::Rdmap(r) => match &r.upper {
                Some(tools::decode::model::Upper::Rds(i)) if i.kind == "data" => {
                    Some((i.sport, i.dport, i.len, i.fragment_len))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert!(frags.contains(&(4000, 4001, 5, None)), "{frags:?}");
    let big: Vec<_> = frags.iter().filter(|f| f.2 == 10_000).collect();
    assert_eq!(
        big.iter().map(|f| f.3).collect::<Vec<_>>(),
        [Some(4096), Some(4096), Some(1808)],
        "{frags:?}"
    );
}
