//! The NFSv4.1/4.2 client (`nfs::client::Nfs4Client`) against `serve` over TCP and over
//! RPC-over-RDMA (soft-iWARP on loopback): the v4 self test (files of 0 B..2 MiB written,
//! committed, read back and compared, closed and removed; a session destroyed), and
//! concurrent READs on the session's slots.

use crate::nfs4_util;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{Nfs4Client, selftest4};
use nfs::nfs4::consts::stable;
use nfs::nfs4::server::Nfs4Config;
use nfs::serve::{ServeConfig, Served, start};
use oncrpc::auth::{AuthSys, OpaqueAuth};
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::RdmaClient;

async fn serve(dir: &std::path::Path) -> Served {
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some(nfs4_util::local());
    cfg.rdma = Some(nfs4_util::local());
    cfg.portmap = None;
    cfg.nfs4 = Some(Nfs4Config::default().with_grace(Duration::ZERO));
    start(cfg).await.unwrap()
}

async fn rdma_transport(served: &Served) -> Arc<RdmaClient> {
    nfs4_util::rdma_client(served, None).await
}

fn cred() -> OpaqueAuth {
    let (uid, gid) = nfs4_util::me();
    OpaqueAuth::sys(&AuthSys {
        stamp: 1,
        machinename: Bytes::from_static(b"test"),
        uid,
        gid,
        gids: vec![],
    })
}

async fn client(served: &Served, rdma: bool, minor: u32) -> Nfs4Client {
    let t: Arc<dyn RpcTransport> = if rdma {
        rdma_transport(served).await
    } else {
        Arc::new(TcpClient::connect(served.nfs_addr.unwrap()).await.unwrap())
    };
    Nfs4Client::connect(t, cred(), minor, b"nfs4-client-test", None)
        .await
        .unwrap()
}

async fn selftest(rdma: bool, minor: u32) {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let c = client(&served, rdma, minor).await;
    assert_eq!(c.minor(), minor);
    let mut lines = Vec::new();
    let r = selftest4(c, 2, |l| lines.push(l.to_string())).await;
    assert!(r.is_ok(), "{r:?}\n{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l == "OK file 2097152 B: written, committed, read back, removed"),
        "{lines:#?}"
    );
    // Everything is gone again: files, the client's state.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    let counts = served.nfs4().unwrap().state().counts();
    assert_eq!(
        (counts.clients, counts.sessions, counts.opens),
        (0, 0, 0),
        "{counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selftest_v41_over_tcp() {
    selftest(false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selftest_v42_over_tcp() {
    selftest(false, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selftest_v41_over_rdma() {
    selftest(true, 1).await;
}

/// Many READs at once share the session's slots; each slot's sequence id advances only with
/// its own calls, so none is refused (SEQ_MISORDERED would fail the call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_share_the_slots() {
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    for rdma in [false, true] {
        let c = Arc::new(client(&served, rdma, 1).await);
        let root = c.root().await.unwrap();
        let f = Arc::new(c.open(&root, b"shared", Some(0o644)).await.unwrap());
        let data = nfs4_util::pattern(256 << 10, 9);
        c.write(&f, 0, data.clone(), stable::FILE_SYNC4)
            .await
            .unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..64u64 {
            let (c, f) = (c.clone(), f.clone());
            tasks.spawn(async move {
                let off = (i % 64) * 4096;
                let (d, _) = c.read(&f, off, 4096).await.unwrap();
                (off, d)
            });
        }
        while let Some(r) = tasks.join_next().await {
            let (off, d) = r.unwrap();
            assert_eq!(
                &d[..],
                &data[off as usize..off as usize + 4096],
                "rdma={rdma}"
            );
        }
        c.close(&f).await.unwrap();
        c.remove(&root, b"shared").await.unwrap();
    }
}

/// Over RPC-over-RDMA a COMPOUND whose reply has a bound that fits inline (SEQUENCE, PUTFH,
/// GETATTR of fixed-size attributes) goes without a Reply chunk; one asking for an attribute
/// of unbounded size (an ACL) still gets one, sized by the session (RFC 8267 §6.2.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_replies_need_no_reply_chunk() {
    use nfs::nfs4::consts::attr;
    let tmp = tempfile::tempdir().unwrap();
    let served = serve(tmp.path()).await;
    let rdma = rdma_transport(&served).await;
    let c = Nfs4Client::connect(rdma.clone(), cred(), 1, b"reply-bound", None)
        .await
        .unwrap();
    let root = c.root().await.unwrap();
    let before = rdma.stats().long_reply;
    for _ in 0..20 {
        let f = c
            .getattr(
                &root,
                &[
                    attr::TYPE,
                    attr::CHANGE,
                    attr::SIZE,
                    attr::MODE,
                    attr::OWNER,
                ],
            )
            .await
            .unwrap();
        assert!(!f.vals.is_empty() && f.mask.get(attr::SIZE));
    }
    assert_eq!(
        rdma.stats().long_reply,
        before,
        "a GETATTR of bounded attributes registered a Reply chunk"
    );
    let _ = c.getattr(&root, &[attr::TYPE, attr::ACL]).await;
    assert_eq!(
        rdma.stats().long_reply,
        before + 1,
        "a GETATTR of an ACL must offer a Reply chunk"
    );
}
