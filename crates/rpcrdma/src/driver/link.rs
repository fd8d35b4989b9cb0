//! The verbs side of a connection: the queue pair with its receive buffers ([`Link`]), the
//! send-queue completion router ([`Router`]), memory registration through a protection domain
//! ([`VerbsRegistrar`]) and the reusable sink buffers ([`SinkPool`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use verbs::{
    Access, CompletionQueue, Connection, MemoryRegion, Payload, ProtectionDomain, QueuePair,
    RecvWr, SendOp, SendWr, WcStatus,
};

use crate::engine::{RegError, Region, RegionId, Registrar};
use crate::header::Segment;
use crate::lost::{SendCompletion, reply_lost};

/// Room a sink region keeps before the bytes the peer may write: enough for the inline results
/// that precede an NFS READ's data (NFSv3: 104 bytes; an NFSv4 COMPOUND's SEQUENCE, PUTFH and
/// READ results: about 150), so the reply can be put together around the data.
const SINK_HEAD: usize = 512;
/// Room after them: XDR round-up and whatever inline results follow the item.
const SINK_TAIL: usize = 64;
/// Sink buffers at least this large are reused once the caller drops what was read into them.
/// At 256 KiB, every 64 KiB READ reply's Write-chunk sink (client) and every 64 KiB WRITE's
/// Read-chunk sink (server) was a fresh zeroed allocation: `memset` of those sinks was 1.6 % of
/// `nfs bench --io 64k --depth 4` over RDMA (perf, stop 31), work NFS over TCP does not do.
const SINK_POOL_MIN: usize = 32 << 10;
/// Idle sink buffers kept per connection (a client's readahead window of 1 MiB READs).
const SINK_POOL_KEEP: usize = 16;

/// Large sink buffers, reused ([`oncrpc::BufPool`]) instead of zeroed afresh for every NFS
/// READ. A reused buffer holds what an earlier reply put there; only the bytes the peer says it
/// wrote are ever handed out, as in Linux's xprtrdma, whose Write chunks target page-cache
/// pages that are not cleared first either.
pub(super) struct SinkPool(Arc<oncrpc::BufPool>);

impl Default for SinkPool {
    fn default() -> Self {
        SinkPool(oncrpc::BufPool::new(SINK_POOL_KEEP))
    }
}

impl SinkPool {
    /// A buffer of at least `len` bytes (large ones rounded up to 4 KiB, so that calls whose
    /// inline parts differ by a few bytes share buffers).
    pub(super) fn get(&self, len: usize) -> Vec<u8> {
        if len >= SINK_POOL_MIN {
            return self.0.get(len.next_multiple_of(4096));
        }
        vec![0; len]
    }

    /// `range` of `buf` as `Bytes`; a large buffer comes back here when the last of them goes.
    pub(super) fn wrap(&self, buf: Vec<u8>, range: std::ops::Range<usize>) -> Bytes {
        if buf.len() < SINK_POOL_MIN {
            return Bytes::from(buf).slice(range);
        }
        self.0.wrap(buf, range)
    }
}

/// Memory registration through a verbs protection domain. The provider picks random STags
/// (RFC 8166 §8.1.2: handles are not predictable).
pub(super) struct VerbsRegistrar {
    pd: ProtectionDomain,
    next: RegionId,
    /// Each region with the offset of its advertised part (non-zero for sinks).
    pub(super) regions: HashMap<RegionId, (MemoryRegion, usize)>,
    sinks: SinkPool,
}

impl VerbsRegistrar {
    pub(super) fn new(pd: ProtectionDomain) -> Self {
        VerbsRegistrar {
            pd,
            next: 0,
            regions: HashMap::new(),
            sinks: SinkPool::default(),
        }
    }

    /// Record a registration whose advertised part is `len` bytes at `head`.
    fn add(&mut self, mr: MemoryRegion, head: usize, len: usize) -> Region {
        self.next += 1;
        let seg = Segment {
            handle: mr.rkey(),
            length: len as u32,
            offset: mr.addr() + head as u64,
        };
        self.regions.insert(self.next, (mr, head));
        Region {
            id: self.next,
            segments: vec![seg],
        }
    }
}

