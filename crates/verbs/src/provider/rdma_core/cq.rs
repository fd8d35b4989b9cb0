//! Completion queues: an `ibv_cq` with a completion channel and a polling thread each.

use super::*;

pub(crate) struct HwCq {
    pub(super) cq: *mut sys::ibv_cq,
    pub(super) channel: *mut sys::ibv_comp_channel,
    pub(super) stop_fd: RawFd,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    pub(super) _dev: Arc<HwDevice>,
}

// SAFETY: the CQ and channel are used by the polling thread and destroyed in Drop after it
// was joined; verbs calls on them are thread-safe.
unsafe impl Send for HwCq {}
// SAFETY: as above.
unsafe impl Sync for HwCq {}

pub(super) struct CqPtrs {
    pub(super) cq: *mut sys::ibv_cq,
    pub(super) channel: *mut sys::ibv_comp_channel,
    pub(super) stop_fd: RawFd,
}
// SAFETY: moved into the polling thread, which is joined before the objects are destroyed.
unsafe impl Send for CqPtrs {}

impl Drop for HwCq {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: stop_fd is our eventfd; writing 8 bytes wakes the polling thread.
        unsafe {
            libc::write(self.stop_fd, (&one as *const u64).cast(), 8);
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        // SAFETY: the thread is gone and every QP using the CQ holds an Arc to us, so none is
        // left; acked events were counted by the thread.
        unsafe {
            sys::ibv_destroy_cq(self.cq);
            sys::ibv_destroy_comp_channel(self.channel);
            libc::close(self.stop_fd);
        }
    }
}

impl HwCq {
    pub(crate) fn create(dev: &Arc<HwDevice>, sink: Arc<CqInner>) -> Result<Arc<HwCq>, VerbsError> {
        let entries = dev.config.cq_entries.clamp(16, dev.max_cqe.max(16));
        // SAFETY: plain verbs object creation on a valid context; every failure path frees
        // what was created before it.
        unsafe {
            let channel = sys::ibv_create_comp_channel(dev.ctx);
            if channel.is_null() {
                return Err(os_err("ibv_create_comp_channel"));
            }
            set_nonblocking((*channel).fd);
            let cq = sys::ibv_create_cq(
                dev.ctx,
                i32::try_from(entries).unwrap_or(i32::MAX),
                ptr::null_mut(),
                channel,
                0,
            );
            if cq.is_null() {
                let e = os_err("ibv_create_cq");
                sys::ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let stop_fd = libc::eventfd(0, libc::EFD_CLOEXEC);
            if stop_fd < 0 {
                let e = os_err("eventfd");
                sys::ibv_destroy_cq(cq);
                sys::ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let ptrs = CqPtrs {
                cq,
                channel,
                stop_fd,
            };
            let weak_dev = Arc::downgrade(dev);
            let thread = std::thread::Builder::new()
                .name("oxrdma-cq".into())
                .spawn(move || cq_thread(ptrs, sink, weak_dev))
                .map_err(|e| VerbsError::Io(format!("CQ thread: {e}")));
            let thread = match thread {
                Ok(t) => t,
                Err(e) => {
                    sys::ibv_destroy_cq(cq);
                    sys::ibv_destroy_comp_channel(channel);
                    libc::close(stop_fd);
                    return Err(e);
                }
            };
            Ok(Arc::new(HwCq {
                cq,
                channel,
                stop_fd,
                thread: Mutex::new(Some(thread)),
                _dev: dev.clone(),
            }))
        }
    }
}

/// The per-CQ thread: sleep on the completion channel, drain the CQ, translate.
pub(super) fn cq_thread(p: CqPtrs, sink: Arc<CqInner>, dev: Weak<HwDevice>) {
    let mut wcs: Vec<sys::ibv_wc> = Vec::with_capacity(32);
    let mut unacked: u32 = 0;
    // SAFETY (whole loop): the CQ, channel and eventfd outlive this thread (HwCq::drop joins
    // it first); `wcs` has capacity for the 32 entries ibv_poll_cq may write.
    unsafe {
        // Poll up to 32 completions and hand them on; false when the CQ was empty.
        let drain = |wcs: &mut Vec<sys::ibv_wc>| {
            let n = sys::ibv_poll_cq(p.cq, 32, wcs.as_mut_ptr());
            if n <= 0 {
                return false;
            }
            wcs.set_len(usize::try_from(n).unwrap_or(0));
            deliver(wcs, &sink, &dev);
            wcs.set_len(0);
            true
        };
        sys::ibv_req_notify_cq(p.cq, 0);
        loop {
            // Drain, re-arm, drain again (the race rdma-core's man page describes).
            while drain(&mut wcs) {}
            sys::ibv_req_notify_cq(p.cq, 0);
            if drain(&mut wcs) {
                continue;
            }
            let mut fds = [
                libc::pollfd {
                    fd: (*p.channel).fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: p.stop_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let r = libc::poll(fds.as_mut_ptr(), 2, -1);
            if r < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            if fds[1].revents != 0 {
                break;
            }
            if fds[0].revents != 0 {
                let mut cq = ptr::null_mut();
                let mut cq_ctx = ptr::null_mut();
                if sys::ibv_get_cq_event(p.channel, &mut cq, &mut cq_ctx) == 0 {
                    unacked += 1;
                    if unacked >= 64 {
                        sys::ibv_ack_cq_events(p.cq, unacked);
                        unacked = 0;
                    }
                }
            }
        }
        if unacked > 0 {
            sys::ibv_ack_cq_events(p.cq, unacked);
        }
    }
}

pub(super) fn deliver(wcs: &[sys::ibv_wc], sink: &Arc<CqInner>, dev: &Weak<HwDevice>) {
    let Some(dev) = dev.upgrade() else { return };
    // Completions come in runs of one QP: look each QP up once per run.
    let mut last: Option<(u32, Option<Arc<QpCore>>)> = None;
    for wc in wcs {
        if last.as_ref().is_none_or(|(n, _)| *n != wc.qp_num) {
            let core = dev.qps.lock().get(&wc.qp_num).and_then(Weak::upgrade);
            last = Some((wc.qp_num, core));
        }
        // None: a completion of a QP destroyed meanwhile.
        if let Some((_, Some(core))) = &last
            && let Some(c) = core.complete(wc)
        {
            push(sink, c);
        }
    }
}

/// Queue `c` and run the queue's handler, if it has one: the polling thread and posters hold
/// no lock a handler could need.
pub(super) fn push(cq: &CqInner, c: Completion) {
    if cq.enqueue(c) {
        cq.run_handler();
    }
}

pub(super) fn wc_status(s: sys::ibv_wc_status::Type) -> WcStatus {
    use sys::ibv_wc_status as w;
    match s {
        w::IBV_WC_SUCCESS => WcStatus::Success,
        w::IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        w::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOperationError,
        w::IBV_WC_LOC_PROT_ERR | w::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtectionError,
        w::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushError,
        w::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        w::IBV_WC_REM_OP_ERR | w::IBV_WC_REM_ABORT_ERR => WcStatus::RemoteOperationError,
        w::IBV_WC_REM_INV_REQ_ERR | w::IBV_WC_REM_INV_RD_REQ_ERR => {
            WcStatus::RemoteInvalidRequestError
        }
        _ => WcStatus::FatalError,
    }
}
