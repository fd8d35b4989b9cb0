//! `oxrdma nfs …` end to end: `nfs serve` on ephemeral ports (the `ADDRS` line tells where),
//! reached by the `nfs` client library over RPC-over-RDMA and over TCP, the port mapper's
//! "rdma" registration, a clean exit on SIGTERM; and `nfs client … selftest` against an
//! in-process server over both transports. Sizes are small: these check the tool works.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client, PortmapClient};
use nfs::nfs3::{CreateHow3, Sattr3};
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};

/// Kills the server when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads stdout until the `ADDRS` line; returns its key=value pairs and every line so far.
fn addrs(child: &mut Child) -> (HashMap<String, String>, Vec<String>) {
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = Vec::new();
    let mut rd = BufReader::new(out);
    loop {
        let mut l = String::new();
        let n = rd.read_line(&mut l).expect("read stdout");
        assert!(n > 0, "server exited before printing ADDRS: {lines:?}");
        lines.push(l.trim_end().to_string());
        if let Some(rest) = l.strip_prefix("ADDRS ") {
            let map = rest
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            // Keep reading the mount lines that follow.
            for _ in 0..3 {
                let mut l = String::new();
                if rd.read_line(&mut l).unwrap_or(0) == 0 {
                    break;
                }
                lines.push(l.trim_end().to_string());
            }
            return (map, lines);
        }
    }
}

fn addr(map: &HashMap<String, String>, key: &str, scheme: &str) -> SocketAddr {
    let v = &map[key];
    v.strip_prefix(scheme)
        .and_then(|a| a.strip_prefix("://"))
        .unwrap_or_else(|| panic!("{key}={v}"))
        .parse()
        .unwrap()
}

fn data(n: usize, seed: u8) -> Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 10) as u8)
        .collect::<Vec<_>>()
        .into()
}

async fn round_trip(c: &Nfs3Client, root: &nfs::nfs3::Fh3, name: &str, n: usize) -> Bytes {
    let fh = c
        .create(
            root,
            name.as_bytes(),
            CreateHow3::Unchecked(Sattr3::default()),
        )
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let d = data(n, name.len() as u8);
    c.write_all(&fh, &d, 65536).await.unwrap();
    let back = c.read_all(&fh, 65536).await.unwrap();
    assert!(back[..] == d[..], "{name}: data differs");
    d
}

#[test]
fn serve_on_ephemeral_ports_round_trips_over_rdma_and_tcp() {
    let tmp = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "serve"])
        .arg(tmp.path())
        .args([
            "--tcp",
            "127.0.0.1:0",
            "--rdma",
            "127.0.0.1:0",
            "--portmap",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Running(child);
    let (map, lines) = addrs(&mut server.0);
    let tcp = addr(&map, "nfs", "tcp");
    let rdma = addr(&map, "rdma", "rdma");
    let pm = addr(&map, "portmap", "tcp");
    assert_eq!(addr(&map, "mount", "tcp"), tcp, "MOUNT on the NFS port");
    let text = lines.join("\n");
    assert!(
        text.contains(&format!(
            "mount -t nfs -o vers=3,proto=rdma,port={},mountport={},mountproto=tcp,nolock 127.0.0.1:/ /mnt",
            rdma.port(),
            tcp.port()
        )),
        "{text}"
    );
    assert!(text.contains("proto=tcp,"), "{text}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            let pmc: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(pm).await.unwrap());
            let ua = PortmapClient::new(pmc)
                .getaddr(4, nfs::nfs3::PROGRAM, 3, "rdma")
                .await
                .unwrap();
            assert_eq!(nfs::portmap::parse_uaddr(&ua), Some(rdma));
            let t: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(tcp).await.unwrap());
            let root = MountClient::new(t.clone()).mnt("/").await.unwrap();
            let ct = Nfs3Client::new(t).with_auth_sys(0, 0, vec![]);
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> =
                Arc::new(nfs::ulb::NfsBinding::new());
            let r = RdmaClient::connect_with(rdma, TransportConfig::default(), vec![ulb], None)
                .await
                .unwrap();
            let cr = Nfs3Client::new(Arc::new(r)).with_auth_sys(0, 0, vec![]);
            let a = round_trip(&cr, &root, "over-rdma", 200_000).await;
            let b = round_trip(&ct, &root, "over-tcp", 70_000).await;
            // Each transport sees what the other wrote.
            for (name, d, c) in [("over-tcp", &b, &cr), ("over-rdma", &a, &ct)] {
                let fh = c.lookup(&root, name.as_bytes()).await.unwrap();
                let fh = fh.into_result().unwrap().object;
                assert!(c.read_all(&fh, 65536).await.unwrap()[..] == d[..]);
            }
        })
        .await
        .expect("NFS round trips timed out");
    });
    assert_eq!(
        std::fs::read(tmp.path().join("over-tcp")).unwrap().len(),
        70_000
    );

    // SIGTERM ends it cleanly, and says what became of the calls over each transport (none
    // was under way).
    let err = stop(server);
    for t in ["tcp", "rdma"] {
        let want = format!(
            "oxrdma: shutdown: {t}: 0 of 0 calls in progress finished and answered, 0 dropped for the next instance"
        );
        assert!(err.lines().any(|l| l == want), "{want:?} in {err}");
    }
}