impl Registrar for VerbsRegistrar {
    fn register_source(&mut self, data: Bytes) -> Result<Region, RegError> {
        // The caller's bytes are registered as they are: no copy even when the caller keeps
        // them (an NFS WRITE's data, say). The region only ever reads them.
        let len = data.len();
        let mr = self
            .pd
            .register_bytes(data, Access::REMOTE_READ)
            .map_err(|e| RegError::Register(e.to_string()))?;
        Ok(self.add(mr, 0, len))
    }

    fn register_sink(&mut self, len: usize) -> Result<Region, RegError> {
        // The peer is told of `len` bytes at SINK_HEAD. The room around them is registered too
        // (one region), but nothing the peer could put there is ever read: the region is
        // fenced before its contents are taken, and the room is then overwritten.
        let buf = self.sinks.get(SINK_HEAD + len.max(1) + SINK_TAIL);
        let mr = self
            .pd
            .register(buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|e| RegError::Register(e.to_string()))?;
        Ok(self.add(mr, SINK_HEAD, len.max(1)))
    }

    fn sink_contents(&mut self, id: RegionId, len: usize) -> Result<Bytes, RegError> {
        let (mr, head) = self.regions.get(&id).ok_or(RegError::Unknown(id))?;
        // The contents are read once, as the RPC completes: fence the region and take its
        // memory instead of copying it (RFC 8166 §4.4.1 wants it invalidated by now anyway).
        let v = mr
            .take_vec()
            .map_err(|e| RegError::Register(e.to_string()))?;
        let end = head
            .checked_add(len)
            .filter(|e| *e <= v.len())
            .ok_or_else(|| RegError::Register(format!("{len} bytes asked of a sink region")))?;
        Ok(self.sinks.wrap(v, *head..end))
    }

    fn sink_framed(
        &mut self,
        id: RegionId,
        len: usize,
        prefix: &[u8],
        suffix: &[u8],
    ) -> Result<Option<Bytes>, RegError> {
        let (mr, head) = self.regions.get(&id).ok_or(RegError::Unknown(id))?;
        let head = *head;
        let pad = xdr::pad_len(len);
        let end = head + len + pad + suffix.len();
        if prefix.len() > head || end > mr.len() {
            return Ok(None);
        }
        // Fenced first (take_vec invalidates): nothing the peer writes lands after this.
        let mut v = mr
            .take_vec()
            .map_err(|e| RegError::Register(e.to_string()))?;
        if end > v.len() {
            return Err(RegError::Register("sink region already taken".into()));
        }
        let start = head - prefix.len();
        v[start..head].copy_from_slice(prefix);
        v[head + len..head + len + pad].fill(0);
        v[head + len + pad..end].copy_from_slice(suffix);
        Ok(Some(self.sinks.wrap(v, start..end)))
    }

    fn invalidate(&mut self, id: RegionId, _remote: bool) -> Result<(), RegError> {
        let (mr, _) = self.regions.remove(&id).ok_or(RegError::Unknown(id))?;
        // RFC 8166 §4.4.1 / §8.1.3: the STag is dead before the RPC completes. A remote
        // invalidation already did it; invalidating again locally is harmless.
        mr.invalidate();
        Ok(())
    }
}

/// Send-queue completion routing shared by a connection's tasks.
#[derive(Default)]
pub(super) struct Router {
    next: AtomicU64,
    pub(super) waiters: Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>,
    /// Told the XID of a reply whose unsignaled Send failed (it completes only then).
    pub(super) on_reply_failed: Mutex<Option<ReplyFailed>>,
    /// A completion failed with an RDMA operational error (not a flush).
    pub(super) op_error: std::sync::atomic::AtomicBool,
    /// Set under the `waiters` lock by [`Router::close`]: nothing routes completions any more.
    closed: std::sync::atomic::AtomicBool,
}

pub(super) type ReplyFailed = Box<dyn Fn(u32) + Send + Sync>;

/// `wr_id` tag of a reply's unsignaled Send; the low 32 bits carry its XID.
pub(super) const REPLY_WR: u64 = 1 << 63;

