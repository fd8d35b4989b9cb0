//! The port mapper client (RFC 1833: PMAP v2 and RPCBIND v3/v4): NULL, SET, UNSET, GETPORT,
//! GETADDR and DUMP, over any [`RpcTransport`] (TCP, or rpcbind's AF_LOCAL socket through
//! [`oncrpc::TcpClient::over_stream`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{OpaqueAuth, ReplyExpectation, RpcTransport};

use super::{Caller, ClientError};
use crate::portmap::{self, Mapping, Rpcb, RpcbString};
use crate::xdr_util::Void;

/// A port mapper / rpcbind client.
#[derive(Clone)]
pub struct PortmapClient {
    c: Caller,
}

impl std::fmt::Debug for PortmapClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortmapClient")
            .field("transport", &self.c.rpc.describe())
            .finish_non_exhaustive()
    }
}

impl PortmapClient {
    /// A client calling with AUTH_NONE.
    pub fn new(rpc: Arc<dyn RpcTransport>) -> Self {
        PortmapClient {
            c: Caller {
                rpc,
                cred: OpaqueAuth::none(),
                timeout: None,
            },
        }
    }

    /// The same client with a timeout for each call.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.c.timeout = Some(t);
        self
    }

    /// The NULL procedure of port mapper version `vers` (2, 3 or 4): is it there.
    pub async fn null(&self, vers: u32) -> Result<(), ClientError> {
        let _: Void = self
            .c
            .call(
                portmap::PROGRAM,
                vers,
                portmap::rpcb_proc::NULL,
                Void,
                ReplyExpectation::default(),
            )
            .await?;
        Ok(())
    }

    /// RPCBPROC_SET (rpcbind `vers` 3 or 4, RFC 1833 §2.2.1): register `r`; rpcbind's answer
    /// (false when the entry exists or the caller may not set it).
    pub async fn set(&self, vers: u32, r: &Rpcb) -> Result<bool, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                vers,
                portmap::rpcb_proc::SET,
                r.clone(),
                ReplyExpectation::default(),
            )
            .await
    }

    /// RPCBPROC_UNSET (rpcbind `vers` 3 or 4): remove the registrations of (prog, vers, netid)
    /// (every netid when `r_netid` is empty); whether any went.
    pub async fn unset(&self, vers: u32, r: &Rpcb) -> Result<bool, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                vers,
                portmap::rpcb_proc::UNSET,
                r.clone(),
                ReplyExpectation::default(),
            )
            .await
    }

    /// PMAPPROC_SET (v2, RFC 1833 §3.2): register `m` (a TCP or UDP port).
    pub async fn pmap_set(&self, m: Mapping) -> Result<bool, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::SET,
                m,
                ReplyExpectation::default(),
            )
            .await
    }

    /// PMAPPROC_UNSET (v2): remove every mapping of (prog, vers).
    pub async fn pmap_unset(&self, prog: u32, vers: u32) -> Result<bool, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::UNSET,
                Mapping {
                    prog,
                    vers,
                    prot: 0,
                    port: 0,
                },
                ReplyExpectation::default(),
            )
            .await
    }

    /// PMAPPROC_GETPORT (v2): the TCP port of (prog, vers), 0 when unregistered.
    pub async fn getport(&self, prog: u32, vers: u32) -> Result<u16, ClientError> {
        let port: u32 = self
            .c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::GETPORT,
                Mapping {
                    prog,
                    vers,
                    prot: portmap::IPPROTO_TCP,
                    port: 0,
                },
                ReplyExpectation::default(),
            )
            .await?;
        Ok(u16::try_from(port).unwrap_or(0))
    }

    /// PMAPPROC_DUMP (v2).
    pub async fn dump(&self) -> Result<portmap::List<Mapping>, ClientError> {
        self.c
            .call(
                portmap::PROGRAM,
                2,
                portmap::pmap_proc::DUMP,
                Void,
                ReplyExpectation::default(),
            )
            .await
    }

    /// RPCBPROC_GETADDR (rpcbind `vers` 3 or 4): the universal address, empty when unregistered.
    pub async fn getaddr(
        &self,
        vers: u32,
        prog: u32,
        prog_vers: u32,
        netid: &str,
    ) -> Result<String, ClientError> {
        let s: RpcbString = self
            .c
            .call(
                portmap::PROGRAM,
                vers,
                portmap::rpcb_proc::GETADDR,
                Rpcb {
                    prog,
                    vers: prog_vers,
                    netid: RpcbString(Bytes::copy_from_slice(netid.as_bytes())),
                    addr: RpcbString::default(),
                    owner: RpcbString::default(),
                },
                ReplyExpectation::default(),
            )
            .await?;
        Ok(String::from_utf8_lossy(s.as_bytes()).into_owned())
    }
}
