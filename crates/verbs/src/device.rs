//! [`Device`]: the public handle that creates PDs, CQs, QPs, listeners and connections, and
//! hands each call to its provider (see [`crate::provider`]).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::VerbsError;
use crate::conn::{ConnParams, Connection, Listener};
use crate::cq::CompletionQueue;
use crate::mem::{ProtectionDomain, StagTable};
use crate::provider::loopback::{self, LoopbackFabric};
use crate::provider::soft::{self, SoftIwarpConfig};
use crate::provider::{self, Native};
use crate::qp::QueuePair;

/// Which provider a [`Device`] uses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Provider {
    /// Soft-iWARP (MPA/DDP/RDMAP) over tokio TCP.
    SoftIwarp(SoftIwarpConfig),
    /// The same protocol stack over in-memory pipes of a [`LoopbackFabric`].
    Loopback(LoopbackFabric, SoftIwarpConfig),
    /// A real RDMA device (NIC, kernel siw or rxe) through rdma-core.
    #[cfg(feature = "rdma-core")]
    RdmaCore(crate::provider::rdma_core::RdmaCoreConfig),
}

static DEFAULT_DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();

/// An RDMA device: owns the STag table; creates PDs, CQs, QPs, listeners and connections.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    table: Arc<StagTable>,
    provider: Provider,
    next_qp: AtomicU32,
    /// The native (rdma-core) device, or why it could not be opened; `None` for the soft
    /// providers.
    native: Option<Result<Native, VerbsError>>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("provider", &self.inner.provider)
            .finish()
    }
}

impl Device {
    /// Open a device on `provider`.
    pub fn open(provider: Provider) -> Self {
        let provider = provider::with_env_overrides(provider);
        let native = provider::open_native(&provider);
        Self {
            inner: Arc::new(DeviceInner {
                table: StagTable::new(),
                provider,
                next_qp: AtomicU32::new(1),
                native,
            }),
        }
    }

    /// Open an rdma-core device (feature `rdma-core`): fails with [`VerbsError::NoDevice`]
    /// where rdma-core or the named device is missing.
    #[cfg(feature = "rdma-core")]
    pub fn rdma_core(
        config: crate::provider::rdma_core::RdmaCoreConfig,
    ) -> Result<Self, VerbsError> {
        Self::open_checked(Provider::RdmaCore(config))
    }

    /// A device from a provider name, as the CLI's `--provider` takes it: `soft-iwarp`, or
    /// `rdma-core` / `rdma-core:DEVICE` (feature `rdma-core`).
    pub fn from_spec(spec: &str) -> Result<Self, VerbsError> {
        match spec {
            "soft-iwarp" | "siw" | "" => Ok(Self::soft_iwarp()),
            s if s == "rdma-core" || s.starts_with("rdma-core:") => {
                let name = s.strip_prefix("rdma-core:").map(str::to_string);
                provider::native_provider(name).and_then(Self::open_checked)
            }
            _ => Err(VerbsError::InvalidArgument(
                "unknown provider (soft-iwarp, rdma-core or rdma-core:DEVICE)",
            )),
        }
    }

    /// Open `provider`, failing if its native device could not be opened.
    fn open_checked(provider: Provider) -> Result<Self, VerbsError> {
        let d = Self::open(provider);
        if let Some(Err(e)) = &d.inner.native {
            return Err(e.clone());
        }
        Ok(d)
    }

    /// True for an rdma-core device.
    pub fn is_rdma_core(&self) -> bool {
        self.inner.native.is_some()
    }

    /// The rdma-core device behind this `Device`, if it is one.
    #[cfg(feature = "rdma-core")]
    pub fn rdma_core_info(&self) -> Option<crate::provider::rdma_core::RdmaCoreDevice> {
        match &self.inner.native {
            Some(Ok(h)) => Some(crate::provider::rdma_core::RdmaCoreDevice {
                name: h.name().to_string(),
                iwarp: h.iwarp(),
            }),
            _ => None,
        }
    }

