//! RDS over RDMA (the RDS/IB wire behaviour, run on the `verbs` crate: soft-iWARP by default,
//! the in-memory loopback provider in tests).
//!
//! Sans-IO parts (deterministically tested, fuzzed):
//! - [`ConnData`]: the 32-byte IPv4 connection private data and version negotiation.
//! - [`Splitter`]: cuts the engine's transmit byte stream (header, payload, header, …) back into
//!   messages.
//! - [`Fragmenter`] / [`Reassembler`]: every Send is the 48-byte header + ≤ 4096 payload bytes;
//!   every fragment repeats seq, len and ports; a mismatch is a protocol error.
//! - [`Credits`]: the IB credit flow control.
//!
//! The driver (`accept_loop`, `connect_task`, `conn_task`) runs one tokio task per RDMA
//! connection. Sends are posted by transmit passes ([`tx`]): each takes every message the
//! engine has queued and posts all the Sends that credits allow in one list (one vectored write
//! on soft-iWARP). The application that queued a message runs the pass itself when no other is
//! running; the connection task runs the others (credits arrived, an ack due). Receives are
//! taken in the provider's context by a completion handler ([`rx`]). The engine runs in its
//! `Acked` mode (h_ack piggybacking, ACK_REQUIRED every 8).
//!
//! RDMA operations: RDMA Write only. The sink registers an [`RdmaBuffer`] and advertises it
//! with an RDMA_DEST extension; the source's driver posts the RDMA Write just before the first
//! Send of the message carrying the RDMA extension (same QP, so placed first); the sink
//! invalidates the rkey when that message is received (use once). A Write is posted once: if
//! the connection drops before the message is acknowledged, the retransmitted message arrives
//! without its data.
//!
//! Not done: RDMA Read operations, IPv6 private data, version 4.x; the initial `dp_ack_seq` is
//! sent but not applied on receive (retransmission with duplicate suppression covers it).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use verbs::{Access, ConnParams, Connection, Device, QueuePair, RecvWr};

use crate::engine::{AcceptOutcome, PathId, Token};
use crate::tcp::{Inner, pump};
use crate::wire::{FRAG_SIZE, HEADER_LEN};

mod counters;
mod rx;
mod tx;

pub(crate) use counters::CounterCells;
pub use counters::RdmaCounters;
pub(crate) use tx::{Tx, transmit};

pub use crate::wire::rdma::{
    CONN_DATA_LEN, ConnData, Fragment, Fragmenter, MINOR_MASK, Reassembler, RxOutput, Splitter,
};

/// The RDS/IB IPv4 rdma_cm port (facts "RDS over IB/RDMA").
pub const RDS_IB_PORT: u16 = 18634;
/// Settings of RDS over RDMA.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// The verbs device (`None`: a soft-iWARP device of its own).
    pub device: Option<Device>,
    /// rdma_cm port to listen on and dial (18634).
    pub port: u16,
    /// Receive buffers per connection (each 48 + 4096 bytes); advertised as initial credits.
    pub recv_bufs: u32,
    /// Advertise credits (flow control is on only if both sides do).
    pub flow_control: bool,
    /// Version offered first as initiator (major, minor); after a reject we retry at 3.1.
    pub offer: (u8, u8),
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: None,
            port: RDS_IB_PORT,
            recv_bufs: 64,
            flow_control: true,
            offer: (3, 1),
        }
    }
}

/// IB credit flow control (facts: on only if both sides advertised nonzero credit; `h_credit`
/// carries newly posted receive buffers, ≤ 255; the last credit is kept for a credit update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Flow control in force.
    pub enabled: bool,
    /// Sends we may still post.
    pub send: u32,
    /// Receive buffers posted that the peer has not been told about.
    pub unadvertised: u32,
}

impl Credits {
    /// After the handshake: `ours` / `theirs` are the advertised private-data credits.
    pub fn new(ours: u32, theirs: u32) -> Credits {
        Credits {
            enabled: ours != 0 && theirs != 0,
            send: theirs,
            unadvertised: 0,
        }
    }

