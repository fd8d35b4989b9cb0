//! The transport-neutral server side: programs, calls, outcomes and the dispatcher.
//!
//! A [`Program`] sees a decoded [`Call`] and returns an [`Outcome`]. It never sees the transport:
//! the same program is served over TCP (record marking) and over RPC-over-RDMA. The only thing a
//! transport passes through is [`Call::reply_policy`], which tells the program's encoder whether
//! DDP-eligible result items (RFC 8166 §6.1) may be reduced into Write chunks.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use xdr::{DdpPolicy, Decoder, Encoded, Encoder};

use crate::auth::{Credential, OpaqueAuth};
use crate::message::{
    AcceptStat, AuthStat, CallHeader, MessageError, MessageHeader, RPC_VERSION, RejectedReply,
    ReplyHeader,
};

/// A boxed, sendable future (object-safe async in traits).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which transport carried a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// ONC RPC over TCP with record marking (RFC 5531 §11).
    Tcp,
    /// RPC-over-RDMA (RFC 8166).
    Rdma,
    /// In-process (tests).
    Local,
}

/// Facts about the connection a call arrived on.
#[derive(Debug, Clone)]
pub struct CallContext {
    pub peer: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub transport: TransportKind,
    /// The connection's backward direction, when the transport offers one
    /// ([`crate::backchannel`]).
    pub back: Option<crate::backchannel::BackHandle>,
}

impl CallContext {
    /// A context for in-process calls.
    pub fn local() -> Arc<Self> {
        Arc::new(CallContext {
            peer: None,
            local: None,
            transport: TransportKind::Local,
            back: None,
        })
    }
}

/// One decoded call, handed to a [`Program`].
#[derive(Debug, Clone)]
pub struct Call {
    pub header: CallHeader,
    /// The credential, parsed (AUTH_NONE, AUTH_SYS, RPCSEC_GSS service).
    pub credential: Credential,
    /// The procedure arguments: the rest of the call's XDR stream, with any Read chunk data
    /// already put back in place by the transport.
    pub args: Bytes,
    pub context: Arc<CallContext>,
    /// How the program must encode DDP-eligible result items.
    pub reply_policy: DdpPolicy,
    /// What the transport knew of the call's neighbours when it handed the call over.
    pub hints: CallHints,
}

/// What a transport knows of a call's neighbours on its connection when it hands the call to
/// the [`Dispatcher`]. Hints only: a program that ignores them is correct, only slower.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallHints {
    /// No other call of this connection was executing, and none of its bytes were waiting
    /// to be read, when this call was handed over: work the program does on the calling task
    /// holds back no other call of the connection. The NFS server then reads up to 1 MiB
    /// from the page cache there instead of hopping to a blocking thread and back.
    pub alone: bool,
}

impl CallHints {
    /// Hints for a call that is alone on its connection, or not ([`CallHints::alone`]).
    pub fn alone_if(alone: bool) -> Self {
        CallHints { alone }
    }
}

impl Call {
    /// An encoder for the results, set up with the transport's reduction policy.
    pub fn reply_encoder(&self) -> Encoder {
        Encoder::new().with_policy(self.reply_policy)
    }

    /// A decoder over the arguments (zero-copy opaques).
    pub fn args_decoder(&self) -> Decoder<'_> {
        Decoder::from_bytes(&self.args)
    }
}

/// What a program made of a call.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// SUCCESS with these results.
    Success(Encoded),
    /// PROC_UNAVAIL.
    ProcUnavail,
    /// GARBAGE_ARGS: the arguments could not be decoded.
    GarbageArgs,
    /// SYSTEM_ERR.
    SystemErr,
    /// MSG_DENIED / AUTH_ERROR.
    AuthError(AuthStat),
    /// Send no reply at all (for example a duplicate request still in progress).
    NoReply,
}

/// An RPC program (one program number, a range of versions).
pub trait Program: Send + Sync + 'static {
    /// The program number.
    fn program(&self) -> u32;
    /// Lowest and highest version served (PROG_MISMATCH reports them).
    fn versions(&self) -> (u32, u32);
    /// Human-readable name, for logs and `rpcinfo`-like listings.
    fn name(&self) -> &'static str {
        "program"
    }
    /// Execute one call. The version is within [`Program::versions`].
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome>;
}

/// A finished reply message, ready for a transport.
#[derive(Debug)]
pub struct ReplyMessage {
    pub xid: u32,
    /// The whole RPC reply (header and results). Reduced result items carry Positions relative
    /// to the start of this stream.
    pub message: Encoded,
}

/// Routes calls to programs and builds the reply for every RFC 5531 outcome.
#[derive(Clone, Default)]
pub struct Dispatcher {
    programs: HashMap<u32, Arc<dyn Program>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut progs: Vec<_> = self.programs.keys().copied().collect();
        progs.sort_unstable();
        f.debug_struct("Dispatcher")
            .field("programs", &progs)
            .finish()
    }
}

impl Dispatcher {
    /// An empty dispatcher: every call gets PROG_UNAVAIL.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve `program`. A later registration of the same program number replaces it.
    pub fn register(&mut self, program: Arc<dyn Program>) -> &mut Self {
        self.programs.insert(program.program(), program);
        self
    }

