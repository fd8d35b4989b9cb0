//! The socket-style API: [`RdsSocket`] (async) and [`BlockingRdsSocket`].
//!
//! Sockets on one local address share one [`RdsStack`]. [`RdsSocket::bind`] finds the stack
//! started for the address (or starts one on the default port 16385).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::{RdsError, SendError};
use crate::tcp::{Inner, RdsStack, StackConfig, pump};
use crate::wire::MAX_MSG_LEN;

fn registry() -> &'static Mutex<HashMap<Ipv4Addr, Weak<Inner>>> {
    static R: OnceLock<Mutex<HashMap<Ipv4Addr, Weak<Inner>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn register(inner: &Arc<Inner>) {
    let mut r = registry().lock();
    r.insert(inner.cfg.local, Arc::downgrade(inner));
}

pub(crate) fn unregister(inner: &Arc<Inner>) {
    let mut r = registry().lock();
    if r.get(&inner.cfg.local)
        .is_some_and(|w| w.as_ptr() == Arc::as_ptr(inner))
    {
        r.remove(&inner.cfg.local);
    }
}

/// What a blocking send waited for (counts of would-block attempts before it was queued).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendWaits {
    /// The destination port was marked congested by the peer's congestion map.
    pub congested: u32,
    /// This port's send buffer was full.
    pub buffer_full: u32,
    /// The multipath handshake was pending.
    pub handshake: u32,
}

/// An RDS socket bound to (local address, RDS port).
#[derive(Debug)]
pub struct RdsSocket {
    stack: RdsStack,
    port: u16,
    readable: Arc<Notify>,
}

impl RdsStack {
    /// Binds an RDS port on this stack (`port` 0 picks a free one).
    pub fn bind(&self, port: u16) -> Result<RdsSocket, RdsError> {
        let port = {
            let mut e = self.inner.engine.lock();
            if port == 0 {
                e.bind_any().ok_or(RdsError::AddrInUse(0))?
            } else {
                e.bind(port)?;
                port
            }
        };
        let readable = Arc::new(Notify::new());
        self.inner
            .readable
            .lock()
            .insert(port, Arc::clone(&readable));
        Ok(RdsSocket {
            stack: self.clone(),
            port,
            readable,
        })
    }
}

impl RdsSocket {
    /// Binds `addr` (IP + RDS port; port 0 = any). Uses the stack already started for the IP,
    /// or starts one with [`StackConfig::new`] (RDS/TCP port 16385).
    pub async fn bind(addr: SocketAddrV4) -> Result<RdsSocket, RdsError> {
        let existing = {
            let r = registry().lock();
            r.get(addr.ip()).and_then(Weak::upgrade)
        };
        let stack = match existing {
            Some(inner) => RdsStack { inner },
            None => RdsStack::start(StackConfig::new(*addr.ip())).await?,
        };
        stack.bind(addr.port())
    }