    /// Whether a Send may be posted now; `update` = the Send carries a credit advertisement and
    /// no data (a credit update), which may use the last credit.
    pub fn can_send(&self, update: bool) -> bool {
        !self.enabled || self.send >= 2 || (self.send == 1 && update)
    }

    /// Takes one credit and returns the `h_credit` to put in the Send (0 unless `first`).
    pub fn take(&mut self, first: bool) -> u8 {
        if !self.enabled {
            return 0;
        }
        self.send = self.send.saturating_sub(1);
        if !first {
            return 0;
        }
        let adv = self.unadvertised.min(255);
        self.unadvertised -= adv;
        adv as u8
    }

    /// The peer granted `n` credits.
    pub fn grant(&mut self, n: u8) {
        self.send = self.send.saturating_add(u32::from(n));
    }

    /// A receive buffer was re-posted.
    pub fn posted(&mut self) {
        if self.enabled {
            self.unadvertised += 1;
        }
    }

    /// Whether to send a standalone credit update now: enough buffers to tell about and
    /// nothing else queued to carry them.
    pub fn wants_update(&self, ring: u32) -> bool {
        self.enabled && self.unadvertised > 0 && self.unadvertised >= ring / 2
    }
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

const BUF_LEN: usize = HEADER_LEN + FRAG_SIZE;
/// Sends posted and not yet completed, at most.
const SQ_DEPTH: usize = 64;

pub(crate) struct RdmaLink {
    pub(crate) close: Arc<Notify>,
    /// The transmit side, for passes run by whoever queued something ([`transmit`]).
    pub(crate) tx: Arc<Tx>,
}

fn device(inner: &Inner) -> Option<Device> {
    inner.rdma_device.clone()
}

fn pd_of(inner: &Inner) -> Result<&verbs::ProtectionDomain, verbs::VerbsError> {
    inner
        .rdma_pd
        .as_ref()
        .ok_or(verbs::VerbsError::InvalidState("not an RDMA stack"))
}

/// The RDMA cookie (facts: `rkey | offset << 32`).
pub fn cookie(rkey: u32, offset: u32) -> u64 {
    u64::from(rkey) | (u64::from(offset) << 32)
}

/// Splits a cookie into (rkey, offset).
pub fn split_cookie(c: u64) -> (u32, u32) {
    (c as u32, (c >> 32) as u32)
}

/// A buffer registered for one RDMA operation by a peer (use once: its rkey is invalidated when
/// the message completing the operation arrives).
#[derive(Debug)]
pub struct RdmaBuffer {
    mr: Arc<verbs::MemoryRegion>,
}

impl RdmaBuffer {
    /// The cookie to hand to the peer (offset 0).
    pub fn cookie(&self) -> u64 {
        cookie(self.mr.rkey(), 0)
    }

    /// The tagged offset of the buffer's first byte, which the peer adds the cookie's offset
    /// to: 0 on zero-based providers (soft-iWARP), the virtual address on rdma-core devices.
    /// Like Linux RDS applications, send it to the peer in the payload when it is not 0.
    pub fn addr(&self) -> u64 {
        self.mr.addr()
    }

    /// The buffer's bytes.
    pub fn read(&self) -> Bytes {
        self.mr.read(0, self.mr.len()).unwrap_or_default()
    }

    /// Fills the buffer at `off` (what a peer's RDMA Read will fetch).
    pub fn write(&self, off: usize, data: &[u8]) -> Result<(), crate::RdsError> {
        self.mr
            .write(off, data)
            .map_err(|e| std::io::Error::other(e.to_string()).into())
    }

    /// Whether the peer may still access it.
    pub fn is_valid(&self) -> bool {
        self.mr.is_valid()
    }
}

impl crate::tcp::RdsStack {
    /// What the RDS-over-RDMA driver did so far (all zero on TCP stacks).
    pub fn rdma_counters(&self) -> RdmaCounters {
        self.inner.rdma_counters.snapshot()
    }

