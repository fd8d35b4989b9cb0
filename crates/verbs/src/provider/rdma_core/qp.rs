//! Queue pairs: send slots, bounce buffers, receives posted before the QP exists.

use super::*;

/// Marks receive slots in the hardware wr_id.
pub(super) const RECV_BIT: u64 = 1 << 63;

pub(super) struct SendSlot {
    pub(super) wr_id: u64,
    pub(super) opcode: WcOpcode,
    pub(super) signaled: bool,
    /// Memory of an inline payload (and its temporary registration) until completion.
    pub(super) _keep: Option<(Bytes, Option<RawMr>)>,
    /// The bounce slot an inline payload was copied into, freed on completion.
    pub(super) bounce: Option<u16>,
}

/// Size and number of the per-QP bounce slots for inline payloads too big for the device's
/// inline data: copying up to 16 KiB is far cheaper than registering (pinning) the bytes and
/// deregistering them again for every Send (measured: RDS 8 KiB messages over kernel siw).
pub(super) const BOUNCE_SLOT: usize = 16 * 1024;
pub(super) const BOUNCE_SLOTS: usize = 64;

/// A registered buffer of [`BOUNCE_SLOTS`] slots of [`BOUNCE_SLOT`] bytes.
pub(super) struct Bounce {
    // Declared before `buf`: deregistered before the memory is freed.
    pub(super) mr: RawMr,
    pub(super) buf: Box<[u8]>,
    pub(super) free: Vec<u16>,
}

impl Bounce {
    pub(super) fn new(pd: &Arc<HwPd>) -> Result<Bounce, VerbsError> {
        let mut buf = vec![0u8; BOUNCE_SLOT * BOUNCE_SLOTS].into_boxed_slice();
        // SAFETY: the buffer is kept beside its registration and freed after it (field order).
        let mr = unsafe { RawMr::register(pd, buf.as_mut_ptr(), buf.len(), Access::NONE)? };
        Ok(Bounce {
            mr,
            buf,
            free: (0..BOUNCE_SLOTS as u16).rev().collect(),
        })
    }

    /// Copy `b` into a free slot: (slot, address, lkey).
    pub(super) fn put(&mut self, b: &[u8]) -> Option<(u16, u64, u32)> {
        if b.len() > BOUNCE_SLOT {
            return None;
        }
        let i = self.free.pop()?;
        let off = usize::from(i) * BOUNCE_SLOT;
        // SAFETY: slot `i` was free, so the device is not reading it; `off + b.len()` is
        // within the buffer (b.len() <= BOUNCE_SLOT, i < BOUNCE_SLOTS). Raw pointers: other
        // slots may be in use by the device.
        let dst = unsafe { self.buf.as_mut_ptr().add(off) };
        // SAFETY: as above; `b` is not in the bounce buffer.
        unsafe { ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
        Some((i, dst as u64, self.mr.keys().0))
    }
}

pub(super) struct Slab<T> {
    pub(super) items: Vec<Option<T>>,
    pub(super) free: Vec<usize>,
    pub(super) used: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
            used: 0,
        }
    }
}

impl<T> Slab<T> {
    pub(super) fn insert(&mut self, v: T) -> usize {
        self.used += 1;
        if let Some(i) = self.free.pop() {
            self.items[i] = Some(v);
            i
        } else {
            self.items.push(Some(v));
            self.items.len() - 1
        }
    }
    pub(super) fn remove(&mut self, i: usize) -> Option<T> {
        let v = self.items.get_mut(i)?.take();
        if v.is_some() {
            self.used -= 1;
            self.free.push(i);
        }
        v
    }
}

