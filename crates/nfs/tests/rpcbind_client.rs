//! The typed port mapper client (SET, UNSET, GETPORT, GETADDR, PMAP v2 SET/UNSET) against the
//! crate's own port mapper over TCP, and registration through the system rpcbind's AF_LOCAL
//! socket (skipped with a reason when no rpcbind answers there).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::client::PortmapClient;
use nfs::portmap::{self, Mapping, Registration, Rpcb, RpcbString};
use nfs::register::{LOCAL_SOCKETS, RpcbindAt, SystemRpcbind};
use nfs::serve::{ServeConfig, start};
use oncrpc::TcpClient;

/// A program number in the transient range (RFC 5531 §7.3: 0x40000000-0x5fffffff).
const TEST_PROG: u32 = 0x4f0a_7e40;

fn s(v: &str) -> RpcbString {
    RpcbString(Bytes::copy_from_slice(v.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_unset_getport_getaddr_over_tcp() {
    let tmp = tempfile::tempdir().unwrap();
    let mut pm = ServeConfig::new(tmp.path());
    pm.tcp = None;
    pm.rdma = None;
    pm.nfs4 = None;
    pm.portmap = Some("127.0.0.1:0".parse().unwrap());
    let pm = start(pm).await.unwrap();
    let at = pm.portmap_addr.unwrap();
    let q = PortmapClient::new(Arc::new(TcpClient::connect(at).await.unwrap()));
    q.null(2).await.unwrap();
    q.null(4).await.unwrap();
    let r = Rpcb {
        prog: TEST_PROG,
        vers: 1,
        netid: s("tcp"),
        addr: s("127.0.0.1.3.7"),
        owner: s("test"),
    };
    assert!(q.set(4, &r).await.unwrap());
    assert_eq!(q.getport(TEST_PROG, 1).await.unwrap(), 3 * 256 + 7);
    assert_eq!(
        q.getaddr(3, TEST_PROG, 1, "tcp").await.unwrap(),
        "127.0.0.1.3.7"
    );
    assert!(q.unset(4, &r).await.unwrap());
    assert!(!q.unset(4, &r).await.unwrap());
    assert_eq!(q.getport(TEST_PROG, 1).await.unwrap(), 0);
    // Version 2's SET and UNSET.
    let m = Mapping {
        prog: TEST_PROG,
        vers: 2,
        prot: portmap::IPPROTO_TCP,
        port: 4000,
    };
    assert!(q.pmap_set(m).await.unwrap());
    assert_eq!(q.getport(TEST_PROG, 2).await.unwrap(), 4000);
    assert!(q.pmap_unset(TEST_PROG, 2).await.unwrap());
    assert_eq!(q.getport(TEST_PROG, 2).await.unwrap(), 0);
    pm.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_through_the_system_rpcbind_local_socket() {
    let mut found = None;
    for p in LOCAL_SOCKETS {
        if let Ok(r) = SystemRpcbind::connect(RpcbindAt::Local(p.into())).await {
            found = Some(r);
            break;
        }
    }
    let Some(rb) = found else {
        eprintln!("SKIP: no rpcbind answers on {LOCAL_SOCKETS:?}");
        return;
    };
    let addr: SocketAddr = "127.0.0.1:4001".parse().unwrap();
    let reg = Registration {
        prog: TEST_PROG,
        vers: 3,
        netid: "tcp".into(),
        addr,
        owner: "oxrdma-test".into(),
    };
    rb.register(std::slice::from_ref(&reg)).await.unwrap();
    // Seen by a client over TCP (rpcbind answers GETADDR for the netid of the transport the
    // query came on, so the AF_LOCAL socket would look up "local").
    let q = PortmapClient::new(Arc::new(
        TcpClient::connect("127.0.0.1:111".parse().unwrap())
            .await
            .unwrap(),
    ));
    assert_eq!(q.getport(TEST_PROG, 3).await.unwrap(), addr.port());
    assert_eq!(rb.unregister_all().await.unwrap(), 1);
    assert_eq!(q.getport(TEST_PROG, 3).await.unwrap(), 0);
}
