//! The client side: [`RdmaClient`], one connection that implements `oncrpc::RpcTransport`,
//! reconnects and retransmits. Calls and received messages go through an inbox that whoever
//! holds the Requester drains, so no thread sleeps on its lock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncrpc::rtt::RttTable;
use oncrpc::service::BoxFuture;
use oncrpc::{CallContext, CallRequest, Dispatcher, RpcError, RpcTransport};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tokio::sync::{Notify, oneshot};
use verbs::{CompletionQueue, ProtectionDomain, RecvWr, WcStatus};
use xdr::{DdpPolicy, Encoder};

use super::link::{Link, Router, SinkPool, VerbsRegistrar, recv_pool};
use super::{DriverError, TransportConfig};
use crate::call_policy::{CallEncoding, CallPolicy};
use crate::engine::Params;
use crate::privdata::PrivateData;
use crate::requester::{self, OutCall, Requester};
use crate::ulb::{Bindings, UpperLayerBinding};

/// Say which version a new connection uses when it is settled at once (configured, or the
/// server was remembered as version 1 only); a probe's outcome is logged by the Requester.
fn log_version(addr: SocketAddr, req: &Requester) {
    match req.version_reason() {
        Some(reason) => {
            tracing::info!(%addr, "RPC-over-RDMA version {} ({reason})", req.version().number())
        }
        None => tracing::info!(%addr, "RPC-over-RDMA: probing with version 2"),
    }
}

struct ClientState {
    req: Requester,
    reg: VerbsRegistrar,
    waiters: crate::engine::XidMap<Waiter>,
    /// Round-trip times of answered calls ([`RpcTransport::rtt`]).
    rtt: Arc<RttTable>,
    closed: bool,
    /// The instant the timer task sleeps until: it wakes then, or when told of an earlier
    /// deadline through `timer` (see [`client_timer`]).
    armed: Option<Instant>,
    timer: Arc<Notify>,
    /// The inbox's batch being worked, swapped with the inbox: both keep their capacity, and
    /// each piece of work moves once (stop 38).
    batch: Vec<Work>,
}

struct ClientInner {
    addr: SocketAddr,
    cfg: TransportConfig,
    state: Mutex<ClientState>,
    /// Calls whose callers found `state` locked; submitted by its holder (see `submit_call`).
    inbox: Mutex<Vec<Work>>,
    link: Mutex<Arc<Link>>,
    next_xid: AtomicU32,
    back: Option<Dispatcher>,
    reconnects: AtomicU64,
    /// The Requester's decisions about calls: how each is encoded (reduction, RFC 8166 §6.1,
    /// §8.2.2.3) and the short Reply chunk retries (RFC 8267 §3.1).
    policy: Arc<CallPolicy>,
    /// Calls sent again with a larger Reply chunk after RDMA_ERR_CHUNK.
    short_reply_retries: AtomicU64,
    /// Where backward calls run: replies are handled in the provider's context, which may be
    /// a thread outside the runtime (rdma-core's completion thread).
    rt: tokio::runtime::Handle,
}

impl ClientInner {
    fn link(&self) -> Arc<Link> {
        self.link.lock().clone()
    }
}

/// A connected queue pair for a client, with its receive buffers posted.
async fn open_client_link(
    addr: SocketAddr,
    config: &TransportConfig,
    nrecv: usize,
) -> Result<(Arc<Link>, CompletionQueue, Params, ProtectionDomain), DriverError> {
    let dev = config.device();
    let cfg = &config.rpc;
    let pd = dev.alloc_pd();
    let scq = dev.create_cq();
    let rcq = dev.create_cq();
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let recv_bufs = recv_pool(
        &pd,
        nrecv,
        //= specs/rfc8166.txt#section-3.3.3
        //# Receiver implementations MUST support inline thresholds of 1024 bytes but MAY support
        //# larger inline thresholds values.
        // RFC 8166 §3.3.3: receivers support at least 1024-byte messages.
        // cel-05 §3.3: at least 4096 bytes when the client may speak version 2.
        cfg.recv_buffer_size(true) as usize,
    )?;
    // RFC 8167 §4.3.1: receives for replies and for backward calls go up before connecting.
    for (i, mr) in recv_bufs.iter().enumerate() {
        qp.post_recv(RecvWr::new(i as u64, mr.sge(0, mr.len() as u32)))?;
    }
    let conn = dev.connect(&qp, addr, config.conn_params()).await?;
    let params: Params = cfg
        .negotiate(PrivateData::decode(conn.peer_private_data()))
        .into();
    let router = Arc::new(Router::default());
    let router_task = tokio::spawn(router.clone().run(scq));
    let link = Arc::new(Link {
        qp,
        conn,
        recv_bufs,
        router,
        router_task,
        read_sinks: SinkPool::default(),
    });
    Ok((link, rcq, params, pd))
}