pub(super) struct CoreState {
    /// The live QP (null before connecting and after destruction).
    pub(super) qp: *mut sys::ibv_qp,
    pub(super) pd: *mut sys::ibv_pd,
    pub(super) state: QpState,
    pub(super) sends: Slab<SendSlot>,
    /// Posted receives (kept whole so a failed connect can re-queue them).
    pub(super) recvs: Slab<RecvWr>,
    /// Receives posted before the QP exists.
    pub(super) early_recvs: Vec<RecvWr>,
    /// Send WRs waiting for a free send-queue slot.
    pub(super) backlog: VecDeque<SendWr>,
    pub(super) sq_depth: usize,
    pub(super) max_sge: usize,
    pub(super) max_inline: usize,
    /// A registered scratch buffer (address, lkey): receives without a scatter list get one
    /// zero-length element of it, since some providers (siw's) refuse an empty list.
    pub(super) scratch: Option<(u64, u32)>,
    /// Bounce slots for inline payloads (registered on first use; `Err` if that failed).
    pub(super) bounce: Option<Result<Bounce, ()>>,
}

/// The bookkeeping of a hardware QP, shared with the CQ threads.
pub(crate) struct QpCore {
    pub(super) st: Mutex<CoreState>,
    pub(super) send_cq: Arc<CqInner>,
    pub(super) recv_cq: Arc<CqInner>,
    pub(super) qp_num: AtomicU32,
    pub(super) hw_pd: Arc<HwPd>,
}

// SAFETY: the raw pointers in CoreState are only used under its Mutex, and the QP pointer is
// cleared (under the Mutex) before the QP is destroyed.
unsafe impl Send for QpCore {}
// SAFETY: as above.
unsafe impl Sync for QpCore {}

pub(super) fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        opcode,
        status: WcStatus::WrFlushError,
        byte_len: 0,
        invalidated_rkey: None,
        solicited: false,
        qp_num,
    }
}

pub(super) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithInvalidate(_) => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate(_) => WcOpcode::LocalInvalidate,
    }
}

impl QpCore {
    pub(super) fn qp_num(&self) -> u32 {
        self.qp_num.load(Ordering::Relaxed)
    }

