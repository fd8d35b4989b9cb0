//! Sans-IO RDMAP/DDP engine of one queue pair.
//!
//! The engine takes received ULPDUs (`Engine::on_ulpdu`) and work requests, places data into
//! registered memory, pushes completions, and hands out the next DDP segment to transmit
//! (`Engine::poll_transmit`). It never touches a socket; MPA framing is the driver's job.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::cq::{Completion, CqInner, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use crate::mem::{Access, AccessFault, MrInner, StagTable, lock};
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

/// One DDP segment (= MPA ULPDU) to transmit: header bytes then payload.
#[derive(Debug, Clone)]
pub struct TxSegment {
    /// DDP/RDMAP header (and Read Request / Terminate body).
    pub hdr: Bytes,
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

type Resolved = Vec<(Arc<MrInner>, usize, usize)>;

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
    scq: Arc<CqInner>,
    rcq: Arc<CqInner>,
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
    pub(crate) events: Vec<EngineEvent>,
    /// Set once a Terminate has been queued or received: the driver closes after flushing.
    pub(crate) closing: bool,
}

impl Engine {
    pub(crate) fn new(
        qp_num: u32,
        pd: u32,
        table: Arc<StagTable>,
        scq: Arc<CqInner>,
        rcq: Arc<CqInner>,
    ) -> Self {
        Self {
            qp_num,
            pd,
            table,
            scq,
            rcq,
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
            events: Vec::new(),
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
            self.events.push(EngineEvent::Established);
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
            self.rcq
                .push(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
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

    fn flush_send(&self, wr: &SendWr) {
        self.scq.push(self.wc(
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
                self.scq
                    .push(self.wc(r.wr_id, WcOpcode::RdmaRead, WcStatus::WrFlushError, 0));
            }
        }
        for e in std::mem::take(&mut self.sq) {
            self.flush_send(&e.wr);
        }
        if let Some(wr) = self.rx_send.take().and_then(|rx| rx.wr) {
            self.rcq
                .push(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
        }
        for wr in std::mem::take(&mut self.rq) {
            self.rcq
                .push(self.wc(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushError, 0));
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
        self.events.push(EngineEvent::TerminateSent(t));
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
                let d = lock(&mr.data);
                let s = off + r.sent as usize;
                Bytes::copy_from_slice(&d[s..s + n])
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

    fn resolve(&self, sgl: &[crate::Sge], need: Access) -> Result<Resolved, AccessFault> {
        let mut v = Vec::with_capacity(sgl.len());
        for s in sgl {
            if s.length == 0 {
                continue;
            }
            let mr = self
                .table
                .check(s.lkey, self.pd, need, s.addr, u64::from(s.length))?;
            let off = (s.addr - mr.base) as usize;
            v.push((mr, off, s.length as usize));
        }
        Ok(v)
    }

    fn local_fail(&mut self, wr: &SendWr, status: WcStatus) {
        self.scq
            .push(self.wc(wr.wr_id, send_wc_opcode(wr.opcode), status, 0));
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
                    Payload::Sgl(v) => {
                        let v = v.clone();
                        self.resolve(&v, need)
                    }
                    Payload::Inline(_) => Ok(Vec::new()),
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
                                self.scq.push(self.wc(
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
                    self.scq.push(self.wc(
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

    /// Process one received ULPDU (one DDP segment).
    pub(crate) fn on_ulpdu(&mut self, u: &[u8]) {
        if self.closing || self.state != QpState::Rts {
            return;
        }
        let (h, n) = match DdpHeader::decode(u) {
            Ok(x) => x,
            Err(e) => {
                let (layer, etype, code) = match e {
                    WireError::BadDdpVersion(_) if u.first().is_some_and(|b| b & 0x80 != 0) => {
                        (1, term::DDP_ETYPE_TAGGED, term::DDP_T_VERSION)
                    }
                    WireError::BadDdpVersion(_) => {
                        (1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_VERSION)
                    }
                    WireError::BadRdmapVersion(_) => {
                        (0, term::RDMAP_ETYPE_REMOTE_OPERATION, term::RDMAP_VERSION)
                    }
                    WireError::BadOpcode(_) => (
                        0,
                        term::RDMAP_ETYPE_REMOTE_OPERATION,
                        term::RDMAP_UNEXPECTED_OPCODE,
                    ),
                    _ => (1, term::DDP_ETYPE_CATASTROPHIC, 0),
                };
                self.terminate(layer, etype, code, None);
                return;
            }
        };
        let data = &u[n..];
        if self.awaiting_rtr {
            self.on_rtr(&h, data, u);
            return;
        }
        match h.model {
            BufferModel::Tagged { stag, to } => match h.opcode {
                Opcode::Write => self.on_write(stag, to, data, u),
                _ => self.on_read_response(&h, stag, to, data, u),
            },
            BufferModel::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => match qn {
                QN_SEND => self.on_send(&h, inv_stag, msn, mo, data, u),
                QN_READ_REQ => self.on_read_request(&h, msn, mo, data, u),
                QN_TERMINATE => self.on_terminate(&h, msn, mo, data, u),
                // RFC 5041 §7.2: invalid QN.
                _ => self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_QN, Some(u)),
            },
        }
    }

    fn on_rtr(&mut self, h: &DdpHeader, data: &[u8], u: &[u8]) {
        // RFC 6581 §3: the first FPDU must be the zero-length RTR.
        let ok = match (h.opcode, h.model) {
            (Opcode::Write, BufferModel::Tagged { .. }) => data.is_empty() && h.last,
            (
                Opcode::ReadRequest,
                BufferModel::Untagged {
                    qn: QN_READ_REQ,
                    msn: 1,
                    mo: 0,
                    ..
                },
            ) => match ReadRequest::decode(data) {
                Ok(rr) if rr.size == 0 => {
                    self.expect_rreq += 1;
                    self.inbound.push_back(InRead {
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                        src: None,
                        len: 0,
                        sent: 0,
                    });
                    true
                }
                _ => false,
            },
            (
                Opcode::Send,
                BufferModel::Untagged {
                    qn: QN_SEND,
                    msn: 1,
                    mo: 0,
                    ..
                },
            ) => {
                self.expect_send += 1;
                data.is_empty() && h.last
            }
            _ => false,
        };
        if ok {
            self.awaiting_rtr = false;
            self.events.push(EngineEvent::Established);
        } else if h.opcode == Opcode::Terminate {
            let BufferModel::Untagged { msn, mo, .. } = h.model else {
                return;
            };
            self.awaiting_rtr = false;
            self.on_terminate(h, msn, mo, data, u);
        } else {
            // RFC 6581 §3: anything else is a protocol error.
            self.terminate(2, term::LLP_ETYPE_MPA, term::MPA_INVALID_REQ_REP, Some(u));
        }
    }

    fn tagged_fault(&mut self, f: AccessFault, u: &[u8]) {
        // Faults found while placing a tagged segment: DDP tagged-buffer errors (RFC 5041 §7.2),
        // except access rights: RFC 5041 has no code for them, RFC 5040 §4.8 has "access rights
        // violation" at the RDMAP layer, which we use. (Linux siw instead reports DDP / tagged /
        // invalid STag for this case; both are decoded the same way by our peers.)
        let (layer, etype, code) = match f {
            AccessFault::InvalidStag => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_INVALID_STAG),
            AccessFault::Bounds => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_BASE_BOUNDS),
            AccessFault::WrongPd => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_STAG_NOT_ASSOC),
            AccessFault::Rights => (
                0,
                term::RDMAP_ETYPE_REMOTE_PROTECTION,
                term::RDMAP_ACCESS_RIGHTS,
            ),
        };
        self.terminate(layer, etype, code, Some(u));
    }

    fn on_write(&mut self, stag: u32, to: u64, data: &[u8], u: &[u8]) {
        // siw: a zero-length Write is not checked against the STag.
        if data.is_empty() {
            return;
        }
        match self
            .table
            .check(stag, self.pd, Access::REMOTE_WRITE, to, data.len() as u64)
        {
            Ok(mr) => place(&mr, (to - mr.base) as usize, data),
            Err(f) => self.tagged_fault(f, u),
        }
    }

    fn on_read_response(&mut self, h: &DdpHeader, stag: u32, to: u64, data: &[u8], u: &[u8]) {
        let Some(r) = self.reads_out.front_mut() else {
            // RFC 5040 §4.8: a Read Response with no matching request.
            self.terminate(
                0,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_UNEXPECTED_OPCODE,
                Some(u),
            );
            return;
        };
        if stag != r.sink_stag
            || to != r.sink_to.wrapping_add(r.got)
            || r.got + data.len() as u64 > r.len
        {
            let code = if stag != r.sink_stag {
                term::DDP_T_INVALID_STAG
            } else {
                term::DDP_T_BASE_BOUNDS
            };
            self.terminate(1, term::DDP_ETYPE_TAGGED, code, Some(u));
            return;
        }
        if let Some((mr, off)) = &r.sink {
            place(mr, off + r.got as usize, data);
        }
        r.got += data.len() as u64;
        if h.last {
            if r.got != r.len {
                self.terminate(1, term::DDP_ETYPE_TAGGED, term::DDP_T_BASE_BOUNDS, Some(u));
                return;
            }
            let Some(r) = self.reads_out.pop_front() else {
                return;
            };
            if !r.rtr && r.signaled {
                self.scq.push(self.wc(
                    r.wr_id,
                    WcOpcode::RdmaRead,
                    WcStatus::Success,
                    r.got as u32,
                ));
            }
        }
    }

    fn on_send(&mut self, h: &DdpHeader, inv_stag: u32, msn: u32, mo: u32, data: &[u8], u: &[u8]) {
        if !h.opcode.is_send() {
            self.terminate(
                0,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_UNEXPECTED_OPCODE,
                Some(u),
            );
            return;
        }
        // RFC 5041 §5.3: MSN and MO are checked strictly, segments arrive in order on TCP.
        if msn != self.expect_send {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_MSN_RANGE, Some(u));
            return;
        }
        let cur_got = self.rx_send.as_ref().map_or(0, |r| r.got);
        if mo as usize != cur_got {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_MO, Some(u));
            return;
        }
        if self.rx_send.is_none() {
            let Some(wr) = self.rq.pop_front() else {
                // RFC 5041 §7.2: no buffer available (iWARP has no RNR retry; siw terminates).
                self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER, Some(u));
                return;
            };
            match self.resolve(&wr.sgl, Access::LOCAL_WRITE) {
                Ok(sges) => {
                    let cap = sges.iter().map(|s| s.2).sum();
                    self.rx_send = Some(RxSend {
                        wr: Some(wr),
                        sges,
                        cap,
                        got: 0,
                        msn,
                    });
                }
                Err(_) => {
                    self.rcq.push(self.wc(
                        wr.wr_id,
                        WcOpcode::Recv,
                        WcStatus::LocalProtectionError,
                        0,
                    ));
                    self.terminate(
                        0,
                        term::RDMAP_ETYPE_CATASTROPHIC,
                        term::RDMAP_CATASTROPHIC_STREAM,
                        Some(u),
                    );
                    return;
                }
            }
        }
        let Some(rx) = self.rx_send.as_mut() else {
            return;
        };
        if rx.got + data.len() > rx.cap {
            let wr_id = rx.wr.take().map(|w| w.wr_id);
            if let Some(id) = wr_id {
                self.rcq
                    .push(self.wc(id, WcOpcode::Recv, WcStatus::LocalLengthError, 0));
            }
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_TOO_LONG, Some(u));
            return;
        }
        scatter(&rx.sges, rx.got, data);
        rx.got += data.len();
        debug_assert_eq!(rx.msn, msn);
        if !h.last {
            return;
        }
        let Some(rx) = self.rx_send.take() else {
            return;
        };
        self.expect_send = self.expect_send.wrapping_add(1);
        let mut c = self.wc(
            rx.wr.as_ref().map_or(0, |w| w.wr_id),
            WcOpcode::Recv,
            WcStatus::Success,
            rx.got as u32,
        );
        c.solicited = matches!(h.opcode, Opcode::SendSe | Opcode::SendSeInvalidate);
        if matches!(h.opcode, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
            // RFC 5040 §5.3: invalidate when the message completes.
            if self.table.invalidate(inv_stag, self.pd).is_err() {
                self.rcq.push(c);
                self.terminate(
                    0,
                    term::RDMAP_ETYPE_REMOTE_PROTECTION,
                    term::RDMAP_CANNOT_INVALIDATE,
                    Some(u),
                );
                return;
            }
            c.invalidated_rkey = Some(inv_stag);
        }
        self.rcq.push(c);
    }

    fn on_read_request(&mut self, h: &DdpHeader, msn: u32, mo: u32, data: &[u8], u: &[u8]) {
        if h.opcode != Opcode::ReadRequest {
            self.terminate(
                0,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_UNEXPECTED_OPCODE,
                Some(u),
            );
            return;
        }
        if msn != self.expect_rreq {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_MSN_RANGE, Some(u));
            return;
        }
        if mo != 0 || !h.last {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_MO, Some(u));
            return;
        }
        let Ok(rr) = ReadRequest::decode(data) else {
            self.terminate(
                0,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_CATASTROPHIC_STREAM,
                Some(u),
            );
            return;
        };
        // RFC 5040 §6.4 / RFC 6581: more outstanding Read Requests than IRD is an error; the
        // untagged Read Request queue has no buffer for it.
        if self.inbound.len() as u32 >= self.params.ird.max(1) {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER, Some(u));
            return;
        }
        self.expect_rreq = self.expect_rreq.wrapping_add(1);
        let src = if rr.size == 0 {
            // siw: a zero-length Read gets a zero-length response without an STag check.
            None
        } else {
            match self.table.check(
                rr.src_stag,
                self.pd,
                Access::REMOTE_READ,
                rr.src_to,
                u64::from(rr.size),
            ) {
                Ok(mr) => {
                    let off = (rr.src_to - mr.base) as usize;
                    Some((mr, off))
                }
                Err(f) => {
                    let code = match f {
                        AccessFault::InvalidStag => term::RDMAP_INVALID_STAG,
                        AccessFault::Bounds => term::RDMAP_BASE_BOUNDS,
                        AccessFault::Rights => term::RDMAP_ACCESS_RIGHTS,
                        AccessFault::WrongPd => term::RDMAP_STAG_NOT_ASSOC,
                    };
                    self.terminate(0, term::RDMAP_ETYPE_REMOTE_PROTECTION, code, Some(u));
                    return;
                }
            }
        };
        self.inbound.push_back(InRead {
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
            src,
            len: u64::from(rr.size),
            sent: 0,
        });
    }