/// `nfs serve` with a control socket and a state directory, then a clean stop.
fn serve_with_state(tmp: &std::path::Path) -> (Running, Vec<String>) {
    let export = tmp.join("export");
    std::fs::create_dir_all(&export).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "serve"])
        .arg(&export)
        .args(["--tcp", "127.0.0.1:0", "--no-rdma", "--no-portmap"])
        .arg("--control")
        .arg(tmp.join("control.sock"))
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server = Running(child);
    let (_, lines) = addrs(&mut server.0);
    (server, lines)
}

/// SIGTERM, then what the server said on stderr.
fn stop(mut server: Running) -> String {
    let st = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = server.0.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.0.stderr.take().unwrap(), &mut err).unwrap();
    err
}

#[test]
fn status_reports_and_a_clean_stop_keeps_the_write_verifier() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, lines) = serve_with_state(tmp.path());
    assert!(
        lines
            .iter()
            .any(|l| l == "write verifier new (no clean shutdown recorded)"),
        "{lines:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "status", "--control"])
        .arg(tmp.path().join("control.sock"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    for want in [
        "exports:",
        "clients: ",
        "rdma credits: ",
        "calls per procedure:",
    ] {
        assert!(report.contains(want), "{want:?} in {report}");
    }
    let err = stop(server);
    assert!(err.contains("write verifier recorded"), "{err}");
    let record = std::fs::read_to_string(tmp.path().join("state/write-verifier")).unwrap();
    assert!(record.starts_with("clean "), "{record}");
    // The next start keeps it.
    let (server, lines) = serve_with_state(tmp.path());
    assert!(
        lines
            .iter()
            .any(|l| l == "write verifier kept from the previous clean shutdown"),
        "{lines:?}"
    );
    stop(server);
    // No server: status says why.
    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "status", "--control"])
        .arg(tmp.path().join("control.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn client_selftest_over_rdma_and_tcp() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = rt.block_on(async {
        let mut cfg = nfs::serve::ServeConfig::new(tmp.path());
        cfg.tcp = Some("127.0.0.1:0".parse().unwrap());
        cfg.rdma = Some("127.0.0.1:0".parse().unwrap());
        cfg.portmap = None;
        nfs::serve::start(cfg).await.unwrap()
    });
    let tcp = served.nfs_addr.unwrap();
    let rdma = served.rdma_addr.unwrap();
    let mport = tcp.port().to_string();
    for ep in [["--rdma", &rdma.to_string()], ["--tcp", &tcp.to_string()]] {
        let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
            .args(["nfs", "client"])
            .args(ep)
            .args([
                "--mount-port",
                &mport,
                "--export",
                "/",
                "selftest",
                "--max-mb",
                "2",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{ep:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.starts_with("CONNECTED "), "{text}");
        assert!(text.contains("OK read-cmp-2097152"), "{text}");
        assert!(text.contains("OK gone"), "{text}");
        assert_eq!(text.lines().last(), Some("PASS"), "{text}");
    }
    // A wrong export fails with a message and exit status 1.
    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args(["nfs", "client", "--tcp", &tcp.to_string()])
        .args(["--export", "/nonexistent", "selftest"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MNT /nonexistent"));
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    rt.block_on(served.shutdown());
}

/// `nfs client --nfs-version 4.1|4.2 selftest`: a session, files written and read back through
/// OPEN/WRITE/COMMIT/READ/CLOSE/REMOVE, the session destroyed; over RDMA and TCP.
#[test]
fn client_selftest_nfs4_over_rdma_and_tcp() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = rt.block_on(async {
        let mut cfg = nfs::serve::ServeConfig::new(tmp.path());
        cfg.tcp = Some("127.0.0.1:0".parse().unwrap());
        cfg.rdma = Some("127.0.0.1:0".parse().unwrap());
        cfg.portmap = None;
        // A fresh server: nothing to reclaim, no grace period to wait out.
        cfg.nfs4 =
            Some(nfs::nfs4::server::Nfs4Config::default().with_grace(std::time::Duration::ZERO));
        nfs::serve::start(cfg).await.unwrap()
    });
    let tcp = served.nfs_addr.unwrap().to_string();
    let rdma = served.rdma_addr.unwrap().to_string();
    for (ep, v) in [(["--rdma", &rdma], "4.1"), (["--tcp", &tcp], "4.2")] {
        let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
            .args(["nfs", "client", "--nfs-version", v])
            .args(ep)
            .args(["selftest", "--max-mb", "2"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{ep:?} {v}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.starts_with("CONNECTED "), "{text}");
        assert!(text.contains(&format!("(NFSv{v}, ")), "{text}");
        assert!(
            text.contains("OK file 2097152 B: written, committed, read back, removed"),
            "{text}"
        );
        assert!(
            text.contains("OK destroy_session destroy_clientid"),
            "{text}"
        );
        assert_eq!(text.lines().last(), Some("PASS"), "{text}");
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    rt.block_on(served.shutdown());
}

#[test]
fn bench_prints_every_row_and_the_ratios() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args([
            "nfs",
            "bench",
            "--size-mb",
            "1",
            "--getattrs",
            "20",
            "--dir",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 10 && ["rdma", "tcp", "raw-tcp"].contains(&f[0]))
        .collect();
    // Every transport with NFSv3 and NFSv4.1 (the default --nfs-version 3,4.1).
    let mut want = Vec::new();
    for t in ["rdma", "tcp"] {
        for v in ["3", "4.1"] {
            for io in ["4096", "65536", "1048576"] {
                want.push((t, v, "WRITE", io));
                want.push((t, v, "READ", io));
            }
            want.push((t, v, "GETATTR", "-"));
        }
    }
    want.push(("raw-tcp", "-", "STREAM", "1048576"));
    let got: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|f| (f[0], f[1], f[2], f[3])).collect();
    assert_eq!(got, want, "{text}");
    for f in &rows {
        // ops/s is always a positive number; MB/s for everything but GETATTR.
        assert!(f[5].parse::<f64>().unwrap() > 0.0, "{f:?}");
        if f[2] != "GETATTR" {
            assert!(f[4].parse::<f64>().unwrap() > 0.0, "{f:?}");
        }
        // Both NFS transports measure round-trip times (rtt-p50, rtt-p99); the raw stream
        // has none.
        if f[0] != "raw-tcp" {
            assert!(f[8].parse::<f64>().unwrap() >= 1.0, "{f:?}");
            assert!(f[9].parse::<f64>().unwrap() >= 1.0, "{f:?}");
        } else {
            assert_eq!((f[8], f[9]), ("-", "-"), "{f:?}");
        }
    }
    for l in [
        "ratio READ-1MiB rdma/raw-tcp ",
        "ratio READ-1MiB rdma/nfs-tcp ",
    ] {
        let line = text.lines().find(|x| x.starts_with(l)).expect(l);
        let v: f64 = line[l.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // A number, not a speed check: two decimals can print 0.00 on a loaded machine
        // (one 1 MiB READ against a raw stream), which is no failure of the command.
        assert!(v.is_finite() && v >= 0.0, "{line}");
    }
    // The temporary export is gone again.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

    let out = Command::new(env!("CARGO_BIN_EXE_oxrdma"))
        .args([
            "nfs",
            "bench",
            "--size-mb",
            "1",
            "--getattrs",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j = String::from_utf8_lossy(&out.stdout);
    assert!(
        j.trim_start().starts_with('{') && j.trim_end().ends_with('}'),
        "{j}"
    );
    assert_eq!(j.matches("\"transport\":").count(), 29, "{j}");
    assert_eq!(j.matches("\"nfs\":\"4.1\"").count(), 14, "{j}");
    assert!(j.contains("\"ratio_read_1mib_rdma_over_raw_tcp\":"), "{j}");
}
