//! rds-stress: request/ack load from `tasks` sockets, each with `depth` requests in flight, and
//! with `rdma_size` (rds-stress `-D`) an RDMA Write into a buffer each request advertises,
//! counted as mbi/mbo.

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rds::rdma::RdmaBuffer;
use rds::wire::Extension;
use rds::{RdsError, RdsSocket, RdsStack};
use tokio::task::JoinHandle;

/// rds-stress style parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StressParams {
    /// `-q`: request size, bytes.
    pub req_size: usize,
    /// `-a`: ack (response) size, bytes.
    pub ack_size: usize,
    /// `-d`: requests in flight per task.
    pub depth: usize,
    /// `-t`: tasks.
    pub tasks: usize,
    /// `-T`: run time.
    pub duration: Duration,
    /// `-D`: bytes of an RDMA operation each request carries (0: none). The request
    /// advertises a fresh buffer (RDMA_DEST) and the responder RDMA-writes this many bytes
    /// into it before its ack, which carries the RDMA extension that completes the operation.
    /// RDS over RDMA only.
    pub rdma_size: usize,
}

impl Default for StressParams {
    fn default() -> Self {
        // rds-stress defaults: 1024-byte requests, 1024-byte acks... we keep small defaults.
        StressParams {
            req_size: 1024,
            ack_size: 256,
            depth: 1,
            tasks: 1,
            duration: Duration::from_secs(1),
            rdma_size: 0,
        }
    }
}

/// rds-stress style result columns.
#[derive(Debug, Clone, PartialEq)]
pub struct StressResult {
    /// `tsks`.
    pub tasks: usize,
    /// Messages sent per second (requests).
    pub tx_per_s: f64,
    /// Messages received per second (acks).
    pub rx_per_s: f64,
    /// Payload KiB per second, both directions.
    pub tx_rx_kib_per_s: f64,
    /// RDMA KiB/s in: bytes the peer RDMA-wrote into this side's buffers (`-D`), counted
    /// when the message completing the operation arrived and the bytes were checked.
    pub mbi_kib_per_s: f64,
    /// RDMA KiB/s out: bytes this side RDMA-wrote (the responder's side of `-D`; filled in by
    /// callers that run both ends).
    pub mbo_kib_per_s: f64,
    /// Mean request→ack round trip, microseconds.
    pub rtt_us: f64,
    /// Requests sent.
    pub requests: u64,
    /// Acks received.
    pub acks: u64,
    /// Measured wall time.
    pub elapsed: Duration,
}

impl StressResult {
    /// Fills in mbo from the bytes the responders RDMA-wrote ([`StressServer::rdma_out_bytes`])
    /// when both ends ran in this process.
    pub fn set_rdma_out(&mut self, bytes: u64) {
        self.mbo_kib_per_s = bytes as f64 / 1024.0 / self.elapsed.as_secs_f64().max(1e-9);
    }
}

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    pub(crate) acks: u64,
    pub(crate) rtt_sum: Duration,
    pub(crate) rdma_in: u64,
}

/// What the responder RDMA-writes for `-D`, and what the requester checks it received.
fn rdma_pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ 0xa5)
        .collect::<Vec<u8>>()
        .into()
}

pub(crate) fn result(p: &StressParams, t: &Tally, elapsed: Duration) -> StressResult {
    let s = elapsed.as_secs_f64().max(1e-9);
    StressResult {
        tasks: p.tasks,
        tx_per_s: t.requests as f64 / s,
        rx_per_s: t.acks as f64 / s,
        tx_rx_kib_per_s: (t.requests as f64 * p.req_size as f64
            + t.acks as f64 * p.ack_size as f64)
            / 1024.0
            / s,
        mbi_kib_per_s: t.rdma_in as f64 / 1024.0 / s,
        mbo_kib_per_s: 0.0,
        rtt_us: if t.acks == 0 {
            0.0
        } else {
            t.rtt_sum.as_secs_f64() * 1e6 / t.acks as f64
        },
        requests: t.requests,
        acks: t.acks,
        elapsed,
    }
}

/// A running stress responder; dropping it stops it.
#[derive(Debug)]
pub struct StressServer {
    tasks: Vec<JoinHandle<()>>,
    /// First RDS port; task `i` listens on `base_port + i`.
    pub base_port: u16,
    rdma_out: Arc<std::sync::atomic::AtomicU64>,
}