    fn on_terminate(&mut self, h: &DdpHeader, msn: u32, mo: u32, data: &[u8], _u: &[u8]) {
        if h.opcode != Opcode::Terminate || msn != self.expect_term || mo != self.term_mo {
            self.enter_error();
            self.closing = true;
            return;
        }
        self.term_buf.put_slice(data);
        self.term_mo += data.len() as u32;
        if !h.last {
            if self.term_buf.len() > 4096 {
                self.enter_error();
                self.closing = true;
            }
            return;
        }
        let t = Terminate::decode(&self.term_buf).unwrap_or(Terminate {
            layer: 0,
            etype: 0,
            code: 0xff,
            ddp_seg_len: None,
            ddp_hdr: None,
            rdma_hdr: None,
        });
        // A Terminate naming one of our Read Requests fails that Read with the remote error.
        let read_failed = t
            .ddp_hdr
            .as_deref()
            .and_then(|d| DdpHeader::decode(d).ok())
            .is_some_and(|(dh, _)| {
                matches!(
                    dh.model,
                    BufferModel::Untagged {
                        qn: QN_READ_REQ,
                        ..
                    }
                )
            });
        if read_failed && let Some(r) = self.reads_out.pop_front() {
            {
                let protection = (t.layer == 0 && t.etype == term::RDMAP_ETYPE_REMOTE_PROTECTION)
                    || (t.layer == 1 && t.etype == term::DDP_ETYPE_TAGGED);
                let status = if protection {
                    WcStatus::RemoteAccessError
                } else {
                    WcStatus::RemoteOperationError
                };
                if !r.rtr {
                    self.scq
                        .push(self.wc(r.wr_id, WcOpcode::RdmaRead, status, 0));
                }
            }
        }
        self.events.push(EngineEvent::TerminateReceived(t));
        self.enter_error();
        self.closing = true;
    }

