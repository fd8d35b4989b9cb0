//! Service operation (issue 22): `oxrdma nfs status`'s report and the Prometheus endpoint
//! count clients per transport, calls per procedure and bytes; NFS and MOUNT register with a
//! running port mapper and take their registrations back at shutdown; a clean shutdown keeps
//! the write verifier for the next start, a crash does not.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client, PortmapClient};
use nfs::nfs3::StableHow;
use nfs::register::RpcbindAt;
use nfs::serve::{ServeConfig, Served, start};
use nfs::ulb::NfsBinding;
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn config(dir: &std::path::Path) -> ServeConfig {
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg
}

async fn tcp(addr: SocketAddr) -> Arc<dyn RpcTransport> {
    Arc::new(TcpClient::connect(addr).await.unwrap())
}

/// MOUNT "/" over TCP, then a client of NFS over `nfs`.
async fn mounted(s: &Served, nfs: Arc<dyn RpcTransport>) -> (Nfs3Client, nfs::nfs3::Fh3) {
    let root = MountClient::new(tcp(s.nfs_addr.unwrap()).await)
        .mnt("/")
        .await
        .unwrap();
    (Nfs3Client::new(nfs).with_auth_sys(0, 0, vec![]), root)
}

async fn scrape(addr: SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_metrics_count_clients_calls_and_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("control.sock");
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let mut cfg = config(&export);
    cfg.rdma = Some(local());
    cfg.control = Some(sock.clone());
    cfg.metrics = Some(local());
    let s = start(cfg).await.unwrap();

    let (c, root) = mounted(&s, tcp(s.nfs_addr.unwrap()).await).await;
    c.getattr(&root).await.unwrap().into_result().unwrap();
    let rdma = Arc::new(
        RdmaClient::connect_with(
            s.rdma_addr.unwrap(),
            TransportConfig::default(),
            vec![Arc::new(NfsBinding::new())],
            None,
        )
        .await
        .unwrap(),
    );
    let (r, _) = mounted(&s, rdma.clone()).await;
    for _ in 0..3 {
        r.getattr(&root).await.unwrap().into_result().unwrap();
    }

    let st = s.status();
    assert_eq!(st.connected("rdma"), 1, "{:?}", st.clients);
    assert!(st.connected("tcp") >= 1, "{:?}", st.clients);
    assert_eq!(st.exports.len(), 1);
    assert_eq!(
        st.rdma_credit_limit,
        Some(TransportConfig::default().rpc.credits)
    );
    let calls = |t: &str, proc_: &str| {
        st.procedures
            .iter()
            .find(|p| p.transport == t && p.program == "nfs3" && p.procedure == proc_)
            .map_or(0, |p| p.calls)
    };
    assert_eq!(calls("rdma", "GETATTR"), 3);
    assert_eq!(calls("tcp", "GETATTR"), 1);
    let rdma_totals = st.totals.iter().find(|t| t.transport == "rdma").unwrap();
    assert!(rdma_totals.bytes_in > 0 && rdma_totals.bytes_out > 0);
    assert_eq!(rdma_totals.executing, 0);

    // The control socket gives the same report, to its owner only.
    let report = nfs::control::query(&sock).await.unwrap();
    assert!(report.contains(&export.canonicalize().unwrap().display().to_string()));
    assert!(report.contains("1 over rdma"), "{report}");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // The metrics endpoint, in the Prometheus text format.
    let m = scrape(s.metrics_addr().unwrap(), "/metrics").await;
    assert!(m.starts_with("HTTP/1.1 200 OK\r\n"), "{m}");
    assert!(m.contains("Content-Type: text/plain; version=0.0.4"), "{m}");
    assert!(
        m.contains(
            r#"oxrdma_nfs_calls_total{transport="rdma",program="nfs3",procedure="GETATTR"} 3"#
        ),
        "{m}"
    );
    assert!(
        m.contains(r#"oxrdma_nfs_connected_clients{transport="rdma"} 1"#),
        "{m}"
    );
    assert!(m.contains("oxrdma_nfs_exports 1"), "{m}");
    assert!(
        scrape(s.metrics_addr().unwrap(), "/other")
            .await
            .starts_with("HTTP/1.1 404")
    );

    rdma.disconnect().await;
    let report = s.shutdown_within(std::time::Duration::from_secs(10)).await;
    assert!(report.drained && report.synced, "{report:?}");
    assert!(!sock.exists(), "the control socket is removed at shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_a_running_port_mapper_and_takes_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    // A port mapper alone, standing for the system's rpcbind (it accepts loopback callers).
    let mut pm = config(tmp.path());
    pm.tcp = None;
    pm.portmap = Some(local());
    let pm = start(pm).await.unwrap();
    let pm_addr = pm.portmap_addr.unwrap();

    let mut cfg = config(tmp.path());
    cfg.rdma = Some(local());
    cfg.rpcbind = Some(RpcbindAt::Tcp(pm_addr));
    let s = start(cfg).await.unwrap();
    assert_eq!(s.rpcbind(), Some(&RpcbindAt::Tcp(pm_addr)));
    let q = PortmapClient::new(tcp(pm_addr).await);
    let nfs_port = s.nfs_addr.unwrap().port();
    assert_eq!(q.getport(nfs::mount::PROGRAM, 3).await.unwrap(), nfs_port);
    assert_eq!(q.getport(nfs::nfs3::PROGRAM, 3).await.unwrap(), nfs_port);
    assert_eq!(q.getport(nfs::nfs3::PROGRAM, 4).await.unwrap(), nfs_port);
    let rdma = q.getaddr(4, nfs::nfs3::PROGRAM, 3, "rdma").await.unwrap();
    assert_eq!(
        nfs::portmap::parse_uaddr(&rdma),
        s.rdma_addr,
        "the RPC-over-RDMA listener under netid rdma"
    );

    let report = s.shutdown_within(std::time::Duration::from_secs(10)).await;
    assert_eq!(report.unregistered, 4, "{report:?}");
    assert_eq!(q.getport(nfs::mount::PROGRAM, 3).await.unwrap(), 0);
    assert_eq!(q.getport(nfs::nfs3::PROGRAM, 3).await.unwrap(), 0);
    pm.shutdown().await;
}

async fn unstable_write_verifier(s: &Served) -> [u8; 8] {
    let (c, root) = mounted(s, tcp(s.nfs_addr.unwrap()).await).await;
    let fh = c
        .lookup(&root, b"f")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .object;
    let w = c
        .write(&fh, 0, Bytes::from_static(b"data"), StableHow::Unstable)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let commit = c.commit(&fh).await.unwrap().into_result().unwrap();
    assert_eq!(w.verf, commit.verf);
    w.verf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_keeps_the_write_verifier_and_a_crash_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"").unwrap();
    let state = tmp.path().join("write-verifier");
    let cfg = || {
        let mut c = config(&export);
        c.verifier_file = Some(state.clone());
        c
    };

    let s = start(cfg()).await.unwrap();
    assert_eq!(s.verifier_origin(), Some(nfs::verifier::Origin::New));
    let v1 = unstable_write_verifier(&s).await;
    let report = s.shutdown_within(std::time::Duration::from_secs(10)).await;
    assert!(
        report.drained && report.synced && report.verifier_kept,
        "{report:?}"
    );

    // The next start answers with the same verifier: nothing to resend.
    let s = start(cfg()).await.unwrap();
    assert_eq!(s.verifier_origin(), Some(nfs::verifier::Origin::Kept));
    assert_eq!(unstable_write_verifier(&s).await, v1);
    // A crash: no clean shutdown recorded.
    drop(s);
    let s = start(cfg()).await.unwrap();
    assert_eq!(s.verifier_origin(), Some(nfs::verifier::Origin::New));
    assert_ne!(unstable_write_verifier(&s).await, v1);
    s.shutdown().await;
}