/// An RPC-over-RDMA client (one connection).
pub struct RdmaClient {
    inner: Arc<ClientInner>,
    task: tokio::task::JoinHandle<()>,
    timer_task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RdmaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaClient")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for RdmaClient {
    fn drop(&mut self) {
        self.task.abort();
        self.timer_task.abort();
    }
}

impl RdmaClient {
    /// Connect to an RPC-over-RDMA server. `ulbs` are the Upper-Layer Bindings of the
    /// programs this client calls: calls of any other program (or of a version its binding
    /// does not cover) fail with [`RpcError::NoBinding`] without being sent (RFC 8166 §6).
    /// [`crate::ulb::InlineBinding`] serves programs with no DDP-eligible item.
    pub async fn connect(
        addr: SocketAddr,
        config: TransportConfig,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
    ) -> Result<Self, DriverError> {
        Self::connect_with(addr, config, ulbs, None).await
    }

    /// [`RdmaClient::connect`] with an optional backward-direction service (RFC 8167
    /// callbacks; backward-direction programs need no binding here: backward messages are
    /// inline only, which RFC 8167 §5.3 allows).
    pub async fn connect_with(
        addr: SocketAddr,
        config: TransportConfig,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
        backchannel: Option<Dispatcher>,
    ) -> Result<Self, DriverError> {
        let cfg = config.rpc.clone();
        let ulbs: Arc<Bindings> = Arc::new(ulbs.into_iter().map(|u| (u.program(), u)).collect());
        let timer = Arc::new(Notify::new());
        let mut req = Requester::new(cfg.clone(), ulbs);
        let policy = req.call_policy();
        // The Requester remembers version-1-only servers for every client of the process
        // (cel-05 §8.2).
        req.remember_versions_in(addr, crate::version::process_memory());
        let (link, rcq, params, pd) =
            open_client_link(addr, &config, req.receives_needed()).await?;
        let mut state = ClientState {
            req,
            reg: VerbsRegistrar::new(pd),
            waiters: Default::default(),
            rtt: Arc::new(RttTable::new()),
            closed: false,
            armed: None,
            timer: timer.clone(),
            batch: Vec::new(),
        };
        let first = {
            let ClientState { req, reg, .. } = &mut state;
            req.on_connect(params, reg)
        };
        log_version(addr, &state.req);
        debug_assert!(first.is_empty());
        let inner = Arc::new(ClientInner {
            addr,
            cfg: config,
            state: Mutex::new(state),
            inbox: Mutex::new(Vec::new()),
            link: Mutex::new(link),
            next_xid: AtomicU32::new(rand::random::<u32>() | 1),
            back: backchannel,
            reconnects: AtomicU64::new(0),
            policy,
            short_reply_retries: AtomicU64::new(0),
            rt: tokio::runtime::Handle::current(),
        });
        let task = tokio::spawn(client_recv_loop(inner.clone(), rcq));
        let timer_task = tokio::spawn(client_timer(inner.clone(), timer));
        Ok(RdmaClient {
            inner,
            task,
            timer_task,
        })
    }

    /// Requester counters (credits, message forms).
    pub fn stats(&self) -> requester::RequesterStats {
        with_state(&self.inner, |st| st.req.stats().clone())
    }

