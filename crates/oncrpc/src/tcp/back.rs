//! The backward direction of an accepted TCP connection: the server calls its client on the
//! client's connection (NFSv4.1 back channels, RFC 8881 §2.10.3.1: "the client and server can
//! use the same connection for both directions"). Calls go out through the connection's
//! writer; replies are told from calls by their message type (RFC 5531 §9) and matched here
//! by XID.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::backchannel::{BackCall, BackChannel, reply_results};
use crate::client::RpcError;
use crate::service::BoxFuture;

/// Backward calls outstanding on one connection at most; more are refused at once.
pub const MAX_BACK_OUTSTANDING: usize = 16;

type Waiter = oneshot::Sender<Result<Bytes, RpcError>>;

/// One connection's backward calls.
pub(super) struct TcpBack {
    /// The connection's writer; `None` once the connection is going away.
    out: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    waiters: Mutex<HashMap<u32, Waiter>>,
    next_xid: AtomicU32,
}

impl TcpBack {
    pub(super) fn new(out: mpsc::UnboundedSender<Bytes>) -> Arc<Self> {
        Arc::new(TcpBack {
            out: Mutex::new(Some(out)),
            waiters: Mutex::new(HashMap::new()),
            next_xid: AtomicU32::new(rand::random()),
        })
    }

    /// Whether `record` is an RPC reply (message type REPLY, RFC 5531 §9), which on a
    /// server's connection can only answer one of its backward calls.
    pub(super) fn is_reply(record: &[u8]) -> bool {
        record.get(4..8) == Some(&1u32.to_be_bytes()[..])
    }

    /// A reply arrived: complete its call (an unknown XID, late or never sent, is dropped).
    pub(super) fn on_reply(&self, record: Bytes) {
        let Some(xid) = record
            .get(..4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        else {
            return;
        };
        match self.waiters.lock().remove(&xid) {
            Some(w) => {
                let _ = w.send(reply_results(&record));
            }
            None => tracing::debug!(xid, "RPC/TCP reply matching no backward call dropped"),
        }
    }

    /// The connection is going away: no more calls, and those waiting end now.
    pub(super) fn close(&self) {
        self.out.lock().take();
        for (_, w) in self.waiters.lock().drain() {
            let _ = w.send(Err(RpcError::Closed));
        }
    }

    async fn call(self: Arc<Self>, call: BackCall, timeout: Duration) -> Result<Bytes, RpcError> {
        let (tx, rx) = oneshot::channel();
        let xid = {
            let mut w = self.waiters.lock();
            if w.len() >= MAX_BACK_OUTSTANDING {
                return Err(RpcError::Transport(format!(
                    "{MAX_BACK_OUTSTANDING} backward calls already outstanding"
                )));
            }
            let mut xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            while w.contains_key(&xid) {
                xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            }
            w.insert(xid, tx);
            xid
        };
        let sent = match self.out.lock().as_ref() {
            Some(out) => out.send(call.message(xid)).is_ok(),
            None => false,
        };
        if !sent {
            self.waiters.lock().remove(&xid);
            return Err(RpcError::Closed);
        }
        let r = tokio::time::timeout(timeout, rx).await;
        self.waiters.lock().remove(&xid);
        match r {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(RpcError::Closed),
            Err(_) => Err(RpcError::Timeout),
        }
    }
}

/// The [`BackChannel`] of an accepted TCP connection.
pub(super) struct TcpBackChannel(pub(super) Arc<TcpBack>);

impl BackChannel for TcpBackChannel {
    fn enable(&self) {}

    fn call(
        &self,
        call: BackCall,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Bytes, RpcError>> {
        Box::pin(self.0.clone().call(call, timeout))
    }
}
