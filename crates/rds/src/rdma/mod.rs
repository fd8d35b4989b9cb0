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
//! connection, which sends: it takes every message the engine has queued and posts all the
//! Sends that credits allow in one list (one vectored write on soft-iWARP). Receives are taken
//! in the provider's context by a completion handler ([`rx`]). The engine runs in its `Acked`
//! mode (h_ack piggybacking, ACK_REQUIRED every 8).
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

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use verbs::{Access, ConnParams, Connection, Device, QueuePair, RecvWr, SendWr, WcStatus};

use crate::engine::{AcceptOutcome, PathId, Token};
use crate::tcp::{Inner, pump};
use crate::wire::{FRAG_SIZE, HEADER_LEN};

mod counters;
mod rx;

pub(crate) use counters::CounterCells;
pub use counters::RdmaCounters;

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

/// A Read posted ahead of the Send that must follow it.
struct HeldRead {
    wr_id: u64,
    sink: verbs::MemoryRegion,
    len: usize,
    done: Option<tokio::sync::oneshot::Sender<Bytes>>,
    frag: Fragment,
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
        qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sgl: vec![ring.sge((i as usize * BUF_LEN) as u64, BUF_LEN as u32)],
        })?;
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
        let outcome = i.engine.lock().accept(Instant::now(), peer);
        match outcome {
            AcceptOutcome::Reject => {
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
    inner.conns.lock().insert(
        tok,
        crate::tcp::ConnHandle {
            link: crate::tcp::Link::Rdma(RdmaLink {
                close: Arc::clone(&close),
            }),
            peer,
            wake: Arc::clone(&wake),
            awaiting_acks: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        },
    );
    let credits = Credits::new(ours, theirs);
    let h = tokio::spawn(conn_task(
        Arc::downgrade(inner),
        q,
        c,
        tok,
        wake,
        close,
        credits,
    ));
    let mut tasks = inner.tasks.lock();
    tasks.retain(|t| !t.is_finished());
    tasks.push(h);
}

async fn conn_task(
    inner: Weak<Inner>,
    q: Qp,
    conn: Connection,
    tok: Token,
    wake: Arc<Notify>,
    close: Arc<Notify>,
    credits: Credits,
) {
    let ring_n = inner.upgrade().map_or(64, |i| i.rdma.recv_bufs);
    let ctr = inner
        .upgrade()
        .map(|i| Arc::clone(&i.rdma_counters))
        .unwrap_or_default();
    let local = inner.upgrade().map(|i| i.cfg.local);
    let mut split = Splitter::default();
    let mut outq: VecDeque<Fragment> = VecDeque::new();
    let mut in_flight = 0usize;
    let mut next_wr: u64 = 0;
    let scq = q.qp.send_cq().clone();
    let Qp { qp, ring } = q;
    let credits = Arc::new(Mutex::new(rx::TxCredits {
        c: credits,
        stalled: false,
    }));
    // Receives are taken in the provider's context (see `rx`).
    let rx = Arc::new(rx::Rx {
        inner: inner.clone(),
        tok,
        qp: qp.clone(),
        ring,
        ring_n,
        reasm: Mutex::new(Reassembler::default()),
        credits: Arc::clone(&credits),
        wake: Arc::clone(&wake),
        dead: AtomicBool::new(false),
        failed: Notify::new(),
        ctr: Arc::clone(&ctr),
        rt: tokio::runtime::Handle::current(),
    });
    rx.install();
    // RDMA Reads: who waits for each (by rkey), and the one whose Send waits for it (the
    // Send that names the rkey goes out only once the Read completed, like Linux's
    // RDS_RDMA_FENCE; nothing is posted behind it meanwhile, which keeps RDS's order).
    let mut read_waiters: HashMap<u32, tokio::sync::oneshot::Sender<Bytes>> = HashMap::new();
    let mut held: Option<HeldRead> = None;
    'outer: loop {
        let Some(i) = inner.upgrade() else { return };
        CounterCells::add(&ctr.runs, 1);
        // Pull messages from the engine while the queue is short.
        if outq.len() < SQ_DEPTH {
            let mut e = i.engine.lock();
            while outq.len() < SQ_DEPTH {
                match e.poll_transmit(tok) {
                    Some(b) => {
                        split.push_bytes(b);
                        loop {
                            match split.next_msg() {
                                Ok(Some((h, p))) => {
                                    let mut fr = Fragmenter::fragments(&h, &p);
                                    // Facts: the RDMA op is posted before the Send that
                                    // follows it (same QP, so it is placed first).
                                    for x in &h.ext.items {
                                        if let crate::wire::Extension::Rdma { rkey } = x
                                            && let Some(op) = i.rdma_ops.lock().remove(rkey)
                                            && let Some(f0) = fr.first_mut()
                                        {
                                            match op {
                                                PendingOp::Write(off, data) => {
                                                    f0.write = Some((*rkey, off, data));
                                                }
                                                PendingOp::Read(off, len, tx) => {
                                                    f0.read = Some((*rkey, off, len));
                                                    read_waiters.insert(*rkey, tx);
                                                }
                                            }
                                        }
                                    }
                                    outq.extend(fr);
                                }
                                Ok(None) => break,
                                Err(err) => {
                                    tracing::warn!(%err, "rds/rdma: engine stream");
                                    break 'outer;
                                }
                            }
                        }
                    }
                    None => break,
                }
            }
        }
        pump(&i);
        drop(i);
        // Post what credits allow, all in one list: soft-iWARP then frames every Send of this
        // pass into one vectored write instead of one system call (or one writer-task wake-up)
        // per Send.
        let mut wrs: Vec<SendWr> = Vec::new();
        let mut failed = false;
        {
            let mut cr = credits.lock();
            while in_flight < SQ_DEPTH && held.is_none() {
                // A standalone credit update (ack-only header carrying h_credit) when at least half
                // the ring waits to be advertised. Only then: single-credit updates bouncing between
                // two blocked senders would keep the credits split into 1-credit packets for ever.
                let front_is_update = outq
                    .front()
                    .is_some_and(|f| f.first && f.payload.is_empty() && f.header.is_ack_only());
                if cr.c.wants_update(ring_n) && !front_is_update {
                    CounterCells::add(&ctr.credit_updates, 1);
                    outq.push_front(Fragment {
                        header: crate::wire::ack_only(0),
                        payload: Bytes::new(),
                        first: true,
                        write: None,
                        read: None,
                    });
                }
                let Some(f) = outq.front() else { break };
                let update = f.first
                    && f.payload.is_empty()
                    && f.header.is_ack_only()
                    && cr.c.unadvertised > 0;
                if !cr.c.can_send(update) {
                    // The receive handler wakes us when credits arrive.
                    cr.stalled = true;
                    CounterCells::add(&ctr.credit_stalls, 1);
                    break;
                }
                let Some(mut f) = outq.pop_front() else { break };
                if let Some((rkey, off, len)) = f.read.take() {
                    let Ok(sink) = qp
                        .pd()
                        .register_len((len as usize).max(1), Access::LOCAL_WRITE)
                    else {
                        failed = true;
                        break;
                    };
                    next_wr += 1;
                    wrs.push(SendWr::new(
                        next_wr,
                        verbs::SendOp::RdmaRead {
                            remote_addr: off,
                            rkey,
                        },
                        if len == 0 {
                            Vec::new()
                        } else {
                            vec![sink.sge(0, len)]
                        },
                    ));
                    in_flight += 1;
                    held = Some(HeldRead {
                        wr_id: next_wr,
                        sink,
                        len: len as usize,
                        done: read_waiters.remove(&rkey),
                        frag: f,
                    });
                    break;
                }
                if let Some((rkey, off, data)) = f.write.take() {
                    next_wr += 1;
                    wrs.push(SendWr {
                        wr_id: next_wr,
                        opcode: verbs::SendOp::RdmaWrite {
                            remote_addr: off,
                            rkey,
                        },
                        payload: verbs::Payload::Inline(data),
                        signaled: true,
                        solicited: false,
                    });
                    in_flight += 1;
                }
                let c = cr.c.take(f.first);
                let Ok(bytes) = f.encode(c) else {
                    failed = true;
                    break;
                };
                tracing::trace!(
                    ?local,
                    tok,
                    len = bytes.len(),
                    c,
                    credits = ?cr.c,
                    "rds/rdma: send"
                );
                next_wr += 1;
                wrs.push(SendWr::send_bytes(next_wr, bytes));
                CounterCells::add(&ctr.sends, 1);
                in_flight += 1;
            }
        }
        if !wrs.is_empty() {
            CounterCells::add(&ctr.post_calls, 1);
            if qp.post_send_list(wrs).is_err() {
                break 'outer;
            }
        }
        if failed {
            break 'outer;
        }
        tokio::select! {
            c = scq.next() => {
                let mut next = Some(c);
                while let Some(c) = next.take() {
                    if c.status != WcStatus::Success {
                        break 'outer;
                    }
                    in_flight = in_flight.saturating_sub(1);
                    if held.as_ref().is_some_and(|h| h.wr_id == c.wr_id)
                        && let Some(h) = held.take()
                    {
                        // The Read is done: hand its bytes over and let its Send go first.
                        let Ok(data) = h.sink.take(h.len) else { break 'outer };
                        if let Some(tx) = h.done {
                            let _ = tx.send(data);
                        }
                        outq.push_front(h.frag);
                    }
                    next = scq.try_next();
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