    /// The RPC-over-RDMA version the connection speaks now (cel-05 §8: version 2 once the
    /// server answered the probe in version 2, version 1 after a fallback).
    pub fn rpcrdma_version(&self) -> crate::version::Version {
        with_state(&self.inner, |st| st.req.version())
    }

    /// Reconnections so far.
    pub fn reconnects(&self) -> u64 {
        self.inner.reconnects.load(Ordering::Relaxed)
    }

    /// Drop the connection, as a client that loses it would: every registration is fenced,
    /// the client reconnects and retransmits its outstanding calls with their XIDs. For
    /// fault injection.
    pub async fn disconnect(&self) {
        let link = self.inner.link();
        link.conn.disconnect().await;
    }

    /// Registrations still alive (all fenced once calls complete).
    pub fn live_registrations(&self) -> usize {
        with_state(&self.inner, |st| st.reg.regions.len())
    }
}

/// A submitted call's caller, and what its round-trip time needs.
struct Waiter {
    done: oneshot::Sender<Result<Bytes, RpcError>>,
    key: oncrpc::rtt::ProcKey,
    /// When the requester last asked for its Send (it is posted right after, in `perform`).
    sent_at: Option<Instant>,
}

/// A call waiting in [`ClientInner::inbox`] for whoever holds the state lock to submit it.
struct Submission {
    call: OutCall,
    done: oneshot::Sender<Result<Bytes, RpcError>>,
}

/// Work for the requester, queued in [`ClientInner::inbox`] in arrival order.
enum Work {
    Submit(Submission),
    Receive(Bytes, Option<u32>),
    /// A pull of a responder-provided Read chunk ended.
    PullDone(u64, Result<Bytes, String>),
}

/// What the requester asked for, done once the state lock is released (in this order).
enum Post {
    Send(Bytes),
    Done(
        oneshot::Sender<Result<Bytes, RpcError>>,
        Result<Bytes, RpcError>,
    ),
    BackCall(u32, Bytes),
    Close,
    /// RDMA Read a responder-provided Read chunk (pull id, segments, length).
    Pull(u64, Vec<crate::header::Segment>, usize),
    /// A pull-completion notification, by Send With Invalidate when a handle is given.
    Notify(Bytes, Option<u32>),
}

/// What one turn of the state lock leaves to do after it: usually a Send or a completion or
/// two, on the stack (stop 38: a heap allocation per call before).
type Posts = SmallVec<[Post; 4]>;

fn absorb(st: &mut ClientState, actions: Vec<requester::Action>, posts: &mut Posts) {
    for a in actions {
        match a {
            requester::Action::Send { xid, data } => {
                // Round-trip times run from the last transmission (as `mountstats` counts
                // them): a call resent after a version 2 error restarts its clock.
                if let Some(w) = st.waiters.get_mut(&xid) {
                    w.sent_at = Some(Instant::now());
                }
                posts.push(Post::Send(data));
            }
            requester::Action::Complete { xid, result } => {
                if let Some(w) = st.waiters.remove(&xid) {
                    if let (Ok(_), Some(t)) = (&result, w.sent_at) {
                        st.rtt.record(w.key, t.elapsed());
                    }
                    posts.push(Post::Done(w.done, result));
                }
            }
            requester::Action::BackCall { xid, message } => {
                posts.push(Post::BackCall(xid, message));
            }
            requester::Action::Close => posts.push(Post::Close),
            requester::Action::Pull {
                pull,
                segments,
                len,
                ..
            } => posts.push(Post::Pull(pull, segments, len)),
            requester::Action::Notify { data, invalidate } => {
                posts.push(Post::Notify(data, invalidate))
            }
        }
    }
}

fn work_locked(st: &mut ClientState, w: Work, posts: &mut Posts) {
    match w {
        Work::Submit(sub) => submit_locked(st, sub, posts),
        Work::Receive(msg, invalidated) => {
            let ClientState { req, reg, .. } = st;
            let actions = req.on_receive(msg, invalidated, reg);
            absorb(st, actions, posts);
        }
        Work::PullDone(pull, result) => {
            let ClientState { req, reg, .. } = st;
            let actions = req.pull_done(pull, result, reg);
            absorb(st, actions, posts);
        }
    }
}

