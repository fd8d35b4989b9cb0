//! The backward direction of a connection: calls a server makes to its client on the
//! connection the client opened (RFC 8167 on RPC-over-RDMA; on TCP the same stream, as
//! NFSv4.1 back channels use it, RFC 8881 §2.10.3.1).
//!
//! A transport puts a [`BackHandle`] in each connection's [`crate::CallContext`]; an upper
//! layer that learns the client takes calls (for NFSv4.1, a CREATE_SESSION or
//! BIND_CONN_TO_SESSION granting the back channel) calls [`BackChannel::enable`] and then
//! [`BackChannel::call`]. The transport matches the reply by XID and bounds what is
//! outstanding; the caller gives each call its timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xdr::Encoder;

use crate::auth::OpaqueAuth;
use crate::client::RpcError;
use crate::message::{AcceptStat, CallHeader, MessageHeader, ReplyHeader};
use crate::service::BoxFuture;

/// One backward call, before it has an XID.
#[derive(Debug, Clone)]
pub struct BackCall {
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    /// The credential (the verifier is AUTH_NONE).
    pub cred: OpaqueAuth,
    /// The procedure's arguments, encoded.
    pub args: Bytes,
}

impl BackCall {
    /// The whole RPC call message with XID `xid`.
    pub fn message(&self, xid: u32) -> Bytes {
        let h = CallHeader {
            xid,
            prog: self.prog,
            vers: self.vers,
            proc_: self.proc_,
            cred: self.cred.clone(),
            verf: OpaqueAuth::none(),
        };
        let mut e = Encoder::with_capacity(h.encoded_len() + self.args.len());
        h.encode(&mut e);
        e.put_raw(&self.args);
        e.into_bytes()
    }
}

/// The results of a backward call's reply message, or why it failed.
pub fn reply_results(msg: &Bytes) -> Result<Bytes, RpcError> {
    match MessageHeader::decode_message(msg) {
        Ok((MessageHeader::Reply(ReplyHeader::Accepted { stat, .. }), body)) => match stat {
            AcceptStat::Success => Ok(body),
            other => Err(RpcError::Accepted(other)),
        },
        Ok((MessageHeader::Reply(ReplyHeader::Denied { reason, .. }), _)) => {
            Err(RpcError::Rejected(reason))
        }
        Ok((MessageHeader::Call(_), _)) => Err(RpcError::BadReply("CALL as reply".into())),
        Err(e) => Err(RpcError::BadReply(e.to_string())),
    }
}

/// A connection's backward direction.
pub trait BackChannel: Send + Sync + 'static {
    /// The upper layer learnt that the client answers backward calls on this connection.
    /// Calls made before fail (RPC-over-RDMA, RFC 8167 §6); transports that need no such
    /// gate ignore it.
    fn enable(&self);
    /// Make a backward call and wait at most `timeout` for its results.
    fn call(
        &self,
        call: BackCall,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, RpcError>>;
}

/// A [`BackChannel`] as a [`crate::CallContext`] carries it.
#[derive(Clone)]
pub struct BackHandle(pub Arc<dyn BackChannel>);

impl std::fmt::Debug for BackHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackHandle(..)")
    }
}