    /// Provider and device, for people: `soft-iwarp`, `loopback` or `rdma-core:NAME`.
    pub fn describe(&self) -> String {
        match (&self.inner.provider, &self.inner.native) {
            (_, Some(Ok(h))) => h.describe(),
            (_, Some(Err(_))) => "rdma-core (unavailable)".into(),
            (Provider::Loopback(..), None) => "loopback".into(),
            _ => "soft-iwarp".into(),
        }
    }

    /// The native device behind this `Device`: `None` for the soft providers, an error if it
    /// could not be opened.
    pub(crate) fn native(&self) -> Option<Result<&Native, VerbsError>> {
        self.inner
            .native
            .as_ref()
            .map(|r| r.as_ref().map_err(Clone::clone))
    }

    /// Soft-iWARP over TCP with default settings.
    pub fn soft_iwarp() -> Self {
        Self::open(Provider::SoftIwarp(SoftIwarpConfig::default()))
    }

    /// The process's default device: the one given to [`Device::set_default`] (the CLI's
    /// `--provider`), else a new soft-iWARP device. Upper layers use it when their
    /// configuration names no device.
    pub fn default_device() -> Self {
        DEFAULT_DEVICE
            .get()
            .cloned()
            .unwrap_or_else(Self::soft_iwarp)
    }

    /// Make `dev` the process's default device (once; later calls are refused with the
    /// device back).
    pub fn set_default(dev: Device) -> Result<(), Device> {
        DEFAULT_DEVICE.set(dev)
    }

    /// In-memory loopback provider on `fabric`.
    pub fn loopback(fabric: &LoopbackFabric) -> Self {
        Self::open(Provider::Loopback(
            fabric.clone(),
            SoftIwarpConfig::default(),
        ))
    }

    pub(crate) fn table(&self) -> Arc<StagTable> {
        self.inner.table.clone()
    }

    /// The soft-iWARP settings (the defaults for a native device, which has none).
    pub(crate) fn config(&self) -> &SoftIwarpConfig {
        provider::soft_config(&self.inner.provider)
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain::new(self.clone())
    }

    /// Create a completion queue.
    pub fn create_cq(&self) -> CompletionQueue {
        let mut cq = CompletionQueue::new();
        if let Some(n) = self.native() {
            cq.native = Some(n.and_then(|d| d.create_cq(cq.inner.clone())));
        }
        cq
    }

    /// Create a reliable-connected QP in `pd`. Receives may be posted before connecting.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> QueuePair {
        let qp_num = self.inner.next_qp.fetch_add(1, Ordering::Relaxed);
        match self.native() {
            None => QueuePair::soft(qp_num, pd, send_cq, recv_cq),
            Some(n) => QueuePair::native(
                qp_num,
                pd,
                send_cq,
                recv_cq,
                n.and_then(|d| d.create_qp(pd, send_cq, recv_cq, qp_num)),
            ),
        }
    }

    /// Listen on `addr` (rdma_listen). Port 0 picks a free port.
    pub async fn listen(&self, addr: SocketAddr) -> Result<Listener, VerbsError> {
        match (self.native(), &self.inner.provider) {
            (Some(n), _) => n?.listen(self.clone(), addr),
            (None, Provider::Loopback(fabric, _)) => loopback::listen(self.clone(), fabric, addr),
            (None, _) => soft::cm::listen_tcp(self.clone(), addr).await,
        }
    }

    /// Connect `qp` to a listener (rdma_connect). Returns once established, or the peer's
    /// rejection as [`VerbsError::Rejected`].
    pub async fn connect(
        &self,
        qp: &QueuePair,
        addr: SocketAddr,
        params: ConnParams,
    ) -> Result<Connection, VerbsError> {
        params.validate()?;
        let (transport, local) = match (self.native(), &self.inner.provider) {
            (Some(n), _) => return n?.connect(qp, addr, &params).await,
            (None, Provider::Loopback(fabric, _)) => loopback::connect(fabric, addr)?,
            (None, _) => soft::cm::connect_tcp(self, addr).await?,
        };
        soft::cm::connect(self, qp, transport, local, addr, params).await
    }
}
