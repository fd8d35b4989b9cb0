//! The callback driver: the connections that can carry backward calls, and the sending of
//! what the state core says is due ([`super::super::state::State::take_callbacks`]), each
//! call with its deadline, its outcome reported back to the core.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use oncrpc::{AuthSys, BackCall, BackChannel, BackHandle, OpaqueAuth, TransportKind};
use parking_lot::Mutex;

use super::super::callback::wire::CB_VERSION;
use super::super::state::{CbOutcome, CbSend, CbWhat, ConnId};
use super::super::types::CallbackSecParms4;
use super::Nfs4Server;

/// Connections remembered at most; dead ones are pruned first when it is reached.
const MAX_ROUTES: usize = 4096;

/// A connection's backward direction (held weakly: the connection owns it) and transport.
type Route = (Weak<dyn BackChannel>, TransportKind);

/// The backward direction of each connection that carried a COMPOUND.
#[derive(Default)]
pub(super) struct Routes(Mutex<HashMap<ConnId, Route>>);

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("connections", &self.0.lock().len())
            .finish()
    }
}

impl Routes {
    fn get(&self, conn: ConnId) -> Option<(Arc<dyn BackChannel>, TransportKind)> {
        let m = self.0.lock();
        let (w, t) = m.get(&conn)?;
        Some((w.upgrade()?, *t))
    }

    /// Forget the connections that are gone, and return them. A connection's backward
    /// direction lives in the context its calls carry, so it is gone once the connection has
    /// closed and none of its calls is still running.
    pub(super) fn sweep(&self) -> Vec<ConnId> {
        let mut gone = Vec::new();
        self.0.lock().retain(|conn, (w, _)| {
            let live = w.strong_count() > 0;
            if !live {
                gone.push(*conn);
            }
            live
        });
        gone
    }
}

/// The RPC credential of a callback (RFC 8881 §18.36.3 `csa_sec_parms`): the client's
/// AUTH_SYS parameters as it gave them, else AUTH_NONE.
fn credential(sec: &Option<CallbackSecParms4>) -> OpaqueAuth {
    match sec {
        Some(CallbackSecParms4::Sys(p)) => OpaqueAuth::sys(&AuthSys {
            stamp: p.stamp,
            machinename: p.machinename.clone(),
            uid: p.uid,
            gid: p.gid,
            gids: p.gids.clone(),
        }),
        _ => OpaqueAuth::none(),
    }
}

impl Nfs4Server {
    /// A COMPOUND arrived on connection `conn` of `transport`, which offers `back` as its
    /// backward direction (none for in-process calls).
    pub fn note_connection(
        &self,
        conn: ConnId,
        back: Option<&BackHandle>,
        transport: TransportKind,
    ) {
        let Some(b) = back else { return };
        let mut m = self.routes.0.lock();
        if m.get(&conn).is_some_and(|(w, _)| w.strong_count() > 0) {
            return;
        }
        if m.len() >= MAX_ROUTES {
            m.retain(|_, (w, _)| w.strong_count() > 0);
            if m.len() >= MAX_ROUTES {
                return;
            }
        }
        m.insert(conn, (Arc::downgrade(&b.0), transport));
    }

    /// Whether connection `conn` can carry callbacks (CREATE_SESSION grants
    /// CREATE_SESSION4_FLAG_CONN_BACK_CHAN only then, RFC 8881 §18.36.4).
    pub(super) fn back_possible(&self, conn: ConnId) -> bool {
        self.routes.get(conn).is_some()
    }

    /// Send the callbacks that are due. Each runs in a task of its own on the current tokio
    /// runtime (none: they wait for the next call from one).
    pub fn run_callbacks(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        loop {
            let due = self.state().take_callbacks(Instant::now());
            if due.is_empty() {
                return;
            }
            let mut failed_now = false;
            for cb in due {
                match self.routes.get(cb.conn) {
                    None => {
                        // The connection is gone: the callback fails at once.
                        self.state().callback_done(cb.id, &CbOutcome::Failed);
                        failed_now = true;
                    }
                    Some((back, transport)) => {
                        let server = self.clone();
                        rt.spawn(async move { server.send_callback(back, transport, cb).await });
                    }
                }
            }
            if !failed_now {
                return;
            }
        }
    }

    async fn send_callback(
        self: Arc<Self>,
        back: Arc<dyn BackChannel>,
        transport: TransportKind,
        cb: CbSend,
    ) {
        // RFC 8167 §6: backward calls only once the upper layer knows the client takes them
        // (the session's back channel was granted on this connection). On RPC-over-RDMA the
        // connection's BackChannel is the Responder's RFC 8167 backward call.
        //= specs/rfc8267.txt#section-6.5.2
        //# NFS version 4 clients and servers MUST use
        //# the approach described in [RFC8167] when backchannel operations are
        //# conveyed on RPC-over-RDMA version 1 transports.
        back.enable();
        let call = BackCall {
            prog: cb.program,
            vers: CB_VERSION,
            proc_: cb.proc_,
            // CB_NULL goes as AUTH_NONE; Linux's callback service refuses a CB_COMPOUND
            // under AUTH_NONE, so CB_COMPOUND carries the client's `csa_sec_parms`.
            cred: if cb.proc_ == 0 {
                OpaqueAuth::none()
            } else {
                credential(&cb.sec)
            },
            args: cb.args.clone(),
        };
        let timeout = cb.deadline.saturating_duration_since(Instant::now());
        let what = match cb.what {
            CbWhat::Null => "CB_NULL",
            CbWhat::NotifyLock { .. } => "CB_COMPOUND(CB_SEQUENCE,CB_NOTIFY_LOCK)",
        };
        let outcome = match back.call(call, timeout).await {
            Ok(results) => {
                tracing::info!(
                    conn = cb.conn,
                    ?transport,
                    callback = what,
                    "NFSv4 callback answered"
                );
                CbOutcome::Replied(results)
            }
            Err(e) => {
                tracing::info!(conn = cb.conn, ?transport, callback = what, error = %e,
                    "NFSv4 callback failed");
                CbOutcome::Failed
            }
        };
        let more = {
            let mut st = self.state();
            st.callback_done(cb.id, &outcome);
            st.callbacks_queued()
        };
        if more {
            self.run_callbacks();
        }
    }
}
