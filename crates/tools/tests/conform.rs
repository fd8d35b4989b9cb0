//! `tools::conform` over soft-iWARP on 127.0.0.1: every case passes against the in-process
//! `nfs serve` (versions 1 and 2, NFS binding cases with a file to read), and a deliberately
//! broken responder (a bare verbs peer that grants no credits and answers every message, a
//! bad version too, with an RDMA_MSG reply) makes the cases it breaks fail.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use nfs::serve::{ServeConfig, start};
use tools::conform::{self, ConformConfig, NfsTarget, Outcome};
use verbs::{Access, ConnParams, Device, RecvWr, SendWr};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_passes_against_our_server() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir_all(&export).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(export.join("conform.dat"), &data).unwrap();
    let mut cfg = ServeConfig::new(&export);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    let served = start(cfg).await.unwrap();
    let mut c = ConformConfig::new(served.rdma_addr.unwrap());
    c.nfs = Some(NfsTarget {
        mount: served.nfs_addr.unwrap(),
        export: "/".into(),
        file: Some("conform.dat".into()),
    });
    let results = tokio::time::timeout(
        Duration::from_secs(120),
        conform::run(Device::soft_iwarp(), c),
    )
    .await
    .expect("the suite did not finish")
    .expect("the suite could not run");
    print!("{}", conform::table("our server", &results));
    served.shutdown().await;
    assert_eq!(results.len(), conform::cases().len());
    let not_passed: Vec<_> = results
        .iter()
        .filter(|r| r.outcome != Outcome::Pass)
        .map(|r| (r.id, r.outcome, r.detail.clone()))
        .collect();
    assert!(not_passed.is_empty(), "{not_passed:?}");
    let xml = conform::junit_xml("our server", &results);
    assert!(xml.contains(&format!(
        "tests=\"{}\" failures=\"0\" errors=\"0\" skipped=\"0\"",
        results.len()
    )));
}

/// The NFS cases are not applicable, with the reason, when no MOUNT target is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs_cases_without_a_mount_are_not_applicable() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(dir.path());
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    let served = start(cfg).await.unwrap();
    let mut c = ConformConfig::new(served.rdma_addr.unwrap());
    c.only = vec!["nfs-".into(), "v1-short".into()];
    let results = conform::run(Device::soft_iwarp(), c).await.unwrap();
    served.shutdown().await;
    let nfs_cases = conform::cases()
        .iter()
        .filter(|c| c.id.starts_with("nfs-"))
        .count();
    assert_eq!(results.len(), nfs_cases + 1);
    for r in &results {
        let want = if r.id.starts_with("nfs-") {
            Outcome::NotApplicable
        } else {
            Outcome::Pass
        };
        assert_eq!(r.outcome, want, "{r:?}");
    }
    assert!(results[1].detail.contains("--mount"));
}

/// A reply that makes no difference between calls: `RDMA_MSG`, granting zero credits, with an
/// accepted-SUCCESS RPC reply of the message's XID, whatever the message was.
fn broken_reply(xid: u32) -> Bytes {
    let mut b = BytesMut::new();
    for w in [xid, 1, 0, 0, 0, 0, 0] {
        b.put_u32(w);
    }
    for w in [xid, 1, 0, 0, 0, 0] {
        b.put_u32(w);
    }
    b.freeze()
}

/// A broken responder on soft-iWARP: accepts connections and answers every message it
/// receives with [`broken_reply`], until the test ends.
async fn broken_responder() -> SocketAddr {
    let dev = Device::soft_iwarp();
    let mut listener = dev.listen(local()).await.unwrap();
    let addr = listener.local_addr();
    tokio::spawn(async move {
        while let Ok(req) = listener.accept().await {
            let dev = dev.clone();
            tokio::spawn(async move {
                let pd = dev.alloc_pd();
                let (scq, rcq) = (dev.create_cq(), dev.create_cq());
                let qp = dev.create_qp(&pd, &scq, &rcq);
                let mut bufs = Vec::new();
                for i in 0..32u64 {
                    let mr = pd.register_len(8192, Access::LOCAL_WRITE).unwrap();
                    qp.post_recv(RecvWr::new(i, mr.sge(0, 8192))).unwrap();
                    bufs.push(mr);
                }
                let Ok(conn) = req.accept(&qp, ConnParams::default()).await else {
                    return;
                };
                let mut id = 1000;
                loop {
                    let c = rcq.next().await;
                    if c.status != verbs::WcStatus::Success {
                        break;
                    }
                    let m = bufs[c.wr_id as usize].read(0, 4).unwrap();
                    let xid = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
                    let _ = conn
                        .qp()
                        .post_recv(RecvWr::new(c.wr_id, bufs[c.wr_id as usize].sge(0, 8192)));
                    id += 1;
                    if conn
                        .qp()
                        .post_send(SendWr::send_bytes(id, broken_reply(xid)))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_responder_fails_the_cases_it_breaks() {
    let addr = broken_responder().await;
    let mut c = ConformConfig::new(addr);
    c.wait = Duration::from_secs(2);
    c.only = vec![
        "v1-short-msg".into(),
        "v1-credit-grant".into(),
        "v1-err-vers".into(),
        "v1-err-chunk-proc".into(),
        "v1-discard-done".into(),
        "v2-probe".into(),
    ];
    let results = tokio::time::timeout(
        Duration::from_secs(60),
        conform::run(Device::soft_iwarp(), c),
    )
    .await
    .unwrap()
    .unwrap();
    print!("{}", conform::table("broken responder", &results));
    assert_eq!(results.len(), 6);
    for r in &results {
        assert_eq!(r.outcome, Outcome::Fail, "{r:?}");
    }
    let by_id = |id: &str| results.iter().find(|r| r.id == id).unwrap().detail.clone();
    assert!(by_id("v1-credit-grant").contains("granted 0"));
    assert!(by_id("v1-err-vers").contains("expected RDMA_ERROR"));
    assert!(by_id("v1-discard-done").contains("answered"));
    assert!(by_id("v2-probe").contains("neither a version 2 reply nor ERR_VERS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_there_is_an_error_not_a_table() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut c = ConformConfig::new(addr);
    c.wait = Duration::from_secs(1);
    assert!(conform::run(Device::soft_iwarp(), c).await.is_err());
}
