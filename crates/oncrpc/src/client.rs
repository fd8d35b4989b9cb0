//! The transport-neutral client side: a call request, the errors, and the [`RpcTransport`]
//! trait that the TCP client here and the RPC-over-RDMA client in `rpcrdma` both implement.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xdr::Encoder;

use crate::auth::OpaqueAuth;
use crate::message::{AcceptStat, CallHeader, RejectedReply};
use crate::service::BoxFuture;

/// Encodes a call's arguments. It may run more than once (a retransmission over RDMA re-encodes
/// with fresh memory registrations), each time into an encoder whose policy the transport chose.
pub type ArgsEncoder = Arc<dyn Fn(&mut Encoder) + Send + Sync>;

/// What the Upper-Layer Binding knows about the reply before it arrives (RFC 8166 §6:
/// the Requester must provision Write chunks and a Reply chunk before sending the call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyExpectation {
    /// The largest reply (RPC header and results, all items inline) the procedure can produce.
    /// `None` when unbounded or unknown.
    pub max_len: Option<usize>,
    /// Maximum sizes of the reply's DDP-eligible items, in XDR order (one Write chunk each).
    pub ddp_items: Vec<usize>,
}

/// One call to make.
#[derive(Clone)]
pub struct CallRequest {
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub cred: OpaqueAuth,
    pub verf: OpaqueAuth,
    /// Writes the procedure arguments (not the RPC header).
    pub args: ArgsEncoder,
    pub reply: ReplyExpectation,
    /// Per-call timeout; the transport's default when `None`.
    pub timeout: Option<Duration>,
}

impl std::fmt::Debug for CallRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallRequest")
            .field("prog", &self.prog)
            .field("vers", &self.vers)
            .field("proc", &self.proc_)
            .field("cred_flavor", &self.cred.flavor)
            .field("reply", &self.reply)
            .finish_non_exhaustive()
    }
}

impl CallRequest {
    /// A call with AUTH_NONE, no special reply expectations, and arguments from `args`.
    pub fn new(
        prog: u32,
        vers: u32,
        proc_: u32,
        args: impl Fn(&mut Encoder) + Send + Sync + 'static,
    ) -> Self {
        CallRequest {
            prog,
            vers,
            proc_,
            cred: OpaqueAuth::none(),
            verf: OpaqueAuth::none(),
            args: Arc::new(args),
            reply: ReplyExpectation::default(),
            timeout: None,
        }
    }

    /// A call with no arguments (the NULL procedure).
    pub fn null(prog: u32, vers: u32) -> Self {
        Self::new(prog, vers, 0, |_| {})
    }

    /// Set the credential.
    pub fn with_cred(mut self, cred: OpaqueAuth) -> Self {
        self.cred = cred;
        self
    }

    /// Set what the reply may hold.
    pub fn with_reply(mut self, reply: ReplyExpectation) -> Self {
        self.reply = reply;
        self
    }

    /// Set the timeout.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// The RPC call header (RFC 5531 §9) of this call under `xid`.
    pub fn header(&self, xid: u32) -> CallHeader {
        CallHeader {
            xid,
            prog: self.prog,
            vers: self.vers,
            proc_: self.proc_,
            cred: self.cred.clone(),
            verf: self.verf.clone(),
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// No reply within the timeout (after any retransmissions).
    #[error("RPC call timed out")]
    Timeout,
    /// The connection failed and could not be re-established.
    #[error("RPC transport failed: {0}")]
    Transport(String),
    /// An I/O error.
    #[error("RPC I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The server rejected the call (MSG_DENIED).
    #[error("RPC call rejected: {0:?}")]
    Rejected(RejectedReply),
    /// The server accepted the call but did not execute it successfully.
    #[error("RPC call not executed: {0:?}")]
    Accepted(AcceptStat),
    /// The reply could not be decoded.
    #[error("malformed RPC reply: {0}")]
    BadReply(String),
    /// The transport has been shut down.
    #[error("RPC client is closed")]
    Closed,
    /// The RPC-over-RDMA Responder answered RDMA_ERR_CHUNK (RFC 8166 §4.5.2): it could not
    /// parse the transport header, or the reply did not fit the reply resources the call
    /// offered (its Reply chunk or the inline threshold; RFC 8267 §3.1).
    #[error("RPC-over-RDMA responder returned RDMA_ERR_CHUNK")]
    RdmaErrChunk,
    /// The transport may not carry calls of this program and version, so nothing was sent.
    /// RPC-over-RDMA carries only programs that have an Upper-Layer Binding (RFC 8166 §6:
    /// "Each RPC Program and Version tuple that utilizes RPC-over-RDMA version 1 needs to have a
    /// ULB specification").
    #[error("program {prog} version {vers} has no Upper-Layer Binding on this transport; not sent")]
    NoBinding { prog: u32, vers: u32 },
}

/// A client transport: sends calls, matches replies by XID, returns the results of an
/// accepted, successful reply (the XDR after the reply header).
pub trait RpcTransport: Send + Sync + 'static {
    /// Make one call.
    fn call(&self, req: CallRequest) -> BoxFuture<'_, Result<Bytes, RpcError>>;
    /// A short description ("tcp://127.0.0.1:2049").
    fn describe(&self) -> String;
    /// Round-trip times per procedure, from each call's transmission to its reply's arrival
    /// ([`crate::rtt`]), when this transport measures them.
    fn rtt(&self) -> Option<Arc<crate::rtt::RttTable>> {
        None
    }
}

/// A client for one program and version over any [`RpcTransport`], with a fixed credential.
#[derive(Clone)]
pub struct RpcClient {
    transport: Arc<dyn RpcTransport>,
    prog: u32,
    vers: u32,
    cred: OpaqueAuth,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("transport", &self.transport.describe())
            .field("prog", &self.prog)
            .field("vers", &self.vers)
            .field("cred_flavor", &self.cred.flavor)
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// Calls to `prog`/`vers` with AUTH_NONE over `transport`.
    pub fn new(transport: Arc<dyn RpcTransport>, prog: u32, vers: u32) -> Self {
        RpcClient {
            transport,
            prog,
            vers,
            cred: OpaqueAuth::none(),
            timeout: None,
        }
    }

    /// Use this credential (for example [`OpaqueAuth::sys`]) on every call.
    pub fn with_cred(mut self, cred: OpaqueAuth) -> Self {
        self.cred = cred;
        self
    }

    /// Per-call timeout (the transport's default otherwise).
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<dyn RpcTransport> {
        &self.transport
    }

    /// Call procedure `proc_`; `args` writes the arguments. Returns the results (the XDR after
    /// the reply header) of a successful reply.
    pub async fn call(
        &self,
        proc_: u32,
        args: impl Fn(&mut Encoder) + Send + Sync + 'static,
        reply: ReplyExpectation,
    ) -> Result<Bytes, RpcError> {
        let mut req = CallRequest::new(self.prog, self.vers, proc_, args)
            .with_cred(self.cred.clone())
            .with_reply(reply);
        req.timeout = self.timeout;
        self.transport.call(req).await
    }

    /// Call the NULL procedure (0). Any results are ignored.
    pub async fn null(&self) -> Result<(), RpcError> {
        self.call(0, |_| {}, ReplyExpectation::default())
            .await
            .map(drop)
    }
}
