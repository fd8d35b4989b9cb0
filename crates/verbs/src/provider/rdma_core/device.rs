//! Devices (librdmacm's contexts), protection domains and memory regions.

use super::*;

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

/// librdmacm's device contexts with their names. The contexts are owned by librdmacm and stay
/// valid for the life of the process, after the array listing them is freed.
pub(super) fn device_contexts() -> Result<Vec<(*mut sys::ibv_context, RdmaCoreDevice)>, VerbsError>
{
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
    pub(super) ctx: *mut sys::ibv_context,
    pub(crate) name: String,
    pub(crate) iwarp: bool,
    pub(crate) config: RdmaCoreConfig,
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    pub(super) max_sge: u32,
    pub(super) max_rd_atom: u8,
    pub(super) max_init_rd_atom: u8,
    /// QPs by number, for the CQ threads.
    pub(super) qps: Mutex<std::collections::HashMap<u32, Weak<QpCore>>>,
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
    pub(super) pd: *mut sys::ibv_pd,
    pub(super) dev: Arc<HwDevice>,
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
pub(super) struct RawMr {
    pub(super) mr: *mut sys::ibv_mr,
    pub(super) _pd: Arc<HwPd>,
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
    pub(super) unsafe fn register(
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

    pub(super) fn keys(&self) -> (u32, u32) {
        // SAFETY: mr is a live registration.
        unsafe { ((*self.mr).lkey, (*self.mr).rkey) }
    }
}

/// The hardware side of a [`MemoryRegion`](crate::MemoryRegion): the registration of its
/// buffer, which comes and goes with invalidate / reregister.
pub(crate) struct HwMr {
    pub(super) pd: Arc<HwPd>,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) reg: Mutex<Option<RawMr>>,
    /// Keys of the latest registration (kept after invalidation, like a stale STag).
    pub(super) keys: Mutex<(u32, u32)>,
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
