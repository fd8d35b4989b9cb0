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
//! The exchange is one call at a time on one stream, with record marking (RFC 5531 §11), a
//! bounded reply size and a timeout per call.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use oncrpc::{AcceptStat, CallHeader, MessageHeader, OpaqueAuth, RecordDecoder, ReplyHeader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use crate::portmap::{self, Registration, Rpcb, RpcbString, rpcb_proc};

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

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A connection to a running rpcbind and what was registered through it.
pub struct SystemRpcbind {
    at: RpcbindAt,
    conn: Mutex<(Box<dyn Stream>, u32)>,
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
        let stream: Box<dyn Stream> = match &at {
            RpcbindAt::Local(p) => Box::new(
                tokio::time::timeout(CALL_TIMEOUT, tokio::net::UnixStream::connect(p))
                    .await
                    .map_err(|_| RegisterError::Timeout { at: at.to_string() })?
                    .map_err(io)?,
            ),
            RpcbindAt::Tcp(a) => Box::new(
                tokio::time::timeout(CALL_TIMEOUT, tokio::net::TcpStream::connect(a))
                    .await
                    .map_err(|_| RegisterError::Timeout { at: at.to_string() })?
                    .map_err(io)?,
            ),
        };
        let r = SystemRpcbind {
            at,
            conn: Mutex::new((stream, rand::random())),
            registered: std::sync::Mutex::new(Vec::new()),
        };
        r.call(rpcb_proc::NULL, Bytes::new()).await?;
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
            let _ = self.set(rpcb_proc::UNSET, reg).await?;
            if !self.set(rpcb_proc::SET, reg).await? {
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
            if self.set(rpcb_proc::UNSET, reg).await? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// RPCBPROC_SET or RPCBPROC_UNSET of `reg`: rpcbind's boolean answer.
    async fn set(&self, proc_: u32, reg: &Registration) -> Result<bool, RegisterError> {
        let s = |v: &str| RpcbString(Bytes::copy_from_slice(v.as_bytes()));
        let args = Rpcb {
            prog: reg.prog,
            vers: reg.vers,
            netid: s(&reg.netid),
            addr: s(&portmap::uaddr(reg.addr)),
            owner: s(&reg.owner),
        };
        let mut enc = Encoder::new();
        args.encode(&mut enc);
        let res = self.call(proc_, enc.into_bytes()).await?;
        bool::decode(&mut Decoder::from_bytes(&res)).map_err(|e| RegisterError::Rejected {
            at: self.at.to_string(),
            why: format!("undecodable result: {e}"),
        })
    }

    /// One call of rpcbind version 4; the results.
    async fn call(&self, proc_: u32, args: Bytes) -> Result<Bytes, RegisterError> {
        let at = self.at.to_string();
        let mut g = self.conn.lock().await;
        let (stream, next_xid) = &mut *g;
        let xid = *next_xid;
        *next_xid = next_xid.wrapping_add(1);
        let header = CallHeader {
            xid,
            prog: portmap::PROGRAM,
            vers: 4,
            proc_,
            cred: OpaqueAuth::none(),
            verf: OpaqueAuth::none(),
        };
        let mut enc = Encoder::new();
        header.encode(&mut enc);
        let mut msg = enc.into_bytes().to_vec();
        msg.extend_from_slice(&args);
        let mut record = oncrpc::record::fragment_header(msg.len(), true).to_vec();
        record.extend_from_slice(&msg);
        let exchange = async {
            stream.write_all(&record).await?;
            let mut decoder = RecordDecoder::new(MAX_REPLY);
            let mut buf = BytesMut::with_capacity(256);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(r)) => return Ok(r),
                    Ok(None) => {}
                    Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                }
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
            }
        };
        let reply = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| RegisterError::Timeout { at: at.clone() })?
            .map_err(|source| RegisterError::Io {
                at: at.clone(),
                source,
            })?;
        let rejected = |why: String| RegisterError::Rejected {
            at: at.clone(),
            why,
        };
        match MessageHeader::decode_message(&reply) {
            Ok((
                MessageHeader::Reply(ReplyHeader::Accepted {
                    xid: x,
                    stat: AcceptStat::Success,
                    ..
                }),
                res,
            )) if x == xid => Ok(res),
            Ok((MessageHeader::Reply(r), _)) if r.xid() == xid => Err(rejected(format!("{r:?}"))),
            Ok(_) => Err(rejected("an unexpected message".into())),
            Err(e) => Err(rejected(e.to_string())),
        }
    }
}
