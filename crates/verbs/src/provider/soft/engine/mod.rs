//! Sans-IO RDMAP/DDP engine of one queue pair.
//!
//! The engine takes received ULPDUs (`Engine::on_ulpdu`) and work requests, places data into
//! registered memory, pushes completions, and hands out the next DDP segment to transmit
//! (`Engine::poll_transmit`). It never touches a socket; MPA framing is the driver's job.

mod harness;
mod rx;

pub use harness::RxHarness;

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::cq::{Completion, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use crate::mem::{Access, AccessFault, MrInner, StagTable};
use crate::wire::WireError;
use crate::wire::ddp::{
    BufferModel, DdpHeader, Opcode, QN_READ_REQ, QN_SEND, QN_TERMINATE, READ_REQ_LEN, ReadRequest,
    TAGGED_HDR_LEN, Terminate, UNTAGGED_HDR_LEN, term,
};

/// Which zero-length message is the RTR (RFC 6581 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrKind {
    /// Zero-length RDMA Write.
    Write,
    /// Zero-length RDMA Read Request.
    Read,
    /// Zero-length Send.
    Send,
}

/// QP state (a subset of the verbs states meaningful here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// Created; receives can be posted, sends cannot.
    Init,
    /// Connected and running.
    Rts,
    /// Failed or disconnected: every WR is flushed.
    Error,
}

/// Events the engine reports to its driver / the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EngineEvent {
    Established,
    TerminateSent(Terminate),
    TerminateReceived(Terminate),
}

/// Which of its QP's completion queues a completion goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqSide {
    Send,
    Recv,
}

/// What the engine produced for the outside world, in the order it produced it: completions
/// for the QP's queues and connection events. The engine never calls out (no queue handler
/// runs under its lock); its driver takes these after releasing the engine and delivers them.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) completions: VecDeque<(CqSide, Completion)>,
    pub(crate) events: VecDeque<EngineEvent>,
}

impl Outbox {
    fn push_send(&mut self, c: Completion) {
        self.completions.push_back((CqSide::Send, c));
    }
    fn push_recv(&mut self, c: Completion) {
        self.completions.push_back((CqSide::Recv, c));
    }
    fn push_event(&mut self, e: EngineEvent) {
        self.events.push_back(e);
    }
}

/// One DDP segment (= MPA ULPDU) to transmit: header bytes then payload.
#[derive(Debug, Clone)]
pub struct TxSegment {
    /// DDP/RDMAP header (and Read Request / Terminate body): on the stack up to
    /// [`INLINE_HDR`] bytes, which every segment but a Terminate fits (one heap allocation
    /// per FPDU before).
    pub hdr: SegHeader,
    /// Payload.
    pub payload: Bytes,
    /// Zero-copy payload still in registered memory (region, offset, length); when set,
    /// `payload` is empty and the driver writes straight from the region.
    pub(crate) mr_payload: Option<(Arc<MrInner>, usize, usize)>,
}

impl TxSegment {
    /// ULPDU length.
    pub fn len(&self) -> usize {
        self.hdr.len() + self.payload.len() + self.mr_payload.as_ref().map_or(0, |m| m.2)
    }
    /// True if the ULPDU is empty (never for valid segments).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Negotiated parameters the engine runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineParams {
    pub ird: u32,
    pub ord: u32,
    /// Largest ULPDU to transmit.
    pub max_ulpdu: usize,
    /// Initiator: RTR to send. Responder: RTR to wait for.
    pub send_rtr: Option<RtrKind>,
    pub await_rtr: bool,
    /// The driver can write payload straight from registered memory.
    pub zero_copy_tx: bool,
}

/// A segment's header bytes: the DDP header and the Read Request body fit inline (18 + 28).
pub type SegHeader = SmallVec<[u8; INLINE_HDR]>;

/// Header bytes a [`SegHeader`] holds without a heap allocation.
pub const INLINE_HDR: usize = 64;

/// A work request's scatter/gather list checked against the STag table: (region, offset,
/// length) per element. One element is the common case (an RPC message in one buffer); it is
/// kept on the stack (a heap allocation per Send and per Receive before).
type Resolved = SmallVec<[(Arc<MrInner>, usize, usize); 2]>;

