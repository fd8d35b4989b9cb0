//! `oxrdma perf …` end to end: the bandwidth columns for write, read and send in-process, the
//! latency columns with `--lat`, JSON, and the two-process `--listen` / `--connect` pair. Sizes
//! and iterations are tiny: these check the tool works, not how fast.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

/// Kills the server when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn oxrdma(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(args)
        .output()
        .expect("oxrdma runs");
    assert!(
        out.status.success(),
        "oxrdma {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The numeric rows of a table: lines that start with a number.
fn rows(stdout: &[u8]) -> Vec<Vec<f64>> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            l.split_whitespace()
                .map(|f| f.parse::<f64>().expect("numeric column"))
                .collect()
        })
        .collect()
}

fn check_bw(stdout: &[u8], sizes: &[f64], iters: f64) {
    let text = String::from_utf8_lossy(stdout);
    for col in [
        "#bytes",
        "#iterations",
        "BW peak[MB/sec]",
        "BW average[MB/sec]",
        "MsgRate[Mpps]",
        "TCP[MB/sec]",
        "ratio",
    ] {
        assert!(text.contains(col), "missing column {col}:\n{text}");
    }
    let rows = rows(stdout);
    assert_eq!(rows.len(), sizes.len(), "{text}");
    for (row, size) in rows.iter().zip(sizes) {
        assert_eq!(row.len(), 7, "{text}");
        assert_eq!((row[0], row[1]), (*size, iters));
        assert!(row[2..].iter().all(|v| *v > 0.0), "zero figure:\n{text}");
        assert!(row[2] >= row[3], "peak below average:\n{text}");
    }
}

#[test]
fn bandwidth_columns_for_each_op() {
    for op in ["write", "read", "send"] {
        let out = oxrdma(&["perf", op, "--size", "4096", "--iters", "50", "--self"]);
        check_bw(&out.stdout, &[4096.0], 50.0);
    }
}

#[test]
fn latency_columns() {
    for op in ["write", "send"] {
        let out = oxrdma(&["perf", op, "--lat", "--iters", "20"]);
        let text = String::from_utf8_lossy(&out.stdout);
        for col in [
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "99% percentile[usec]",
        ] {
            assert!(text.contains(col), "missing column {col}:\n{text}");
        }
        let rows = rows(&out.stdout);
        assert_eq!(rows.len(), 1, "{text}");
        let r = &rows[0];
        assert_eq!((r[0], r[1]), (2.0, 20.0));
        assert!(r[2..].iter().all(|v| *v > 0.0), "zero figure:\n{text}");
        assert!(
            r[2] <= r[4] && r[4] <= r[3],
            "min <= typical <= max:\n{text}"
        );
    }
}

#[test]
fn json_rows() {
    let out = oxrdma(&["perf", "read", "--size", "1024", "--iters", "20", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("{\"op\":\"RDMA_Read\",\"test\":\"bw\""),
        "{text}"
    );
    assert!(text.contains("\"bytes\":1024,\"iterations\":20,"), "{text}");
    assert!(!text.contains("null"), "{text}");
}

#[test]
fn listen_and_connect_in_two_processes() {
    for op in ["write", "send"] {
        let child = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
            .args(["perf", op, "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("oxrdma starts");
        let mut server = Running(child);
        let mut line = String::new();
        BufReader::new(server.0.stdout.take().expect("stdout piped"))
            .read_line(&mut line)
            .expect("server prints its address");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .expect("listening line")
            .to_string();
        let out = oxrdma(&[
            "perf",
            op,
            "--connect",
            &addr,
            "--size",
            "8192",
            "--iters",
            "30",
        ]);
        check_bw(&out.stdout, &[8192.0], 30.0);
        let status = server.0.wait().expect("server exits");
        assert!(status.success(), "server exits cleanly after the client");
    }
}

/// `--provider` picks the RDMA provider for the whole command: `soft-iwarp` runs (and the
/// header names it); an unknown spec, or `rdma-core` in a build without the feature or on a
/// machine without a device, is refused up front with the reason.
#[test]
fn provider_flag_selects_or_refuses() {
    let out = oxrdma(&[
        "--provider",
        "soft-iwarp",
        "perf",
        "write",
        "--self",
        "-s",
        "4096",
        "-n",
        "20",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("soft-iwarp"),
        "header names the provider: {text}"
    );
    assert_eq!(rows(&out.stdout).len(), 1, "one result row: {text}");

    let bad = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["--provider", "bogus", "perf", "write", "--self"])
        .output()
        .expect("oxrdma runs");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("unknown provider"), "{err}");

    let hw = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["--provider", "rdma-core", "perf", "write", "--self"])
        .output()
        .expect("oxrdma runs");
    let err = String::from_utf8_lossy(&hw.stderr);
    if hw.status.success() {
        // A build with the feature on a machine with a device: it ran over that device.
        assert!(
            String::from_utf8_lossy(&hw.stdout).contains("rdma-core"),
            "{err}"
        );
    } else {
        assert!(err.contains("no RDMA device"), "{err}");
    }
}
