//! The rdma-core provider (cargo feature `rdma-core`): the same verbs API over a real RDMA
//! device — a NIC, or the kernel's `siw` / `rxe` — through libibverbs and librdmacm.
//!
//! The bindings are `rdma-mummy-sys`, the sys layer under the `sideway` crate. It links a small
//! static shim that `dlopen`s the system's libibverbs / librdmacm at run time, so a binary built
//! with the feature still starts (and reports "no RDMA device") on a machine without them.
//! `sideway`'s safe layer is not used: its rdma_cm wrapper carries no private data in either
//! direction and cannot reject, both of which RPC-over-RDMA (RFC 8797) and RDS need.
//!
//! How the API maps onto rdma-core:
//! * [`Device`](crate::Device) is one of librdmacm's device contexts (`rdma_get_devices`), so
//!   PDs, CQs and QPs live on the very context rdma_cm ids resolve to.
//! * A [`CompletionQueue`](crate::CompletionQueue) is an `ibv_cq` with a completion channel.
//!   One thread per CQ sleeps in poll(2) on the channel, drains the CQ and hands completions
//!   to the same software queue the soft providers fill, so the async `next()` works unchanged.
//! * A [`QueuePair`](crate::QueuePair) is created on the rdma_cm id when it connects or
//!   accepts (`rdma_create_qp`, so librdmacm drives the QP state machine for iWARP and IB
//!   alike). Receives posted before that are kept and posted to the new QP before
//!   `rdma_connect` / `rdma_accept`.
//! * Every send WR is posted signaled with an internal slot number as its `wr_id`; the slot
//!   records the consumer's `wr_id`, opcode and whether it asked for a completion. That gives
//!   the API's semantics (unsignaled WRs complete only on error; flushed WRs carry their
//!   opcode, which `ibv_wc` does not), frees send-queue slots on time, and keeps the memory of
//!   `Payload::Inline` sends alive until the device is done with it. WRs beyond the send
//!   queue's depth wait in software and are posted as completions free slots.
//! * Owned payloads (`Payload::Inline`) go into the WQE when the device takes that much inline
//!   data, else are copied into one of the QP's registered 16 KiB bounce slots, else (bigger,
//!   or all slots busy) registered for the one WR: a registration per message costs a system
//!   call and page pinning each way.
//! * Memory regions keep their bytes in the same heap buffer as the soft providers and
//!   register it with `ibv_reg_mr`: tagged offsets are virtual addresses
//!   ([`MemoryRegion::addr`](crate::MemoryRegion::addr) is the buffer's address). Invalidating a
//!   region deregisters it; re-registering registers it again (a new STag).
//!
//! What it does not do: no pcap captures (the kernel owns the wire), CRC and peer-to-peer mode
//! are the kernel driver's settings (siw's module parameters), and connection events beyond
//! established / disconnected / device removal are reported as errors.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rdma_mummy_sys as sys;
use tokio::io::unix::AsyncFd;

use crate::VerbsError;
use crate::cq::{Completion, CqInner, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use crate::engine::QpState;
use crate::mem::Access;

mod dispatch;
pub(crate) use dispatch::open;

/// Settings of the rdma-core provider.
#[derive(Debug, Clone)]
pub struct RdmaCoreConfig {
    /// Device name (`siw0`, `rxe0`, `mlx5_0`, …); `None` takes the first device.
    pub device: Option<String>,
    /// Completion-queue entries (clamped to the device's maximum).
    pub cq_entries: u32,
    /// Send-queue depth (clamped to the device's maximum); more WRs wait in software.
    pub max_send_wr: u32,
    /// Receive-queue depth (clamped to the device's maximum).
    pub max_recv_wr: u32,
    /// Inline data asked for at QP creation (the device may give less, or none).
    pub max_inline_data: u32,
}

impl Default for RdmaCoreConfig {
    fn default() -> Self {
        Self {
            device: None,
            cq_entries: 8192,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_inline_data: 64,
        }
    }
}

/// One RDMA device as rdma-core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCoreDevice {
    /// Device name.
    pub name: String,
    /// True for iWARP devices (siw, cxgb4, irdma in iWARP mode).
    pub iwarp: bool,
}

fn os_err(what: &str) -> VerbsError {
    VerbsError::Io(format!("{what}: {}", io::Error::last_os_error()))
}

/// Make a file descriptor of ours non-blocking.
fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on an fd the caller owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

fn ret_err(what: &str, ret: i32) -> VerbsError {
    // Verbs calls return an errno (some providers negate it), or -1 with errno set.
    if ret == -1 {
        os_err(what)
    } else {
        VerbsError::Io(format!(
            "{what}: {}",
            io::Error::from_raw_os_error(ret.saturating_abs())
        ))
    }
}