fn submit_locked(st: &mut ClientState, sub: Submission, posts: &mut Posts) {
    if st.closed {
        posts.push(Post::Done(sub.done, Err(RpcError::Closed)));
        return;
    }
    let xid = sub.call.xid;
    let deadline = sub.call.deadline;
    let key = (sub.call.prog, sub.call.vers, sub.call.proc_);
    st.waiters.insert(
        xid,
        Waiter {
            done: sub.done,
            key,
            sent_at: None,
        },
    );
    let ClientState { req, reg, .. } = st;
    let actions = req.submit(sub.call, reg);
    absorb(st, actions, posts);
    // The timer sleeps until `armed`: wake it for an earlier deadline (under the state lock,
    // as the timer sets `armed`, so no deadline is missed).
    if let Some(d) = deadline
        && st.armed.is_none_or(|a| d < a)
    {
        st.armed = Some(d);
        st.timer.notify_one();
    }
}

/// The client's one timer. The Requester owns every call's deadline
/// ([`Requester::next_deadline`]); this task sleeps until the earliest, then hands the
/// Requester `now` ([`Requester::poll_timeouts`]), which fences the memory of the calls whose
/// time is up (RFC 8166 §4.4.1) and completes them with [`RpcError::Timeout`]. With no call
/// pending it wakes once per default call timeout; a call with an earlier deadline wakes it
/// (see `submit_locked`).
async fn client_timer(inner: Arc<ClientInner>, timer: Arc<Notify>) {
    loop {
        let until = {
            let mut st = inner.state.lock();
            let until = st
                .req
                .next_deadline()
                .unwrap_or_else(|| Instant::now() + inner.cfg.call_timeout);
            st.armed = Some(until);
            drop(st);
            settle_inbox(&inner);
            until
        };
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => {}
            // An earlier deadline came (or a stale permit): look again.
            () = timer.notified() => continue,
        }
        let mut st = inner.state.lock();
        let actions = {
            let ClientState { req, reg, .. } = &mut *st;
            req.poll_timeouts(Instant::now(), reg)
        };
        apply_locked(&inner, st, actions);
    }
}

/// Hand the requester a call to submit or a received message. Work goes through the inbox,
/// in order, and whoever holds the state lock does it: a caller or the receive handler that
/// finds the lock taken leaves its work to the holder instead of sleeping on the lock. With
/// many calls in flight, the thread handling a batch of replies submits the calls they
/// release and posts them from its own context.
fn enqueue(inner: &Arc<ClientInner>, w: Work) {
    inner.inbox.lock().push(w);
    settle_inbox(inner);
}

/// Apply `actions` of the requester (made under `st`): submit what waits in the inbox, release
/// the lock, then post, complete and spawn what they ask for, in order.
fn apply_locked<'a>(
    inner: &'a Arc<ClientInner>,
    mut st: MutexGuard<'a, ClientState>,
    actions: Vec<requester::Action>,
) {
    let mut posts = Posts::new();
    absorb(&mut st, actions, &mut posts);
    release_state(inner, st, posts);
}

/// Do, in order, the work waiting in the inbox (the state lock is held).
fn work_inbox_locked(inner: &ClientInner, st: &mut ClientState, posts: &mut Posts) {
    let mut batch = std::mem::take(&mut st.batch);
    std::mem::swap(&mut *inner.inbox.lock(), &mut batch);
    for w in batch.drain(..) {
        work_locked(st, w, posts);
    }
    st.batch = batch;
}

fn release_state<'a>(
    inner: &'a Arc<ClientInner>,
    mut st: MutexGuard<'a, ClientState>,
    mut posts: Posts,
) {
    loop {
        work_inbox_locked(inner, &mut st, &mut posts);
        drop(st);
        perform(inner, std::mem::take(&mut posts));
        // A submission pushed after the drain above, by a caller that found the lock still
        // held: it is this thread's to submit unless someone else holds the lock now (who will
        // then do it when they release it).
        if inner.inbox.lock().is_empty() {
            return;
        }
        st = match inner.state.try_lock() {
            Some(g) => g,
            None => return,
        };
    }
}