    /// Direct placement, step 1: for a tagged segment whose header has arrived but whose payload
    /// has not, return where its `len` payload bytes go if the segment is valid. The driver then
    /// reads the payload from the socket straight into the region and calls [`Self::on_placed`].
    /// `None` means "take the normal path" (which reports any error with a Terminate).
    pub(crate) fn direct_target(
        &mut self,
        hdr: &[u8],
        len: usize,
    ) -> Option<(Arc<MrInner>, usize)> {
        if self.closing || self.state != QpState::Rts || self.awaiting_rtr || len == 0 {
            return None;
        }
        let (h, n) = DdpHeader::decode(hdr).ok()?;
        let BufferModel::Tagged { stag, to } = h.model else {
            return None;
        };
        if n != hdr.len() {
            return None;
        }
        match h.opcode {
            Opcode::Write => {
                let mr = self
                    .table
                    .check(stag, self.pd, Access::REMOTE_WRITE, to, len as u64)
                    .ok()?;
                let off = (to - mr.base) as usize;
                Some((mr, off))
            }
            Opcode::ReadResponse => {
                let r = self.reads_out.front()?;
                let ok = stag == r.sink_stag
                    && to == r.sink_to.wrapping_add(r.got)
                    && r.got + len as u64 <= r.len
                    && (!h.last || r.got + len as u64 == r.len);
                let (mr, off) = r.sink.as_ref().filter(|_| ok)?;
                Some((mr.clone(), off + r.got as usize))
            }
            _ => None,
        }
    }

