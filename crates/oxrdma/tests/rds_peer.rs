//! `oxrdma rds peer` end to end against an in-process remote node on 127.0.0.2 (the role the
//! kernel's rds_tcp plays in the interop lab). Each mode runs as its own process, one after the
//! other, so the remote node also sees our node restart between them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Output};
use std::time::Duration;

use bytes::Bytes;
use rds::{RdsStack, StackConfig};

const REMOTE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const LOCAL: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// The payload format of `rds peer` and the lab's guest/rds-peer.py.
fn payload(seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size)
        .map(|i| (seq.wrapping_add(i as u64) & 0xff) as u8)
        .collect();
    v[..8].copy_from_slice(&seq.to_be_bytes());
    v
}

async fn peer(port: u16, mode: &[&str]) -> Output {
    let connect = format!("{REMOTE}:{port}");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxrdma"));
    cmd.args(["rds", "peer", "--connect", &connect])
        .args([
            "--local",
            &LOCAL.to_string(),
            "--remote",
            &REMOTE.to_string(),
        ])
        .args(["--connect-timeout", "20"])
        .args(mode);
    tokio::task::spawn_blocking(move || cmd.output().expect("oxrdma runs"))
        .await
        .expect("join")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_congested_send_and_echo_against_a_remote_node() {
    tokio::time::timeout(Duration::from_secs(120), run())
        .await
        .expect("the whole exchange finished within 120 s");
}

async fn run() {
    // A port found free may be taken again before the stack binds it (tests run in parallel):
    // try a few.
    let mut started = None;
    for _ in 0..5 {
        let port = std::net::TcpListener::bind((REMOTE, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut cfg = StackConfig::new(REMOTE);
        cfg.tcp_port = port;
        if let Ok(s) = RdsStack::start(cfg).await {
            started = Some((port, s));
            break;
        }
    }
    let (port, remote) = started.expect("the remote node starts on a free port");

    // The remote node echoes on port 4000.
    let echo_sock = remote.bind(4000).expect("bind 4000");
    let echoer = tokio::spawn(async move {
        loop {
            let Ok((data, src)) = echo_sock.recv_from().await else {
                return;
            };
            if echo_sock.send_to(src, data).await.is_err() {
                return;
            }
        }
    });

    // ping: 10 × 256 B (the defaults), then 20 × 8 KiB, each echo checked by the peer.
    let o = peer(port, &["ping", "--port", "4002", "--to", "4000"]).await;
    let o2 = peer(
        port,
        &[
            "ping", "--port", "4002", "--to", "4000", "--count", "20", "--size", "8192",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", text(&o));
    assert!(o2.status.success(), "{}", text(&o2));
    let out = String::from_utf8_lossy(&o2.stdout);
    assert!(out.contains("CONNECTED 127.0.0.1 -> 127.0.0.2"), "{out}");
    assert!(out.contains("OK ping 8192 count=20"), "{out}");

    // send: 1000 × 8 KiB, one per millisecond or slower, at a port whose 64 KiB receive buffer
    // fills while nobody reads for 1.5 s; the remote node's congestion map (sent once the 9th
    // datagram lands) holds the sender back, and everything arrives, in order.
    let sink = remote.bind(4020).expect("bind 4020");
    sink.set_rcvbuf(64 * 1024);
    let n = 1000u64;
    let sender = tokio::spawn(peer(
        port,
        &[
            "send",
            "--port",
            "4003",
            "--to",
            "4020",
            "--count",
            "1000",
            "--size",
            "8192",
            "--interval",
            "0.001",
            "--linger",
            "0.2",
            "--timeout",
            "20",
        ],
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..n {
        let (data, src) = sink
            .recv_timeout(Duration::from_secs(30))
            .await
            .expect("recv")
            .unwrap_or_else(|| panic!("datagram #{i} never came"));
        assert_eq!(src, SocketAddrV4::new(LOCAL, 4003));
        assert_eq!(&data[..], &payload(i, 8192)[..], "datagram #{i}");
    }
    let o = sender.await.expect("join");
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("OK send 8192 count=1000"), "{out}");
    eprintln!("{out}");
    // The remote node marked 4020 congested and its map held the sender back.
    let waits: u64 = out
        .split("congested_waits=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no congested_waits= in {out}"));
    assert!(
        waits > 0,
        "the congestion map never held a send back: {out}"
    );

    // echo: the remote node pings our echo port; three round trips, then the peer exits. RDS
    // drops a datagram for a port nobody has bound, so the remote node waits for the peer's
    // "echo bound" line before it sends.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["rds", "peer", "--connect", &format!("{REMOTE}:{port}")])
        .args([
            "--local",
            &LOCAL.to_string(),
            "--remote",
            &REMOTE.to_string(),
        ])
        .args(["--connect-timeout", "20"])
        .args(["echo", "--port", "4001", "--count", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("oxrdma runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = Vec::new();
        let mut bound_tx = Some(bound_tx);
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("echo bound")
                && let Some(tx) = bound_tx.take()
            {
                let _ = tx.send(());
            }
            lines.push(line);
        }
        lines.join("\n")
    });
    tokio::time::timeout(Duration::from_secs(40), bound_rx)
        .await
        .expect("the echo peer bound its port within 40 s")
        .expect("the echo peer printed 'echo bound'");
    let pinger = remote.bind(4100).expect("bind 4100");
    let target = SocketAddrV4::new(LOCAL, 4001);
    for i in 0..3u64 {
        let msg = Bytes::from(payload(i, 300));
        tokio::time::timeout(Duration::from_secs(30), pinger.send_to(target, msg.clone()))
            .await
            .expect("send within 30 s")
            .expect("send");
        let (back, src) = pinger
            .recv_timeout(Duration::from_secs(30))
            .await
            .expect("recv")
            .unwrap_or_else(|| panic!("no echo #{i}; remote node: {:#?}", remote.info()));
        assert_eq!(src, target);
        assert_eq!(back, msg, "echo #{i}");
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    let out = reader.join().expect("reader");
    assert!(status.success(), "status {status:?}\n{out}");
    assert!(out.contains("OK echo 3 datagrams"), "{out}");
    echoer.abort();
    remote.shutdown();
}

#[test]
fn the_lower_address_must_be_ours() {
    let o = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["rds", "peer", "--connect", "127.0.0.1:9"])
        .args(["--local", "10.0.2.15", "--remote", "10.0.2.2"])
        .args(["ping", "--port", "1", "--to", "2"])
        .output()
        .expect("oxrdma runs");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("must be lower than --remote"), "{err}");
}