impl Router {
    pub(super) fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A wait for the completion of work request `id`. Once the router is closed the wait
    /// ends at once (its sender dropped: the caller counts it flushed), as the completion
    /// would never be routed to it.
    pub(super) fn wait(&self, id: u64) -> oneshot::Receiver<WcStatus> {
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock();
        if !self.closed.load(Ordering::Relaxed) {
            waiters.insert(id, tx);
        }
        rx
    }

    /// The connection is gone and its completions are no longer routed: end every wait, the
    /// ones made from now on included ([`Router::wait`]). A call that posts its RDMA Reads
    /// after the connection's teardown (its QP flushes them into a queue nobody reads) would
    /// otherwise wait for ever, holding its sink and its memory budget (issue 20).
    pub(super) fn close(&self) {
        let mut waiters = self.waiters.lock();
        self.closed.store(true, Ordering::Relaxed);
        waiters.clear();
    }

    /// Record a send-queue completion's status: anything but success or a flush is an RDMA
    /// operational error.
    pub(super) fn note_status(&self, status: WcStatus) {
        if !matches!(status, WcStatus::Success | WcStatus::WrFlushError) {
            self.op_error.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a reply whose Send completed with `status` is lost ([`crate::lost::reply_lost`],
    /// RFC 8166 §4.5.3).
    pub(super) fn reply_lost(&self, status: WcStatus) -> bool {
        let completion = match status {
            WcStatus::Success => SendCompletion::Success,
            WcStatus::WrFlushError => SendCompletion::Flushed,
            _ => SendCompletion::Failed,
        };
        reply_lost(completion, self.op_error.load(Ordering::Relaxed))
    }

    /// Route completions until the queue pair fails.
    pub(super) async fn run(self: Arc<Self>, cq: CompletionQueue) {
        loop {
            let c = cq.next().await;
            self.note_status(c.status);
            if c.wr_id & REPLY_WR != 0 {
                if self.reply_lost(c.status)
                    && let Some(f) = &*self.on_reply_failed.lock()
                {
                    f(c.wr_id as u32);
                }
            } else if let Some(tx) = self.waiters.lock().remove(&c.wr_id) {
                let _ = tx.send(c.status);
            }
            if c.status != WcStatus::Success {
                tracing::debug!(status = ?c.status, opcode = ?c.opcode, "send queue completion in error");
                // Flushes: fail every waiter.
                self.waiters.lock().clear();
            }
        }
    }
}

/// One connected queue pair with its buffer pools.
pub(super) struct Link {
    pub(super) qp: QueuePair,
    pub(super) conn: Connection,
    pub(super) recv_bufs: Vec<MemoryRegion>,
    pub(super) router: Arc<Router>,
    pub(super) router_task: tokio::task::JoinHandle<()>,
    /// Local sinks of RDMA Reads (Read chunks pulled by a server), reused.
    pub(super) read_sinks: SinkPool,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.router_task.abort();
    }
}

impl Link {
    pub(super) fn post_recv(&self, i: usize) -> Result<(), verbs::VerbsError> {
        let mr = &self.recv_bufs[i];
        self.qp
            .post_recv(RecvWr::new(i as u64, mr.sge(0, mr.len() as u32)))
    }

    /// Post a Send of `data` (owned bytes, like inline data) and wait for its completion.
    ///
    /// Not from a pool of registered buffers reused once the Send completes: soft-iWARP's
    /// zero-copy transmit completes a Send when its FPDU is built, before the bytes are read
    /// out of the registered buffer onto the socket, so a reused buffer could put another
    /// message's bytes on the wire (seen as duplicated replies with the wrong invalidated
    /// STag; `tests/pipelined_null.rs`). Owned bytes are immutable and cost no extra copy.
    pub(super) async fn send(
        &self,
        data: Bytes,
        invalidate: Option<u32>,
    ) -> Result<(), verbs::VerbsError> {
        let op = match invalidate {
            Some(h) => SendOp::SendWithInvalidate(h),
            None => SendOp::Send,
        };
        let id = self.router.id();
        let rx = self.router.wait(id);
        let wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(id, op, Vec::new())
        };
        if let Err(e) = self.qp.post_send(wr) {
            self.router.waiters.lock().remove(&id);
            return Err(e);
        }
        if rx.await.unwrap_or(WcStatus::WrFlushError) == WcStatus::Success {
            Ok(())
        } else {
            Err(verbs::VerbsError::Disconnected)
        }
    }

    /// Post the Send of the reply to `xid`, unsignaled: a reply costs no completion to wait
    /// for. If it fails later (flushed by a connection that broke), the router hears of it and
    /// reports the XID (RFC 8166 §4.5.3/§4.5.4).
    pub(super) fn post_reply(
        &self,
        data: Bytes,
        invalidate: Option<u32>,
        xid: u32,
    ) -> Result<(), verbs::VerbsError> {
        self.qp.post_send(reply_wr(data, invalidate, xid))
    }

    /// Post a Send of `data` without waiting for (or asking for) its completion; errors
    /// still complete, into the router, which nobody waits on for this WR.
    pub(super) fn post_send_unsignaled(&self, data: Bytes) -> Result<(), verbs::VerbsError> {
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(self.router.id(), SendOp::Send, Vec::new())
        };
        wr.signaled = false;
        self.qp.post_send(wr)
    }