    /// Translate one work completion; `None` for a successful WR the consumer did not signal.
    pub(super) fn complete(&self, wc: &sys::ibv_wc) -> Option<Completion> {
        let status = wc_status(wc.status);
        let mut st = self.st.lock();
        let out = if wc.wr_id & RECV_BIT != 0 {
            let wr_id = st.recvs.remove((wc.wr_id & !RECV_BIT) as usize)?.wr_id;
            let inv = if status == WcStatus::Success
                && wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0
            {
                // SAFETY: with IBV_WC_WITH_INV the union holds the invalidated rkey.
                Some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey })
            } else {
                None
            };
            Some(Completion {
                wr_id,
                opcode: WcOpcode::Recv,
                status,
                byte_len: wc.byte_len,
                invalidated_rkey: inv,
                solicited: false,
                qp_num: wc.qp_num,
            })
        } else {
            let slot = st.sends.remove(wc.wr_id as usize)?;
            if let (Some(i), Some(Ok(b))) = (slot.bounce, st.bounce.as_mut()) {
                b.free.push(i);
            }
            (status != WcStatus::Success || slot.signaled).then(|| Completion {
                wr_id: slot.wr_id,
                opcode: slot.opcode,
                status,
                byte_len: if slot.opcode == WcOpcode::RdmaRead {
                    wc.byte_len
                } else {
                    0
                },
                invalidated_rkey: None,
                solicited: false,
                qp_num: wc.qp_num,
            })
        };
        if status != WcStatus::Success {
            st.state = QpState::Error;
        }
        let extra = self.pump(&mut st);
        drop(st);
        for c in extra {
            push(&self.send_cq, c);
        }
        out
    }

    /// Post backlogged sends into free send-queue slots; flush them once the QP failed.
    pub(super) fn pump(&self, st: &mut CoreState) -> Vec<Completion> {
        let mut out = Vec::new();
        while st.sends.used < st.sq_depth && !st.qp.is_null() {
            let Some(wr) = st.backlog.pop_front() else {
                break;
            };
            if st.state == QpState::Error {
                out.push(flushed(wr.wr_id, send_opcode(&wr.opcode), self.qp_num()));
                continue;
            }
            if let Err(e) = self.post_one(st, wr) {
                tracing::warn!("posting a queued send failed: {e}");
            }
        }
        if st.state == QpState::Error {
            for wr in st.backlog.drain(..) {
                out.push(flushed(wr.wr_id, send_opcode(&wr.opcode), self.qp_num()));
            }
        }
        out
    }

    pub(super) fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        if let SendOp::RdmaRead { .. } = wr.opcode {
            match &wr.payload {
                // A zero-length Read (no SGE) is a fence, as on the soft providers.
                Payload::Sgl(v) if v.len() <= 1 => {}
                _ => {
                    return Err(VerbsError::InvalidArgument(
                        "an RDMA Read takes one local SGE (none for zero length)",
                    ));
                }
            }
        }
        let mut st = self.st.lock();
        match st.state {
            QpState::Init => return Err(VerbsError::InvalidState("QP not connected")),
            QpState::Error => {
                drop(st);
                push(
                    &self.send_cq,
                    flushed(wr.wr_id, send_opcode(&wr.opcode), self.qp_num()),
                );
                return Ok(());
            }
            QpState::Rts => {}
        }
        if st.sends.used >= st.sq_depth || !st.backlog.is_empty() {
            st.backlog.push_back(wr);
            return Ok(());
        }
        self.post_one(&mut st, wr)
    }

    /// Copy an inline payload into a bounce slot (registering the slots on first use).
    pub(super) fn bounce(&self, st: &mut CoreState, b: &[u8]) -> Option<(u16, u64, u32)> {
        st.bounce
            .get_or_insert_with(|| {
                Bounce::new(&self.hw_pd).map_err(|e| tracing::debug!("no bounce buffer: {e}"))
            })
            .as_mut()
            .ok()?
            .put(b)
    }

    pub(super) fn post_one(&self, st: &mut CoreState, wr: SendWr) -> Result<(), VerbsError> {
        let opcode = send_opcode(&wr.opcode);
        // Gather lists longer than the device takes go through a bounce buffer.
        let payload = match wr.payload {
            Payload::Sgl(v) if v.len() > st.max_sge => {
                let mut b = Vec::with_capacity(v.iter().map(|s| s.length as usize).sum());
                for s in &v {
                    // SAFETY: a gather element names registered memory of ours (its address
                    // is the buffer's virtual address); the consumer keeps it alive while the
                    // WR is posted, and we copy it now, synchronously.
                    let src = unsafe {
                        std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                    };
                    b.extend_from_slice(src);
                }
                Payload::Inline(Bytes::from(b))
            }
            p => p,
        };
        let mut flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if wr.solicited {
            flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        let mut keep = None;
        let mut bounce = None;
        let mut sges: Vec<sys::ibv_sge> = Vec::new();
        match payload {
            Payload::Sgl(v) => {
                sges.extend(v.iter().map(|s| sys::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                }));
                // A zero-length Read still names one sink element on iWARP devices.
                if let (true, SendOp::RdmaRead { .. }, Some((addr, lkey))) =
                    (sges.is_empty(), wr.opcode, st.scratch)
                {
                    sges.push(sys::ibv_sge {
                        addr,
                        length: 0,
                        lkey,
                    });
                }
            }
            Payload::Inline(b) => {
                if !b.is_empty() {
                    let len = u32::try_from(b.len())
                        .map_err(|_| VerbsError::InvalidArgument("payload over 4 GiB"))?;
                    let readable = !matches!(wr.opcode, SendOp::RdmaRead { .. });
                    if b.len() <= st.max_inline && readable {
                        // Copied into the WQE by ibv_post_send (no lkey needed).
                        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
                        sges.push(sys::ibv_sge {
                            addr: b.as_ptr() as u64,
                            length: len,
                            lkey: 0,
                        });
                        keep = Some((b, None));
                    } else if let Some((i, addr, lkey)) = (readable && b.len() <= BOUNCE_SLOT)
                        .then(|| self.bounce(st, &b))
                        .flatten()
                    {
                        bounce = Some(i);
                        sges.push(sys::ibv_sge {
                            addr,
                            length: len,
                            lkey,
                        });
                    } else {
                        // SAFETY: `b` is kept in the slot (with the registration) until the
                        // WR completes; the device only reads it (no access flags).
                        let raw = unsafe {
                            RawMr::register(
                                &self.hw_pd,
                                b.as_ptr().cast_mut(),
                                b.len(),
                                Access::NONE,
                            )?
                        };
                        sges.push(sys::ibv_sge {
                            addr: b.as_ptr() as u64,
                            length: len,
                            lkey: raw.keys().0,
                        });
                        keep = Some((b, Some(raw)));
                    }
                }
            }
        }
        let slot = st.sends.insert(SendSlot {
            wr_id: wr.wr_id,
            opcode,
            signaled: wr.signaled,
            _keep: keep,
            bounce,
        });
        // SAFETY: zeroed ibv_send_wr is a valid "no union field in use" state; we then fill
        // the fields the opcode needs. `sges` outlives the ibv_post_send call, which copies
        // the WR into the send queue.
        let r = unsafe {
            let mut w: sys::ibv_send_wr = std::mem::zeroed();
            w.wr_id = slot as u64;
            w.sg_list = if sges.is_empty() {
                ptr::null_mut()
            } else {
                sges.as_mut_ptr()
            };
            w.num_sge = i32::try_from(sges.len()).unwrap_or(i32::MAX);
            w.send_flags = flags;
            match wr.opcode {
                SendOp::Send => w.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
                SendOp::SendWithInvalidate(rkey) => {
                    w.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                    w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                    // Some providers take the STag from the RDMA fields instead; the union
                    // member is otherwise unused for a Send.
                    w.wr.rdma = sys::rdma_t {
                        remote_addr: 0,
                        rkey,
                    };
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    w.wr.rdma = sys::rdma_t { remote_addr, rkey };
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
                    w.wr.rdma = sys::rdma_t { remote_addr, rkey };
                }
                SendOp::LocalInvalidate(stag) => {
                    w.opcode = sys::ibv_wr_opcode::IBV_WR_LOCAL_INV;
                    w.imm_data_invalidated_rkey_union.invalidated_rkey = stag;
                }
            }
            let mut bad = ptr::null_mut();
            sys::ibv_post_send(st.qp, &mut w, &mut bad)
        };
        if r != 0 {
            if let (Some(i), Some(Ok(b))) = (bounce, st.bounce.as_mut()) {
                b.free.push(i);
            }
            st.sends.remove(slot);
            return Err(ret_err("ibv_post_send", r));
        }
        Ok(())
    }

    pub(super) fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        let mut st = self.st.lock();
        if st.state == QpState::Error {
            drop(st);
            push(
                &self.recv_cq,
                flushed(wr.wr_id, WcOpcode::Recv, self.qp_num()),
            );
            Ok(())
        } else if st.qp.is_null() {
            // Kept until the QP exists.
            st.early_recvs.push(wr);
            Ok(())
        } else {
            Self::post_recv_locked(&mut st, wr)
        }
    }

    pub(super) fn post_recv_locked(st: &mut CoreState, wr: RecvWr) -> Result<(), VerbsError> {
        let mut sges: Vec<sys::ibv_sge> = wr
            .sgl
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect();
        if let (true, Some((addr, lkey))) = (sges.is_empty(), st.scratch) {
            sges.push(sys::ibv_sge {
                addr,
                length: 0,
                lkey,
            });
        }
        let slot = st.recvs.insert(wr);
        // SAFETY: as for sends; ibv_post_recv copies the WR.
        let r = unsafe {
            let mut w: sys::ibv_recv_wr = std::mem::zeroed();
            w.wr_id = slot as u64 | RECV_BIT;
            w.sg_list = if sges.is_empty() {
                ptr::null_mut()
            } else {
                sges.as_mut_ptr()
            };
            w.num_sge = i32::try_from(sges.len()).unwrap_or(i32::MAX);
            let mut bad = ptr::null_mut();
            sys::ibv_post_recv(st.qp, &mut w, &mut bad)
        };
        if r != 0 {
            st.recvs.remove(slot);
            return Err(ret_err("ibv_post_recv", r));
        }
        Ok(())
    }

    /// The QP failed or was disconnected: move it to the error state so the device flushes
    /// everything posted, and flush what is still waiting in software.
    pub(super) fn set_error(&self) {
        let mut st = self.st.lock();
        if st.state == QpState::Error {
            return;
        }
        st.state = QpState::Error;
        if !st.qp.is_null() {
            // SAFETY: a live QP (cleared under this lock before destruction).
            unsafe {
                let mut attr: sys::ibv_qp_attr = std::mem::zeroed();
                attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
                sys::ibv_modify_qp(
                    st.qp,
                    &mut attr,
                    sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                );
            }
        }
        let qpn = self.qp_num();
        let sends: Vec<_> = st
            .backlog
            .drain(..)
            .map(|w| flushed(w.wr_id, send_opcode(&w.opcode), qpn))
            .collect();
        let recvs: Vec<_> = st
            .early_recvs
            .drain(..)
            .map(|w| flushed(w.wr_id, WcOpcode::Recv, qpn))
            .collect();
        drop(st);
        for c in sends {
            push(&self.send_cq, c);
        }
        for c in recvs {
            push(&self.recv_cq, c);
        }
    }
}

