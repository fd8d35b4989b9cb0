//! The MOUNT v3 client (RFC 1813 Appendix I).

use std::sync::Arc;

use bytes::Bytes;
use oncrpc::{ReplyExpectation, RpcTransport};
use xdr::{XdrDecode, XdrEncode};

use super::{Caller, ClientError, auth_sys};
use crate::mount::{self, DirPath, Exports, MountList, MountRes};
use crate::nfs3::*;
use crate::xdr_util::Void;

/// A MOUNT version 3 client (RFC 8267 §5.1: use it over TCP).
#[derive(Clone)]
pub struct MountClient {
    c: Caller,
}

impl std::fmt::Debug for MountClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountClient")
            .field("transport", &self.c.rpc.describe())
            .finish_non_exhaustive()
    }
}

impl MountClient {
    /// A client calling with AUTH_SYS uid/gid 0 (mountd accepts AUTH_NONE too).
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        MountClient {
            c: Caller {
                rpc,
                cred: auth_sys(0, 0, Vec::new()),
                timeout: None,
            },
        }
    }

    async fn call<A, R>(&self, proc_: u32, args: A) -> Result<R, ClientError>
    where
        A: XdrEncode + Send + Sync + 'static,
        R: for<'a> XdrDecode<'a>,
    {
        self.c
            .call(
                mount::PROGRAM,
                mount::VERSION,
                proc_,
                args,
                ReplyExpectation::default(),
            )
            .await
    }

    /// NULL.
    pub async fn null(&self) -> Result<(), ClientError> {
        let _: Void = self.call(mount::proc_::NULL, Void).await?;
        Ok(())
    }

    /// MNT: the root file handle of `path`.
    pub async fn mnt(&self, path: &str) -> Result<Fh3, ClientError> {
        let r: MountRes = self
            .call(
                mount::proc_::MNT,
                DirPath(Bytes::copy_from_slice(path.as_bytes())),
            )
            .await?;
        match r {
            MountRes::Ok(ok) => Ok(Fh3(ok.fhandle.0)),
            MountRes::Err(s) => Err(ClientError::Mount(s)),
        }
    }

    /// DUMP.
    pub async fn dump(&self) -> Result<MountList, ClientError> {
        self.call(mount::proc_::DUMP, Void).await
    }

    /// UMNT.
    pub async fn umnt(&self, path: &str) -> Result<(), ClientError> {
        let _: Void = self
            .call(
                mount::proc_::UMNT,
                DirPath(Bytes::copy_from_slice(path.as_bytes())),
            )
            .await?;
        Ok(())
    }

    /// UMNTALL.
    pub async fn umntall(&self) -> Result<(), ClientError> {
        let _: Void = self.call(mount::proc_::UMNTALL, Void).await?;
        Ok(())
    }

    /// EXPORT.
    pub async fn export(&self) -> Result<Exports, ClientError> {
        self.call(mount::proc_::EXPORT, Void).await
    }
}
