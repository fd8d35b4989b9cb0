//! `oxrdma rpc …` end to end: `serve-null` answers libtirpc's `rpcinfo` (skipped, with the
//! reason printed, when rpcinfo is not installed) and `bench --self` reports its calls.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const PROG: &str = "536871065"; // 0x20000099, the CLI's default test program

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

/// Start `oxrdma rpc serve-null` on a free port; returns it and the port it printed.
fn serve_null(extra: &[&str]) -> (Running, u16) {
    let child = oxrdma()
        .args(["rpc", "serve-null", "--tcp", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("oxrdma starts");
    let mut running = Running(child);
    let stdout = running.0.stdout.take().expect("stdout piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    // "listening tcp://127.0.0.1:PORT prog N vers L-H"
    let addr = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.strip_prefix("tcp://"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (running, port)
}

fn rpcinfo() -> Option<PathBuf> {
    ["/usr/sbin/rpcinfo", "/usr/bin/rpcinfo", "/sbin/rpcinfo"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// libtirpc's `rpcinfo -n PORT -t` still consults the portmapper on 111; `-a UADDR -T tcp`
/// calls the universal address `h1.h2.h3.h4.p1.p2` directly.
fn run_rpcinfo(bin: &PathBuf, port: u16, vers: &str) -> (bool, String) {
    let uaddr = format!("127.0.0.1.{}.{}", port >> 8, port & 0xff);
    let out = Command::new(bin)
        .args(["-a", &uaddr, "-T", "tcp", PROG, vers])
        .stdin(Stdio::null())
        .output()
        .expect("rpcinfo runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    (out.status.success(), text)
}

#[test]
fn rpcinfo_pings_serve_null() {
    let Some(bin) = rpcinfo() else {
        println!("SKIP: rpcinfo not installed (apt-get install rpcbind)");
        return;
    };
    let (_server, port) = serve_null(&["--vers", "1", "--vers-high", "2"]);
    let (ok, text) = run_rpcinfo(&bin, port, "1");
    assert!(ok && text.contains("ready and waiting"), "{text}");
    // A version outside 1-2: PROG_MISMATCH, and rpcinfo prints the range it got.
    let (ok, text) = run_rpcinfo(&bin, port, "3");
    assert!(!ok, "{text}");
    assert!(
        text.contains("low version = 1") && text.contains("high version = 2"),
        "{text}"
    );
}

#[test]
fn bench_self_reports_json() {
    let out = oxrdma()
        .args([
            "rpc", "bench", "--self", "--calls", "300", "--depth", "8", "--json",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("oxrdma runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\"calls\":300"), "{text}");
    assert!(text.contains("\"errors\":0"), "{text}");
    assert!(text.contains("\"depth\":8"), "{text}");
    assert!(text.contains("\"p99_9\":"), "{text}");
}

#[test]
fn bench_against_serve_null_prints_a_table() {
    let (_server, port) = serve_null(&[]);
    let out = oxrdma()
        .args([
            "rpc",
            "bench",
            "--tcp",
            &format!("127.0.0.1:{port}"),
            "--calls",
            "200",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("oxrdma runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("calls/s") && text.contains("p99.9"), "{text}");
}

#[test]
fn bench_wrong_program_fails_clearly() {
    let (_server, port) = serve_null(&[]);
    let out = oxrdma()
        .args([
            "rpc",
            "bench",
            "--tcp",
            &format!("127.0.0.1:{port}"),
            "--prog",
            "0x20000098",
            "--calls",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("oxrdma runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ProgUnavail"), "{err}");
}
