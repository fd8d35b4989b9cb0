//! The conformance requester's connection: one queue pair on the verbs API, with receive
//! buffers of the size we advertise, raw Sends of whatever bytes a case built, and memory the
//! server may RDMA Read or Write. Nothing here interprets RPC-over-RDMA: the cases do.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use rpcrdma::privdata::PrivateData;
use verbs::{
    Access, CompletionQueue, ConnParams, Connection, Device, MemoryRegion, ProtectionDomain,
    RecvWr, SendWr, WcStatus,
};

use super::ConformError;

/// How the requester sets up a connection.
#[derive(Debug, Clone)]
pub struct LinkOpts {
    /// Size of each posted receive buffer, and the receive size advertised in the RFC 8797
    /// private data (a multiple of 1024, at most 256 KiB).
    pub recv_size: u32,
    /// Receive buffers posted (at least the credits we ask for).
    pub recvs: usize,
    /// Send the RFC 8797 private data (otherwise none, and both sides assume 1024 bytes).
    pub private_data: bool,
    /// Connection setup bound.
    pub connect_timeout: Duration,
}

impl Default for LinkOpts {
    fn default() -> Self {
        LinkOpts {
            recv_size: 1024,
            recvs: 64,
            private_data: true,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What a wait for the next received message ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A message (the bytes of the Send).
    Msg(Bytes),
    /// Nothing arrived within the wait.
    Timeout,
    /// The receive completed in error: the connection broke, or (local length error) the
    /// peer sent more than our receive buffer holds.
    Failed(WcStatus),
}

/// One connected queue pair of the conformance requester.
pub struct Link {
    conn: Connection,
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    bufs: Vec<MemoryRegion>,
    recv_size: u32,
    next_wr: u64,
    received: u64,
    nudges: u32,
    /// What the server sent in its private data, decoded (`None`: absent or not RFC 8797).
    pub peer_private: Option<PrivateData>,
    /// The raw private data bytes the server sent.
    pub peer_private_raw: Bytes,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer", &self.conn.peer_addr())
            .field("recv_size", &self.recv_size)
            .field("peer_private", &self.peer_private)
            .finish_non_exhaustive()
    }
}

/// The wr_id range of the receive buffers (index + this); sends use ids below it.
const RECV_WR_BASE: u64 = 1 << 40;

impl Link {
    /// Connect to `addr` on `dev`, posting `opts.recvs` receive buffers first.
    pub async fn connect(
        dev: &Device,
        addr: SocketAddr,
        opts: &LinkOpts,
    ) -> Result<Link, ConformError> {
        let pd = dev.alloc_pd();
        let (scq, rcq) = (dev.create_cq(), dev.create_cq());
        let qp = dev.create_qp(&pd, &scq, &rcq);
        let mut bufs = Vec::with_capacity(opts.recvs);
        for i in 0..opts.recvs {
            let mr = pd.register_len(opts.recv_size as usize, Access::LOCAL_WRITE)?;
            qp.post_recv(RecvWr::new(
                RECV_WR_BASE + i as u64,
                mr.sge(0, opts.recv_size),
            ))?;
            bufs.push(mr);
        }
        let params = ConnParams {
            private_data: if opts.private_data {
                Bytes::copy_from_slice(&PrivateData::new(opts.recv_size, false).encode())
            } else {
                Bytes::new()
            },
            ..ConnParams::default()
        };
        let conn = tokio::time::timeout(opts.connect_timeout, dev.connect(&qp, addr, params))
            .await
            .map_err(|_| ConformError::Timeout("connection setup"))??;
        let raw = conn.peer_private_data().clone();
        Ok(Link {
            peer_private: PrivateData::decode(&raw),
            peer_private_raw: raw,
            conn,
            pd,
            scq,
            rcq,
            bufs,
            recv_size: opts.recv_size,
            next_wr: 1,
            received: 0,
            nudges: 0,
        })
    }

    /// Our receive buffer size (the reply inline threshold we advertised).
    pub fn recv_size(&self) -> u32 {
        self.recv_size
    }

    /// Send `msg` in one RDMA Send and wait (bounded) for its completion.
    pub async fn send(&mut self, msg: Bytes, wait: Duration) -> Result<(), ConformError> {
        let id = self.next_wr;
        self.next_wr += 1;
        self.conn.qp().post_send(SendWr::send_bytes(id, msg))?;
        loop {
            let c = tokio::time::timeout(wait, self.scq.next())
                .await
                .map_err(|_| ConformError::Timeout("Send completion"))?;
            if c.status != WcStatus::Success {
                return Err(ConformError::Transport(format!(
                    "Send completed with {:?}",
                    c.status
                )));
            }
            if c.wr_id == id {
                return Ok(());
            }
        }
    }

