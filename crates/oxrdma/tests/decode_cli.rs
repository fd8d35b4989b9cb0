//! `oxrdma decode` end to end: a capture of RDS over TCP written with the project's capture
//! writer, printed as lines, in detail, as JSON, filtered; and a file that is not a capture.

use std::net::SocketAddr;
use std::process::Command;

use bytes::Bytes;
use rds::wire::{ExtList, Header, Message, ping, pong};
use verbs::capture::{Capture, Dir};

fn oxrdma() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxrdma"))
}

fn rds(h: Header, payload: &'static [u8]) -> Vec<u8> {
    Message {
        header: h,
        payload: Bytes::from_static(payload),
    }
    .encode()
    .unwrap()
    .to_vec()
}

fn capture(dir: &std::path::Path) -> std::path::PathBuf {
    let local: SocketAddr = "127.0.0.1:40002".parse().unwrap();
    let peer: SocketAddr = "127.0.0.1:16385".parse().unwrap();
    let mut c = Capture::create(dir, local, peer, true).unwrap();
    c.record(Dir::Out, &rds(ping(1, 4000), b"")).unwrap();
    c.record(Dir::In, &rds(pong(1, 4000, ExtList::new()), b""))
        .unwrap();
    let data = Header {
        seq: 2,
        sport: 4000,
        dport: 4001,
        ..Header::default()
    };
    c.record(Dir::Out, &rds(data, b"hello")).unwrap();
    c.close().unwrap();
    c.path().to_path_buf()
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = oxrdma().arg("decode").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn decode_prints_lines_detail_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = capture(dir.path());
    let p = path.to_str().unwrap();
    let (ok, out, err) = run(&[p]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].contains("RDS ping seq=1"), "{out}");
    assert!(lines[1].contains("RDS pong seq=1"), "{out}");
    assert!(lines[2].contains("RDS data seq=2 len=5 4000→4001"), "{out}");
    assert!(err.contains("3 messages"), "{err}");

    let (ok, out, _) = run(&[p, "-V"]);
    assert!(ok);
    assert!(
        out.contains("    sport: 4000") && out.contains("layer: rds_tcp"),
        "{out}"
    );

    let (ok, out, _) = run(&[p, "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["streams"][0]["protocol"], "rds_tcp");
    assert_eq!(v["messages"].as_array().unwrap().len(), 3);
    assert_eq!(v["messages"][2]["kind"], "data");

    let (ok, out, _) = run(&[p, "--stream", "1"]);
    assert!(ok && out.is_empty(), "{out}");

    let (ok, out, _) = run(&[p, "--rpc"]);
    assert!(ok && out.contains("procedure"), "{out}");
}

#[test]
fn decode_refuses_a_file_that_is_not_a_capture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pcap");
    std::fs::write(&path, b"not a capture at all").unwrap();
    let (ok, _, err) = run(&[path.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a pcap or pcapng file"), "{err}");
}