    /// Registers a `len`-byte buffer a peer may RDMA-write to or read from once (RDMA stacks
    /// only). Advertise it with [`crate::RdsSocket::send_rdma_dest`].
    pub fn rdma_buffer(&self, len: usize) -> Result<RdmaBuffer, crate::RdsError> {
        let pd = pd_of(&self.inner).map_err(|e| std::io::Error::other(e.to_string()))?;
        let mr = pd
            .register_len(
                len,
                Access::LOCAL_WRITE
                    .union(Access::REMOTE_WRITE)
                    .union(Access::REMOTE_READ),
            )
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mr = Arc::new(mr);
        self.inner
            .rdma_mrs
            .lock()
            .insert(mr.rkey(), Arc::clone(&mr));
        Ok(RdmaBuffer { mr })
    }
}

/// Receive side of an RDMA operation: a message carrying `Extension::Rdma { rkey }` completes
/// the operation on that buffer; use-once, so the rkey is invalidated now.
pub(crate) fn complete_ops(inner: &Inner, ext: &[crate::wire::Extension]) {
    for e in ext {
        if let crate::wire::Extension::Rdma { rkey } = e
            && let Some(mr) = inner.rdma_mrs.lock().remove(rkey)
        {
            mr.invalidate();
        }
    }
}

/// Sender side: remembers the RDMA Write to post before the message naming `rkey`.
pub(crate) fn queue_write(inner: &Inner, rkey: u32, remote_addr: u64, data: Bytes) {
    inner
        .rdma_ops
        .lock()
        .insert(rkey, PendingOp::Write(remote_addr, data));
}

/// Sender side: remembers the RDMA Read to run before the message naming `rkey` is sent; the
/// bytes come back through the receiver (dropped unanswered if the connection fails first).
pub(crate) fn queue_read(
    inner: &Inner,
    rkey: u32,
    remote_addr: u64,
    len: u32,
) -> tokio::sync::oneshot::Receiver<Bytes> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    inner
        .rdma_ops
        .lock()
        .insert(rkey, PendingOp::Read(remote_addr, len, tx));
    rx
}

/// An RDMA operation waiting for the message that names its rkey.
#[derive(Debug)]
pub(crate) enum PendingOp {
    /// Write `data` at the tagged offset.
    Write(u64, Bytes),
    /// Read this many bytes from the tagged offset and hand them over.
    Read(u64, u32, tokio::sync::oneshot::Sender<Bytes>),
}

struct Qp {
    qp: QueuePair,
    ring: verbs::MemoryRegion,
}

fn make_qp(dev: &Device, pd: &verbs::ProtectionDomain, n: u32) -> Result<Qp, verbs::VerbsError> {
    let (scq, rcq) = (dev.create_cq(), dev.create_cq());
    let qp = dev.create_qp(pd, &scq, &rcq);
    let ring = pd.register_len(BUF_LEN * n as usize, Access::LOCAL_WRITE)?;
    for i in 0..n {
        qp.post_recv(RecvWr::new(
            u64::from(i),
            ring.sge((i as usize * BUF_LEN) as u64, BUF_LEN as u32),
        ))?;
    }
    Ok(Qp { qp, ring })
}

fn ack_seq(inner: &Inner, peer: Ipv4Addr) -> u64 {
    let info = inner.engine.lock().info();
    info.conns
        .iter()
        .find(|c| c.peer == peer)
        .and_then(|c| c.paths.first())
        .map_or(0, |p| p.next_rx_seq.saturating_sub(1))
}

fn our_data(inner: &Inner, peer: Ipv4Addr, (major, minor): (u8, u8)) -> ConnData {
    let cfg = &inner.rdma;
    ConnData {
        saddr: inner.cfg.local,
        daddr: peer,
        major,
        minor,
        minor_mask: MINOR_MASK,
        tos: 0,
        ack_seq: ack_seq(inner, peer),
        credit: if cfg.flow_control { cfg.recv_bufs } else { 0 },
    }
}

