//! `oxrdma conform` end to end: `oxrdma nfs serve` as a child on ephemeral loopback ports,
//! the suite run by the binary against it with the NFS cases on; every case passes, the exit
//! status is 0 and the JUnit file counts no failure. Against nothing, it exits 1 with a reason.

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

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxrdma"))
}

#[test]
fn conform_passes_against_nfs_serve_and_writes_junit() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    std::fs::write(export.join("f.dat"), vec![0x5a; 20_000]).unwrap();
    let child = bin()
        .args(["nfs", "serve"])
        .arg(&export)
        .args([
            "--listen",
            "127.0.0.1",
            "--rdma",
            "127.0.0.1:0",
            "--tcp",
            "127.0.0.1:0",
            "--no-portmap",
            "--no-rpcbind",
            "--no-control",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut srv = Running(child);
    let out = srv.0.stdout.take().unwrap();
    let mut rd = BufReader::new(out);
    let mut addrs = String::new();
    while !addrs.starts_with("ADDRS ") {
        addrs.clear();
        assert!(rd.read_line(&mut addrs).unwrap() > 0, "server exited");
    }
    let get = |k: &str| {
        addrs
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k))
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string()
    };
    let (rdma, tcp) = (get("rdma="), get("nfs="));
    let junit = tmp.path().join("conform.xml");
    let o = bin()
        .arg("conform")
        .arg(format!("rdma://{rdma}"))
        .args(["--mount", &tcp, "--nfs-file", "f.dat", "--junit"])
        .arg(&junit)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    println!("{table}");
    assert!(
        o.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let last = table.lines().last().unwrap();
    assert!(last.ends_with(" pass, 0 fail, 0 not applicable"), "{last}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("failures=\"0\" errors=\"0\" skipped=\"0\""),
        "{xml}"
    );
    assert!(xml.contains("v1-err-vers (RFC 8166 §4.5.1, §4.5)"));
}

#[test]
fn conform_without_a_server_exits_1_with_the_reason() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let o = bin()
        .args([
            "conform",
            &format!("rdma://127.0.0.1:{port}"),
            "--wait",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("connect"), "{err}");
}