#[derive(Debug)]
struct SqEntry {
    wr: SendWr,
    resolved: Option<Resolved>,
    off: u64,
    msn: u32,
}

#[derive(Debug)]
struct OutRead {
    wr_id: u64,
    signaled: bool,
    sink: Option<(Arc<MrInner>, usize)>,
    sink_stag: u32,
    sink_to: u64,
    len: u64,
    got: u64,
    rtr: bool,
}

#[derive(Debug)]
struct InRead {
    sink_stag: u32,
    sink_to: u64,
    src: Option<(Arc<MrInner>, usize)>,
    len: u64,
    sent: u64,
}

#[derive(Debug)]
struct RxSend {
    wr: Option<RecvWr>,
    sges: Resolved,
    cap: usize,
    got: usize,
    msn: u32,
}

/// The per-QP protocol engine.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) qp_num: u32,
    pd: u32,
    table: Arc<StagTable>,
    pub(crate) state: QpState,
    params: EngineParams,
    awaiting_rtr: bool,
    sq: VecDeque<SqEntry>,
    ctrl_out: VecDeque<TxSegment>,
    msn_send: u32,
    msn_rreq: u32,
    msn_term: u32,
    reads_out: VecDeque<OutRead>,
    rq: VecDeque<RecvWr>,
    rx_send: Option<RxSend>,
    expect_send: u32,
    expect_rreq: u32,
    expect_term: u32,
    term_mo: u32,
    term_buf: BytesMut,
    inbound: VecDeque<InRead>,
    toggle: bool,
    /// Completions and events for the driver to deliver once it released the engine.
    pub(crate) outbox: Outbox,
    /// Set once a Terminate has been queued or received: the driver closes after flushing.
    pub(crate) closing: bool,
}

impl Engine {
    pub(crate) fn new(qp_num: u32, pd: u32, table: Arc<StagTable>) -> Self {
        Self {
            qp_num,
            pd,
            table,
            state: QpState::Init,
            params: EngineParams {
                ird: 0,
                ord: 0,
                max_ulpdu: 1024,
                send_rtr: None,
                await_rtr: false,
                zero_copy_tx: false,
            },
            awaiting_rtr: false,
            sq: VecDeque::new(),
            ctrl_out: VecDeque::new(),
            msn_send: 0,
            msn_rreq: 0,
            msn_term: 0,
            reads_out: VecDeque::new(),
            rq: VecDeque::new(),
            rx_send: None,
            expect_send: 1,
            expect_rreq: 1,
            expect_term: 1,
            term_mo: 0,
            term_buf: BytesMut::new(),
            inbound: VecDeque::new(),
            toggle: false,
            outbox: Outbox::default(),
            closing: false,
        }
    }

    /// Start running with the negotiated parameters.
    pub(crate) fn start(&mut self, p: EngineParams) {
        if self.state != QpState::Init {
            return;
        }
        self.params = p;
        self.state = QpState::Rts;
        // RFC 6581 §3: the initiator sends the zero-length RTR as its first FPDU.
        match p.send_rtr {
            Some(RtrKind::Write) => {
                let h = DdpHeader {
                    last: true,
                    opcode: Opcode::Write,
                    model: BufferModel::Tagged { stag: 0, to: 0 },
                };
                self.ctrl_out.push_back(seg(&h, &[], Bytes::new()));
            }
            Some(RtrKind::Read) => {
                self.msn_rreq += 1;
                let h = untagged(Opcode::ReadRequest, QN_READ_REQ, self.msn_rreq, 0, 0);
                let mut body = BytesMut::new();
                ReadRequest::default().encode(&mut body);
                self.ctrl_out.push_back(seg(&h, &body, Bytes::new()));
                self.reads_out.push_back(OutRead {
                    wr_id: 0,
                    signaled: false,
                    sink: None,
                    sink_stag: 0,
                    sink_to: 0,
                    len: 0,
                    got: 0,
                    rtr: true,
                });
            }
            Some(RtrKind::Send) => {
                self.msn_send += 1;
                let h = untagged(Opcode::Send, QN_SEND, self.msn_send, 0, 0);
                self.ctrl_out.push_back(seg(&h, &[], Bytes::new()));
            }
            None => {}
        }
        if p.await_rtr {
            self.awaiting_rtr = true;
        } else {
            self.outbox.push_event(EngineEvent::Established);
        }
    }

