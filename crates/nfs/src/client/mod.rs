//! NFSv3, MOUNT v3 and port mapper clients over any [`oncrpc::RpcTransport`] (TCP or
//! RPC-over-RDMA).
//!
//! The NFS Upper-Layer Binding is applied on the call side: WRITE data and the SYMLINK path
//! are encoded with `put_ddp_opaque` (the [`Data`] and [`NfsPath`] types do it), so an
//! RPC-over-RDMA transport can move them through Read chunks; READ and READLINK calls carry a
//! [`ReplyExpectation`] with one DDP-eligible item of the requested size and the procedure's
//! maximum reply size (RFC 8267 §4, §4.1), so the transport can provision a Write chunk.
//! Every call returns the procedure's result union ([`Res`]): the NFS status and its
//! weak-cache-consistency data stay visible to the caller.
//!
//! One client per file: `nfs3`, `nfs4` (a minimal NFSv4.1/4.2 client with a session),
//! `mount3`, `rpcbind` (port mapper), `nfsacl`; `selftest` runs
//! them end to end. This module keeps the shared error type and call helper.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{AuthSys, CallRequest, OpaqueAuth, ReplyExpectation, RpcError, RpcTransport};
use xdr::{XdrDecode, XdrEncode};

use crate::mount;
use crate::nfs3::*;
use crate::xdr_util::decode_exact;

mod mount3;
mod nfs3;
mod nfs4;
mod nfsacl;
mod rpcbind;
mod selftest;
mod selftest4;

pub use mount3::MountClient;
pub use nfs3::{Nfs3Client, diropargs};
pub use nfs4::{Nfs4Client, Nfs4Error, Open4};
pub use nfsacl::NfsAclClient;
pub use rpcbind::PortmapClient;
pub use selftest::{SelftestError, selftest};
pub use selftest4::selftest4;

/// Why a client call failed (the NFS status of a completed call is in its result instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The RPC layer failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The results did not decode.
    #[error("malformed results: {0}")]
    Decode(#[from] xdr::XdrError),
    /// The server answered with an NFS or MOUNT error status.
    #[error("server returned {0}")]
    Status(Nfsstat3),
    /// MOUNT refused the path.
    #[error("MNT failed: {0:?}")]
    Mount(mount::Mountstat3),
}

impl<T, F> Res<T, F> {
    /// The success body, or the status as a [`ClientError::Status`].
    pub fn into_result(self) -> Result<T, ClientError> {
        match self {
            Res::Ok(t) => Ok(t),
            Res::Err(s, _) => Err(ClientError::Status(s)),
        }
    }
}

/// Shared plumbing: a transport, a credential, a timeout.
#[derive(Clone)]
struct Caller {
    rpc: Arc<dyn RpcTransport>,
    cred: OpaqueAuth,
    timeout: Option<Duration>,
}

/// The AUTH_SYS credential (RFC 5531 Appendix A) every client sends as machine "oxrdma".
fn auth_sys(uid: u32, gid: u32, gids: Vec<u32>) -> OpaqueAuth {
    OpaqueAuth::sys(&AuthSys {
        stamp: 0,
        machinename: Bytes::from_static(b"oxrdma"),
        uid,
        gid,
        gids,
    })
}

impl Caller {
    async fn call<A, R>(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: A,
        reply: ReplyExpectation,
    ) -> Result<R, ClientError>
    where
        A: XdrEncode + Send + Sync + 'static,
        R: for<'a> XdrDecode<'a>,
    {
        let mut req = CallRequest::new(prog, vers, proc_, move |e| args.encode(e))
            .with_cred(self.cred.clone())
            .with_reply(reply);
        req.timeout = self.timeout;
        let out: Bytes = self.rpc.call(req).await?;
        Ok(decode_exact(&out)?)
    }
}
