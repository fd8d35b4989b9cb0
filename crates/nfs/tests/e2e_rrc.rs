//! NFSv3 over RPC-over-RDMA version 2 with responder-provided Read chunks
//! (draft-cel-nfsv4-rpcrdma-reliable-reply-02), end to end over soft-iWARP on loopback: a
//! client in read-chunk reply mode sends READ and READDIR with no Write chunk and no Reply
//! chunk, and the server's large replies come back as Read chunks the client pulls. The same
//! READDIR of a 10,000-entry directory without a Reply chunk fails against a server that does
//! not offer them (REPLY_RESOURCE: the client's call ends with RDMA_ERR_CHUNK).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nfs::client::{MountClient, Nfs3Client};
use nfs::nfs3::{CreateHow3, Sattr3};
use nfs::serve::{ServeConfig, start};
use nfs::ulb::NfsBinding;
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::rrc::{ReplyMode, RrcConfig};
use rpcrdma::version::VersionPolicy;
use rpcrdma::{RdmaClient, TransportConfig};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn client(
    served: &nfs::serve::Served,
    mode: ReplyMode,
) -> (Arc<RdmaClient>, Nfs3Client, nfs::nfs3::Fh3) {
    let tcp: Arc<dyn RpcTransport> =
        Arc::new(TcpClient::connect(served.nfs_addr.unwrap()).await.unwrap());
    let root = MountClient::new(tcp).mnt("/").await.unwrap();
    let mut tc = TransportConfig::default();
    tc.rpc.version_policy = VersionPolicy::V2;
    tc.rpc.rrc = RrcConfig {
        enabled: true,
        reply_mode: mode,
        ..RrcConfig::default()
    };
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let rdma = Arc::new(
        RdmaClient::connect_with(served.rdma_addr.unwrap(), tc, vec![ulb], None)
            .await
            .unwrap(),
    );
    let c = Nfs3Client::new(rdma.clone()).with_auth_sys(0, 0, vec![]);
    // Settles version 2 and both sides' properties.
    c.null().await.unwrap();
    (rdma, c, root)
}

async fn serve(dir: &std::path::Path, read_chunks: bool) -> nfs::serve::Served {
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.rdma = Some(local());
    let mut t = TransportConfig::default();
    t.rpc.rrc.enabled = read_chunks;
    cfg.rdma_config = Some(t);
    start(cfg).await.unwrap()
}

async fn run() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..10_000 {
        std::fs::write(tmp.path().join(format!("entry-{i:05}")), b"").unwrap();
    }
    let served = serve(tmp.path(), true).await;
    let (rdma, c, root) = client(&served, ReplyMode::ReadChunk).await;
    assert!(rdma.stats().rrc_pulls == 0);
    // READ of files of every size class, bit-exact.
    for (i, len) in [0usize, 100, 4000, 4097, 65_536, 1 << 20, (1 << 20) + 13]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let name = format!("file-{i}");
        std::fs::write(tmp.path().join(&name), &data).unwrap();
        let fh = c
            .lookup(&root, name.as_bytes())
            .await
            .unwrap()
            .into_result()
            .unwrap()
            .object;
        let back = c.read_all(&fh, 1 << 20).await.unwrap();
        assert!(back == data, "file of {len} bytes not bit-exact");
    }
    // READDIR of 10,000 entries (and the 7 files) in one call of 1 MiB.
    let (entries, calls) = c.readdir_all(&root, 1 << 20).await.unwrap();
    assert_eq!((entries.len(), calls), (10_000 + 7 + 2, 1));
    let s = rdma.stats();
    // Neither READ nor READDIR offered a Write or a Reply chunk.
    assert_eq!(s.write_chunk_calls, 0, "{s:?}");
    assert_eq!(s.long_reply, 0, "{s:?}");
    assert!(s.rrc_pulls >= 4, "{s:?}");
    assert_eq!(s.rrc_notifications, s.rrc_pulls);
    assert_eq!(rdma.live_registrations(), 0);
    // A file written through the server still reads back (WRITE uses Read chunks as before).
    let fh = c
        .create(&root, b"written", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .into_result()
        .unwrap()
        .obj
        .unwrap();
    let w = pattern(300_000, 9);
    c.write_all(&fh, &w, 1 << 20).await.unwrap();
    assert!(c.read_all(&fh, 1 << 20).await.unwrap() == w);
    let _ = served.shutdown().await;

    // The same READDIR with no Reply chunk ("send-only") against a server without them.
    let plain = serve(tmp.path(), false).await;
    let (rdma, c, root) = client(&plain, ReplyMode::SendOnly).await;
    let e = c.readdir_all(&root, 1 << 20).await.unwrap_err();
    assert!(e.to_string().contains("ERR_CHUNK"), "{e}");
    assert_eq!(rdma.stats().rrc_pulls, 0);
    // And the read-chunk mode keeps to Reply chunks there: it works.
    let (rdma, c, root) = client(&plain, ReplyMode::ReadChunk).await;
    let (entries, _) = c.readdir_all(&root, 1 << 20).await.unwrap();
    assert_eq!(entries.len(), 10_000 + 8 + 2);
    assert_eq!(rdma.stats().rrc_pulls, 0);
    let _ = plain.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3_read_and_readdir_through_responder_read_chunks() {
    tokio::time::timeout(Duration::from_secs(120), run())
        .await
        .expect("timed out");
}