/// Accept loop of an RDMA stack.
pub(crate) async fn accept_loop(inner: Weak<Inner>, mut l: verbs::Listener) {
    loop {
        let Ok(req) = l.accept().await else {
            return;
        };
        let Some(i) = inner.upgrade() else {
            return;
        };
        let pd = match ConnData::decode(req.private_data()) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(%e, "rds/rdma: bad private data");
                let _ = req.reject(&[]).await;
                continue;
            }
        };
        let peer = pd.saddr;
        if pd.negotiate().is_none() {
            // Facts: versions other than 3.1 are rejected; the initiator retries at 3.1.
            let ours = our_data(&i, peer, (3, 1)).encode();
            let _ = req.reject(&ours).await;
            continue;
        }
        let outcome = crate::tcp::accept(&i, peer);
        match outcome {
            AcceptOutcome::Reject => {
                let _ = req.reject(&[]).await;
            }
            AcceptOutcome::Refuse => {
                tracing::debug!(%peer, "rds/rdma: refused, a bound on peers or unbound transports");
                let _ = req.reject(&[]).await;
            }
            AcceptOutcome::Accept(tok) => {
                let Some(dev) = device(&i) else { return };
                let res = async {
                    let q = make_qp(&dev, pd_of(&i)?, i.rdma.recv_bufs)?;
                    let ours = our_data(&i, peer, (3, 1));
                    let params = ConnParams {
                        private_data: Bytes::copy_from_slice(&ours.encode()),
                        ..ConnParams::default()
                    };
                    let c = req.accept(&q.qp, params).await?;
                    Ok::<_, verbs::VerbsError>((q, c, ours.credit))
                }
                .await;
                match res {
                    Ok((q, c, ours)) => start(&i, q, c, peer, tok, ours, pd.credit),
                    Err(e) => {
                        tracing::debug!(%e, "rds/rdma: accept failed");
                        i.engine.lock().transport_down(Instant::now(), tok);
                    }
                }
            }
        }
        pump(&i);
    }
}

/// Connects a path over RDMA.
pub(crate) async fn connect_task(inner: Weak<Inner>, path: PathId) {
    let Some(i) = inner.upgrade() else { return };
    let Some(dev) = device(&i) else { return };
    // Dial the peer's RDS address, or its NAT override's IP, on the rdma_cm port.
    let ip = i
        .cfg
        .peer_addrs
        .get(&path.peer)
        .map_or(path.peer, |a| *a.ip());
    let target = SocketAddr::V4(SocketAddrV4::new(ip, i.rdma.port));
    let mut offer = i.rdma.offer;
    drop(i);
    let res = loop {
        let Some(i) = inner.upgrade() else { return };
        let attempt = async {
            let q = make_qp(&dev, pd_of(&i)?, i.rdma.recv_bufs)?;
            let ours = our_data(&i, path.peer, offer);
            let params = ConnParams {
                private_data: Bytes::copy_from_slice(&ours.encode()),
                ..ConnParams::default()
            };
            let c = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                dev.connect(&q.qp, target, params),
            )
            .await
            .map_err(|_| verbs::VerbsError::Timeout)??;
            Ok::<_, verbs::VerbsError>((q, c, ours.credit))
        }
        .await;
        drop(i);
        match attempt {
            Err(verbs::VerbsError::Rejected(_)) if offer != (3, 1) => {
                // Facts: after a reject the active side retries at 3.1.
                offer = (3, 1);
            }
            r => break r,
        }
    };
    let Some(i) = inner.upgrade() else { return };
    match res {
        Ok((q, c, ours)) => {
            let theirs = ConnData::decode(c.peer_private_data()).map_or(0, |d| d.credit);
            let tok = i.engine.lock().connected(Instant::now(), path);
            match tok {
                Some(tok) => start(&i, q, c, path.peer, tok, ours, theirs),
                None => drop(c),
            }
        }
        Err(e) => {
            tracing::debug!(?path, %e, "rds/rdma: connect failed");
            i.engine.lock().connect_failed(Instant::now(), path);
        }
    }
    pump(&i);
}