    /// Change the largest ULPDU for segments not yet cut (the driver follows the MSS). The
    /// segments of one message may then differ in size: each carries its own offset and length
    /// (RFC 5041), and siw's receiver, like ours, places each by its header.
    pub(crate) fn set_max_ulpdu(&mut self, n: usize) {
        self.params.max_ulpdu = n;
    }

    pub(crate) fn post_send(&mut self, wr: SendWr) -> Result<(), crate::VerbsError> {
        match self.state {
            QpState::Init => return Err(crate::VerbsError::InvalidState("QP is not connected")),
            QpState::Error => {
                self.flush_send(&wr);
                return Ok(());
            }
            QpState::Rts => {}
        }
        if matches!(wr.opcode, SendOp::RdmaRead { .. }) {
            match &wr.payload {
                Payload::Sgl(v) if v.len() <= 1 => {}
                _ => {
                    return Err(crate::VerbsError::InvalidArgument(
                        "RDMA Read takes one local sge",
                    ));
                }
            }
        }
        if wr.len() > u64::from(u32::MAX) {
            return Err(crate::VerbsError::InvalidArgument(
                "message longer than 4 GiB",
            ));
        }
        self.sq.push_back(SqEntry {
            wr,
            resolved: None,
            off: 0,
            msn: 0,
        });
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, wr: RecvWr) {
        if self.state == QpState::Error {
            self.outbox
                .push_recv(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
        } else {
            self.rq.push_back(wr);
        }
    }

    fn wc(&self, wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: u32) -> Completion {
        Completion {
            wr_id,
            opcode,
            status,
            byte_len,
            invalidated_rkey: None,
            solicited: false,
            qp_num: self.qp_num,
        }
    }

    fn flush_send(&mut self, wr: &SendWr) {
        self.outbox.push_send(self.wc(
            wr.wr_id,
            send_wc_opcode(wr.opcode),
            WcStatus::WrFlushError,
            0,
        ));
    }

    /// Move to the error state and flush every outstanding WR (verbs: WR_FLUSH_ERR).
    pub(crate) fn enter_error(&mut self) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        for r in std::mem::take(&mut self.reads_out) {
            if !r.rtr {
                self.outbox.push_send(self.wc(
                    r.wr_id,
                    WcOpcode::RdmaRead,
                    WcStatus::WrFlushError,
                    0,
                ));
            }
        }
        for e in std::mem::take(&mut self.sq) {
            self.flush_send(&e.wr);
        }
        if let Some(wr) = self.rx_send.take().and_then(|rx| rx.wr) {
            self.outbox
                .push_recv(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
        }
        for wr in std::mem::take(&mut self.rq) {
            self.outbox
                .push_recv(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
        }
        self.inbound.clear();
    }

    /// The transport went away (FIN, reset, or local disconnect).
    pub(crate) fn on_disconnect(&mut self) {
        self.enter_error();
        self.closing = true;
    }

    /// Queue a Terminate (RFC 5040 §6.1 / §8), stop placing data, and go to error.
    pub(crate) fn terminate(&mut self, layer: u8, etype: u8, code: u8, failed: Option<&[u8]>) {
        if self.closing {
            return;
        }
        let mut t = Terminate {
            layer,
            etype,
            code,
            ddp_seg_len: None,
            ddp_hdr: None,
            rdma_hdr: None,
        };
        if let Some((f, Ok((h, n)))) = failed.map(|f| (f, DdpHeader::decode(f))) {
            {
                // RFC 5040 §4.8: M with the segment length, D with the DDP header, R with the RDMA header.
                t.ddp_seg_len = Some(f.len().min(usize::from(u16::MAX)) as u16);
                t.ddp_hdr = Some(f[..n].to_vec());
                if h.opcode == Opcode::ReadRequest && f.len() >= n + READ_REQ_LEN {
                    t.rdma_hdr = Some(f[n..n + READ_REQ_LEN].to_vec());
                }
            }
        }
        self.msn_term += 1;
        let h = untagged(Opcode::Terminate, QN_TERMINATE, self.msn_term, 0, 0);
        let mut body = BytesMut::new();
        t.encode(&mut body);
        self.ctrl_out.clear();
        self.ctrl_out.push_back(seg(&h, &body, Bytes::new()));
        self.outbox.push_event(EngineEvent::TerminateSent(t));
        self.enter_error();
        self.closing = true;
    }

    /// Next segment to put on the wire, if any.
    pub(crate) fn poll_transmit(&mut self) -> Option<TxSegment> {
        if let Some(s) = self.ctrl_out.pop_front() {
            return Some(s);
        }
        // RFC 6581 §3: the responder sends nothing before the RTR arrived.
        if self.state != QpState::Rts || self.awaiting_rtr {
            return None;
        }
        self.toggle = !self.toggle;
        if self.toggle {
            if let Some(s) = self.next_read_response() {
                return Some(s);
            }
            self.next_sq_segment()
        } else {
            if let Some(s) = self.next_sq_segment() {
                return Some(s);
            }
            self.next_read_response()
        }
    }

    /// Nothing of the send queue is left to the engine: every send WR was handed to the
    /// driver's transmit queue (and completed, if signaled) or flushed, no RDMA Read waits for
    /// its response, and no Read Response or Terminate is left to cut. What the driver still
    /// has to write is its own to report ([`super::SoftQp::send_queue_idle`]).
    pub(crate) fn send_queue_idle(&self) -> bool {
        self.sq.is_empty()
            && self.ctrl_out.is_empty()
            && self.reads_out.is_empty()
            && self.inbound.is_empty()
    }

    /// True if `poll_transmit` could return something.
    pub(crate) fn has_tx(&self) -> bool {
        !self.ctrl_out.is_empty()
            || (self.state == QpState::Rts
                && !self.awaiting_rtr
                && (!self.inbound.is_empty()
                    || self.sq.front().is_some_and(|e| {
                        !matches!(e.wr.opcode, SendOp::RdmaRead { .. })
                            || (self.reads_out.len() as u32) < self.params.ord.max(1)
                    })))
    }

    fn next_read_response(&mut self) -> Option<TxSegment> {
        let max = self.params.max_ulpdu - TAGGED_HDR_LEN;
        let r = self.inbound.front_mut()?;
        let n = (r.len - r.sent).min(max as u64) as usize;
        let zc = self.params.zero_copy_tx;
        let mut mr_payload = None;
        let payload = match &r.src {
            Some((mr, off)) if zc && n > 0 => {
                mr_payload = Some((mr.clone(), off + r.sent as usize, n));
                Bytes::new()
            }
            Some((mr, off)) => {
                let s = off + r.sent as usize;
                mr.data.lock().bytes(s..s + n)
            }
            None => Bytes::new(),
        };
        let last = r.sent + n as u64 == r.len;
        let h = DdpHeader {
            last,
            opcode: Opcode::ReadResponse,
            model: BufferModel::Tagged {
                stag: r.sink_stag,
                to: r.sink_to.wrapping_add(r.sent),
            },
        };
        r.sent += n as u64;
        if last {
            self.inbound.pop_front();
        }
        let mut sg = seg(&h, &[], payload);
        sg.mr_payload = mr_payload;
        Some(sg)
    }

    fn local_fail(&mut self, wr: &SendWr, status: WcStatus) {
        self.outbox
            .push_send(self.wc(wr.wr_id, send_wc_opcode(wr.opcode), status, 0));
        self.enter_error();
        self.closing = true;
    }

    fn next_sq_segment(&mut self) -> Option<TxSegment> {
        loop {
            let e = self.sq.front_mut()?;
            // Resolve the local gather list on first touch.
            if e.resolved.is_none() {
                let need = match e.wr.opcode {
                    SendOp::RdmaRead { .. } => Access::LOCAL_WRITE,
                    _ => Access::NONE,
                };
                let r = match &e.wr.payload {
                    Payload::Sgl(v) => resolve_sgl(&self.table, self.pd, v, need),
                    Payload::Inline(_) => Ok(Resolved::new()),
                };
                let e = self.sq.front_mut()?;
                match r {
                    Ok(r) => e.resolved = Some(r),
                    Err(_) => {
                        let e = self.sq.pop_front()?;
                        self.local_fail(&e.wr, WcStatus::LocalProtectionError);
                        return None;
                    }
                }
            }
            let e = self.sq.front_mut()?;
            match e.wr.opcode {
                SendOp::LocalInvalidate(stag) => {
                    let e = self.sq.pop_front()?;
                    match self.table.invalidate(stag, self.pd) {
                        Ok(()) => {
                            if e.wr.signaled {
                                self.outbox.push_send(self.wc(
                                    e.wr.wr_id,
                                    WcOpcode::LocalInvalidate,
                                    WcStatus::Success,
                                    0,
                                ));
                            }
                        }
                        Err(_) => self.local_fail(&e.wr, WcStatus::LocalProtectionError),
                    }
                    continue;
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    // RFC 5040 §6.4: at most ORD Read Requests outstanding; later WRs wait.
                    if self.reads_out.len() as u32 >= self.params.ord.max(1) {
                        return None;
                    }
                    let e = self.sq.pop_front()?;
                    let (sink, sink_stag, sink_to) = match (&e.wr.payload, e.resolved.as_deref()) {
                        (Payload::Sgl(v), Some(r)) if !v.is_empty() => (
                            r.first().map(|(m, o, _)| (m.clone(), *o)),
                            v[0].lkey,
                            v[0].addr,
                        ),
                        _ => (None, 0, 0),
                    };
                    let len = e.wr.len();
                    self.msn_rreq += 1;
                    let h = untagged(Opcode::ReadRequest, QN_READ_REQ, self.msn_rreq, 0, 0);
                    let rr = ReadRequest {
                        sink_stag,
                        sink_to,
                        size: len as u32,
                        src_stag: rkey,
                        src_to: remote_addr,
                    };
                    let mut body = BytesMut::with_capacity(READ_REQ_LEN);
                    rr.encode(&mut body);
                    self.reads_out.push_back(OutRead {
                        wr_id: e.wr.wr_id,
                        signaled: e.wr.signaled,
                        sink,
                        sink_stag,
                        sink_to,
                        len,
                        got: 0,
                        rtr: false,
                    });
                    return Some(seg(&h, &body, Bytes::new()));
                }
                _ => {}
            }
            let total = e.wr.len();
            let (opcode, hdr_len) = match e.wr.opcode {
                SendOp::RdmaWrite { .. } => (Opcode::Write, TAGGED_HDR_LEN),
                SendOp::SendWithInvalidate(_) if e.wr.solicited => {
                    (Opcode::SendSeInvalidate, UNTAGGED_HDR_LEN)
                }
                SendOp::SendWithInvalidate(_) => (Opcode::SendInvalidate, UNTAGGED_HDR_LEN),
                _ if e.wr.solicited => (Opcode::SendSe, UNTAGGED_HDR_LEN),
                _ => (Opcode::Send, UNTAGGED_HDR_LEN),
            };
            let max = (self.params.max_ulpdu - hdr_len) as u64;
            let n = (total - e.off).min(max) as usize;
            let mut mr_payload = None;
            let payload = match &e.wr.payload {
                Payload::Inline(b) => b.slice(e.off as usize..e.off as usize + n),
                Payload::Sgl(_) => {
                    let r = e.resolved.as_deref().unwrap_or(&[]);
                    match single_region(r, e.off as usize, n) {
                        Some(m) if self.params.zero_copy_tx => {
                            mr_payload = Some(m);
                            Bytes::new()
                        }
                        _ => gather(r, e.off as usize, n),
                    }
                }
            };
            let last = e.off + n as u64 == total;
            if opcode != Opcode::Write && e.off == 0 {
                self.msn_send += 1;
                e.msn = self.msn_send;
            }
            let mut h = match e.wr.opcode {
                SendOp::RdmaWrite { remote_addr, rkey } => DdpHeader {
                    last,
                    opcode,
                    model: BufferModel::Tagged {
                        stag: rkey,
                        to: remote_addr.wrapping_add(e.off),
                    },
                },
                SendOp::SendWithInvalidate(inv) => {
                    untagged(opcode, QN_SEND, e.msn, e.off as u32, inv)
                }
                _ => untagged(opcode, QN_SEND, e.msn, e.off as u32, 0),
            };
            h.last = last;
            e.off += n as u64;
            if last {
                let e = self.sq.pop_front()?;
                if e.wr.signaled {
                    // iWARP: Sends and Writes complete once handed to the LLP.
                    self.outbox.push_send(self.wc(
                        e.wr.wr_id,
                        send_wc_opcode(e.wr.opcode),
                        WcStatus::Success,
                        total as u32,
                    ));
                }
            }
            let mut sg = seg(&h, &[], payload);
            sg.mr_payload = mr_payload;
            return Some(sg);
        }
    }
}

fn send_wc_opcode(op: SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithInvalidate(_) => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate(_) => WcOpcode::LocalInvalidate,
    }
}

fn untagged(opcode: Opcode, qn: u32, msn: u32, mo: u32, inv_stag: u32) -> DdpHeader {
    DdpHeader {
        last: true,
        opcode,
        model: BufferModel::Untagged {
            inv_stag,
            qn,
            msn,
            mo,
        },
    }
}

/// Check a scatter/gather list's elements against the STag table (zero-length ones are
/// skipped).
fn resolve_sgl(
    table: &StagTable,
    pd: u32,
    sgl: &[crate::Sge],
    need: Access,
) -> Result<Resolved, AccessFault> {
    let mut v = Resolved::new();
    for s in sgl {
        if s.length == 0 {
            continue;
        }
        let mr = table.check(s.lkey, pd, need, s.addr, u64::from(s.length))?;
        let off = (s.addr - mr.base) as usize;
        v.push((mr, off, s.length as usize));
    }
    Ok(v)
}

fn seg(h: &DdpHeader, body: &[u8], payload: Bytes) -> TxSegment {
    let (a, n) = h.to_array();
    let mut b = SegHeader::new();
    b.extend_from_slice(&a[..n]);
    b.extend_from_slice(body);
    TxSegment {
        hdr: b,
        payload,
        mr_payload: None,
    }
}

fn place(mr: &MrInner, off: usize, data: &[u8]) {
    let mut d = mr.data.lock();
    d.make_mut()[off..off + data.len()].copy_from_slice(data);
}

/// The (region, offset, length) holding `[off, off+n)` of a gather list if one SGE covers it.
fn single_region(
    sges: &[(Arc<MrInner>, usize, usize)],
    mut off: usize,
    n: usize,
) -> Option<(Arc<MrInner>, usize, usize)> {
    if n == 0 {
        return None;
    }
    for (mr, base, len) in sges {
        if off >= *len {
            off -= len;
            continue;
        }
        return (off + n <= *len).then(|| (mr.clone(), base + off, n));
    }
    None
}

fn gather(sges: &[(Arc<MrInner>, usize, usize)], mut off: usize, mut n: usize) -> Bytes {
    // Fast path: one region covers the chunk.
    let mut out = BytesMut::with_capacity(n);
    for (mr, base, len) in sges {
        if n == 0 {
            break;
        }
        if off >= *len {
            off -= len;
            continue;
        }
        let take = (len - off).min(n);
        let d = mr.data.lock();
        out.put_slice(&d[base + off..base + off + take]);
        n -= take;
        off = 0;
    }
    out.freeze()
}

fn scatter(sges: &[(Arc<MrInner>, usize, usize)], mut off: usize, mut data: &[u8]) {
    for (mr, base, len) in sges {
        if data.is_empty() {
            break;
        }
        if off >= *len {
            off -= len;
            continue;
        }
        let take = (len - off).min(data.len());
        place(mr, base + off, &data[..take]);
        data = &data[take..];
        off = 0;
    }
}
