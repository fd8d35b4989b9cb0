//! Thin tokio drivers that run the engines over the `verbs` API: [`RdmaServer`] serves an
//! `oncrpc::Dispatcher`, [`RdmaClient`] implements `oncrpc::RpcTransport`.
//!
//! They do I/O only. Every protocol decision is the engines' ([`crate::requester`],
//! [`crate::responder`], [`crate::call_policy`], [`crate::lost`]); so is every deadline: each
//! role has one timer task that sleeps until the engine's next deadline and hands it `now`.
//! Every action an engine returns is performed by one exhaustive `perform` per role.
//!
//! - `link.rs`: one connected queue pair with its receive buffers, the send-queue completion
//!   router, memory registration through a protection domain, the reusable sink buffers.
//! - `server.rs`: [`RdmaServer`], [`ServerConnection`], the receive handler and `perform`.
//! - `client.rs`: [`RdmaClient`], its inbox, its timer and `perform`.
//! - `drain.rs`: closing a server's connections without losing a reply
//!   ([`ServerConnection::drain`], [`RdmaServer::quiesce`]).
//!
//! Each connection has a registered receive-buffer pool (the credit grant plus the backward
//! credits, RFC 8167 §4.3) and a registered send-buffer pool; one task reads the receive
//! completion queue, one routes send-queue completions to whoever waits for them.
mod back;
mod budget;
mod client;
mod drain;
mod link;
mod server;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::RpcTransport;
use verbs::{ConnParams, Device};

use crate::engine::Config;
use crate::ulb::UpperLayerBinding;

pub use client::RdmaClient;
pub use drain::{DrainReport, QuiesceReport};
pub use server::{RdmaServer, ServerConnection, ServerCounters};

/// Errors of the drivers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error("verbs: {0}")]
    Verbs(#[from] verbs::VerbsError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad address {0}")]
    Address(String),
    #[error("unsupported URL scheme in {0} (use rdma://host:port or tcp://host:port)")]
    Scheme(String),
}

/// Settings for a client or server.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// Protocol settings (credits, inline thresholds, chunk usage).
    pub rpc: Config,
    /// The RDMA device; soft-iWARP over TCP when `None`.
    pub device: Option<Device>,
    /// Default per-call timeout (client).
    pub call_timeout: Duration,
    /// Capture connections to pcap files in this directory.
    pub capture_dir: Option<std::path::PathBuf>,
    /// Client: how many times to try to reconnect after losing the connection.
    pub reconnect_attempts: u32,
    /// Server: the memory every connection's receive buffers and Read-chunk sinks are drawn
    /// from ([`oncrpc::MemoryBudget`]); `None`: a budget of a quarter of the machine's memory
    /// ([`oncrpc::MemoryBudget::machine_default`]). A connection whose receive buffers do not
    /// fit is refused; a call whose Read chunks do not fit waits (up to `rdma_timeout`) for
    /// memory to come back, then closes its connection.
    pub budget: Option<Arc<oncrpc::MemoryBudget>>,
    /// Server: how long the peer may take to answer an RDMA Read of its Read chunks before the
    /// connection is closed and its memory given back (default 30 s, the client's default call
    /// timeout: a requester that has not delivered a call's data by then has given up on it).
    pub rdma_timeout: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            rpc: Config::default(),
            device: None,
            call_timeout: Duration::from_secs(30),
            capture_dir: None,
            reconnect_attempts: 5,
            budget: None,
            rdma_timeout: Duration::from_secs(30),
        }
    }
}

impl TransportConfig {
    fn device(&self) -> Device {
        self.device.clone().unwrap_or_else(Device::default_device)
    }

    fn conn_params(&self) -> ConnParams {
        ConnParams {
            private_data: Bytes::copy_from_slice(&self.rpc.private_data().encode()),
            capture_dir: self.capture_dir.clone(),
            ..ConnParams::default()
        }
    }
}
/// Connect to `rdma://host:port` (RPC-over-RDMA over soft-iWARP, or the device in `config`;
/// `ulbs` as in [`RdmaClient::connect`]) or `tcp://host:port` (ONC RPC over TCP with record
/// marking, `oncrpc::TcpClient`; `config` and `ulbs` are not used).
pub async fn connect(
    url: &str,
    config: TransportConfig,
    ulbs: Vec<Arc<dyn UpperLayerBinding>>,
) -> Result<Arc<dyn RpcTransport>, DriverError> {
    let (tcp, rest) = if let Some(r) = url.strip_prefix("rdma://") {
        (false, r)
    } else if let Some(r) = url.strip_prefix("tcp://") {
        (true, r)
    } else {
        return Err(DriverError::Scheme(url.to_string()));
    };
    let addr = tokio::net::lookup_host(rest)
        .await
        .map_err(|e| DriverError::Address(e.to_string()))?
        .next()
        .ok_or_else(|| DriverError::Address(rest.to_string()))?;
    if tcp {
        let c = oncrpc::TcpClient::connect(addr).await?;
        return Ok(Arc::new(c));
    }
    Ok(Arc::new(RdmaClient::connect(addr, config, ulbs).await?))
}