/// Run `f` on the requester state, then settle the inbox: work queued while `f` held the lock
/// is done here (or by whoever holds the lock next). Every use of the state lock ends with
/// `release_state` or goes through this, so nothing is left in the inbox.
fn with_state<R>(inner: &Arc<ClientInner>, f: impl FnOnce(&mut ClientState) -> R) -> R {
    let r = f(&mut inner.state.lock());
    settle_inbox(inner);
    r
}

/// Submit what waits in the inbox if the state lock is free.
fn settle_inbox(inner: &Arc<ClientInner>) {
    if inner.inbox.lock().is_empty() {
        return;
    }
    let st = match inner.state.try_lock() {
        Some(g) => g,
        None => return,
    };
    release_state(inner, st, Posts::new());
}

fn perform(inner: &Arc<ClientInner>, posts: Posts) {
    for p in posts {
        match p {
            Post::Send(data) => {
                // Posted here, in order, from the caller's (or the receive handler's) context:
                // no task hop before the call is on the wire. Unsignaled: nothing waits for
                // the completion, since a Send that fails means the connection is gone, which
                // the receive handler sees (the flush of its posted Receives) and answers by
                // reconnecting.
                let _ = inner.link().post_send_unsignaled(data);
            }
            Post::Done(tx, result) => {
                let _ = tx.send(result);
            }
            Post::Notify(data, invalidate) => {
                // Like a call's Send: a failure means the connection is gone, which the
                // receive handler sees; the responder invalidates the chunk then.
                let _ = inner.link().post_send_inv_unsignaled(data, invalidate);
            }
            Post::Pull(pull, segments, len) => {
                let (inner2, link) = (inner.clone(), inner.link());
                let ord = inner.cfg.rpc.rrc.ord;
                inner.rt.spawn(async move {
                    let r = link
                        .pull_chunk(&segments, len, ord)
                        .await
                        .map_err(|e| e.to_string());
                    enqueue(&inner2, Work::PullDone(pull, r));
                });
            }
            Post::BackCall(xid, message) => {
                let inner2 = inner.clone();
                inner.rt.spawn(async move {
                    let Some(d) = &inner2.back else { return };
                    let ctx = Arc::new(CallContext {
                        peer: Some(inner2.addr),
                        local: Some(inner2.link().conn.local_addr()),
                        transport: oncrpc::TransportKind::Rdma,
                        back: None,
                    });
                    // RFC 8167 §5: nothing is reduced in the backward direction.
                    if let Some(r) = d.dispatch(message, ctx, DdpPolicy::Inline).await {
                        let mut st = inner2.state.lock();
                        let a = st.req.back_reply(xid, r.message.to_bytes());
                        apply_locked(&inner2, st, a.into_iter().collect());
                    }
                });
            }
            Post::Close => {
                // RFC 8166 §4.5.4: memory that could not be invalidated is fenced by closing the
                // connection, before the RPC completes: the QP is in the error state when
                // `abort` returns, and the completion that follows this action comes after.
                inner.link().conn.abort();
                fail_all(inner, "memory could not be fenced");
            }
        }
    }
}

fn fail_all(inner: &Arc<ClientInner>, why: &str) {
    // Calls still in the inbox are failed as closed when `apply_locked` settles it.
    let mut st = inner.state.lock();
    st.closed = true;
    let waiters = std::mem::take(&mut st.waiters);
    let actions = {
        let ClientState { req, reg, .. } = &mut *st;
        req.on_disconnect(reg)
    };
    // A `Close` among them (a registration that could not be invalidated) is performed too;
    // the waiters are already taken, so it fails nothing twice.
    apply_locked(inner, st, actions);
    for (_, w) in waiters {
        let _ = w.done.send(Err(RpcError::Transport(why.to_string())));
    }
}