/// The hardware part of a [`QueuePair`](crate::QueuePair).
pub(crate) struct HwQueuePair {
    pub(super) core: Arc<QpCore>,
    /// The scratch buffer behind `CoreState::scratch` (registration dropped first).
    pub(super) _scratch: Option<(RawMr, Box<[u8; 64]>)>,
    pub(super) dev: Arc<HwDevice>,
    pub(super) scq: Arc<HwCq>,
    pub(super) rcq: Arc<HwCq>,
    /// The rdma_cm id the QP was created on (the QP is destroyed before the id).
    pub(super) id: Mutex<Option<Arc<CmId>>>,
}

impl fmt::Debug for HwQueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwQueuePair")
            .field("qp_num", &self.core.qp_num())
            .finish_non_exhaustive()
    }
}

impl Drop for HwQueuePair {
    fn drop(&mut self) {
        self.destroy_qp();
    }
}

impl HwQueuePair {
    pub(crate) fn new(
        pd: &Arc<HwPd>,
        scq: &Arc<HwCq>,
        rcq: &Arc<HwCq>,
        send_sink: Arc<CqInner>,
        recv_sink: Arc<CqInner>,
        placeholder_num: u32,
    ) -> HwQueuePair {
        let mut buf = Box::new([0u8; 64]);
        // SAFETY: the box is kept next to its registration (dropped after it) in this QP.
        let scratch = unsafe { RawMr::register(pd, buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }
            .map_err(|e| tracing::debug!("no scratch buffer: {e}"))
            .ok();
        let scratch_sge = scratch.as_ref().map(|m| (buf.as_ptr() as u64, m.keys().0));
        HwQueuePair {
            _scratch: scratch.map(|m| (m, buf)),
            core: Arc::new(QpCore {
                st: Mutex::new(CoreState {
                    qp: ptr::null_mut(),
                    pd: pd.pd,
                    state: QpState::Init,
                    sends: Slab::default(),
                    recvs: Slab::default(),
                    early_recvs: Vec::new(),
                    backlog: VecDeque::new(),
                    sq_depth: 0,
                    max_sge: 1,
                    max_inline: 0,
                    scratch: scratch_sge,
                    bounce: None,
                }),
                send_cq: send_sink,
                recv_cq: recv_sink,
                qp_num: AtomicU32::new(placeholder_num),
                hw_pd: pd.clone(),
            }),
            dev: pd.dev.clone(),
            scq: scq.clone(),
            rcq: rcq.clone(),
            id: Mutex::new(None),
        }
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.core.qp_num()
    }

    pub(crate) fn state(&self) -> QpState {
        self.core.st.lock().state
    }

    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
        self.core.post_send(wr)
    }

