//! Registration with the system's rpcbind (RFC 1833), when one runs, instead of serving a port
//! mapper of our own.
//!
//! Linux's rpcbind accepts SET and UNSET only from local callers: over its AF_LOCAL socket
//! (`/run/rpcbind.sock`), or over loopback from a privileged port when started with `-L`. So
//! the local socket is tried first, then TCP on 127.0.0.1:111 (another port mapper, such as a
//! second `oxrdma nfs serve`, which accepts loopback callers). Each registration is made as
//! `svc_reg(3)` makes it: RPCBPROC_UNSET of the (program, version, netid), then RPCBPROC_SET
//! (rpcbind version 4); [`SystemRpcbind::unregister_all`] takes them back at shutdown.
//!
//! The calls go through the crate's port mapper client ([`crate::client::PortmapClient`]) on
//! the ONC RPC client of `oncrpc` (record marking, XIDs, a bounded reply size), over rpcbind's
//! AF_LOCAL socket or TCP, with a timeout per call.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{ClientConfig, RpcError, TcpClient};

use crate::client::{ClientError, PortmapClient};
use crate::portmap::{self, Registration, Rpcb, RpcbString};

/// Where Linux's rpcbind listens for local callers.
pub const LOCAL_SOCKETS: [&str; 2] = ["/run/rpcbind.sock", "/var/run/rpcbind.sock"];

/// The largest reply accepted from rpcbind (SET/UNSET/NULL answer a few words).
const MAX_REPLY: usize = 64 << 10;

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why talking to rpcbind failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    #[error("rpcbind at {at}: {source}")]
    Io {
        at: String,
        #[source]
        source: io::Error,
    },
    #[error("rpcbind at {at} did not answer within {CALL_TIMEOUT:?}")]
    Timeout { at: String },
    #[error("rpcbind at {at} rejected the call: {why}")]
    Rejected { at: String, why: String },
    #[error("rpcbind at {at} refused to register program {prog} version {vers} on {netid}")]
    Refused {
        at: String,
        prog: u32,
        vers: u32,
        netid: String,
    },
}

/// How rpcbind is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RpcbindAt {
    /// Its AF_LOCAL socket.
    Local(PathBuf),
    /// TCP.
    Tcp(SocketAddr),
}

impl std::fmt::Display for RpcbindAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcbindAt::Local(p) => write!(f, "{}", p.display()),
            RpcbindAt::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

/// A connection to a running rpcbind and what was registered through it.
pub struct SystemRpcbind {
    at: RpcbindAt,
    client: PortmapClient,
    registered: std::sync::Mutex<Vec<Registration>>,
}

impl std::fmt::Debug for SystemRpcbind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemRpcbind")
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

impl SystemRpcbind {
    /// The rpcbind of this machine, if one answers: its local socket, else TCP on
    /// 127.0.0.1:111.
    pub async fn find() -> Option<Self> {
        let tries = LOCAL_SOCKETS
            .iter()
            .map(|p| RpcbindAt::Local(PathBuf::from(p)))
            .chain(std::iter::once(RpcbindAt::Tcp(SocketAddr::from((
                [127, 0, 0, 1],
                portmap::PORT,
            )))));
        for at in tries {
            if let Ok(r) = Self::connect(at).await {
                return Some(r);
            }
        }
        None
    }

    /// Connect to rpcbind at `at` and check that it answers (RPCBPROC_NULL, version 4).
    pub async fn connect(at: RpcbindAt) -> Result<Self, RegisterError> {
        let io = |source| RegisterError::Io {
            at: at.to_string(),
            source,
        };
        let config = ClientConfig::default()
            .with_timeout(CALL_TIMEOUT)
            .with_max_record(MAX_REPLY)
            .with_reconnect_attempts(1);
        let transport = match &at {
            RpcbindAt::Local(p) => {
                let s = tokio::time::timeout(CALL_TIMEOUT, tokio::net::UnixStream::connect(p))
                    .await
                    .map_err(|_| RegisterError::Timeout { at: at.to_string() })?
                    .map_err(io)?;
                TcpClient::over_stream(s, format!("unix:{}", p.display()), config)
            }
            RpcbindAt::Tcp(a) => TcpClient::connect_with(*a, config).await.map_err(io)?,
        };
        let client = PortmapClient::new(Arc::new(transport)).with_timeout(CALL_TIMEOUT);
        let r = SystemRpcbind {
            at,
            client,
            registered: std::sync::Mutex::new(Vec::new()),
        };
        r.client.null(4).await.map_err(|e| r.error(e))?;
        Ok(r)
    }

    /// Where rpcbind was reached.
    pub fn at(&self) -> &RpcbindAt {
        &self.at
    }

    /// Register each of `regs` (replacing an earlier registration of the same program,
    /// version and netid). Stops at the first refusal.
    pub async fn register(&self, regs: &[Registration]) -> Result<(), RegisterError> {
        for reg in regs {
            let _ = self.set(false, reg).await?;
            if !self.set(true, reg).await? {
                return Err(RegisterError::Refused {
                    at: self.at.to_string(),
                    prog: reg.prog,
                    vers: reg.vers,
                    netid: reg.netid.clone(),
                });
            }
            self.registered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(reg.clone());
        }
        Ok(())
    }

    /// Take back everything [`SystemRpcbind::register`] registered; returns how many rpcbind
    /// removed.
    pub async fn unregister_all(&self) -> Result<usize, RegisterError> {
        let regs = std::mem::take(&mut *self.registered.lock().unwrap_or_else(|e| e.into_inner()));
        let mut removed = 0;
        for reg in &regs {
            if self.set(false, reg).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// RPCBPROC_SET (`set`) or RPCBPROC_UNSET of `reg` (rpcbind version 4): rpcbind's
    /// boolean answer.
    async fn set(&self, set: bool, reg: &Registration) -> Result<bool, RegisterError> {
        let s = |v: &str| RpcbString(Bytes::copy_from_slice(v.as_bytes()));
        let args = Rpcb {
            prog: reg.prog,
            vers: reg.vers,
            netid: s(&reg.netid),
            addr: s(&portmap::uaddr(reg.addr)),
            owner: s(&reg.owner),
        };
        let r = if set {
            self.client.set(4, &args).await
        } else {
            self.client.unset(4, &args).await
        };
        r.map_err(|e| self.error(e))
    }

    /// A client error as what went wrong with this rpcbind.
    fn error(&self, e: ClientError) -> RegisterError {
        let at = self.at.to_string();
        match e {
            ClientError::Rpc(RpcError::Timeout) => RegisterError::Timeout { at },
            ClientError::Rpc(RpcError::Io(source)) => RegisterError::Io { at, source },
            ClientError::Rpc(RpcError::Transport(why)) => RegisterError::Io {
                at,
                source: io::Error::new(io::ErrorKind::ConnectionAborted, why),
            },
            other => RegisterError::Rejected {
                at,
                why: other.to_string(),
            },
        }
    }
}
