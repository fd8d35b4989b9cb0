//! Backward-direction calls on an accepted connection (RFC 8167): [`ServerConnection`] for
//! callers that hold a connection, [`RdmaBack`] for upper layers that reach it through the
//! `oncrpc::BackChannel` of a call's context (NFSv4.1 callbacks).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncrpc::{BackCall, BackChannel, RpcError};
use tokio::sync::oneshot;
use xdr::Encoder;

use super::server::{ServerConn, perform};
use crate::responder;

/// A handle on one accepted connection, for backward-direction calls (RFC 8167).
#[derive(Clone)]
pub struct ServerConnection {
    pub(super) conn: Arc<ServerConn>,
}

impl std::fmt::Debug for ServerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConnection")
            .field("peer", &self.conn.peer)
            .finish_non_exhaustive()
    }
}

impl ServerConnection {
    pub(super) fn new(conn: Arc<ServerConn>) -> Self {
        ServerConnection { conn }
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.conn.peer
    }

    /// The connection's Responder counters.
    pub fn stats(&self) -> responder::ResponderStats {
        self.conn.resp.lock().stats().clone()
    }

    /// Whether the connection is being drained ([`ServerConnection::drain`]): new calls are
    /// dropped.
    pub fn quiescing(&self) -> bool {
        self.conn.resp.lock().is_quiescing()
    }

    /// Responder-provided Read chunks waiting for their notification, and their bytes.
    pub fn rrc_waiting(&self) -> (usize, usize) {
        self.conn.resp.lock().rrc_waiting()
    }

    /// Close this connection at once (the client reconnects and retransmits; replies not yet
    /// transmitted are lost: [`ServerConnection::drain`] closes without losing any).
    pub async fn disconnect(&self) {
        self.conn.link.conn.disconnect().await;
    }

    /// The Upper Layer learnt that the client handles backward calls (for NFSv4.1, a
    /// CREATE_SESSION or BIND_CONN_TO_SESSION asking for the back channel): RFC 8167 §6.
    pub fn enable_backchannel(&self) {
        self.conn.resp.lock().enable_backchannel();
    }

    /// Make a backward-direction call (AUTH_NONE) and wait for its results. Fails with
    /// [`RpcError::Transport`] before [`ServerConnection::enable_backchannel`].
    pub async fn back_call(
        &self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: impl FnOnce(&mut Encoder),
        timeout: Duration,
    ) -> Result<Bytes, RpcError> {
        let mut e = Encoder::new();
        args(&mut e);
        let call = BackCall {
            prog,
            vers,
            proc_,
            cred: oncrpc::OpaqueAuth::none(),
            args: e.into_bytes(),
        };
        back_call(self.conn.clone(), call, timeout).await
    }
}

/// Send `call` on `c` and wait for its reply or the Responder's deadline.
async fn back_call(
    c: Arc<ServerConn>,
    call: BackCall,
    timeout: Duration,
) -> Result<Bytes, RpcError> {
    let xid = c.next_xid.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    c.back_waiters.lock().insert(xid, tx);
    // The Responder owns the deadline: `server_timer` ends the call when it is due.
    let sent = {
        let mut r = c.resp.lock();
        let sent = r.back_call_until(xid, call.message(xid), Some(Instant::now() + timeout));
        c.arm(&r);
        sent
    };
    let actions = match sent {
        Ok(a) => a,
        Err(responder::BackError::Closed) => {
            c.back_waiters.lock().remove(&xid);
            return Err(RpcError::Closed);
        }
        Err(err) => {
            c.back_waiters.lock().remove(&xid);
            return Err(RpcError::Transport(err.to_string()));
        }
    };
    // A client that reads nothing may never complete the Send: the Sends go from a task
    // of their own, and this call waits only for its reply or the Responder's deadline.
    let conn = c.clone();
    tokio::spawn(async move { perform(actions, &conn.link, &conn.resp, None).await });
    let msg = match rx.await {
        Ok(r) => r?,
        Err(_) => return Err(RpcError::Closed),
    };
    oncrpc::backchannel::reply_results(&msg)
}

/// The backward direction of a connection as a call's context carries it. It holds the
/// connection weakly: a context kept after the connection closed makes no calls.
pub(super) struct RdmaBack(pub(super) Weak<ServerConn>);

impl BackChannel for RdmaBack {
    fn enable(&self) {
        if let Some(c) = self.0.upgrade() {
            c.resp.lock().enable_backchannel();
        }
    }

    fn call(
        &self,
        call: BackCall,
        timeout: Duration,
    ) -> oncrpc::service::BoxFuture<'static, Result<Bytes, RpcError>> {
        let conn = self.0.upgrade();
        Box::pin(async move {
            match conn {
                Some(c) => back_call(c, call, timeout).await,
                None => Err(RpcError::Closed),
            }
        })
    }
}