    /// Builder form of [`Dispatcher::register`].
    pub fn with(mut self, program: Arc<dyn Program>) -> Self {
        self.register(program);
        self
    }

    /// The registered programs: (program, low version, high version, name).
    pub fn programs(&self) -> Vec<(u32, u32, u32, &'static str)> {
        let mut v: Vec<_> = self
            .programs
            .values()
            .map(|p| {
                let (lo, hi) = p.versions();
                (p.program(), lo, hi, p.name())
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Handle one complete RPC message. Returns the reply to send, or `None` when nothing may
    /// be sent (a malformed header whose XID cannot be trusted, a REPLY message, or
    /// [`Outcome::NoReply`]).
    pub async fn dispatch(
        &self,
        msg: Bytes,
        context: Arc<CallContext>,
        reply_policy: DdpPolicy,
    ) -> Option<ReplyMessage> {
        self.dispatch_hinted(msg, context, reply_policy, CallHints::default())
            .await
    }

    /// [`Dispatcher::dispatch`], with what the transport knows of the call's neighbours.
    pub async fn dispatch_hinted(
        &self,
        msg: Bytes,
        context: Arc<CallContext>,
        reply_policy: DdpPolicy,
        hints: CallHints,
    ) -> Option<ReplyMessage> {
        let (header, args) = match MessageHeader::decode_message(&msg) {
            Ok((MessageHeader::Call(h), args)) => (h, args),
            Ok((MessageHeader::Reply(_), _)) => return None,
            // RFC 5531 §9: a call with rpcvers != 2 is rejected with RPC_MISMATCH.
            Err(MessageError::RpcVersion { xid, .. }) => {
                return Some(denied(
                    xid,
                    RejectedReply::RpcMismatch {
                        low: RPC_VERSION,
                        high: RPC_VERSION,
                    },
                ));
            }
            Err(e) => {
                tracing::debug!(error = %e, "discarding malformed RPC message");
                return None;
            }
        };
        self.dispatch_call_hinted(header, args, context, reply_policy, hints)
            .await
    }

    /// Handle a call whose header has already been decoded.
    pub async fn dispatch_call(
        &self,
        header: CallHeader,
        args: Bytes,
        context: Arc<CallContext>,
        reply_policy: DdpPolicy,
    ) -> Option<ReplyMessage> {
        self.dispatch_call_hinted(header, args, context, reply_policy, CallHints::default())
            .await
    }

    async fn dispatch_call_hinted(
        &self,
        header: CallHeader,
        args: Bytes,
        context: Arc<CallContext>,
        reply_policy: DdpPolicy,
        hints: CallHints,
    ) -> Option<ReplyMessage> {
        let xid = header.xid;
        let credential = match Credential::parse(&header.cred) {
            Ok(c) => c,
            // RFC 5531 §9: a credential the server cannot decode is AUTH_BADCRED.
            Err(_) => return Some(denied(xid, RejectedReply::AuthError(AuthStat::BadCred))),
        };
        let Some(program) = self.programs.get(&header.prog) else {
            return Some(accepted(xid, AcceptStat::ProgUnavail, None));
        };
        let (low, high) = program.versions();
        if header.vers < low || header.vers > high {
            return Some(accepted(xid, AcceptStat::ProgMismatch { low, high }, None));
        }
        let call = Call {
            header,
            credential,
            args,
            context,
            reply_policy,
            hints,
        };
        let outcome = program.call(call).await;
        match outcome {
            Outcome::Success(results) => Some(accepted(xid, AcceptStat::Success, Some(results))),
            Outcome::ProcUnavail => Some(accepted(xid, AcceptStat::ProcUnavail, None)),
            Outcome::GarbageArgs => Some(accepted(xid, AcceptStat::GarbageArgs, None)),
            Outcome::SystemErr => Some(accepted(xid, AcceptStat::SystemErr, None)),
            Outcome::AuthError(stat) => Some(denied(xid, RejectedReply::AuthError(stat))),
            Outcome::NoReply => None,
        }
    }
}

/// Build an accepted reply with an AUTH_NONE verifier.
pub fn accepted(xid: u32, stat: AcceptStat, results: Option<Encoded>) -> ReplyMessage {
    let h = ReplyHeader::Accepted {
        xid,
        verf: OpaqueAuth::none(),
        stat,
    };
    let mut enc = Encoder::with_capacity(h.encoded_len());
    h.encode(&mut enc);
    let head = enc.into_bytes();
    let message = match results {
        Some(mut r) => {
            r.prepend(head);
            r
        }
        None => {
            let mut e = Encoded::default();
            e.prepend(head);
            e
        }
    };
    ReplyMessage { xid, message }
}

/// Build a denied reply.
pub fn denied(xid: u32, reason: RejectedReply) -> ReplyMessage {
    let h = ReplyHeader::Denied { xid, reason };
    let mut enc = Encoder::with_capacity(h.encoded_len());
    h.encode(&mut enc);
    let mut message = Encoded::default();
    message.prepend(enc.into_bytes());
    ReplyMessage { xid, message }
}
