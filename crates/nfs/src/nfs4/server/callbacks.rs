//! The callback driver: the connections that can carry backward calls, and the sending of
//! what the state core says is due ([`super::super::state::State::take_callbacks`]), each
//! call with its deadline, its outcome reported back to the core.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use oncrpc::{AuthSys, BackCall, BackChannel, BackHandle, OpaqueAuth};
use parking_lot::Mutex;

use super::super::callback::wire::CB_VERSION;
use super::super::state::{CbOutcome, CbSend, ConnId};
use super::super::types::CallbackSecParms4;
use super::Nfs4Server;

/// Connections remembered at most; dead ones are pruned first when it is reached.
const MAX_ROUTES: usize = 4096;

/// The backward direction of each connection that carried a COMPOUND.
#[derive(Default)]
pub(super) struct Routes(Mutex<HashMap<ConnId, Weak<dyn BackChannel>>>);

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("connections", &self.0.lock().len())
            .finish()
    }
}

impl Routes {
    fn get(&self, conn: ConnId) -> Option<Arc<dyn BackChannel>> {
        self.0.lock().get(&conn).and_then(Weak::upgrade)
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
    /// A COMPOUND arrived on connection `conn`, whose transport offers `back` as its backward
    /// direction (none for in-process calls).
    pub fn note_connection(&self, conn: ConnId, back: Option<&BackHandle>) {
        let Some(b) = back else { return };
        let mut m = self.routes.0.lock();
        if m.get(&conn).is_some_and(|w| w.strong_count() > 0) {
            return;
        }
        if m.len() >= MAX_ROUTES {
            m.retain(|_, w| w.strong_count() > 0);
            if m.len() >= MAX_ROUTES {
                return;
            }
        }
        m.insert(conn, Arc::downgrade(&b.0));
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
                    Some(back) => {
                        let server = self.clone();
                        rt.spawn(async move { server.send_callback(back, cb).await });
                    }
                }
            }
            if !failed_now {
                return;
            }
        }
    }

    async fn send_callback(self: Arc<Self>, back: Arc<dyn BackChannel>, cb: CbSend) {
        // RFC 8167 §6: backward calls only once the upper layer knows the client takes them
        // (the session's back channel was granted on this connection).
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
        let outcome = match back.call(call, timeout).await {
            Ok(results) => CbOutcome::Replied(results),
            Err(e) => {
                tracing::info!(conn = cb.conn, proc_ = cb.proc_, error = %e, "NFSv4 callback failed");
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
