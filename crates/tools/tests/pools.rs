//! Buffer pools give their memory back when the connection that owns them closes, not later
//! (issue 20): an RPC-over-RDMA server connection keeps up to 16 idle sink buffers of the NFS
//! WRITEs it received (`rpcrdma`'s sink pool, an `oncrpc::BufPool`); once the connection is
//! gone, so are they. Alone in its test binary: `oncrpc::bufpool::idle_bytes` counts every
//! pool of the process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nfs::ulb::NfsBinding;
use oncrpc::MemoryBudget;
use rpcrdma::{RdmaServer, TransportConfig};
use tools::hostile::{Polite, Target};

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_buffers_are_freed_when_their_connection_closes() {
    let tmp = tempfile::tempdir().unwrap();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut sc = nfs::serve::ServeConfig::new(tmp.path());
    sc.tcp = Some(local);
    sc.portmap = None;
    let served = nfs::serve::start(sc).await.unwrap();
    let budget = MemoryBudget::new(64 * MIB, 16 * MIB);
    let cfg = TransportConfig {
        budget: Some(budget.clone()),
        ..TransportConfig::default()
    };
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let rdma = RdmaServer::bind(local, (*served.nfs_dispatcher()).clone(), vec![ulb], cfg)
        .await
        .unwrap();
    let tcp = served.nfs_addr.unwrap();
    // 1 MiB of data written over TCP: no pool involved.
    let target = Target::mount(rdma.local_addr(), tcp, "data", MIB)
        .await
        .unwrap();
    assert_eq!(oncrpc::bufpool::idle_bytes(), 0);
    // Four 1 MiB WRITEs over RPC-over-RDMA: their Read chunks land in pooled sinks, which go
    // back to the connection's pool when the WRITEs are done.
    let polite = Polite::connect(&target, "polite").await.unwrap();
    polite.write_mib(4).await.unwrap();
    for _ in 0..6000 {
        if oncrpc::bufpool::idle_bytes() >= MIB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        oncrpc::bufpool::idle_bytes() >= MIB,
        "the sinks are kept for reuse"
    );
    drop(polite);
    // The connection closes: its pool goes with it, not at some later call.
    for _ in 0..6000 {
        if budget.connections() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(budget.connections(), 0);
    assert_eq!(oncrpc::bufpool::idle_bytes(), 0);
    assert_eq!(budget.used(), 0);
}