    /// Direct placement, step 2: the payload of the segment with header `hdr` (validated by
    /// [`Self::direct_target`]) has been placed; do the bookkeeping (Read completion).
    pub(crate) fn on_placed(&mut self, hdr: &[u8], len: usize) {
        let Ok((h, _)) = DdpHeader::decode(hdr) else {
            return;
        };
        if h.opcode != Opcode::ReadResponse {
            return;
        }
        let Some(r) = self.reads_out.front_mut() else {
            return;
        };
        r.got += len as u64;
        if h.last {
            let Some(r) = self.reads_out.pop_front() else {
                return;
            };
            if !r.rtr && r.signaled {
                self.scq.push(self.wc(
                    r.wr_id,
                    WcOpcode::RdmaRead,
                    WcStatus::Success,
                    r.got as u32,
                ));
            }
        }
    }

    /// A CRC or framing error was detected by the MPA layer (RFC 5044 §8).
    pub(crate) fn on_llp_error(&mut self, code: u8) {
        self.terminate(2, term::LLP_ETYPE_MPA, code, None);
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

fn seg(h: &DdpHeader, body: &[u8], payload: Bytes) -> TxSegment {
    let mut b = BytesMut::with_capacity(h.encoded_len() + body.len());
    h.encode(&mut b);
    b.put_slice(body);
    TxSegment {
        hdr: b.freeze(),
        payload,
        mr_payload: None,
    }
}

fn place(mr: &MrInner, off: usize, data: &[u8]) {
    let mut d = lock(&mr.data);
    d[off..off + data.len()].copy_from_slice(data);
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
        let d = lock(&mr.data);
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

/// A self-contained receive path (MPA FPDU decoding + this engine) over a few registered
/// regions, for fuzzing and property tests: feed it arbitrary bytes, it must never panic.
#[derive(Debug)]
pub struct RxHarness {
    engine: Engine,
    dec: crate::wire::mpa::FpduDecoder,
    buf: BytesMut,
    _mrs: Vec<Arc<MrInner>>,
    direct: bool,
}

impl RxHarness {
    /// A running QP (IRD/ORD 4, optional CRC, optionally awaiting an RTR) with receives posted.
    pub fn new(crc: bool, await_rtr: bool) -> Self {
        let table = StagTable::new();
        let scq = Arc::new(CqInner::default());
        let rcq = Arc::new(CqInner::default());
        let mut engine = Engine::new(1, 1, table.clone(), scq, rcq);
        let mrs: Vec<_> = [
            Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            Access::REMOTE_READ,
        ]
        .into_iter()
        .map(|a| table.insert_fixed(1, 0x100 + a.bits(), vec![0u8; 4096].into_boxed_slice(), a))
        .collect();
        engine.start(EngineParams {
            ird: 4,
            ord: 4,
            max_ulpdu: 1024,
            send_rtr: None,
            await_rtr,
            zero_copy_tx: false,
        });
        for i in 0..4 {
            engine.post_recv(RecvWr {
                wr_id: i,
                sgl: vec![crate::Sge {
                    lkey: mrs[0].stag(),
                    addr: 0,
                    length: 1024,
                }],
            });
        }
        Self {
            engine,
            dec: crate::wire::mpa::FpduDecoder::new(crc),
            buf: BytesMut::new(),
            _mrs: mrs,
            direct: false,
        }
    }

    /// Also exercise the driver's direct-placement calls (`direct_target` / `on_placed`) for
    /// tagged segments, as the TCP driver does without CRC.
    pub fn with_direct_placement(mut self) -> Self {
        self.direct = true;
        self
    }

    /// Feed stream bytes; returns the number of segments the engine then wanted to send.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        self.buf.extend_from_slice(data);
        loop {
            if self.engine.closing {
                break;
            }
            match self.dec.decode(&mut self.buf) {
                Ok(Some(u)) => {
                    let tagged = u.len() >= TAGGED_HDR_LEN && u[0] & 0x80 != 0;
                    let target = if self.direct && tagged {
                        self.engine
                            .direct_target(&u[..TAGGED_HDR_LEN], u.len() - TAGGED_HDR_LEN)
                    } else {
                        None
                    };
                    match target {
                        Some((mr, off)) => {
                            place(&mr, off, &u[TAGGED_HDR_LEN..]);
                            self.engine
                                .on_placed(&u[..TAGGED_HDR_LEN], u.len() - TAGGED_HDR_LEN);
                        }
                        None => self.engine.on_ulpdu(&u),
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    self.engine.on_llp_error(term::MPA_CRC);
                    break;
                }
            }
        }
        let mut n = 0;
        while n < 10_000 && self.engine.poll_transmit().is_some() {
            n += 1;
        }
        n
    }

    /// Feed one ULPDU directly (no MPA framing).
    pub fn feed_ulpdu(&mut self, u: &[u8]) {
        self.engine.on_ulpdu(u);
    }

    /// QP state.
    pub fn state(&self) -> QpState {
        self.engine.state
    }

    /// Terminate the engine sent, if any.
    pub fn terminate_sent(&self) -> Option<&Terminate> {
        self.engine.events.iter().find_map(|e| match e {
            EngineEvent::TerminateSent(t) => Some(t),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(msn: u32, mo: u32, qn: u32, data: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::Send,
            model: BufferModel::Untagged {
                inv_stag: 0,
                qn,
                msn,
                mo,
            },
        }
        .encode(&mut b);
        b.put_slice(data);
        b.to_vec()
    }

    fn rreq(msn: u32, size: u32) -> Vec<u8> {
        let mut b = BytesMut::new();
        untagged(Opcode::ReadRequest, QN_READ_REQ, msn, 0, 0).encode(&mut b);
        ReadRequest {
            size,
            ..Default::default()
        }
        .encode(&mut b);
        b.to_vec()
    }

    fn codes(h: &RxHarness) -> (u8, u8, u8) {
        let t = h.terminate_sent().expect("terminate");
        (t.layer, t.etype, t.code)
    }

    #[test]
    fn read_requests_beyond_ird_terminate() {
        let mut h = RxHarness::new(false, false);
        for msn in 1..=4 {
            h.feed_ulpdu(&rreq(msn, 0));
        }
        assert!(h.terminate_sent().is_none());
        h.feed_ulpdu(&rreq(5, 0));
        assert_eq!(
            codes(&h),
            (1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER)
        );
        assert_eq!(h.state(), QpState::Error);
    }

    #[test]
    fn bad_msn_and_mo_and_qn() {
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(2, 0, 0, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_MSN_RANGE));
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(1, 4, 0, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_INVALID_MO));
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(1, 0, 9, b"x"));
        assert_eq!(codes(&h), (1, 2, term::DDP_U_INVALID_QN));
    }

    #[test]
    fn unexpected_read_response_and_bad_rtr() {
        let mut h = RxHarness::new(false, false);
        let mut b = BytesMut::new();
        DdpHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            model: BufferModel::Tagged { stag: 1, to: 0 },
        }
        .encode(&mut b);
        h.feed_ulpdu(&b);
        assert_eq!(codes(&h), (0, 2, term::RDMAP_UNEXPECTED_OPCODE));
        let mut h = RxHarness::new(false, true);
        h.feed_ulpdu(&send(1, 0, 0, b"not an rtr"));
        assert_eq!(codes(&h), (2, 0, term::MPA_INVALID_REQ_REP));
    }

    #[test]
    fn terminate_is_transmitted_on_qn2() {
        let mut h = RxHarness::new(false, false);
        h.feed_ulpdu(&send(7, 0, 0, b""));
        let s = h.engine.poll_transmit().expect("terminate segment");
        let (d, n) = DdpHeader::decode(&s.hdr).unwrap();
        assert_eq!(d.opcode, Opcode::Terminate);
        assert!(matches!(
            d.model,
            BufferModel::Untagged {
                qn: QN_TERMINATE,
                msn: 1,
                mo: 0,
                ..
            }
        ));
        assert_eq!(
            Terminate::decode(&s.hdr[n..]).unwrap(),
            *h.terminate_sent().unwrap()
        );
        assert!(
            h.engine.poll_transmit().is_none(),
            "nothing after a Terminate"
        );
    }
}