    /// Send several messages back to back (one post each, no wait between them), then wait
    /// for all their completions.
    pub async fn send_burst(
        &mut self,
        msgs: Vec<Bytes>,
        wait: Duration,
    ) -> Result<(), ConformError> {
        let first = self.next_wr;
        let n = msgs.len() as u64;
        for m in msgs {
            let id = self.next_wr;
            self.next_wr += 1;
            self.conn.qp().post_send(SendWr::send_bytes(id, m))?;
        }
        let mut done = 0;
        while done < n {
            let c = tokio::time::timeout(wait, self.scq.next())
                .await
                .map_err(|_| ConformError::Timeout("Send completion"))?;
            if c.status != WcStatus::Success {
                return Err(ConformError::Transport(format!(
                    "Send completed with {:?}",
                    c.status
                )));
            }
            if (first..first + n).contains(&c.wr_id) {
                done += 1;
            }
        }
        Ok(())
    }

    /// The next received message, or why there is none within `wait`. The buffer is posted
    /// again once its bytes are copied out.
    pub async fn recv(&mut self, wait: Duration) -> Result<Received, ConformError> {
        let Ok(c) = tokio::time::timeout(wait, self.rcq.next()).await else {
            return Ok(Received::Timeout);
        };
        if c.status != WcStatus::Success {
            return Ok(Received::Failed(c.status));
        }
        let Some(i) = c.wr_id.checked_sub(RECV_WR_BASE).map(|i| i as usize) else {
            return Err(ConformError::Transport(format!(
                "receive completion with unknown wr_id {}",
                c.wr_id
            )));
        };
        let Some(mr) = self.bufs.get(i) else {
            return Err(ConformError::Transport(format!(
                "receive completion with unknown wr_id {}",
                c.wr_id
            )));
        };
        self.received += 1;
        let len = (c.byte_len as usize).min(self.recv_size as usize);
        let msg = mr.read(0, len)?;
        self.conn
            .qp()
            .post_recv(RecvWr::new(c.wr_id, mr.sge(0, self.recv_size)))?;
        Ok(Received::Msg(msg))
    }

    /// Messages received so far on this connection.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Zero-length RDMA Writes sent by [`Link::nudge`].
    pub fn nudges(&self) -> u32 {
        self.nudges
    }

    /// Send a zero-length RDMA Write (STag 1, TO 0), unsignaled. Linux siw 6.1 as responder
    /// can leave an FPDU that arrives right after its MPA Reply unread until the next segment
    /// comes (`interop/WIRE-NOTES.md`, "Kernel siw responder loses the first FPDU"); a
    /// zero-length Write places nothing (RFC 5040: no STag check without data at siw and
    /// here) and makes it read what waits.
    pub fn nudge(&mut self) -> Result<(), ConformError> {
        let id = self.next_wr;
        self.next_wr += 1;
        self.nudges += 1;
        let mut wr = SendWr::new(
            id,
            verbs::SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 1,
            },
            Vec::new(),
        );
        wr.signaled = false;
        self.conn.qp().post_send(wr)?;
        Ok(())
    }

    /// Memory the server may RDMA Write (Write and Reply chunks), zero-filled.
    pub fn sink(&self, len: usize) -> Result<MemoryRegion, ConformError> {
        Ok(self
            .pd
            .register_len(len.max(1), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?)
    }

    /// Memory the server may RDMA Read (Read chunks), holding `data`.
    pub fn source(&self, data: Vec<u8>) -> Result<MemoryRegion, ConformError> {
        Ok(self.pd.register(data, Access::REMOTE_READ)?)
    }

    /// Whether the queue pair still works (not in the error state).
    pub fn is_up(&self) -> bool {
        !matches!(self.conn.qp().state(), verbs::QpState::Error)
    }

    /// Close the connection (bounded).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.conn.disconnect()).await;
    }
}

/// A segment naming `len` bytes of `mr` from its start (RFC 8166 §4.1: handle, length,
/// offset, with the offset in the provider's tagged-offset space).
pub fn segment(mr: &MemoryRegion, len: u32) -> rpcrdma::header::Segment {
    rpcrdma::header::Segment {
        handle: mr.rkey(),
        length: len,
        offset: mr.addr(),
    }
}
