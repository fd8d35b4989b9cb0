//! The providers behind the public types, and the one internal interface between them.
//!
//! * [`soft`]: soft-iWARP, the sans-IO RDMAP/DDP engine and MPA handshake with a tokio driver
//!   (connection manager, reader, writer, transmit scheduling) over a byte stream;
//! * [`loopback`]: the same stack over the in-process pipes of a [`loopback::LoopbackFabric`];
//! * `rdma_core` (cargo feature `rdma-core`): a real device through libibverbs / librdmacm.
//!
//! The soft providers are the crate's own: the public types ([`crate::Device`],
//! [`crate::QueuePair`], …) hold their state directly. A native provider is reached through
//! the traits of `native` ([`NativeDevice`] and the objects it creates), so the rest of the crate
//! never names rdma-core: the `rdma-core` feature is tested only here, where the provider is
//! declared and opened, and on the public items that exist only with it.

use crate::VerbsError;
use crate::device::Provider;

pub(crate) mod loopback;
pub(crate) mod native;
#[cfg(feature = "rdma-core")]
pub mod rdma_core;
pub(crate) mod soft;

pub(crate) use native::{
    Native, NativeConn, NativeConnReq, NativeCq, NativeMr, NativePd, NativeQp,
};

/// Open the native device `provider` names, if it names one.
pub(crate) fn open_native(provider: &Provider) -> Option<Result<Native, VerbsError>> {
    match provider {
        Provider::SoftIwarp(_) | Provider::Loopback(..) => None,
        #[cfg(feature = "rdma-core")]
        Provider::RdmaCore(c) => Some(rdma_core::open(c.clone())),
    }
}

/// The soft-iWARP settings of `provider` (the defaults for a native device).
pub(crate) fn soft_config(provider: &Provider) -> &soft::SoftIwarpConfig {
    match provider {
        Provider::SoftIwarp(c) | Provider::Loopback(_, c) => c,
        #[cfg(feature = "rdma-core")]
        Provider::RdmaCore(_) => {
            static DEFAULT: std::sync::LazyLock<soft::SoftIwarpConfig> =
                std::sync::LazyLock::new(soft::SoftIwarpConfig::default);
            &DEFAULT
        }
    }
}

/// `provider` with the documented environment overrides of its soft-iWARP settings applied
/// (once, when a device is opened).
pub(crate) fn with_env_overrides(mut provider: Provider) -> Provider {
    match &mut provider {
        Provider::SoftIwarp(c) | Provider::Loopback(_, c) => soft::apply_env_overrides(c),
        #[cfg(feature = "rdma-core")]
        Provider::RdmaCore(_) => {}
    }
    provider
}

/// The provider `rdma-core` / `rdma-core:DEVICE` names.
#[cfg(feature = "rdma-core")]
pub(crate) fn native_provider(device: Option<String>) -> Result<Provider, VerbsError> {
    Ok(Provider::RdmaCore(rdma_core::RdmaCoreConfig {
        device,
        ..Default::default()
    }))
}

/// Why this build has no `rdma-core` provider.
#[cfg(not(feature = "rdma-core"))]
pub(crate) fn native_provider(_device: Option<String>) -> Result<Provider, VerbsError> {
    Err(VerbsError::NoDevice(
        "this build has no rdma-core provider (build with --features rdma-core)".into(),
    ))
}
