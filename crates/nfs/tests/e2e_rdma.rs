//! NFSv3 over RPC-over-RDMA (soft-iWARP over loopback TCP) end to end: the server's RDMA
//! listener from `serve`, the `rpcrdma` client with the NFS binding, MOUNT over TCP
//! (RFC 8267 §5.1), and the RDMA listener found through rpcbind under netid "rdma".

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client, PortmapClient};
use nfs::nfs3::{CreateHow3, Sattr3};
use nfs::serve::{ServeConfig, start};
use nfs::ulb::NfsBinding;
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::version::{Version, VersionPolicy};
use rpcrdma::{RdmaClient, TransportConfig};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_over_rpc_over_rdma() {
    tokio::time::timeout(Duration::from_secs(50), run(VersionPolicy::V1))
        .await
        .expect("NFS over RDMA timed out");
}

/// The same file matrix over RPC-over-RDMA version 2 (cel-05), negotiated by the probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_over_rpc_over_rdma_version_2() {
    tokio::time::timeout(Duration::from_secs(50), run(VersionPolicy::Auto))
        .await
        .expect("NFS over RDMA version 2 timed out");
}

async fn run(policy: VersionPolicy) {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = ServeConfig::new(tmp.path());
    cfg.tcp = Some(local());
    cfg.portmap = Some(local());
    cfg.rdma = Some(local());
    let served = start(cfg).await.unwrap();
    let rdma_addr = served.rdma_addr.unwrap();
    let tcp: Arc<dyn RpcTransport> =
        Arc::new(TcpClient::connect(served.nfs_addr.unwrap()).await.unwrap());
    let pm: Arc<dyn RpcTransport> = Arc::new(
        TcpClient::connect(served.portmap_addr.unwrap())
            .await
            .unwrap(),
    );
    let ua = PortmapClient::new(pm)
        .getaddr(4, nfs::nfs3::PROGRAM, 3, "rdma")
        .await
        .unwrap();
    assert_eq!(nfs::portmap::parse_uaddr(&ua), Some(rdma_addr));
    let root = MountClient::new(tcp).mnt("/").await.unwrap();

    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let mut tc = TransportConfig::default();
    tc.rpc.version_policy = policy;
    let rdma = Arc::new(
        RdmaClient::connect_with(rdma_addr, tc, vec![ulb], None)
            .await
            .unwrap(),
    );
    let c = Nfs3Client::new(rdma.clone()).with_auth_sys(0, 0, vec![]);
    c.null().await.unwrap();
    let want = match policy {
        VersionPolicy::V1 => Version::V1,
        _ => Version::V2,
    };
    assert_eq!(rdma.rpcrdma_version(), want);
    for (i, n) in [0usize, 1, 4095, 4096, (1 << 20) + 3, 8 << 20]
        .into_iter()
        .enumerate()
    {
        let name = format!("r{n}");
        let fh = c
            .create(
                &root,
                name.as_bytes(),
                CreateHow3::Unchecked(Sattr3::default()),
            )
            .await
            .unwrap()
            .into_result()
            .unwrap()
            .obj
            .unwrap();
        let data = pattern(n, i as u8);
        c.write_all(&fh, &data, 1 << 20).await.unwrap();
        let back = c.read_all(&fh, 1 << 20).await.unwrap();
        assert!(back == data, "size {n} differs over RDMA");
        assert_eq!(std::fs::read(tmp.path().join(&name)).unwrap(), data);
    }
    let ln = c
        .symlink(&root, b"ln", b"r4096")
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    assert_eq!(
        &c.readlink(&ln).await.unwrap().into_result().unwrap().data.0[..],
        b"r4096"
    );
    assert_eq!(c.readdirplus_all(&root).await.unwrap().len(), 2 + 7);
    assert_eq!(rdma.rpcrdma_version(), want, "no fallback on the way");
    served.shutdown().await;
}