async fn client_recv_loop(inner: Arc<ClientInner>, mut rcq: CompletionQueue) {
    loop {
        pump_receives(&inner, &rcq).await;
        // The connection is gone: fence every registration, then reconnect and retransmit
        // the outstanding calls with their XIDs (RFC 8167 §4.3.1: fresh receive buffers).
        let old = inner.link();
        {
            let mut st = inner.state.lock();
            // Replies received before the connection failed are handled first: every
            // successful receive was queued in the inbox before the failed completion woke this
            // task, but a caller holding the state lock may have left it there. After
            // `on_disconnect` their Write chunks' memory is fenced and they would be lost,
            // though the server executed and answered those calls.
            let mut posts = Posts::new();
            work_inbox_locked(&inner, &mut st, &mut posts);
            let actions = {
                let ClientState { req, reg, .. } = &mut *st;
                req.on_disconnect(reg)
            };
            absorb(&mut st, actions, &mut posts);
            release_state(&inner, st, posts);
        }
        old.conn.disconnect().await;
        drop(old);
        let mut next = None;
        for attempt in 0..inner.cfg.reconnect_attempts {
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(6))).await;
            let nrecv = with_state(&inner, |st| st.req.receives_needed());
            if let Ok(x) = open_client_link(inner.addr, &inner.cfg, nrecv).await {
                next = Some(x);
                break;
            }
        }
        let Some((link, cq, params, pd)) = next else {
            fail_all(&inner, "connection lost");
            return;
        };
        inner.reconnects.fetch_add(1, Ordering::Relaxed);
        *inner.link.lock() = link;
        rcq = cq;
        let mut st = inner.state.lock();
        st.reg = VerbsRegistrar::new(pd);
        let ClientState { req, reg, .. } = &mut *st;
        let actions = req.on_connect(params, reg);
        log_version(inner.addr, req);
        apply_locked(&inner, st, actions);
    }
}

/// Handle receive completions until the connection fails.
///
/// They are handled in the provider's context ([`CompletionQueue::set_handler`]): a batch of
/// replies read from the connection completes its calls with no task to wake in between, as
/// Linux's reply handler runs from the receive completion. This task only waits for the
/// first failed completion (a flush: the connection is gone).
async fn pump_receives(inner: &Arc<ClientInner>, rcq: &CompletionQueue) {
    let failed = Arc::new(tokio::sync::Notify::new());
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (weak_inner, weak_link) = (Arc::downgrade(inner), Arc::downgrade(&inner.link()));
    let (f, d) = (failed.clone(), dead.clone());
    let installed = rcq.set_handler(Box::new(move |c| {
        if d.load(Ordering::Acquire) {
            return;
        }
        // A link being dropped (replaced after a reconnect) flushes into a handler that has
        // nothing left to do.
        let (Some(inner), Some(link)) = (weak_inner.upgrade(), weak_link.upgrade()) else {
            return;
        };
        if !on_client_receive(&inner, &link, &c) {
            d.store(true, Ordering::Release);
            f.notify_one();
        }
    }));
    if installed {
        failed.notified().await;
    }
}

/// One receive completion of the client's connection; `false` if the connection failed.
fn on_client_receive(inner: &Arc<ClientInner>, link: &Link, c: &verbs::Completion) -> bool {
    if c.status != WcStatus::Success {
        return false;
    }
    let i = c.wr_id as usize;
    let Some(mr) = link.recv_bufs.get(i) else {
        return false;
    };
    let Ok(msg) = mr.read(0, c.byte_len as usize) else {
        return false;
    };
    if link.post_recv(i).is_err() {
        return false;
    }
    enqueue(inner, Work::Receive(msg, c.invalidated_rkey));
    true
}

/// Cancels a call whose future is dropped before it completes (the caller's own timeout, a
/// `select!` that took another branch, an aborted task).
///
/// RFC 8166 §4.4.1: the memory of a canceled RPC must be fenced from the Responder, since "A
/// Responder cannot know that the Requester is no longer waiting for a reply, and it might
/// proceed to read or even update memory that the Requester might have released for other
/// use." [`Requester::cancel`] takes the XID out of
/// the pending table (a late reply is discarded and counted in `late_replies`) and
/// invalidates every region of the call through the [`VerbsRegistrar`] before `drop`
/// returns.
struct CallGuard<'a> {
    inner: &'a Arc<ClientInner>,
    xid: u32,
    armed: bool,
}

