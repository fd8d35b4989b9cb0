//! `oxrdma rpc … --rdma`: serve-null on both transports at once, bench against it over both
//! (with the RDMA ÷ TCP ratio), and `bench --self` (in-process servers on both transports).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills the server when the test ends, however it ends.
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

fn run_ok(args: &[&str]) -> String {
    let out = oxrdma()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("oxrdma runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    text
}

/// The table row for `scheme`: (calls, errors) parsed from its columns.
fn row(text: &str, scheme: &str) -> (u64, u64) {
    let line = text
        .lines()
        .find(|l| l.starts_with(scheme))
        .unwrap_or_else(|| panic!("no {scheme} row in {text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols.len(), 10, "{line:?}");
    (cols[1].parse().unwrap(), cols[2].parse().unwrap())
}

fn ratio_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.starts_with("rdma ÷ tcp: calls/s "))
        .unwrap_or_else(|| panic!("no ratio line in {text}"))
}

#[test]
fn serve_null_on_both_transports_and_bench_rdma() {
    let mut child = oxrdma()
        .args([
            "rpc",
            "serve-null",
            "--rdma",
            "127.0.0.1:0",
            "--tcp",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("oxrdma starts");
    let stdout = child.stdout.take().expect("stdout piped");
    let _server = Running(child);
    // "listening tcp://127.0.0.1:PORT prog N vers L-H", then the rdma:// line.
    let mut lines = BufReader::new(stdout).lines();
    let mut addr = |scheme: &str| {
        let line = lines.next().expect("a listening line").expect("readable");
        let a = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.strip_prefix(scheme))
            .unwrap_or_else(|| panic!("expected {scheme} in {line:?}"));
        a.to_string()
    };
    let tcp = addr("tcp://");
    let rdma = addr("rdma://");

    let text = run_ok(&[
        "rpc", "bench", "--rdma", &rdma, "--calls", "300", "--depth", "4",
    ]);
    assert_eq!(row(&text, "rdma://"), (300, 0));
    assert!(text.contains("p99.9 µs"), "{text}");

    let text = run_ok(&[
        "rpc", "bench", "--rdma", &rdma, "--tcp", &tcp, "--calls", "300", "--depth", "4",
    ]);
    assert_eq!(row(&text, "tcp://"), (300, 0));
    assert_eq!(row(&text, "rdma://"), (300, 0));
    ratio_line(&text);
}

#[test]
fn bench_self_compares_rdma_with_tcp() {
    let text = run_ok(&["rpc", "bench", "--self", "--calls", "300", "--depth", "8"]);
    assert_eq!(row(&text, "tcp://127.0.0.1:"), (300, 0));
    assert_eq!(row(&text, "rdma://127.0.0.1:"), (300, 0));
    let line = ratio_line(&text);
    let x: f64 = line
        .trim_start_matches("rdma ÷ tcp: calls/s ")
        .split('×')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("ratio in {line:?}"));
    assert!(x > 0.0, "{line}");

    let json = run_ok(&[
        "rpc", "bench", "--self", "--calls", "200", "--depth", "2", "--json",
    ]);
    assert!(
        json.starts_with("{\"runs\":[{\"target\":\"tcp://"),
        "{json}"
    );
    assert!(json.contains("{\"target\":\"rdma://"), "{json}");
    assert!(
        json.contains("\"rdma_over_tcp\":{\"calls_per_sec\":"),
        "{json}"
    );
    assert_eq!(json.matches("\"errors\":0").count(), 2, "{json}");
}
