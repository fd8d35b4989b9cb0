//! The provider interface ([`crate::provider`]) over this module's types: what
//! [`crate::Device`] and the other public types call on an rdma-core device.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{
    HwConnGuard, HwConnReq, HwCq, HwDevice, HwEstablished, HwMr, HwPd, HwQueuePair, RdmaCoreConfig,
};
use crate::VerbsError;
use crate::conn::{ConnParams, ConnectRequest, Connection, Listener};
use crate::cq::{CompletionQueue, CqInner, RecvWr, SendWr};
use crate::device::Device;
use crate::mem::{Access, ProtectionDomain};
use crate::provider::native::{
    BoxFuture, Native, NativeConn, NativeConnReq, NativeCq, NativeDevice, NativeEstablished,
    NativeMr, NativePd, NativeQp,
};
use crate::provider::soft::engine::QpState;
use crate::provider::soft::handshake::Negotiated;
use crate::qp::QueuePair;

/// An open rdma-core device behind [`crate::Device`].
#[derive(Debug)]
pub(crate) struct RdmaCore(Arc<HwDevice>);

/// Open the device `config` names.
pub(crate) fn open(config: RdmaCoreConfig) -> Result<Native, VerbsError> {
    Ok(Arc::new(RdmaCore(HwDevice::open(config)?)))
}

/// The rdma-core QP behind `qp`.
fn hw_qp(qp: &QueuePair) -> Result<&HwQueuePair, VerbsError> {
    qp.native_qp()?
        .as_any()
        .downcast_ref::<HwQueuePair>()
        .ok_or(VerbsError::InvalidArgument(
            "the QP belongs to another provider",
        ))
}

/// The rdma-core CQ behind `c`.
fn hw_cq(c: &CompletionQueue) -> Result<Arc<HwCq>, VerbsError> {
    match c.native.as_ref() {
        Some(Ok(h)) => h
            .clone()
            .into_any()
            .downcast::<HwCq>()
            .map_err(|_| VerbsError::InvalidArgument("the CQ belongs to another provider")),
        Some(Err(e)) => Err(e.clone()),
        None => Err(VerbsError::InvalidArgument(
            "the CQ belongs to another provider",
        )),
    }
}

/// Run an rdma-core connect or accept for `qp` and make the connection.
async fn establish(
    qp: &QueuePair,
    setup: impl Future<Output = Result<HwEstablished, VerbsError>>,
) -> Result<Connection, VerbsError> {
    Connection::establish_native(qp, async move {
        let e = setup.await?;
        Ok(NativeEstablished {
            neg: Negotiated {
                crc: false,
                ird: e.ird,
                ord: e.ord,
                send_rtr: None,
                await_rtr: false,
                peer_private_data: e.peer_private_data,
                peer_ird_ord: None,
            },
            local: e.local,
            peer: e.peer,
            events: e.events,
            done: e.done,
            conn: Box::new(e.guard),
        })
    })
    .await
}

impl NativeDevice for RdmaCore {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn iwarp(&self) -> bool {
        self.0.iwarp
    }

    fn alloc_pd(&self) -> Result<Arc<dyn NativePd>, VerbsError> {
        Ok(HwPd::alloc(&self.0)?)
    }

    fn create_cq(&self, sink: Arc<CqInner>) -> Result<Arc<dyn NativeCq>, VerbsError> {
        Ok(HwCq::create(&self.0, sink)?)
    }

    fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        qp_num: u32,
    ) -> Result<Box<dyn NativeQp>, VerbsError> {
        let other_pd = VerbsError::InvalidArgument("the PD belongs to another provider");
        let pd_hw = pd
            .native
            .clone()
            .ok_or(other_pd.clone())??
            .into_any()
            .downcast::<HwPd>()
            .map_err(|_| other_pd)?;
        Ok(Box::new(HwQueuePair::new(
            &pd_hw,
            &hw_cq(send_cq)?,
            &hw_cq(recv_cq)?,
            send_cq.inner.clone(),
            recv_cq.inner.clone(),
            qp_num,
        )))
    }

    fn listen(&self, dev: Device, addr: SocketAddr) -> Result<Listener, VerbsError> {
        let hw = self.0.clone();
        let l = super::listen(&hw, addr)?;
        let local = l.local;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok(r) = l.next_request(&hw).await {
                let (local, peer) = (r.local, r.peer);
                let req = ConnectRequest::native(dev.clone(), Box::new(r), local, peer);
                if tx.send(req).is_err() {
                    break;
                }
            }
        });
        Ok(Listener::new(rx, local, task, None))
    }

    fn connect<'a>(
        &'a self,
        qp: &'a QueuePair,
        addr: SocketAddr,
        params: &'a ConnParams,
    ) -> BoxFuture<'a, Result<Connection, VerbsError>> {
        Box::pin(async move {
            let qhw = hw_qp(qp)?;
            establish(
                qp,
                super::connect(
                    &self.0,
                    qhw,
                    addr,
                    &params.private_data,
                    params.ird,
                    params.ord,
                ),
            )
            .await
        })
    }
}

impl NativePd for HwPd {
    unsafe fn register(
        self: Arc<Self>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn NativeMr>, VerbsError> {
        // SAFETY: forwarded caller contract.
        Ok(Box::new(unsafe { HwMr::new(&self, ptr, len, access)? }))
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl NativeMr for HwMr {
    fn lkey(&self) -> u32 {
        HwMr::lkey(self)
    }
    fn rkey(&self) -> u32 {
        HwMr::rkey(self)
    }
    fn addr(&self) -> u64 {
        HwMr::addr(self)
    }
    fn deregister(&self) {
        HwMr::deregister(self)
    }
    fn reregister(&self, access: Access) -> Result<u32, VerbsError> {
        HwMr::reregister(self, access)
    }
}

impl NativeCq for HwCq {
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl NativeQp for HwQueuePair {
    fn qp_num(&self) -> u32 {
        HwQueuePair::qp_num(self)
    }
    fn state(&self) -> QpState {
        HwQueuePair::state(self)
    }
    fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        HwQueuePair::post_send(self, wr)
    }
    fn send_queue_idle(&self) -> bool {
        HwQueuePair::send_queue_idle(self)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        HwQueuePair::post_recv(self, wr)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl NativeConnReq for HwConnReq {
    fn private_data(&self) -> &Bytes {
        &self.private_data
    }
    fn ird(&self) -> u16 {
        u16::from(self.peer_ird)
    }
    fn ord(&self) -> u16 {
        u16::from(self.peer_ord)
    }
    fn accept<'a>(
        self: Box<Self>,
        qp: &'a QueuePair,
        params: ConnParams,
    ) -> BoxFuture<'a, Result<Connection, VerbsError>> {
        Box::pin(async move {
            let qhw = hw_qp(qp)?;
            establish(
                qp,
                HwConnReq::accept(*self, qhw, &params.private_data, params.ird, params.ord),
            )
            .await
        })
    }
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), VerbsError> {
        HwConnReq::reject(*self, private_data)
    }
}

impl NativeConn for HwConnGuard {
    fn abort(&self) {
        HwConnGuard::abort(self)
    }
}
