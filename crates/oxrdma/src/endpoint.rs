//! Transport selection shared by every command group.
//!
//! Each transport has its own flag (`--tcp ADDR` today; `--rdma ADDR` is added by the
//! RPC-over-RDMA code), and a server may be given several at once. Commands turn the flags into
//! [`Endpoint`]s and call [`serve`] or [`connect`]; adding a transport means one flag in
//! [`ListenArgs`] / [`ConnectArgs`], one [`Endpoint`] variant, and one arm in each function.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use oncrpc::{Dispatcher, RpcTransport, ServerConfig, TcpClient, TcpServer};

/// One place to serve on or connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// ONC RPC over TCP with record marking (RFC 5531 §11).
    Tcp(SocketAddr),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// Server-side transport flags: give one or more.
#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// Serve ONC RPC over TCP on ADDR (for example 127.0.0.1:20048; port 0 picks a free port).
    /// May be repeated.
    #[arg(long, value_name = "ADDR")]
    pub tcp: Vec<SocketAddr>,
}

impl ListenArgs {
    /// Every endpoint asked for, in flag order.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.tcp.iter().copied().map(Endpoint::Tcp).collect()
    }
}

/// Client-side transport flags: give exactly one.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Call the server over TCP at ADDR.
    #[arg(long, value_name = "ADDR")]
    pub tcp: Option<SocketAddr>,
}

impl ConnectArgs {
    /// The endpoint asked for, if any.
    pub fn endpoint(&self) -> Option<Endpoint> {
        self.tcp.map(Endpoint::Tcp)
    }
}

/// A running server on one endpoint.
#[derive(Debug)]
pub enum Server {
    Tcp(TcpServer),
}

impl Server {
    /// Where it really listens (the chosen port when 0 was asked for).
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Server::Tcp(s) => Endpoint::Tcp(s.local_addr()),
        }
    }

    /// Stop accepting, finish calls in progress, close connections.
    pub async fn shutdown(self) {
        match self {
            Server::Tcp(s) => s.shutdown().await,
        }
    }
}

/// Start serving `dispatcher` on `endpoint`.
pub async fn serve(
    endpoint: Endpoint,
    dispatcher: Arc<Dispatcher>,
) -> Result<Server, Box<dyn std::error::Error + Send + Sync>> {
    match endpoint {
        Endpoint::Tcp(addr) => {
            let s = TcpServer::bind(addr, dispatcher, ServerConfig::default())
                .await
                .map_err(|e| format!("cannot listen on tcp://{addr}: {e}"))?;
            Ok(Server::Tcp(s))
        }
    }
}

/// Connect an RPC client transport to `endpoint`.
pub async fn connect(
    endpoint: Endpoint,
) -> Result<Arc<dyn RpcTransport>, Box<dyn std::error::Error + Send + Sync>> {
    match endpoint {
        Endpoint::Tcp(addr) => {
            let c = TcpClient::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to tcp://{addr}: {e}"))?;
            Ok(Arc::new(c))
        }
    }
}