/// librdmacm's device contexts with their names. The contexts are owned by librdmacm and stay
/// valid for the life of the process, after the array listing them is freed.
fn device_contexts() -> Result<Vec<(*mut sys::ibv_context, RdmaCoreDevice)>, VerbsError> {
    let mut out = Vec::new();
    let mut n: i32 = 0;
    // SAFETY: rdma_get_devices returns NULL or an array of `n` context pointers owned by
    // librdmacm; we read device names and transports from it and free the array, not the
    // contexts.
    unsafe {
        let list = sys::rdma_get_devices(&mut n);
        if list.is_null() {
            return Err(VerbsError::NoDevice(
                "librdmacm found no RDMA device (or rdma-core is not installed)".into(),
            ));
        }
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let ctx = *list.add(i);
            if ctx.is_null() || (*ctx).device.is_null() {
                continue;
            }
            let dev = (*ctx).device;
            out.push((
                ctx,
                RdmaCoreDevice {
                    name: CStr::from_ptr(sys::ibv_get_device_name(dev))
                        .to_string_lossy()
                        .into_owned(),
                    iwarp: (*dev).transport_type == sys::ibv_transport_type::IBV_TRANSPORT_IWARP,
                },
            ));
        }
        sys::rdma_free_devices(list);
    }
    Ok(out)
}

/// The devices librdmacm can use. Fails with [`VerbsError::NoDevice`] when the libraries are
/// missing or no device exists.
pub fn rdma_core_devices() -> Result<Vec<RdmaCoreDevice>, VerbsError> {
    let out: Vec<RdmaCoreDevice> = device_contexts()?.into_iter().map(|(_, d)| d).collect();
    if out.is_empty() {
        return Err(VerbsError::NoDevice("no RDMA device".into()));
    }
    Ok(out)
}

/// An open device: one of librdmacm's contexts and its limits.
pub(crate) struct HwDevice {
    ctx: *mut sys::ibv_context,
    pub(crate) name: String,
    pub(crate) iwarp: bool,
    pub(crate) config: RdmaCoreConfig,
    max_qp_wr: u32,
    max_cqe: u32,
    max_sge: u32,
    max_rd_atom: u8,
    max_init_rd_atom: u8,
    /// QPs by number, for the CQ threads.
    qps: Mutex<std::collections::HashMap<u32, Weak<QpCore>>>,
}

// SAFETY: the context pointer is owned by librdmacm for the life of the process, and verbs
// calls on a context are thread-safe (libibverbs' documented contract).
unsafe impl Send for HwDevice {}
// SAFETY: as above; the only mutable state is behind a Mutex.
unsafe impl Sync for HwDevice {}

impl fmt::Debug for HwDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwDevice")
            .field("name", &self.name)
            .field("iwarp", &self.iwarp)
            .finish_non_exhaustive()
    }
}