    /// Local address (IP, RDS port).
    pub fn local_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.stack.local(), self.port)
    }

    /// The stack this socket lives on.
    pub fn stack(&self) -> &RdsStack {
        &self.stack
    }

    /// Sets the receive buffer (SO_RCVBUF): the port is congested while more is queued.
    pub fn set_rcvbuf(&self, bytes: usize) {
        self.stack.inner.engine.lock().set_rcvbuf(self.port, bytes);
        pump(&self.stack.inner);
    }

    /// Sets the send buffer: a new message is queued only while less than this is queued and
    /// unconfirmed (Linux: half of SO_SNDBUF).
    pub fn set_sndbuf(&self, bytes: usize) {
        self.stack.inner.engine.lock().set_sndbuf(self.port, bytes);
        pump(&self.stack.inner);
    }

    /// Sends without waiting: would-block errors are returned as they are.
    pub fn try_send_to(&self, dest: SocketAddrV4, payload: Bytes) -> Result<(), SendError> {
        let r = self
            .stack
            .inner
            .engine
            .lock()
            .send(Instant::now(), self.port, dest, payload);
        pump(&self.stack.inner);
        r
    }

    /// Sends one datagram (≤ 1 MiB; zero-length is fine). Waits while the destination port is
    /// congested or the multipath handshake is pending, as a blocking Linux send does.
    pub async fn send_to(&self, dest: SocketAddrV4, payload: Bytes) -> Result<(), SendError> {
        self.send_to_counted(dest, payload).await.map(|_| ())
    }

    /// [`RdsSocket::send_to`], also saying what made it wait: how many attempts found the
    /// destination port congested, the send buffer full, or the handshake pending.
    pub async fn send_to_counted(
        &self,
        dest: SocketAddrV4,
        payload: Bytes,
    ) -> Result<SendWaits, SendError> {
        if payload.len() > MAX_MSG_LEN {
            return Err(SendError::TooLong(payload.len()));
        }
        let mut waits = SendWaits::default();
        loop {
            let ready = self.stack.inner.send_ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            match self.try_send_to(dest, payload.clone()) {
                Err(e) if e.is_would_block() => {
                    match e {
                        SendError::Congested => waits.congested += 1,
                        SendError::SendBufferFull => waits.buffer_full += 1,
                        _ => waits.handshake += 1,
                    }
                    // Re-check periodically as well: a cleared congestion bit may arrive on a
                    // connection we are not notified about.
                    let _ = tokio::time::timeout(Duration::from_millis(100), ready).await;
                }
                Ok(()) => return Ok(waits),
                Err(e) => return Err(e),
            }
        }
    }

    /// Receives one datagram and its source (peer IP, source RDS port).
    pub async fn recv_from(&self) -> Result<(Bytes, SocketAddrV4), RdsError> {
        let d = self.recv_datagram().await?;
        Ok((d.payload, d.src))
    }

    /// Receives one datagram with the RDMA / RDMA_DEST extensions it carried. A message with
    /// `Extension::Rdma { rkey }` completes a peer's RDMA operation on one of our
    /// [`crate::rdma::RdmaBuffer`]s: that buffer's rkey is invalidated (use once).
    pub async fn recv_datagram(&self) -> Result<crate::engine::Datagram, RdsError> {
        loop {
            let n = self.readable.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            let d = self.stack.inner.engine.lock().recv(self.port);
            if let Some(d) = d {
                crate::rdma::complete_ops(&self.stack.inner, &d.ext);
                // Reading may clear congestion, which queues a map update.
                pump(&self.stack.inner);
                return Ok(d);
            }
            n.await;
        }
    }

    async fn send_ext(
        &self,
        dest: SocketAddrV4,
        payload: Bytes,
        ext: Vec<crate::wire::Extension>,
    ) -> Result<(), SendError> {
        loop {
            let ready = self.stack.inner.send_ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let r = self.stack.inner.engine.lock().send_with_ext(
                Instant::now(),
                self.port,
                dest,
                payload.clone(),
                ext.clone(),
            );
            pump(&self.stack.inner);
            match r {
                Err(e) if e.is_would_block() => {
                    let _ = tokio::time::timeout(Duration::from_millis(100), ready).await;
                }
                r => return r,
            }
        }
    }

    /// Sends `payload` advertising `buf` (an RDMA_DEST extension with its rkey and offset 0):
    /// the peer may RDMA-write into it once ([`RdsSocket::send_rdma_write`]).
    pub async fn send_rdma_dest(
        &self,
        dest: SocketAddrV4,
        buf: &crate::rdma::RdmaBuffer,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let (rkey, offset) = crate::rdma::split_cookie(buf.cookie());
        self.send_ext(
            dest,
            payload,
            vec![crate::wire::Extension::RdmaDest { rkey, offset }],
        )
        .await
    }

    /// The rkey and tagged offset of an RDMA operation on the peer buffer named by `cookie`,
    /// at `remote_addr` plus the cookie's offset. RDMA stacks only.
    fn rdma_target(&self, cookie: u64, remote_addr: u64) -> Result<(u32, u64), SendError> {
        if self.stack.inner.rdma_device.is_none() {
            return Err(SendError::NotRdma);
        }
        let (rkey, offset) = crate::rdma::split_cookie(cookie);
        Ok((rkey, remote_addr.wrapping_add(u64::from(offset))))
    }

    /// RDMA-writes `data` to the peer buffer named by `cookie` (`rkey | offset << 32`, from the
    /// peer's RDMA_DEST), then sends `payload` carrying the RDMA extension that completes the
    /// operation (facts: the op is posted before the Send that follows it). RDMA stacks only.
    ///
    /// `remote_addr` is the peer buffer's address as the peer's application reported it
    /// ([`crate::rdma::RdmaBuffer::addr`]), like Linux's `remote_vec.addr`: the Write goes to
    /// tagged offset `remote_addr + offset`. It is 0 for zero-based registrations (soft-iWARP,
    /// and Linux RDS/IB's own) and the buffer's virtual address on an rdma-core device.
    pub async fn send_rdma_write(
        &self,
        dest: SocketAddrV4,
        cookie: u64,
        remote_addr: u64,
        data: Bytes,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let (rkey, to) = self.rdma_target(cookie, remote_addr)?;
        crate::rdma::queue_write(&self.stack.inner, rkey, to, data);
        self.send_ext(dest, payload, vec![crate::wire::Extension::Rdma { rkey }])
            .await
    }

    /// RDMA-reads `len` bytes from the peer buffer named by `cookie` at `remote_addr` plus the
    /// cookie's offset (see [`RdsSocket::send_rdma_write`]), then sends `payload` carrying the
    /// RDMA extension, which tells the peer the operation is over (it invalidates the buffer:
    /// use once). The Send waits for the Read to complete, as Linux orders it with
    /// RDS_RDMA_FENCE. Returns the bytes read. RDMA stacks only.
    pub async fn send_rdma_read(
        &self,
        dest: SocketAddrV4,
        cookie: u64,
        remote_addr: u64,
        len: usize,
        payload: Bytes,
    ) -> Result<Bytes, SendError> {
        let (rkey, to) = self.rdma_target(cookie, remote_addr)?;
        let len = u32::try_from(len)
            .ok()
            .filter(|l| *l as usize <= crate::wire::MAX_MSG_LEN)
            .ok_or(SendError::TooLong(len))?;
        let rx = crate::rdma::queue_read(&self.stack.inner, rkey, to, len);
        if let Err(e) = self
            .send_ext(dest, payload, vec![crate::wire::Extension::Rdma { rkey }])
            .await
        {
            self.stack.inner.rdma_ops.lock().remove(&rkey);
            return Err(e);
        }
        rx.await.map_err(|_| SendError::RdmaFailed)
    }

    /// Receives with a time limit (`None` on timeout).
    pub async fn recv_timeout(
        &self,
        t: Duration,
    ) -> Result<Option<(Bytes, SocketAddrV4)>, RdsError> {
        match tokio::time::timeout(t, self.recv_from()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

impl Drop for RdsSocket {
    fn drop(&mut self) {
        self.stack.inner.engine.lock().unbind(self.port);
        self.stack.inner.readable.lock().remove(&self.port);
        pump(&self.stack.inner);
    }
}

fn blocking_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("rds-blocking")
            .build()
            .unwrap_or_else(|e| panic!("cannot start the RDS runtime: {e}"))
    })
}