    /// Every send WR is posted to the device signaled (see the module's notes), so a slot is
    /// taken until the device completes its WR, whether or not the consumer asked for the
    /// completion: no slot in use and nothing waiting for one means every WR posted so far
    /// has completed.
    pub(crate) fn send_queue_idle(&self) -> bool {
        let st = self.core.st.lock();
        st.sends.used == 0 && st.backlog.is_empty()
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        self.core.post_recv(wr)
    }

    /// Create the QP on `id` (rdma_create_qp) and post the receives that were waiting.
    pub(super) fn instantiate(&self, id: &Arc<CmId>) -> Result<(), VerbsError> {
        let mut slot = self.id.lock();
        if slot.is_some() {
            return Err(VerbsError::InvalidState("QP already connected"));
        }
        let cfg = &self.dev.config;
        let cap_wr = |want: u32| want.clamp(1, self.dev.max_qp_wr.max(1));
        let mut st = self.core.st.lock();
        if st.state == QpState::Error {
            return Err(VerbsError::InvalidState("QP is in the error state"));
        }
        let max_sge = self.dev.max_sge.min(16);
        let mut created = Err(VerbsError::Io("rdma_create_qp not attempted".into()));
        // Some devices take no inline data: try with, then without.
        for inline in [cfg.max_inline_data, 0] {
            // SAFETY: a zeroed init_attr plus the fields set below is a valid RC request;
            // the PD and CQs are alive (held by self).
            let r = unsafe {
                let mut a: sys::ibv_qp_init_attr = std::mem::zeroed();
                a.send_cq = self.scq.cq;
                a.recv_cq = self.rcq.cq;
                a.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
                a.cap.max_send_wr = cap_wr(cfg.max_send_wr);
                a.cap.max_recv_wr = cap_wr(cfg.max_recv_wr);
                a.cap.max_send_sge = max_sge;
                a.cap.max_recv_sge = max_sge;
                a.cap.max_inline_data = inline;
                let r = sys::rdma_create_qp(id.id, st.pd, &mut a);
                (r, a.cap)
            };
            if r.0 == 0 {
                created = Ok(r.1);
                break;
            }
            created = Err(os_err("rdma_create_qp"));
        }
        let cap = created?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let qp = unsafe { (*id.id).qp };
        st.qp = qp;
        // SAFETY: qp is live.
        let num = unsafe { (*qp).qp_num };
        self.core.qp_num.store(num, Ordering::Relaxed);
        st.sq_depth = cap.max_send_wr.max(1) as usize;
        st.max_sge = cap.max_send_sge.max(1) as usize;
        st.max_inline = cap.max_inline_data as usize;
        self.dev.qps.lock().insert(num, Arc::downgrade(&self.core));
        let early = std::mem::take(&mut st.early_recvs);
        for wr in early {
            QpCore::post_recv_locked(&mut st, wr)?;
        }
        *slot = Some(id.clone());
        Ok(())
    }