impl HwDevice {
    pub(crate) fn open(config: RdmaCoreConfig) -> Result<Arc<HwDevice>, VerbsError> {
        let all = device_contexts()?;
        let chosen = all
            .iter()
            .find(|(_, d)| config.device.as_deref().is_none_or(|want| want == d.name));
        let Some((ctx, found)) = chosen else {
            return Err(VerbsError::NoDevice(match &config.device {
                Some(d) => {
                    let names: Vec<&str> = all.iter().map(|(_, d)| d.name.as_str()).collect();
                    format!("no RDMA device named {d} (have: {})", names.join(", "))
                }
                None => "no RDMA device".into(),
            }));
        };
        let (ctx, name, iwarp) = (*ctx, found.name.clone(), found.iwarp);
        // SAFETY: ctx is one of librdmacm's live contexts (see device_contexts).
        unsafe {
            let mut attr: sys::ibv_device_attr = std::mem::zeroed();
            let r = sys::ibv_query_device(ctx, &mut attr);
            if r != 0 {
                return Err(ret_err("ibv_query_device", r));
            }
            let pos = |v: i32| u32::try_from(v).unwrap_or(0);
            Ok(Arc::new(HwDevice {
                ctx,
                iwarp,
                name,
                config,
                max_qp_wr: pos(attr.max_qp_wr),
                max_cqe: pos(attr.max_cqe),
                max_sge: pos(attr.max_sge).max(1),
                max_rd_atom: u8::try_from(attr.max_qp_rd_atom.max(0)).unwrap_or(u8::MAX),
                max_init_rd_atom: u8::try_from(attr.max_qp_init_rd_atom.max(0)).unwrap_or(u8::MAX),
                qps: Mutex::new(Default::default()),
            }))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Protection domains and memory regions

pub(crate) struct HwPd {
    pd: *mut sys::ibv_pd,
    dev: Arc<HwDevice>,
}

// SAFETY: an ibv_pd may be used from any thread; it is freed once, in Drop.
unsafe impl Send for HwPd {}
// SAFETY: as above.
unsafe impl Sync for HwPd {}

impl Drop for HwPd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every MR and QP holds an Arc to us, so none is left.
        unsafe {
            sys::ibv_dealloc_pd(self.pd);
        }
    }
}

impl HwPd {
    pub(crate) fn alloc(dev: &Arc<HwDevice>) -> Result<Arc<HwPd>, VerbsError> {
        // SAFETY: dev.ctx is a valid context.
        let pd = unsafe { sys::ibv_alloc_pd(dev.ctx) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        Ok(Arc::new(HwPd {
            pd,
            dev: dev.clone(),
        }))
    }
}

/// One `ibv_mr`.
struct RawMr {
    mr: *mut sys::ibv_mr,
    _pd: Arc<HwPd>,
}

// SAFETY: an ibv_mr handle may be deregistered from any thread; it is freed once, in Drop.
unsafe impl Send for RawMr {}
// SAFETY: as above.
unsafe impl Sync for RawMr {}

impl Drop for RawMr {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and deregistered only here.
        unsafe {
            sys::ibv_dereg_mr(self.mr);
        }
    }
}

impl RawMr {
    /// # Safety
    /// `ptr..ptr+len` must stay allocated until the returned value is dropped.
    unsafe fn register(
        pd: &Arc<HwPd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, VerbsError> {
        // Access bits are rdma-core's IBV_ACCESS_LOCAL_WRITE / REMOTE_WRITE / REMOTE_READ.
        // SAFETY: the caller keeps the memory alive; pd is valid.
        let mr = unsafe { sys::ibv_reg_mr(pd.pd, ptr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            return Err(os_err("ibv_reg_mr"));
        }
        Ok(RawMr {
            mr,
            _pd: pd.clone(),
        })
    }

    fn keys(&self) -> (u32, u32) {
        // SAFETY: mr is a live registration.
        unsafe { ((*self.mr).lkey, (*self.mr).rkey) }
    }
}

/// The hardware side of a [`MemoryRegion`](crate::MemoryRegion): the registration of its
/// buffer, which comes and goes with invalidate / reregister.
pub(crate) struct HwMr {
    pd: Arc<HwPd>,
    ptr: *mut u8,
    len: usize,
    reg: Mutex<Option<RawMr>>,
    /// Keys of the latest registration (kept after invalidation, like a stale STag).
    keys: Mutex<(u32, u32)>,
}

// SAFETY: `ptr` is the address of the region's heap buffer, which the MemoryRegion owns and
// keeps in place while this registration exists; it is only handed to the device.
unsafe impl Send for HwMr {}
// SAFETY: as above; mutable state is behind Mutexes.
unsafe impl Sync for HwMr {}

impl HwMr {
    /// # Safety
    /// `ptr..ptr+len` must stay allocated and in place until [`HwMr::deregister`] or drop.
    pub(crate) unsafe fn new(
        pd: &Arc<HwPd>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<HwMr, VerbsError> {
        // SAFETY: forwarded caller contract.
        let raw = unsafe { RawMr::register(pd, ptr, len, access)? };
        let keys = raw.keys();
        Ok(HwMr {
            pd: pd.clone(),
            ptr,
            len,
            reg: Mutex::new(Some(raw)),
            keys: Mutex::new(keys),
        })
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.keys.lock().0
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.keys.lock().1
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Stop all access by the device (ibv_dereg_mr).
    pub(crate) fn deregister(&self) {
        self.reg.lock().take();
    }

    /// Register again with `access`; returns the new rkey.
    pub(crate) fn reregister(&self, access: Access) -> Result<u32, VerbsError> {
        let mut reg = self.reg.lock();
        reg.take();
        // SAFETY: the buffer is still owned by the region and in place (HwMr::new contract).
        let raw = unsafe { RawMr::register(&self.pd, self.ptr, self.len, access)? };
        let keys = raw.keys();
        *reg = Some(raw);
        *self.keys.lock() = keys;
        Ok(keys.1)
    }
}

// ---------------------------------------------------------------------------------------------
// Completion queues

pub(crate) struct HwCq {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    stop_fd: RawFd,
    thread: Mutex<Option<JoinHandle<()>>>,
    _dev: Arc<HwDevice>,
}

// SAFETY: the CQ and channel are used by the polling thread and destroyed in Drop after it
// was joined; verbs calls on them are thread-safe.
unsafe impl Send for HwCq {}
// SAFETY: as above.
unsafe impl Sync for HwCq {}

struct CqPtrs {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    stop_fd: RawFd,
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
fn cq_thread(p: CqPtrs, sink: Arc<CqInner>, dev: Weak<HwDevice>) {
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

fn deliver(wcs: &[sys::ibv_wc], sink: &Arc<CqInner>, dev: &Weak<HwDevice>) {
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
fn push(cq: &CqInner, c: Completion) {
    if cq.enqueue(c) {
        cq.run_handler();
    }
}

fn wc_status(s: sys::ibv_wc_status::Type) -> WcStatus {
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

// ---------------------------------------------------------------------------------------------
// Queue pairs

/// Marks receive slots in the hardware wr_id.
const RECV_BIT: u64 = 1 << 63;

struct SendSlot {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    /// Memory of an inline payload (and its temporary registration) until completion.
    _keep: Option<(Bytes, Option<RawMr>)>,
    /// The bounce slot an inline payload was copied into, freed on completion.
    bounce: Option<u16>,
}

/// Size and number of the per-QP bounce slots for inline payloads too big for the device's
/// inline data: copying up to 16 KiB is far cheaper than registering (pinning) the bytes and
/// deregistering them again for every Send (measured: RDS 8 KiB messages over kernel siw).
const BOUNCE_SLOT: usize = 16 * 1024;
const BOUNCE_SLOTS: usize = 64;

/// A registered buffer of [`BOUNCE_SLOTS`] slots of [`BOUNCE_SLOT`] bytes.
struct Bounce {
    // Declared before `buf`: deregistered before the memory is freed.
    mr: RawMr,
    buf: Box<[u8]>,
    free: Vec<u16>,
}

impl Bounce {
    fn new(pd: &Arc<HwPd>) -> Result<Bounce, VerbsError> {
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
    fn put(&mut self, b: &[u8]) -> Option<(u16, u64, u32)> {
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

struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
    used: usize,
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
    fn insert(&mut self, v: T) -> usize {
        self.used += 1;
        if let Some(i) = self.free.pop() {
            self.items[i] = Some(v);
            i
        } else {
            self.items.push(Some(v));
            self.items.len() - 1
        }
    }
    fn remove(&mut self, i: usize) -> Option<T> {
        let v = self.items.get_mut(i)?.take();
        if v.is_some() {
            self.used -= 1;
            self.free.push(i);
        }
        v
    }
}

struct CoreState {
    /// The live QP (null before connecting and after destruction).
    qp: *mut sys::ibv_qp,
    pd: *mut sys::ibv_pd,
    state: QpState,
    sends: Slab<SendSlot>,
    /// Posted receives (kept whole so a failed connect can re-queue them).
    recvs: Slab<RecvWr>,
    /// Receives posted before the QP exists.
    early_recvs: Vec<RecvWr>,
    /// Send WRs waiting for a free send-queue slot.
    backlog: VecDeque<SendWr>,
    sq_depth: usize,
    max_sge: usize,
    max_inline: usize,
    /// A registered scratch buffer (address, lkey): receives without a scatter list get one
    /// zero-length element of it, since some providers (siw's) refuse an empty list.
    scratch: Option<(u64, u32)>,
    /// Bounce slots for inline payloads (registered on first use; `Err` if that failed).
    bounce: Option<Result<Bounce, ()>>,
}

/// The bookkeeping of a hardware QP, shared with the CQ threads.
pub(crate) struct QpCore {
    st: Mutex<CoreState>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    qp_num: AtomicU32,
    hw_pd: Arc<HwPd>,
}

// SAFETY: the raw pointers in CoreState are only used under its Mutex, and the QP pointer is
// cleared (under the Mutex) before the QP is destroyed.
unsafe impl Send for QpCore {}
// SAFETY: as above.
unsafe impl Sync for QpCore {}

fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Completion {
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

fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithInvalidate(_) => WcOpcode::Send,
        SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate(_) => WcOpcode::LocalInvalidate,
    }
}

impl QpCore {
    fn qp_num(&self) -> u32 {
        self.qp_num.load(Ordering::Relaxed)
    }

    /// Translate one work completion; `None` for a successful WR the consumer did not signal.
    fn complete(&self, wc: &sys::ibv_wc) -> Option<Completion> {
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
    fn pump(&self, st: &mut CoreState) -> Vec<Completion> {
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

    fn post_send(&self, wr: SendWr) -> Result<(), VerbsError> {
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
    fn bounce(&self, st: &mut CoreState, b: &[u8]) -> Option<(u16, u64, u32)> {
        st.bounce
            .get_or_insert_with(|| {
                Bounce::new(&self.hw_pd).map_err(|e| tracing::debug!("no bounce buffer: {e}"))
            })
            .as_mut()
            .ok()?
            .put(b)
    }

    fn post_one(&self, st: &mut CoreState, wr: SendWr) -> Result<(), VerbsError> {
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

    fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
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

    fn post_recv_locked(st: &mut CoreState, wr: RecvWr) -> Result<(), VerbsError> {
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
    fn set_error(&self) {
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
    core: Arc<QpCore>,
    /// The scratch buffer behind `CoreState::scratch` (registration dropped first).
    _scratch: Option<(RawMr, Box<[u8; 64]>)>,
    dev: Arc<HwDevice>,
    scq: Arc<HwCq>,
    rcq: Arc<HwCq>,
    /// The rdma_cm id the QP was created on (the QP is destroyed before the id).
    id: Mutex<Option<Arc<CmId>>>,
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

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), VerbsError> {
        self.core.post_recv(wr)
    }

    /// Create the QP on `id` (rdma_create_qp) and post the receives that were waiting.
    fn instantiate(&self, id: &Arc<CmId>) -> Result<(), VerbsError> {
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
    fn set_rts(&self) {
        let mut st = self.core.st.lock();
        if st.state == QpState::Init {
            st.state = QpState::Rts;
        }
    }

    fn destroy_qp(&self) {
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
    fn abandon(&self) {
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

// ---------------------------------------------------------------------------------------------
// Connection manager

struct Channel {
    ch: *mut sys::rdma_event_channel,
    afd: Option<AsyncFd<RawFd>>,
}

// SAFETY: the channel is read through `&self` by one task at a time (each id has its own
// channel), and destroyed once in Drop.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // Deregister from tokio before the fd is closed.
        self.afd.take();
        // SAFETY: created by rdma_create_event_channel; every id on it was destroyed first
        // (ids hold an Arc to their channel).
        unsafe { sys::rdma_destroy_event_channel(self.ch) };
    }
}

/// What we keep of one rdma_cm event (it is acked at once).
struct CmEv {
    kind: sys::rdma_cm_event_type::Type,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private_data: Bytes,
    responder_resources: u8,
    initiator_depth: u8,
}

// SAFETY: `id` is only an address here; it is turned into an owned CmId (or ignored) by the
// task that received the event.
unsafe impl Send for CmEv {}

fn event_name(kind: sys::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe {
        let p = sys::rdma_event_str(kind);
        if p.is_null() {
            format!("event {kind}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

impl Channel {
    fn new() -> Result<Arc<Channel>, VerbsError> {
        // SAFETY: plain creation; the fd is made non-blocking for tokio.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(os_err("rdma_create_event_channel"));
        }
        // SAFETY: ch is valid.
        let fd = unsafe { (*ch).fd };
        set_nonblocking(fd);
        let mut c = Channel { ch, afd: None };
        // SAFETY: the fd stays open while registered: Channel::drop drops the AsyncFd before
        // rdma_destroy_event_channel closes it.
        let afd = unsafe { AsyncFd::register(fd) }.map_err(|e| {
            VerbsError::Io(format!("registering an rdma_cm channel with tokio: {e:?}"))
        })?;
        c.afd = Some(afd);
        Ok(Arc::new(c))
    }

    async fn next(&self) -> Result<CmEv, VerbsError> {
        let afd = self
            .afd
            .as_ref()
            .ok_or(VerbsError::InvalidState("event channel closed"))?;
        loop {
            let mut guard = afd.readable().await?;
            let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
            // SAFETY: non-blocking read of one event from our channel.
            let r = unsafe { sys::rdma_get_cm_event(self.ch, &mut ev) };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    guard.clear_ready();
                    continue;
                }
                return Err(e.into());
            }
            // SAFETY: ev is a valid event until acked; the conn param's private data is
            // `private_data_len` bytes (for connection events) and copied out before the ack.
            let out = unsafe {
                let e = &*ev;
                let conn = e.param.conn;
                let pd = if conn.private_data.is_null() || conn.private_data_len == 0 {
                    Bytes::new()
                } else {
                    Bytes::copy_from_slice(std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        usize::from(conn.private_data_len),
                    ))
                };
                let out = CmEv {
                    kind: e.event,
                    status: e.status,
                    id: e.id,
                    private_data: pd,
                    responder_resources: conn.responder_resources,
                    initiator_depth: conn.initiator_depth,
                };
                sys::rdma_ack_cm_event(ev);
                out
            };
            return Ok(out);
        }
    }

    async fn expect(
        &self,
        want: sys::rdma_cm_event_type::Type,
        within: Duration,
        what: &str,
    ) -> Result<CmEv, VerbsError> {
        let ev = tokio::time::timeout(within, self.next())
            .await
            .map_err(|_| VerbsError::Timeout)??;
        if ev.kind == want {
            return Ok(ev);
        }
        if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED {
            return Err(VerbsError::Rejected(ev.private_data));
        }
        Err(VerbsError::Io(format!(
            "{what}: {} (status {})",
            event_name(ev.kind),
            ev.status
        )))
    }
}

/// An rdma_cm id and its own event channel.
pub(crate) struct CmId {
    id: *mut sys::rdma_cm_id,
    chan: Arc<Channel>,
}

// SAFETY: rdma_cm calls on an id are thread-safe; the id is destroyed once, in Drop.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: every event of the id was acked on receipt; its QP (if any) was destroyed
        // first (HwQueuePair holds an Arc to us).
        unsafe {
            sys::rdma_destroy_id(self.id);
        }
    }
}

impl CmId {
    fn new() -> Result<Arc<CmId>, VerbsError> {
        let chan = Channel::new()?;
        let mut id = ptr::null_mut();
        // SAFETY: creating an id on our channel.
        let r = unsafe {
            sys::rdma_create_id(
                chan.ch,
                &mut id,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if r != 0 {
            return Err(os_err("rdma_create_id"));
        }
        Ok(Arc::new(CmId { id, chan }))
    }

    /// Take ownership of an id that arrived with a connect request, moving it to a channel
    /// of its own.
    fn adopt(id: *mut sys::rdma_cm_id) -> Result<Arc<CmId>, VerbsError> {
        let chan = Channel::new()?;
        // SAFETY: the id's CONNECT_REQUEST event was acked, so migration does not block.
        let r = unsafe { sys::rdma_migrate_id(id, chan.ch) };
        if r != 0 {
            let e = os_err("rdma_migrate_id");
            // SAFETY: nobody else owns the id.
            unsafe {
                sys::rdma_reject(id, ptr::null(), 0);
                sys::rdma_destroy_id(id);
            }
            return Err(e);
        }
        Ok(Arc::new(CmId { id, chan }))
    }

    fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: reading a field of our live id.
        unsafe { (*self.id).verbs }
    }

    fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: the route's address storage is part of the live id.
        unsafe {
            let id = &*self.id;
            (
                sockaddr_to_std(sys::rdma_get_local_addr(id)),
                sockaddr_to_std(sys::rdma_get_peer_addr(id)),
            )
        }
    }

    fn check_device(&self, dev: &HwDevice) -> Result<(), VerbsError> {
        let v = self.verbs();
        if v == dev.ctx {
            Ok(())
        } else if v.is_null() {
            Err(VerbsError::InvalidArgument(
                "the address is not on an RDMA device",
            ))
        } else {
            Err(VerbsError::InvalidArgument(
                "the address belongs to a different RDMA device than this Device",
            ))
        }
    }
}

fn sockaddr_to_std(sa: &libc::sockaddr) -> Option<SocketAddr> {
    let p: *const libc::sockaddr = sa;
    // SAFETY: the family tag says which sockaddr type the storage holds; rdma_cm stores a full
    // sockaddr_storage there.
    unsafe {
        match i32::from(sa.sa_family) {
            libc::AF_INET => {
                let s = &*p.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    u32::from_be(s.sin_addr.s_addr).into(),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*p.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    s.sin6_addr.s6_addr.into(),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

fn std_to_sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: an all-zero sockaddr_storage is valid; we write the matching struct over it.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        match a {
            SocketAddr::V4(v) => {
                let s = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                (*s).sin_family = libc::AF_INET as libc::sa_family_t;
                (*s).sin_port = v.port().to_be();
                (*s).sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                (*s).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                (*s).sin6_port = v.port().to_be();
                (*s).sin6_addr.s6_addr = v.ip().octets();
                (*s).sin6_flowinfo = v.flowinfo();
                (*s).sin6_scope_id = v.scope_id();
            }
        }
        ss
    }
}

/// What a hardware connection reports to [`Connection`](crate::Connection).
pub(crate) struct HwEstablished {
    pub(crate) guard: HwConnGuard,
    pub(crate) peer_private_data: Bytes,
    pub(crate) ird: u16,
    pub(crate) ord: u16,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    pub(crate) events: tokio::sync::mpsc::UnboundedReceiver<crate::CmEvent>,
    pub(crate) done: tokio::sync::watch::Receiver<bool>,
}

/// Owned by the Connection: disconnects on drop and stops the event task.
pub(crate) struct HwConnGuard {
    id: Arc<CmId>,
    core: Arc<QpCore>,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for HwConnGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwConnGuard").finish_non_exhaustive()
    }
}

impl HwConnGuard {
    /// rdma_disconnect, and move the QP to the error state so every WR is flushed now.
    pub(crate) fn abort(&self) {
        // SAFETY: our live id.
        unsafe {
            sys::rdma_disconnect(self.id.id);
        }
        self.core.set_error();
    }
}

impl Drop for HwConnGuard {
    fn drop(&mut self) {
        self.abort();
        self.task.abort();
    }
}

fn unspecified(a: Option<SocketAddr>) -> SocketAddr {
    a.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
}

fn conn_param(
    private_data: &Bytes,
    responder_resources: u8,
    initiator_depth: u8,
) -> Result<sys::rdma_conn_param, VerbsError> {
    let len = u8::try_from(private_data.len())
        .map_err(|_| VerbsError::InvalidArgument("private data longer than 255 bytes"))?;
    // SAFETY: zeroed rdma_conn_param is valid; we fill the fields we use. The private data
    // pointer stays valid while the caller holds `private_data` (across the connect call).
    let mut p: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = if len == 0 {
        ptr::null()
    } else {
        private_data.as_ptr().cast()
    };
    p.private_data_len = len;
    p.responder_resources = responder_resources;
    p.initiator_depth = initiator_depth;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.flow_control = 1;
    Ok(p)
}

fn start(id: Arc<CmId>, qp: &HwQueuePair, ev: CmEv, ird: u8, ord: u8) -> HwEstablished {
    qp.set_rts();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let core = qp.core.clone();
    let task_id = id.clone();
    let task_core = core.clone();
    let task = tokio::spawn(async move {
        loop {
            let e = match task_id.chan.next().await {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(crate::CmEvent::Error(e.to_string()));
                    break;
                }
            };
            use sys::rdma_cm_event_type as t;
            match e.kind {
                t::RDMA_CM_EVENT_DISCONNECTED => break,
                t::RDMA_CM_EVENT_TIMEWAIT_EXIT | t::RDMA_CM_EVENT_ESTABLISHED => {}
                other => {
                    let _ = tx.send(crate::CmEvent::Error(format!(
                        "{} (status {})",
                        event_name(other),
                        e.status
                    )));
                    if matches!(
                        other,
                        t::RDMA_CM_EVENT_DEVICE_REMOVAL
                            | t::RDMA_CM_EVENT_CONNECT_ERROR
                            | t::RDMA_CM_EVENT_UNREACHABLE
                    ) {
                        break;
                    }
                }
            }
        }
        task_core.set_error();
        let _ = tx.send(crate::CmEvent::Disconnected);
        let _ = done_tx.send(true);
    });
    let (local, peer) = id.addrs();
    HwEstablished {
        guard: HwConnGuard { id, core, task },
        peer_private_data: ev.private_data,
        ird: u16::from(ird),
        ord: u16::from(ord),
        local: unspecified(local),
        peer: unspecified(peer),
        events: rx,
        done: done_rx,
    }
}

/// rdma_resolve_addr / rdma_resolve_route / rdma_create_qp / rdma_connect.
pub(crate) async fn connect(
    dev: &Arc<HwDevice>,
    qp: &HwQueuePair,
    addr: SocketAddr,
    private_data: &Bytes,
    ird: u16,
    ord: u16,
) -> Result<HwEstablished, VerbsError> {
    if !Arc::ptr_eq(&qp.dev, dev) {
        return Err(VerbsError::InvalidArgument("QP belongs to another device"));
    }
    use sys::rdma_cm_event_type as t;
    let id = CmId::new()?;
    let mut dst = std_to_sockaddr(addr);
    // SAFETY: dst is a valid sockaddr for the call's duration.
    let r = unsafe {
        sys::rdma_resolve_addr(
            id.id,
            ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            2000,
        )
    };
    if r != 0 {
        return Err(os_err("rdma_resolve_addr"));
    }
    id.chan
        .expect(
            t::RDMA_CM_EVENT_ADDR_RESOLVED,
            Duration::from_secs(5),
            "address resolution",
        )
        .await?;
    id.check_device(dev)?;
    // SAFETY: our id, address resolved.
    if unsafe { sys::rdma_resolve_route(id.id, 2000) } != 0 {
        return Err(os_err("rdma_resolve_route"));
    }
    id.chan
        .expect(
            t::RDMA_CM_EVENT_ROUTE_RESOLVED,
            Duration::from_secs(5),
            "route resolution",
        )
        .await?;
    qp.instantiate(&id)?;
    let resp = ird.min(u16::from(dev.max_rd_atom)).min(255) as u8;
    let init = ord.min(u16::from(dev.max_init_rd_atom)).min(255) as u8;
    // Route resolved and QP created on the id: rdma_connect may go.
    let ev = establish(
        &id,
        qp,
        private_data,
        resp,
        init,
        sys::rdma_connect,
        "rdma_connect",
    )
    .await?;
    // The peer's answer bounds our depths: its IRD caps our ORD. The rdma_cm reports the
    // reply's depths from our side, so its IRD is the event's initiator depth.
    let ord_eff = if ev.initiator_depth > 0 {
        init.min(ev.initiator_depth)
    } else {
        init
    };
    Ok(start(id, qp, ev, resp, ord_eff))
}

/// The last step of connect and accept: `call` (rdma_connect or rdma_accept) with our
/// parameters, then wait for ESTABLISHED. On failure the QP is destroyed but the consumer's
/// QP stays usable for another try (receives it had posted are flushed).
async fn establish(
    id: &CmId,
    qp: &HwQueuePair,
    private_data: &Bytes,
    resp: u8,
    init: u8,
    call: unsafe extern "C" fn(*mut sys::rdma_cm_id, *mut sys::rdma_conn_param) -> i32,
    what: &'static str,
) -> Result<CmEv, VerbsError> {
    let result = async {
        {
            let mut p = conn_param(private_data, resp, init)?;
            // SAFETY: the caller created the QP on the id; `p` and the private data outlive
            // the call.
            if unsafe { call(id.id, &mut p) } != 0 {
                return Err(os_err(what));
            }
        }
        id.chan
            .expect(
                sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
                Duration::from_secs(15),
                what.strip_prefix("rdma_").unwrap_or(what),
            )
            .await
    }
    .await;
    if result.is_err() {
        qp.abandon();
        qp.core.st.lock().state = QpState::Init;
    }
    result
}

/// A listening rdma_cm id.
pub(crate) struct HwListener {
    id: Arc<CmId>,
    pub(crate) local: SocketAddr,
}

impl fmt::Debug for HwListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwListener")
            .field("local", &self.local)
            .finish()
    }
}

pub(crate) fn listen(dev: &Arc<HwDevice>, addr: SocketAddr) -> Result<HwListener, VerbsError> {
    let id = CmId::new()?;
    let mut sa = std_to_sockaddr(addr);
    // SAFETY: sa is valid for the call.
    if unsafe { sys::rdma_bind_addr(id.id, (&mut sa as *mut libc::sockaddr_storage).cast()) } != 0 {
        return Err(os_err("rdma_bind_addr"));
    }
    // A specific address binds the id to its device; a wildcard does not (requests are then
    // checked one by one).
    if !id.verbs().is_null() {
        id.check_device(dev)?;
    }
    // SAFETY: bound id.
    if unsafe { sys::rdma_listen(id.id, 128) } != 0 {
        return Err(os_err("rdma_listen"));
    }
    let (local, _) = id.addrs();
    Ok(HwListener {
        local: local.unwrap_or(addr),
        id,
    })
}

/// An incoming request, owning its id until accept or reject.
pub(crate) struct HwConnReq {
    id: Option<Arc<CmId>>,
    dev: Arc<HwDevice>,
    pub(crate) private_data: Bytes,
    /// The initiator's responder resources (its IRD) and initiator depth (its ORD).
    /// The rdma_cm reports a request's depths from the listener's side (the IB CM and iw_cm
    /// both swap them: the event's `initiator_depth` is what we may use, the initiator's
    /// responder resources), so they are read crosswise here.
    pub(crate) peer_ird: u8,
    pub(crate) peer_ord: u8,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

impl fmt::Debug for HwConnReq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwConnReq")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Drop for HwConnReq {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // Neither accepted nor rejected: reject, like destroying the id would.
            // SAFETY: our id.
            unsafe {
                sys::rdma_reject(id.id, ptr::null(), 0);
            }
        }
    }
}

impl HwListener {
    /// Wait for the next connection request.
    pub(crate) async fn next_request(&self, dev: &Arc<HwDevice>) -> Result<HwConnReq, VerbsError> {
        loop {
            let ev = self.id.chan.next().await?;
            if ev.kind != sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                tracing::debug!("listener: ignoring {}", event_name(ev.kind));
                continue;
            }
            let id = match CmId::adopt(ev.id) {
                Ok(id) => id,
                Err(e) => {
                    tracing::warn!("connect request dropped: {e}");
                    continue;
                }
            };
            let (local, peer) = id.addrs();
            return Ok(HwConnReq {
                id: Some(id),
                dev: dev.clone(),
                private_data: ev.private_data,
                peer_ird: ev.initiator_depth,
                peer_ord: ev.responder_resources,
                local: unspecified(local),
                peer: unspecified(peer),
            });
        }
    }
}

impl HwConnReq {
    pub(crate) async fn accept(
        mut self,
        qp: &HwQueuePair,
        private_data: &Bytes,
        ird: u16,
        ord: u16,
    ) -> Result<HwEstablished, VerbsError> {
        let id = self
            .id
            .take()
            .ok_or(VerbsError::InvalidState("request already answered"))?;
        if let Err(e) = id.check_device(&self.dev) {
            // SAFETY: our id.
            unsafe { sys::rdma_reject(id.id, ptr::null(), 0) };
            return Err(e);
        }
        if !Arc::ptr_eq(&qp.dev, &self.dev) {
            // SAFETY: our id.
            unsafe { sys::rdma_reject(id.id, ptr::null(), 0) };
            return Err(VerbsError::InvalidArgument("QP belongs to another device"));
        }
        qp.instantiate(&id)?;
        // Our IRD serves the initiator's ORD and our ORD is bounded by its IRD.
        let resp = ird
            .min(u16::from(self.dev.max_rd_atom))
            .min(u16::from(self.peer_ord.max(1)))
            .min(255) as u8;
        let init = ord
            .min(u16::from(self.dev.max_init_rd_atom))
            .min(u16::from(self.peer_ird))
            .min(255) as u8;
        let mut ev = establish(
            &id,
            qp,
            private_data,
            resp,
            init,
            sys::rdma_accept,
            "rdma_accept",
        )
        .await?;
        // The initiator's private data came with the request.
        ev.private_data = self.private_data.clone();
        Ok(start(id, qp, ev, resp, init))
    }

    pub(crate) fn reject(mut self, private_data: &[u8]) -> Result<(), VerbsError> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| VerbsError::InvalidArgument("private data longer than 255 bytes"))?;
        if let Some(id) = self.id.take() {
            // SAFETY: our id; the private data is valid for the call.
            let r = unsafe {
                sys::rdma_reject(
                    id.id,
                    if len == 0 {
                        ptr::null()
                    } else {
                        private_data.as_ptr().cast()
                    },
                    len,
                )
            };
            if r != 0 {
                return Err(os_err("rdma_reject"));
            }
        }
        Ok(())
    }
}