    /// Post a Send (or a Send With Invalidate of `invalidate`) of `data`, unsignaled.
    pub(super) fn post_send_inv_unsignaled(
        &self,
        data: Bytes,
        invalidate: Option<u32>,
    ) -> Result<(), verbs::VerbsError> {
        let op = match invalidate {
            Some(h) => SendOp::SendWithInvalidate(h),
            None => SendOp::Send,
        };
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(self.router.id(), op, Vec::new())
        };
        wr.signaled = false;
        self.qp.post_send(wr)
    }

    /// RDMA Read `segs` one after another into `mr` from offset `at`, at most `window` Reads
    /// outstanding at once; fails on the first Read that does not complete successfully.
    async fn read_segments(
        &self,
        mr: &MemoryRegion,
        segs: &[Segment],
        mut at: u64,
        window: usize,
    ) -> Result<(), verbs::VerbsError> {
        for part in segs.chunks(window.max(1)) {
            let mut waits = Vec::with_capacity(part.len());
            for s in part {
                let id = self.router.id();
                let rx = self.router.wait(id);
                self.qp.post_send(SendWr::new(
                    id,
                    SendOp::RdmaRead {
                        remote_addr: s.offset,
                        rkey: s.handle,
                    },
                    vec![mr.sge(at, s.length)],
                ))?;
                at += u64::from(s.length);
                waits.push(rx);
            }
            for rx in waits {
                let st = rx.await.unwrap_or(WcStatus::WrFlushError);
                if st != WcStatus::Success {
                    tracing::debug!(status = ?st, "RDMA Read completed in error");
                    return Err(verbs::VerbsError::Disconnected);
                }
            }
        }
        Ok(())
    }

    /// RDMA Read a responder-provided Read chunk (`segs`, `len` bytes in all) into a buffer of
    /// exactly its size, with at most `ord` Reads outstanding at once (the requester's ORD).
    pub(super) async fn pull_chunk(
        &self,
        segs: &[Segment],
        len: usize,
        ord: usize,
    ) -> Result<Bytes, verbs::VerbsError> {
        let total: usize = segs.iter().map(|s| s.length as usize).sum();
        if total != len {
            return Err(verbs::VerbsError::OutOfBounds);
        }
        let mr = self
            .qp
            .pd()
            .register(self.read_sinks.get(len.max(1)), Access::LOCAL_WRITE)?;
        // Bounded: the client's call deadline ends the call; a connection that breaks flushes
        // the Reads (and the router ends the waits when it closes).
        self.read_segments(&mr, segs, 0, ord).await?;
        let v = mr.take_vec()?;
        if v.len() < len {
            return Err(verbs::VerbsError::OutOfBounds);
        }
        Ok(self.read_sinks.wrap(v, 0..len))
    }

    /// RDMA Write (unsignaled: errors still complete, and QP ordering puts it before the Send).
    pub(super) fn write(&self, seg: Segment, data: Bytes) -> Result<(), verbs::VerbsError> {
        self.qp.post_send(self.write_wr(seg, data))
    }

    /// The unsignaled RDMA Write of `data` to `seg` that [`Link::write`] posts.
    pub(super) fn write_wr(&self, seg: Segment, data: Bytes) -> SendWr {
        let mut wr = SendWr {
            payload: Payload::Inline(data),
            ..SendWr::new(
                self.router.id(),
                SendOp::RdmaWrite {
                    remote_addr: seg.offset,
                    rkey: seg.handle,
                },
                Vec::new(),
            )
        };
        wr.signaled = false;
        wr
    }

    /// RDMA Read one chunk into a buffer between `pre` and (after the XDR round-up) `post`;
    /// returns that buffer, the whole call, and the chunk's length.
    pub(super) async fn read_chunk_framed(
        &self,
        segs: &[Segment],
        pre: &[u8],
        post: &[u8],
    ) -> Result<(Bytes, usize), verbs::VerbsError> {
        let total: usize = segs.iter().map(|s| s.length as usize).sum();
        let pad = xdr::pad_len(total);
        let end = pre.len() + total + pad + post.len();
        let mr = self
            .qp
            .pd()
            .register(self.read_sinks.get(end.max(1)), Access::LOCAL_WRITE)?;
        // Every wait on the peer has a bound, which the Responder owns: a peer that never
        // answers its Read Requests loses the connection when the Reads are due
        // (`Responder::handle_timeout`), which flushes them, and the sink goes with it. All
        // the Reads go at once: the Responder already counted them against the IRD.
        self.read_segments(&mr, segs, pre.len() as u64, segs.len())
            .await?;
        // Every Read completed, so every byte of the chunk is in place; fence the region and
        // put the rest of the call around the chunk.
        let mut v = mr.take_vec()?;
        if v.len() < end {
            return Err(verbs::VerbsError::OutOfBounds);
        }
        let data_end = pre.len() + total;
        v[..pre.len()].copy_from_slice(pre);
        v[data_end..data_end + pad].fill(0);
        v[data_end + pad..end].copy_from_slice(post);
        Ok((self.read_sinks.wrap(v, 0..end), total))
    }

    /// RDMA Read one chunk into local memory: all its segments into one buffer, in order.
    pub(super) async fn read_chunk(&self, segs: &[Segment]) -> Result<Bytes, verbs::VerbsError> {
        let (b, n) = self.read_chunk_framed(segs, &[], &[]).await?;
        // Without anything around it the buffer is the chunk and its round-up.
        Ok(b.slice(..n))
    }
}

