//! [`QueuePair`]: a reliable-connected queue pair of either kind of provider.

use std::fmt;
use std::sync::Arc;

use crate::VerbsError;
use crate::cq::{CompletionQueue, RecvWr, SendWr};
use crate::mem::ProtectionDomain;
use crate::provider::NativeQp;
use crate::provider::soft::engine::QpState;
use crate::provider::soft::{self, SoftQp};
use parking_lot::Mutex;

/// What carries a queue pair's work requests.
pub(crate) enum QpKind {
    /// The soft-iWARP engine (soft-iWARP and loopback providers).
    Soft(Arc<SoftQp>),
    /// A native QP, or why it could not be created.
    Native(Result<Box<dyn NativeQp>, VerbsError>),
}

pub(crate) struct QpShared {
    /// Declared first so that a native QP is destroyed before its CQs and PD.
    kind: QpKind,
    qp_num: u32,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    pd: ProtectionDomain,
    /// A QP carries one connection in its life.
    pub(crate) connected: Mutex<bool>,
}

/// A reliable-connected queue pair. Clones are handles to the same QP.
#[derive(Clone)]
pub struct QueuePair {
    pub(crate) shared: Arc<QpShared>,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.shared.qp_num)
            .field("state", &self.state())
            .finish()
    }
}

impl QueuePair {
    /// A QP of the soft providers.
    pub(crate) fn soft(
        qp_num: u32,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Self {
        let soft = SoftQp::new(qp_num, pd, send_cq, recv_cq);
        Self::with_kind(QpKind::Soft(soft), qp_num, pd, send_cq, recv_cq)
    }

    /// A QP of a native provider (or why it could not be created).
    pub(crate) fn native(
        qp_num: u32,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        native: Result<Box<dyn NativeQp>, VerbsError>,
    ) -> Self {
        Self::with_kind(QpKind::Native(native), qp_num, pd, send_cq, recv_cq)
    }

    fn with_kind(
        kind: QpKind,
        qp_num: u32,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Self {
        QueuePair {
            shared: Arc::new(QpShared {
                kind,
                qp_num,
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                pd: pd.clone(),
                connected: Mutex::new(false),
            }),
        }
    }

    /// The soft-iWARP side of this QP, if it is one.
    pub(crate) fn soft_qp(&self) -> Option<&Arc<SoftQp>> {
        match &self.shared.kind {
            QpKind::Soft(s) => Some(s),
            QpKind::Native(_) => None,
        }
    }

    /// The native QP behind this handle, if it is one.
    pub(crate) fn native_qp(&self) -> Result<&dyn NativeQp, VerbsError> {
        match &self.shared.kind {
            QpKind::Native(Ok(h)) => Ok(h.as_ref()),
            QpKind::Native(Err(e)) => Err(e.clone()),
            QpKind::Soft(_) => Err(VerbsError::InvalidArgument(
                "the QP belongs to another provider",
            )),
        }
    }

    /// Mark the QP as having its connection (a QP carries one connection in its life).
    pub(crate) fn claim_connection(&self) -> Result<(), VerbsError> {
        let mut c = self.shared.connected.lock();
        if *c {
            return Err(VerbsError::InvalidState("QP already connected"));
        }
        *c = true;
        Ok(())
    }

    /// QP number (local, unique per device; on rdma-core the device's number once connected).
    pub fn qp_num(&self) -> u32 {
        match &self.shared.kind {
            QpKind::Native(Ok(h)) => h.qp_num(),
            _ => self.shared.qp_num,
        }
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        match &self.shared.kind {
            QpKind::Soft(s) => s.state(),
            QpKind::Native(h) => h.as_ref().map_or(QpState::Error, |h| h.state()),
        }
    }
    /// The PD the QP was created in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.shared.pd
    }
    /// Send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.shared.send_cq
    }
    /// Receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.shared.recv_cq
    }

    /// Post a send-queue WR (ibv_post_send). Fails only for malformed WRs or an unconnected QP;
    /// on an errored QP the WR completes with `WrFlushError`.
    pub fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        match &self.shared.kind {
            QpKind::Soft(s) => soft::post_send(s, std::iter::once(wr)),
            QpKind::Native(_) => self.native_qp()?.post_send(wr),
        }
    }

    /// Post several WRs in order.
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), VerbsError> {
        match &self.shared.kind {
            QpKind::Soft(s) => soft::post_send(s, wrs),
            QpKind::Native(_) => {
                let h = self.native_qp()?;
                for wr in wrs {
                    h.post_send(wr)?;
                }
                Ok(())
            }
        }
    }

    /// Every send-queue WR posted so far has completed, whether it asked for its completion
    /// or not: on soft-iWARP, each was handed to the connection's transmit queue and that queue
    /// was written to the socket, whose close ([`crate::Connection::disconnect`]) sends it all
    /// before its FIN; on rdma-core, the device completed it (every WR is posted signaled to
    /// the device). A driver that posts replies unsignaled waits for this before it closes a
    /// connection it wants no reply lost on. Also true on a QP in error: its WRs were flushed.
    pub fn send_queue_idle(&self) -> bool {
        match &self.shared.kind {
            QpKind::Soft(s) => s.send_queue_idle(),
            QpKind::Native(h) => h.as_ref().map_or(true, |h| h.send_queue_idle()),
        }
    }

    /// Post a receive WR (ibv_post_recv). Allowed before the connection is established.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        match &self.shared.kind {
            QpKind::Soft(s) => {
                s.post_recv(wr);
                Ok(())
            }
            QpKind::Native(_) => self.native_qp()?.post_recv(wr),
        }
    }
}
