//! `oxrdma rds …` end to end: `rds ping` against `rds listen` (two processes on 127.0.0.1 and
//! 127.0.0.2), and `rds stress --self -T 1` with its rds-stress columns and nonzero rates.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills the node when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn oxrdma() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxrdma"))
}

/// A transport port free on 127.0.0.1 (both nodes use it, on different addresses).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn rds_ping_against_listen() {
    let port = free_port().to_string();
    let child = oxrdma()
        .args(["rds", "listen", "127.0.0.2", "--tport", &port])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("oxrdma starts");
    let mut node = Running(child);
    let stdout = node.0.stdout.take().expect("stdout piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    assert!(
        line.starts_with("listening rds://127.0.0.2:4000"),
        "{line:?}"
    );
    let out = oxrdma()
        .args([
            "rds",
            "ping",
            "127.0.0.2",
            "--local",
            "127.0.0.1",
            "--tport",
            &port,
        ])
        .args(["-c", "3", "-i", "0.05"])
        .output()
        .expect("rds ping runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "   N: RTT usec" per pong.
    let rtts: Vec<u64> = text
        .lines()
        .filter_map(|l| l.trim().strip_suffix(" usec"))
        .filter_map(|l| l.split(": ").nth(1))
        .filter_map(|v| v.parse().ok())
        .collect();
    assert_eq!(rtts.len(), 3, "{text}");
    assert!(rtts.iter().all(|&r| r > 0), "{text}");
    assert!(text.contains("3 pings sent, 3 received, 0% loss"), "{text}");
}

#[test]
fn rds_stress_self_reports_columns() {
    stress_self("tcp", "rds");
}

#[test]
fn rds_stress_self_over_rdma_reports_columns() {
    stress_self("rdma", "rds-rd");
}

fn stress_self(transport: &str, row_name: &str) {
    let out = oxrdma()
        .args([
            "rds", "stress", "--self", "-T", "1", "-q", "1024", "-a", "64", "-d", "2",
        ])
        .args(["--baseline", "--transport", transport])
        .output()
        .expect("rds stress runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = text
        .lines()
        .find(|l| l.contains("tsks"))
        .unwrap_or_else(|| panic!("no header in {text}"));
    let cols: Vec<&str> = head
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cols,
        [
            "tsks",
            "tx/s",
            "rx/s",
            "tx+rx K/s",
            "mbi K/s",
            "mbo K/s",
            "rtt us"
        ],
        "{head}"
    );
    for name in [row_name, "tcp"] {
        let row: Vec<f64> = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row in {text}"))
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().expect("a number"))
            .collect();
        assert_eq!(row.len(), 7, "{text}");
        assert_eq!(row[0], 1.0, "tasks: {text}");
        assert!(
            row[1] > 0.0 && row[2] > 0.0 && row[3] > 0.0,
            "rates: {text}"
        );
        assert!(row[6] > 0.0, "rtt: {text}");
    }
}

/// rds-stress -D over RDS/RDMA: every request advertises a buffer, the responder RDMA-writes
/// 8 KiB into it before acking, and the requester counts the bytes once the ack completing
/// the operation arrived and they checked out: mbi (requester) equals mbo (responder).
#[test]
fn rds_stress_rdma_size_fills_mbi_and_mbo() {
    let out = oxrdma()
        .args([
            "rds",
            "stress",
            "--self",
            "-T",
            "1",
            "-q",
            "512",
            "-a",
            "64",
            "-d",
            "4",
            "-D",
            "8192",
            "--transport",
            "rdma",
        ])
        .output()
        .expect("rds stress runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Vec<f64> = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("rds-rd"))
        .unwrap_or_else(|| panic!("no rds-rd row in {text}"))
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().expect("a number"))
        .collect();
    let (acks_per_s, mbi, mbo) = (row[2], row[4], row[5]);
    assert!(acks_per_s > 0.0 && mbi > 0.0, "{text}");
    // 8 KiB per acked request, checked.
    assert!((mbi - acks_per_s * 8.0).abs() <= 8.0 + mbi * 0.01, "{text}");
    // The responder wrote at least what was checked (the last writes may miss the deadline).
    assert!(mbo >= mbi, "{text}");
}

#[test]
fn rds_stress_rdma_size_needs_rdma() {
    let out = oxrdma()
        .args(["rds", "stress", "--self", "-T", "1", "-D", "4096"])
        .output()
        .expect("rds stress runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-D needs --transport rdma"), "{err}");
}

#[test]
fn rds_stress_rdma_size_needs_room_for_the_address() {
    let out = oxrdma()
        .args([
            "rds",
            "stress",
            "--self",
            "--transport",
            "rdma",
            "-T",
            "1",
            "-q",
            "4",
            "-D",
            "4096",
        ])
        .output()
        .expect("rds stress runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-D needs -q of at least 8"), "{err}");
}
