//! The connection manager: rdma_cm ids and event channels, connect, listen, accept, reject.

use super::*;

pub(super) struct Channel {
    pub(super) ch: *mut sys::rdma_event_channel,
    pub(super) afd: Option<AsyncFd<RawFd>>,
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
pub(super) struct CmEv {
    pub(super) kind: sys::rdma_cm_event_type::Type,
    pub(super) status: i32,
    pub(super) id: *mut sys::rdma_cm_id,
    pub(super) private_data: Bytes,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
}

// SAFETY: `id` is only an address here; it is turned into an owned CmId (or ignored) by the
// task that received the event.
unsafe impl Send for CmEv {}

pub(super) fn event_name(kind: sys::rdma_cm_event_type::Type) -> String {
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
    pub(super) fn new() -> Result<Arc<Channel>, VerbsError> {
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

    pub(super) async fn next(&self) -> Result<CmEv, VerbsError> {
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

    pub(super) async fn expect(
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
    pub(super) id: *mut sys::rdma_cm_id,
    pub(super) chan: Arc<Channel>,
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
    pub(super) fn new() -> Result<Arc<CmId>, VerbsError> {
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
    pub(super) fn adopt(id: *mut sys::rdma_cm_id) -> Result<Arc<CmId>, VerbsError> {
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

    pub(super) fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: reading a field of our live id.
        unsafe { (*self.id).verbs }
    }

    pub(super) fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: the route's address storage is part of the live id.
        unsafe {
            let id = &*self.id;
            (
                sockaddr_to_std(sys::rdma_get_local_addr(id)),
                sockaddr_to_std(sys::rdma_get_peer_addr(id)),
            )
        }
    }

    pub(super) fn check_device(&self, dev: &HwDevice) -> Result<(), VerbsError> {
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

pub(super) fn sockaddr_to_std(sa: &libc::sockaddr) -> Option<SocketAddr> {
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

pub(super) fn std_to_sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
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
    pub(super) id: Arc<CmId>,
    pub(super) core: Arc<QpCore>,
    pub(super) task: tokio::task::JoinHandle<()>,
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

pub(super) fn unspecified(a: Option<SocketAddr>) -> SocketAddr {
    a.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
}

pub(super) fn conn_param(
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

pub(super) fn start(id: Arc<CmId>, qp: &HwQueuePair, ev: CmEv, ird: u8, ord: u8) -> HwEstablished {
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
pub(super) async fn establish(
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
    pub(super) id: Arc<CmId>,
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
    pub(super) id: Option<Arc<CmId>>,
    pub(super) dev: Arc<HwDevice>,
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
