//! Transport selection shared by every command group.
//!
//! Each transport has its own flag (`--tcp ADDR`, `--rdma ADDR`), and a server may be given
//! several at once. Commands turn the flags into
//! [`Endpoint`]s and call [`serve`] or [`connect`]; adding a transport means one flag in
//! [`ListenArgs`] / [`ConnectArgs`], one [`Endpoint`] variant, and one arm in each function.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use oncrpc::{Dispatcher, RpcTransport, ServerConfig, TcpClient, TcpServer};
use rpcrdma::ulb::{InlineBinding, UpperLayerBinding};
use rpcrdma::{RdmaClient, RdmaServer, TransportConfig};

/// One place to serve on or connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// ONC RPC over TCP with record marking (RFC 5531 §11).
    Tcp(SocketAddr),
    /// RPC-over-RDMA version 1 (RFC 8166) over soft-iWARP (RDMAP/DDP/MPA on TCP).
    Rdma(SocketAddr),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
            Endpoint::Rdma(a) => write!(f, "rdma://{a}"),
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
    /// Serve RPC-over-RDMA (RFC 8166) over soft-iWARP on ADDR (port 0 picks a free port).
    /// May be repeated, and combined with --tcp: every endpoint serves at once.
    #[arg(long, value_name = "ADDR")]
    pub rdma: Vec<SocketAddr>,
}

impl ListenArgs {
    /// Every endpoint asked for: TCP ones first, then RDMA ones, each in flag order.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let tcp = self.tcp.iter().copied().map(Endpoint::Tcp);
        tcp.chain(self.rdma.iter().copied().map(Endpoint::Rdma))
            .collect()
    }
}

/// Client-side transport flags.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Call the server over TCP at ADDR.
    #[arg(long, value_name = "ADDR")]
    pub tcp: Option<SocketAddr>,
    /// Call the server with RPC-over-RDMA over soft-iWARP at ADDR.
    #[arg(long, value_name = "ADDR")]
    pub rdma: Option<SocketAddr>,
}

impl ConnectArgs {
    /// Every endpoint asked for: TCP first, then RDMA.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let tcp = self.tcp.map(Endpoint::Tcp);
        tcp.into_iter()
            .chain(self.rdma.map(Endpoint::Rdma))
            .collect()
    }
}

/// A running server on one endpoint.
#[derive(Debug)]
pub enum Server {
    Tcp(TcpServer),
    Rdma(RdmaServer),
}

impl Server {
    /// Where it really listens (the chosen port when 0 was asked for).
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Server::Tcp(s) => Endpoint::Tcp(s.local_addr()),
            Server::Rdma(s) => Endpoint::Rdma(s.local_addr()),
        }
    }

    /// Stop accepting, finish calls in progress, close connections.
    pub async fn shutdown(self) {
        match self {
            Server::Tcp(s) => s.shutdown().await,
            Server::Rdma(s) => {
                // Dropping the server stops accepting; disconnect the established ones.
                let conns = s.connections();
                drop(s);
                for c in conns {
                    c.disconnect().await;
                }
            }
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
        Endpoint::Rdma(addr) => {
            // Only NULL is served here, so no program needs an Upper-Layer Binding.
            let s = RdmaServer::bind(
                addr,
                (*dispatcher).clone(),
                Vec::new(),
                TransportConfig::default(),
            )
            .await
            .map_err(|e| format!("cannot listen on rdma://{addr}: {e}"))?;
            Ok(Server::Rdma(s))
        }
    }
}

/// Connect an RPC client transport to `endpoint`, for NULL calls of version `vers` of program
/// `prog`. Over RPC-over-RDMA a program needs an Upper-Layer Binding (RFC 8166 §6) or the
/// client refuses its calls; NULL has no DDP-eligible item, so the client declares a binding
/// without any ([`InlineBinding`]).
pub async fn connect(
    endpoint: Endpoint,
    prog: u32,
    vers: u32,
) -> Result<Arc<dyn RpcTransport>, Box<dyn std::error::Error + Send + Sync>> {
    match endpoint {
        Endpoint::Tcp(addr) => {
            let c = TcpClient::connect(addr)
                .await
                .map_err(|e| format!("cannot connect to tcp://{addr}: {e}"))?;
            Ok(Arc::new(c))
        }
        Endpoint::Rdma(addr) => {
            let null_only: Arc<dyn UpperLayerBinding> =
                Arc::new(InlineBinding::new(prog, vers..=vers));
            let c = RdmaClient::connect(addr, TransportConfig::default(), vec![null_only])
                .await
                .map_err(|e| format!("cannot connect to rdma://{addr}: {e}"))?;
            Ok(Arc::new(c))
        }
    }
}