pub(super) fn recv_pool(
    pd: &ProtectionDomain,
    nrecv: usize,
    recv_size: usize,
) -> Result<Vec<MemoryRegion>, verbs::VerbsError> {
    (0..nrecv)
        .map(|_| pd.register_len(recv_size, Access::LOCAL_WRITE))
        .collect()
}

/// The unsignaled Send (or Send With Invalidate of `invalidate`) of the reply to `xid` that
/// [`Link::post_reply`] posts.
pub(super) fn reply_wr(data: Bytes, invalidate: Option<u32>, xid: u32) -> SendWr {
    let op = match invalidate {
        Some(h) => SendOp::SendWithInvalidate(h),
        None => SendOp::Send,
    };
    let mut wr = SendWr {
        payload: Payload::Inline(data),
        ..SendWr::new(REPLY_WR | u64::from(xid), op, Vec::new())
    };
    wr.signaled = false;
    wr
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot::error::TryRecvError;

    #[test]
    fn a_closed_router_ends_every_wait_the_later_ones_included() {
        let r = Router::default();
        let mut before = r.wait(r.id());
        assert_eq!(before.try_recv(), Err(TryRecvError::Empty));
        r.close();
        // Waiting: ended by the close.
        assert_eq!(before.try_recv(), Err(TryRecvError::Closed));
        // Begun after it (a call that posts its RDMA Reads on a connection already torn
        // down): ended at once, as its completion will never be routed.
        let mut after = r.wait(r.id());
        assert_eq!(after.try_recv(), Err(TryRecvError::Closed));
        assert!(r.waiters.lock().is_empty());
    }
}