fn start(
    inner: &Arc<Inner>,
    q: Qp,
    c: Connection,
    peer: Ipv4Addr,
    tok: Token,
    ours: u32,
    theirs: u32,
) {
    let wake = Arc::new(Notify::new());
    let close = Arc::new(Notify::new());
    let Qp { qp, ring } = q;
    let ring_n = inner.rdma.recv_bufs;
    let ctr = Arc::clone(&inner.rdma_counters);
    let credits = Arc::new(Mutex::new(rx::TxCredits {
        c: Credits::new(ours, theirs),
        stalled: false,
    }));
    let tx = Arc::new(Tx {
        st: Mutex::new(tx::TxState::default()),
        scq: qp.send_cq().clone(),
        qp: qp.clone(),
        credits: Arc::clone(&credits),
        ring_n,
        ctr: Arc::clone(&ctr),
        tok,
        local: inner.cfg.local,
        wake: Arc::clone(&wake),
        dead: AtomicBool::new(false),
    });
    // Receives are taken in the provider's context (see `rx`).
    let rx = Arc::new(rx::Rx {
        inner: Arc::downgrade(inner),
        tok,
        qp,
        ring,
        ring_n,
        reasm: Mutex::new(Reassembler::default()),
        credits,
        wake: Arc::clone(&wake),
        dead: AtomicBool::new(false),
        failed: Notify::new(),
        ctr,
        rt: tokio::runtime::Handle::current(),
    });
    inner.conns.lock().insert(
        tok,
        crate::tcp::ConnHandle {
            link: crate::tcp::Link::Rdma(RdmaLink {
                close: Arc::clone(&close),
                tx: Arc::clone(&tx),
            }),
            peer,
            wake: Arc::clone(&wake),
            awaiting_acks: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        },
    );
    let h = tokio::spawn(conn_task(Arc::downgrade(inner), tx, rx, c, wake, close));
    let mut tasks = inner.tasks.lock();
    tasks.retain(|t| !t.is_finished());
    tasks.push(h);
}

/// The connection's task: runs the transmit passes nobody ran directly (credits arrived, a
/// pass was busy elsewhere), waits for Send completions when they hold the next Send back, and
/// ends the connection.
async fn conn_task(
    inner: Weak<Inner>,
    tx: Arc<Tx>,
    rx: Arc<rx::Rx>,
    conn: Connection,
    wake: Arc<Notify>,
    close: Arc<Notify>,
) {
    rx.install();
    let tok = tx.tok;
    'outer: loop {
        let Some(i) = inner.upgrade() else { return };
        CounterCells::add(&tx.ctr.runs, 1);
        let wait_completions = {
            let mut st = tx.st.lock();
            if let Err(tx::Broken(why)) = tx.pass(&mut st, &i) {
                tracing::debug!(tok, why, "rds/rdma: transmit side ends the connection");
                break 'outer;
            }
            st.needs_completions()
        };
        drop(i);
        if tx.dead.load(Ordering::Acquire) {
            break 'outer;
        }
        tokio::select! {
            c = tx.scq.next(), if wait_completions => {
                if tx.completed(&mut tx.st.lock(), &c).is_err() {
                    break 'outer;
                }
            }
            _ = wake.notified() => {
                // Let the tasks woken with us (applications answering a batch of receives) queue
                // their messages first: they then leave in one post list, one vectored write.
                tokio::task::yield_now().await;
            }
            _ = close.notified() => break 'outer,
            _ = rx.failed.notified() => break 'outer,
            ev = conn.next_event() => {
                match ev {
                    Some(verbs::CmEvent::Established) => {}
                    _ => break 'outer,
                }
            }
        }
    }
    tracing::debug!(tok, "rds/rdma: connection task ends");
    // Flushed receives find nothing more to do.
    rx.dead.store(true, Ordering::Release);
    conn.disconnect().await;
    let Some(i) = inner.upgrade() else { return };
    i.conns.lock().remove(&tok);
    i.engine.lock().transport_down(Instant::now(), tok);
    pump(&i);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_keep_the_last_one_for_updates() {
        let mut c = Credits::new(4, 2);
        assert!(c.enabled);
        assert!(c.can_send(false));
        c.take(true);
        assert!(!c.can_send(false));
        assert!(c.can_send(true));
        for _ in 0..300 {
            c.posted();
        }
        assert_eq!(c.take(true), 255);
        assert_eq!(c.unadvertised, 45);
        assert_eq!(c.send, 0);
        assert!(!c.can_send(true));
        c.grant(3);
        assert!(c.can_send(false));
        assert!(!Credits::new(0, 5).enabled);
        assert!(!Credits::new(5, 0).enabled);
    }
}