    /// The connection is established: sends may go.
    pub(super) fn set_rts(&self) {
        let mut st = self.core.st.lock();
        if st.state == QpState::Init {
            st.state = QpState::Rts;
        }
    }

    pub(super) fn destroy_qp(&self) {
        let Some(id) = self.id.lock().take() else {
            return;
        };
        let num = self.core.qp_num();
        {
            let mut st = self.core.st.lock();
            st.qp = ptr::null_mut();
            st.state = QpState::Error;
        }
        self.dev.qps.lock().remove(&num);
        // SAFETY: the QP was created on this id by rdma_create_qp and nothing uses the pointer
        // any more (cleared above under the core's lock).
        unsafe {
            sys::rdma_destroy_qp(id.id);
        }
    }

    /// Undo `instantiate` after a failed connection attempt: the receives that were posted
    /// to the destroyed QP go back to waiting for the next QP, in their order.
    pub(super) fn abandon(&self) {
        self.destroy_qp();
        let mut st = self.core.st.lock();
        let mut wrs: Vec<(usize, RecvWr)> = std::mem::take(&mut st.recvs)
            .items
            .into_iter()
            .enumerate()
            .filter_map(|(i, w)| w.map(|w| (i, w)))
            .collect();
        // Slot numbers are reused, so posting order is not recoverable exactly; wr order by
        // slot is the best approximation and all of them are re-posted.
        wrs.sort_by_key(|(i, _)| *i);
        st.early_recvs = wrs.into_iter().map(|(_, w)| w).collect();
        // No send was posted before the connection failed; start the next QP clean.
        st.sends = Slab::default();
        if let Some(Ok(b)) = st.bounce.as_mut() {
            b.free = (0..BOUNCE_SLOTS as u16).rev().collect();
        }
    }
}