impl StressServer {
    /// Bytes RDMA-written into requesters' buffers so far (`-D`).
    pub fn rdma_out_bytes(&self) -> u64 {
        self.rdma_out.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for StressServer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts `tasks` responders on `stack`, ports `base_port..base_port+tasks`: each answers every
/// request with an ack of `ack_size` bytes.
pub fn stress_server(
    stack: &RdsStack,
    base_port: u16,
    tasks: usize,
    ack_size: usize,
) -> Result<StressServer, RdsError> {
    stress_server_rdma(stack, base_port, tasks, ack_size, 0)
}

/// [`stress_server`] that also answers a request advertising a buffer (RDMA_DEST, `-D`) by
/// RDMA-writing `rdma_size` bytes into it before the ack (RDS over RDMA stacks).
pub fn stress_server_rdma(
    stack: &RdsStack,
    base_port: u16,
    tasks: usize,
    ack_size: usize,
    rdma_size: usize,
) -> Result<StressServer, RdsError> {
    let mut hs = Vec::new();
    let ack = Bytes::from(vec![0u8; ack_size]);
    let data = rdma_pattern(rdma_size);
    let rdma_out = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for i in 0..tasks {
        let sock = stack.bind(base_port.wrapping_add(i as u16))?;
        let (ack, data, out) = (ack.clone(), data.clone(), rdma_out.clone());
        hs.push(tokio::spawn(async move {
            while let Ok(d) = sock.recv_datagram().await {
                let dest = d.rdma_dest_cookie();
                // The requester's buffer address (see `stress_send`).
                let base = d
                    .payload
                    .get(..8)
                    .map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
                let r = match dest {
                    Some(c) if !data.is_empty() => {
                        let r = sock
                            .send_rdma_write(d.src, c, base, data.clone(), ack.clone())
                            .await;
                        if r.is_ok() {
                            out.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        }
                        r
                    }
                    _ => sock.send_to(d.src, ack.clone()).await,
                };
                if r.is_err() {
                    break;
                }
            }
        }));
    }
    Ok(StressServer {
        tasks: hs,
        base_port,
        rdma_out,
    })
}

/// One stress request; with `-D` it advertises a fresh use-once buffer for the responder's
/// RDMA Write. `None` when sending failed.
async fn stress_send(
    sock: &RdsSocket,
    stack: &RdsStack,
    dest: SocketAddrV4,
    req: &Bytes,
    rdma_size: usize,
) -> Option<Option<RdmaBuffer>> {
    if rdma_size == 0 {
        return sock.send_to(dest, req.clone()).await.ok().map(|_| None);
    }
    let buf = stack.rdma_buffer(rdma_size).ok()?;
    // The buffer's address goes in the request's first 8 bytes (big-endian), as rds-stress
    // carries it in its own header: the responder writes at that address plus the cookie's
    // offset (0 with zero-based registrations, the virtual address on rdma-core devices).
    let mut r = bytes::BytesMut::with_capacity(req.len().max(8));
    r.extend_from_slice(&buf.addr().to_be_bytes());
    r.extend_from_slice(req.get(8..).unwrap_or_default());
    sock.send_rdma_dest(dest, &buf, r.freeze()).await.ok()?;
    Some(Some(buf))
}

/// Runs the request/ack client: `tasks` sockets, each keeping `depth` requests in flight to
/// `server` port + task index, for `duration`.
pub async fn stress_client(
    stack: &RdsStack,
    server: SocketAddrV4,
    p: StressParams,
) -> Result<StressResult, RdsError> {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let deadline = start + p.duration;
    let mut hs = Vec::new();
    for i in 0..p.tasks {
        let sock: RdsSocket = stack.bind(0)?;
        let dest = SocketAddrV4::new(*server.ip(), server.port().wrapping_add(i as u16));
        let req = Bytes::from(vec![0x55u8; p.req_size]);
        let stack = stack.clone();
        let expect = rdma_pattern(p.rdma_size);
        hs.push(tokio::spawn(async move {
            let mut sent_at: VecDeque<(Instant, Option<RdmaBuffer>)> = VecDeque::new();
            let mut t = Tally::default();
            for _ in 0..p.depth.max(1) {
                let Some(buf) = stress_send(&sock, &stack, dest, &req, p.rdma_size).await else {
                    return t;
                };
                sent_at.push_back((Instant::now(), buf));
                t.requests += 1;
            }
            // Acks come back in order (one port pair, one path).
            while !sent_at.is_empty() {
                let left =
                    deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
                let Ok(Ok(d)) = tokio::time::timeout(left, sock.recv_datagram()).await else {
                    break;
                };
                if let Some((t0, buf)) = sent_at.pop_front() {
                    t.rtt_sum += t0.elapsed();
                    // The ack completes the responder's RDMA Write into this request's buffer:
                    // count its bytes once they are checked.
                    if let Some(buf) = buf {
                        let done = d.ext.iter().any(|e| {
                            matches!(e, Extension::Rdma { rkey }
                                if u64::from(*rkey) == buf.cookie() & 0xffff_ffff)
                        });
                        if done && buf.read() == expect {
                            t.rdma_in += expect.len() as u64;
                        }
                    }
                }
                t.acks += 1;
                if Instant::now() < deadline {
                    let Some(buf) = stress_send(&sock, &stack, dest, &req, p.rdma_size).await
                    else {
                        break;
                    };
                    sent_at.push_back((Instant::now(), buf));
                    t.requests += 1;
                }
            }
            t
        }));
    }
    for h in hs {
        if let Ok(t) = h.await {
            let mut g = tally.lock();
            g.requests += t.requests;
            g.acks += t.acks;
            g.rtt_sum += t.rtt_sum;
            g.rdma_in += t.rdma_in;
        }
    }
    let elapsed = start.elapsed();
    let g = tally.lock();
    Ok(result(&p, &g, elapsed))
}
