//! `oxrdma iwarp peer` end to end: a server and a client process on 127.0.0.1 run the iwpeer
//! protocol (interop/README.md) over soft-iWARP, driven by both ends, plain and with CRC +
//! peer-to-peer (each RTR kind).

use std::io::{BufRead, BufReader, Read};
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

/// Start a server on an ephemeral port; returns it, its stdout reader and its address.
fn server(extra: &[&str]) -> (Running, BufReader<std::process::ChildStdout>, String) {
    let child = oxrdma()
        .args(["iwarp", "peer", "server", "127.0.0.1:0", "--size", "65536"])
        .args(extra)
        .args(["--timeout", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("oxrdma starts");
    let mut s = Running(child);
    let mut out = BufReader::new(s.0.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read the LISTENING line");
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    (s, out, addr)
}

/// One connection: client with `args` against a fresh server; returns both outputs.
fn pair(server_extra: &[&str], client_args: &[&str]) -> (String, String) {
    let (mut srv, mut sout, addr) = server(server_extra);
    let out = oxrdma()
        .args(["iwarp", "peer", "client", &addr, "--timeout", "60"])
        .args(client_args)
        .output()
        .expect("client runs");
    let ctext = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut stext = String::new();
    sout.read_to_string(&mut stext).expect("server output");
    let status = srv.0.wait().expect("server exits");
    assert!(
        out.status.success(),
        "client failed:\n{ctext}\n{}\nserver:\n{stext}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        status.success(),
        "server failed:\n{stext}\nclient:\n{ctext}"
    );
    (ctext, stext)
}

fn oks(text: &str, by: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("OK ") && l.ends_with(&format!("by={by}")))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        .collect()
}

#[test]
fn client_and_server_drive_every_op() {
    for size in ["1", "4093", "65536"] {
        let (c, s) = pair(&[], &["--size", size, "--iters", "2"]);
        assert!(c.contains("CONNECTED"), "{c}");
        assert!(c.contains("crc off"), "{c}");
        assert_eq!(
            oks(&c, "client"),
            ["send", "sendinv", "write", "read"],
            "{c}"
        );
        assert_eq!(
            oks(&s, "server"),
            ["send", "sendinv", "write", "read"],
            "{s}"
        );
        assert!(
            c.contains(&format!("OK write {size} iters=2 by=client")),
            "{c}"
        );
        assert!(c.trim_end().ends_with("PASS") && s.trim_end().ends_with("PASS"));
    }
}

#[test]
fn crc_and_each_rtr_kind() {
    for rtr in ["write", "read", "send"] {
        let (c, s) = pair(
            &[],
            &[
                "--crc",
                "--rtr",
                rtr,
                "--size",
                "3000",
                "--ops",
                "send,read",
            ],
        );
        assert!(c.contains("crc on") && s.contains("crc on"), "{c}\n{s}");
        assert!(s.contains("p2p true"), "{s}");
        assert_eq!(oks(&c, "client"), ["send", "read"], "{c}");
        assert_eq!(oks(&s, "server"), ["send", "read"], "{s}");
    }
}

#[test]
fn server_refuses_a_size_above_its_buffer() {
    let (mut srv, mut sout, addr) = server(&[]);
    let out = oxrdma()
        .args(["iwarp", "peer", "client", &addr, "--size", "65537"])
        .output()
        .expect("client runs");
    let c = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{c}");
    assert!(
        c.contains("server refused HELLO (code 1: its buffer is 65536 bytes)"),
        "{c}"
    );
    let mut s = String::new();
    sout.read_to_string(&mut s).expect("server output");
    assert_eq!(srv.0.wait().expect("server exits").code(), Some(2), "{s}");
}

#[test]
fn help_names_the_peer() {
    let out = oxrdma()
        .args(["help", "iwarp", "peer"])
        .output()
        .expect("help");
    assert!(out.status.success());
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("server") && t.contains("client"), "{t}");
}

#[test]
fn nudges_before_the_hello_answer_are_harmless() {
    // A zero-length RDMA Write (STag 1) after the HELLO: what the client sends when kernel siw
    // sits on its HELLO (siw_accept's lost wakeup); oxrdma must ignore it like siw does.
    let (c, s) = pair(&[], &["--nudge-ms", "0", "--size", "100", "--ops", "write"]);
    assert!(
        c.contains("nudging the server with a zero-length RDMA Write (3)"),
        "{c}"
    );
    assert_eq!(oks(&c, "client"), ["write"], "{c}");
    assert_eq!(oks(&s, "server"), ["write"], "{s}");
}
