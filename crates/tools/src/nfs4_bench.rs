//! The NFSv4.1/4.2 half of `nfs bench` ([`crate::nfs_bench`]): the same sequential WRITE and
//! READ passes at each I/O size and the same GETATTRs, through [`nfs::client::Nfs4Client`]
//! (one session; every COMPOUND is SEQUENCE, PUTFH and the operation), so its rows compare
//! with NFSv3's on the same server and transport.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::client::{Nfs4Client, Open4};
use nfs::nfs4::consts::{attr, stable};
use oncrpc::{AuthSys, OpaqueAuth, RpcTransport, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};

use crate::nfs_bench::{BenchConfig, BenchError, NfsVersion, Pass, Progress, Row, one_at_a_time};

/// Start an NFSv4 session of minor version `minor` over RPC-over-RDMA to `rdma`, else over
/// TCP to `tcp`, as AUTH_SYS `uid`/`gid`; returns the client and a description.
pub async fn connect_client4(
    rdma: Option<SocketAddr>,
    tcp: Option<SocketAddr>,
    minor: u32,
    uid: u32,
    gid: u32,
) -> Result<(Nfs4Client, String), BenchError> {
    let (addr, scheme, transport): (SocketAddr, &str, Arc<dyn RpcTransport>) = match (rdma, tcp) {
        (Some(a), _) => {
            // RFC 8267 §6: the NFS binding makes WRITE data and READ results DDP-eligible.
            let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> =
                Arc::new(nfs::ulb::NfsBinding::new());
            let c = RdmaClient::connect_with(a, TransportConfig::default(), vec![ulb], None)
                .await
                .map_err(|e| format!("cannot connect to rdma://{a}: {e}"))?;
            (a, "rdma", Arc::new(c))
        }
        (None, Some(a)) => {
            let c = TcpClient::connect(a)
                .await
                .map_err(|e| format!("cannot connect to tcp://{a}: {e}"))?;
            (a, "tcp", Arc::new(c))
        }
        (None, None) => return Err("give --rdma ADDR or --tcp ADDR".into()),
    };
    let cred = OpaqueAuth::sys(&AuthSys {
        stamp: 0,
        machinename: Bytes::from_static(b"oxrdma"),
        uid,
        gid,
        gids: Vec::new(),
    });
    let owner = format!(
        "oxrdma {} {:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let c = Nfs4Client::connect(transport, cred, minor, owner.as_bytes(), None)
        .await
        .map_err(|e| format!("NFSv4.{minor} session at {scheme}://{addr}: {e}"))?;
    let desc = format!("{scheme}://{addr} (NFSv4.{minor}, {} slots)", c.slots());
    Ok((c, desc))
}

fn err(e: nfs::client::Nfs4Error) -> BenchError {
    BenchError::Failed(e.to_string())
}

/// Sequential WRITE then READ of each I/O size's pass, then GETATTR, on one session.
pub(crate) async fn bench_nfs4(
    name: &'static str,
    version: NfsVersion,
    c: Arc<Nfs4Client>,
    a: &BenchConfig,
    pb: &dyn Progress,
) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    let root = c.root().await.map_err(err)?;
    for io in a.io.iter().copied() {
        let total = a.pass_bytes(io);
        let fname = format!("bench.{name}.v{}.{io}", version.name());
        let f: Arc<Open4> = Arc::new(
            c.open(&root, fname.as_bytes(), Some(0o644))
                .await
                .map_err(err)?,
        );
        let buf = Bytes::from(vec![0x5a_u8; io as usize]);
        let write = |off: u64| {
            let (c, f, buf) = (c.clone(), f.clone(), buf.clone());
            async move {
                let (n, _, _) = c
                    .write(&f, off, buf, stable::UNSTABLE4)
                    .await
                    .map_err(err)?;
                if n != io {
                    return Err(format!("WRITE at {off} wrote {n} of {io} bytes").into());
                }
                Ok(())
            }
        };
        let read = |off: u64| {
            let (c, f) = (c.clone(), f.clone());
            async move {
                let (d, _) = c.read(&f, off, io).await.map_err(err)?;
                if d.len() != io as usize {
                    return Err(format!("READ at {off} returned {} of {io} bytes", d.len()).into());
                }
                Ok(())
            }
        };
        let pass = Pass {
            transport: name,
            version,
            io,
            total,
            depth: a.depth,
            pb,
            transport_rpc: c.transport(),
        };
        rows.push(
            pass.run("WRITE", write, || async {
                c.commit(&f.fh).await.map(drop).map_err(err)
            })
            .await?,
        );
        rows.push(pass.run("READ", read, || async { Ok(()) }).await?);
        c.close(&f).await.map_err(err)?;
        c.remove(&root, fname.as_bytes()).await.map_err(err)?;
    }
    pb.set_message(format!("{name} v{} GETATTR", version.name()));
    rows.push(
        one_at_a_time(
            name,
            version,
            "GETATTR",
            a.round_getattrs(),
            c.transport(),
            || async {
                c.getattr(&root, &[attr::TYPE, attr::CHANGE, attr::SIZE, attr::MODE])
                    .await
                    .map(drop)
                    .map_err(err)
            },
        )
        .await?,
    );
    Ok(rows)
}