impl CallGuard<'_> {
    fn cancel(&mut self, err: RpcError) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        // Not submitted yet (still in the inbox): nothing of it is registered.
        {
            let mut inbox = self.inner.inbox.lock();
            let before = inbox.len();
            inbox.retain(|w| !matches!(w, Work::Submit(s) if s.call.xid == self.xid));
            if inbox.len() != before {
                return;
            }
        }
        let mut st = self.inner.state.lock();
        let ClientState { req, reg, .. } = &mut *st;
        let actions = req.cancel(self.xid, err, reg);
        // Only `Complete` (whose waiter, if any, is dropped or about to be) and `Close` (an
        // invalidation failed: RFC 8166 §4.5.4, fence by closing) come back from a cancel, with
        // whatever waited in the inbox; none of it needs to run in a task, so this is safe in
        // `drop`.
        apply_locked(self.inner, st, actions);
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.cancel(RpcError::Transport("call dropped before its reply".into()));
    }
}

impl RpcTransport for RdmaClient {
    fn call(&self, req: CallRequest) -> BoxFuture<'_, Result<Bytes, RpcError>> {
        Box::pin(async move {
            let mut req = req;
            let mut tries = 0;
            loop {
                let r = self.call_once(&req).await;
                let Err(RpcError::RdmaErrChunk) = r else {
                    return r;
                };
                // RFC 8267 §3.1: asked for again with a larger Reply chunk, as a new
                // transaction, when the Requester's policy allows (see `CallPolicy`).
                tries += 1;
                let Some(larger) = self.inner.policy.short_reply_retry_size(&req, tries) else {
                    return r;
                };
                self.inner
                    .short_reply_retries
                    .fetch_add(1, Ordering::Relaxed);
                req.reply.max_len = Some(larger);
            }
        })
    }

    fn describe(&self) -> String {
        format!("rdma://{}", self.inner.addr)
    }

    fn rtt(&self) -> Option<Arc<RttTable>> {
        Some(self.inner.state.lock().rtt.clone())
    }
}

impl RdmaClient {
    /// Calls sent again with a larger Reply chunk after RDMA_ERR_CHUNK (RFC 8267 §3.1).
    pub fn short_reply_retries(&self) -> u64 {
        self.inner.short_reply_retries.load(Ordering::Relaxed)
    }

    /// One transmission of a call (a short Reply chunk retry makes another, with a new XID).
    async fn call_once(&self, req: &CallRequest) -> Result<Bytes, RpcError> {
        let inner = &self.inner;
        let xid = inner.next_xid.fetch_add(1, Ordering::Relaxed);
        // How the call is encoded is the Requester's decision (RFC 8166 §6.1, §8.2.2.3).
        let CallEncoding {
            policy,
            no_reduction,
        } = inner.policy.encoding(req);
        let head = req.header(xid);
        let mut enc = Encoder::new().with_policy(policy);
        head.encode(&mut enc);
        (req.args)(&mut enc);
        let timeout = req.timeout.unwrap_or(inner.cfg.call_timeout);
        let call = OutCall {
            xid,
            prog: req.prog,
            vers: req.vers,
            proc_: req.proc_,
            message: enc.finish(),
            reply: req.reply.clone(),
            no_reduction,
            deadline: Some(Instant::now() + timeout),
        };
        let (tx, rx) = oneshot::channel();
        // From here on the call may hold registered memory: if this future is dropped
        // before the call completes, the guard cancels it.
        let mut guard = CallGuard {
            inner,
            xid,
            armed: true,
        };
        enqueue(inner, Work::Submit(Submission { call, done: tx }));
        // No timer here: the Requester owns the call's deadline and completes it with
        // `RpcError::Timeout`, after fencing its memory, when `client_timer` tells it the time.
        match rx.await {
            Ok(r) => {
                // The engine completed it, after fencing its memory.
                guard.armed = false;
                r
            }
            Err(_) => {
                // The waiter went away without a result: make sure nothing stays registered.
                guard.cancel(RpcError::Closed);
                Err(RpcError::Closed)
            }
        }
    }
}
