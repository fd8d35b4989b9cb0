//! Connecting an NFSv3 client the way `nfs client` and `nfs bench` do: RPC-over-RDMA (with the
//! NFS binding's DDP-eligibility, RFC 8267, and the reply mode asked for) or TCP, then MNT over
//! TCP on the NFS host (RFC 8267 §5.1: MOUNT does not go over RPC-over-RDMA).

use std::net::SocketAddr;
use std::sync::Arc;

use nfs::client::{MountClient, Nfs3Client};
use oncrpc::{RpcTransport, TcpClient};
use rpcrdma::rrc::{ReplyMode, RrcConfig};
use rpcrdma::{RdmaClient, TransportConfig};

use crate::nfs_bench::BenchError;

/// Port NFS servers listen on (the MOUNT default for RPC-over-RDMA clients).
pub const NFS_PORT: u16 = 2049;

/// Connect an NFS client (AUTH_SYS uid/gid) over RPC-over-RDMA to `rdma`, else over TCP to `tcp`,
/// and MNT `export` over TCP on the NFS host (port `mount_port`, else the TCP port, else
/// [`NFS_PORT`]); returns the client, the export's root handle and a description.
pub async fn connect_client(
    rdma: Option<SocketAddr>,
    tcp: Option<SocketAddr>,
    mount_port: Option<u16>,
    export: &str,
    uid: u32,
    gid: u32,
) -> Result<(Nfs3Client, nfs::nfs3::Fh3, String), BenchError> {
    connect_client_with(
        rdma,
        tcp,
        mount_port,
        export,
        uid,
        gid,
        ReplyMode::WriteChunk,
    )
    .await
}

/// The RPC-over-RDMA client settings of `mode`: write-chunk is the default transport
/// (nothing announced); the others announce responder-provided Read chunks, which need
/// version 2 (a process default of version 1 becomes a version 2 probe that falls back).
pub fn rdma_client_config(mode: ReplyMode) -> TransportConfig {
    let mut t = TransportConfig::default();
    if mode != ReplyMode::WriteChunk {
        t.rpc.rrc = RrcConfig {
            enabled: true,
            reply_mode: mode,
            ..RrcConfig::default()
        };
        if t.rpc.version_policy == rpcrdma::version::VersionPolicy::V1 {
            t.rpc.version_policy = rpcrdma::version::VersionPolicy::Auto;
        }
    }
    t
}

/// [`connect_client`] with the RPC-over-RDMA client asking for large replies in `mode`.
pub async fn connect_client_with(
    rdma: Option<SocketAddr>,
    tcp: Option<SocketAddr>,
    mount_port: Option<u16>,
    export: &str,
    uid: u32,
    gid: u32,
    mode: ReplyMode,
) -> Result<(Nfs3Client, nfs::nfs3::Fh3, String), BenchError> {
    let (nfs_addr, transport): (SocketAddr, Arc<dyn RpcTransport>) = match (rdma, tcp) {
        (Some(a), _) => {
            // RFC 8267: the NFS binding makes READ/WRITE/READLINK data DDP-eligible.
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> =
                Arc::new(nfs::ulb::NfsBinding::new());
            let c = RdmaClient::connect_with(a, rdma_client_config(mode), vec![ulb], None)
                .await
                .map_err(|e| format!("cannot connect to rdma://{a}: {e}"))?;
            (a, Arc::new(c))
        }
        (None, Some(a)) => {
            let c = TcpClient::connect(a)
                .await
                .map_err(|e| format!("cannot connect to tcp://{a}: {e}"))?;
            (a, Arc::new(c))
        }
        (None, None) => return Err("give --rdma ADDR or --tcp ADDR".into()),
    };
    let mport = mount_port.unwrap_or(match tcp {
        Some(t) if rdma.is_none() => t.port(),
        _ => NFS_PORT,
    });
    let maddr = SocketAddr::new(nfs_addr.ip(), mport);
    let mrpc = TcpClient::connect(maddr)
        .await
        .map_err(|e| format!("cannot connect to MOUNT at tcp://{maddr}: {e}"))?;
    let root = MountClient::new(Arc::new(mrpc))
        .mnt(export)
        .await
        .map_err(|e| format!("MNT {export} at tcp://{maddr}: {e}"))?;
    let scheme = if rdma.is_some() { "rdma" } else { "tcp" };
    let desc = format!("{scheme}://{nfs_addr} (MOUNT tcp://{maddr}, export {export})");
    let client = Nfs3Client::new(transport).with_auth_sys(uid, gid, vec![gid]);
    if rdma.is_some() && mode != ReplyMode::WriteChunk {
        // The first call settles the version and both sides' transport properties; only the
        // calls after it can go without Write and Reply chunks.
        client.null().await?;
    }
    Ok((client, root, desc))
}
