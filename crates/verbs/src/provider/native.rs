//! The interface of a native provider (rdma-core): the device and the objects it creates,
//! as the public types hold them. Without the `rdma-core` feature nothing implements it (the
//! soft providers are reached directly), hence the one lint exception below.

#![cfg_attr(not(feature = "rdma-core"), allow(dead_code))]

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::VerbsError;
use crate::conn::{CmEvent, ConnParams, ConnectRequest, Connection, Listener, ReqKind};
use crate::cq::{CompletionQueue, CqInner, RecvWr, SendWr};
use crate::device::Device;
use crate::mem::{Access, ProtectionDomain};
use crate::provider::soft::engine::QpState;
use crate::provider::soft::handshake::Negotiated;
use crate::qp::QueuePair;

/// A boxed, sendable future (the native provider's async calls).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An open native device.
pub(crate) type Native = Arc<dyn NativeDevice>;

/// A native device: creates the native halves of PDs, CQs and QPs, and runs its own
/// connection manager.
pub(crate) trait NativeDevice: Send + Sync + fmt::Debug {
    /// Device name (`siw0`, `mlx5_0`, …).
    fn name(&self) -> &str;
    /// True for an iWARP device.
    fn iwarp(&self) -> bool;
    /// `rdma-core:NAME (kind)`.
    fn describe(&self) -> String {
        format!(
            "rdma-core:{} ({})",
            self.name(),
            if self.iwarp() { "iWARP" } else { "IB/RoCE" }
        )
    }
    /// Allocate a PD.
    fn alloc_pd(&self) -> Result<Arc<dyn NativePd>, VerbsError>;
    /// Create a CQ whose completions go to `sink`, the public queue.
    fn create_cq(&self, sink: Arc<CqInner>) -> Result<Arc<dyn NativeCq>, VerbsError>;
    /// Create a QP in `pd` (whose native half must be this device's) on the two CQs.
    fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        qp_num: u32,
    ) -> Result<Box<dyn NativeQp>, VerbsError>;
    /// rdma_listen on `addr`; connection requests come out of the listener as
    /// [`crate::ConnectRequest`]s of `dev`.
    fn listen(&self, dev: Device, addr: SocketAddr) -> Result<Listener, VerbsError>;
    /// rdma_connect `qp` to `addr`.
    fn connect<'a>(
        &'a self,
        qp: &'a QueuePair,
        addr: SocketAddr,
        params: &'a ConnParams,
    ) -> BoxFuture<'a, Result<Connection, VerbsError>>;
}

/// A native protection domain.
pub(crate) trait NativePd: Send + Sync + Any {
    /// Register `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// The bytes must stay in place until the returned registration is deregistered or
    /// dropped.
    unsafe fn register(
        self: Arc<Self>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn NativeMr>, VerbsError>;
    /// For the provider's own downcasts.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// A native memory registration.
pub(crate) trait NativeMr: Send + Sync {
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key (STag).
    fn rkey(&self) -> u32;
    /// Address of byte 0 (a virtual address on rdma-core).
    fn addr(&self) -> u64;
    /// Deregister now (idempotent).
    fn deregister(&self);
    /// Register again with `access`: returns the new rkey.
    fn reregister(&self, access: Access) -> Result<u32, VerbsError>;
}

/// A native completion queue (it feeds the public queue itself).
pub(crate) trait NativeCq: Send + Sync + Any {
    /// For the provider's own downcasts.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// A native queue pair.
pub(crate) trait NativeQp: Send + Sync + Any {
    /// The device's QP number once connected (else the local one).
    fn qp_num(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// ibv_post_send.
    fn post_send(&self, wr: SendWr) -> Result<(), VerbsError>;
    /// Every send WR posted so far has completed, signaled or not ([`crate::QueuePair::send_queue_idle`]).
    fn send_queue_idle(&self) -> bool;
    /// ibv_post_recv.
    fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError>;
    /// For the provider's own downcasts.
    fn as_any(&self) -> &dyn Any;
}

/// A native connection request, waiting for accept or reject.
pub(crate) trait NativeConnReq: Send + fmt::Debug {
    /// The initiator's private data.
    fn private_data(&self) -> &Bytes;
    /// The initiator's IRD.
    fn ird(&self) -> u16;
    /// The initiator's ORD.
    fn ord(&self) -> u16;
    /// rdma_accept on `qp`.
    fn accept<'a>(
        self: Box<Self>,
        qp: &'a QueuePair,
        params: ConnParams,
    ) -> BoxFuture<'a, Result<Connection, VerbsError>>;
    /// rdma_reject with private data.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), VerbsError>;
}

/// The native side of an established connection; dropping it disconnects.
pub(crate) trait NativeConn: Send + Sync + fmt::Debug {
    /// Move the QP to the error state and disconnect, without waiting.
    fn abort(&self);
}

impl ConnectRequest {
    /// A native provider's connect request, from `peer` to `local`.
    pub(crate) fn native(
        dev: Device,
        r: Box<dyn NativeConnReq>,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Self {
        ConnectRequest {
            dev,
            kind: ReqKind::Native(r),
            local,
            peer,
        }
    }
}

impl QueuePair {
    /// Give the QP back after a connection attempt that failed before it was established.
    pub(crate) fn release_connection(&self) {
        *self.shared.connected.lock() = false;
    }
}

impl Connection {
    /// Claim `qp`, run a native provider's connect or accept, and make the connection; give
    /// the QP back for another try if that fails.
    pub(crate) async fn establish_native(
        qp: &QueuePair,
        establish: impl Future<Output = Result<NativeEstablished, VerbsError>>,
    ) -> Result<Connection, VerbsError> {
        qp.claim_connection()?;
        match establish.await {
            Ok(e) => Ok(Connection {
                qp: qp.clone(),
                neg: e.neg,
                local: e.local,
                peer: e.peer,
                events: tokio::sync::Mutex::new(e.events),
                first: parking_lot::Mutex::new(Some(CmEvent::Established)),
                done: e.done,
                stats: Default::default(),
                native: Some(e.conn),
            }),
            Err(e) => {
                qp.release_connection();
                Err(e)
            }
        }
    }
}

/// What a native provider's connection setup hands to [`Connection`].
pub(crate) struct NativeEstablished {
    /// What was agreed with the peer.
    pub(crate) neg: Negotiated,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    /// The connection's events after `Established`.
    pub(crate) events: mpsc::UnboundedReceiver<CmEvent>,
    /// Turns true once `Disconnected` was sent.
    pub(crate) done: watch::Receiver<bool>,
    pub(crate) conn: Box<dyn NativeConn>,
}