/// A blocking wrapper around [`RdsSocket`] for non-async callers. Runs the stack on a shared
/// background runtime. Do not call from inside an async context.
#[derive(Debug)]
pub struct BlockingRdsSocket {
    sock: RdsSocket,
}

impl BlockingRdsSocket {
    /// Binds `addr` (see [`RdsSocket::bind`]).
    pub fn bind(addr: SocketAddrV4) -> Result<Self, RdsError> {
        let sock = blocking_runtime().block_on(RdsSocket::bind(addr))?;
        Ok(BlockingRdsSocket { sock })
    }

    /// Starts a stack with `cfg` on the background runtime and binds `port` on it.
    pub fn bind_with(cfg: StackConfig, port: u16) -> Result<Self, RdsError> {
        let sock = blocking_runtime().block_on(async move {
            let s = RdsStack::start(cfg).await?;
            s.bind(port)
        })?;
        Ok(BlockingRdsSocket { sock })
    }

    /// Local address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.sock.local_addr()
    }

    /// Sets the receive buffer.
    pub fn set_rcvbuf(&self, bytes: usize) {
        self.sock.set_rcvbuf(bytes)
    }

    /// Blocking send.
    pub fn send_to(&self, dest: SocketAddrV4, payload: Bytes) -> Result<(), SendError> {
        blocking_runtime().block_on(self.sock.send_to(dest, payload))
    }

    /// Blocking receive.
    pub fn recv_from(&self) -> Result<(Bytes, SocketAddrV4), RdsError> {
        blocking_runtime().block_on(self.sock.recv_from())
    }

    /// Blocking receive with a time limit.
    pub fn recv_timeout(&self, t: Duration) -> Result<Option<(Bytes, SocketAddrV4)>, RdsError> {
        blocking_runtime().block_on(self.sock.recv_timeout(t))
    }

    /// The async socket inside.
    pub fn inner(&self) -> &RdsSocket {
        &self.sock
    }
}
