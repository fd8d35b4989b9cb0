//! The server side: [`RdmaServer`] accepts connections and serves an `oncrpc::Dispatcher`
//! over each; [`ServerConnection`] makes backward-direction calls (RFC 8167).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncrpc::{CallContext, CallHints, Dispatcher, RpcError};
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use verbs::{Device, RecvWr, WcStatus};

use super::back::RdmaBack;
pub use super::back::ServerConnection;
use super::budget::{BudgetedRegistrar, hold_in_budget};
use super::drain::{Posting, QuiesceReport, drain_all};
use super::link::{Link, REPLY_WR, Router, SinkPool, recv_pool, reply_wr};
use super::{DriverError, TransportConfig};
use crate::engine::Params;
use crate::lost::LostReplies;
use crate::privdata::PrivateData;
use crate::responder::{self, Incoming, Responder};
use crate::ulb::{Bindings, UpperLayerBinding};

/// Counters over all connections of a server.
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub connections: AtomicU64,
    pub calls: AtomicU64,
    /// Highest number of calls in progress on one connection.
    pub max_in_progress: AtomicU32,
    /// Calls that arrived beyond the grant (must stay 0 with a well-behaved client).
    pub over_credit: AtomicU64,
}

struct ServerShared {
    dispatcher: Dispatcher,
    ulbs: Arc<Bindings>,
    cfg: TransportConfig,
    /// XIDs whose replies were lost, per peer host (RFC 8166 §4.5.3): stored here between
    /// connections, handed to each connection's Responder.
    lost: Mutex<LostReplies>,
    counters: ServerCounters,
    conns: Mutex<HashMap<u64, Arc<ServerConn>>>,
    next_conn: AtomicU64,
    budget: Arc<oncrpc::MemoryBudget>,
    /// [`RdmaServer::quiesce`] began (set under the `conns` lock): a connection accepted from
    /// now on is closed before it serves a call, and counted in `refused`.
    quiescing: AtomicBool,
    refused: AtomicU64,
}

/// Per-connection state shared by the receive handler, the call tasks and [`ServerConnection`].
pub(super) struct ServerConn {
    pub(super) link: Arc<Link>,
    pub(super) resp: Arc<Mutex<Responder>>,
    pub(super) peer: SocketAddr,
    /// This connection's share of the server's memory budget; `_recv` holds its receive
    /// buffers' part for as long as the connection lives.
    budget: Arc<oncrpc::ConnBudget>,
    _recv: oncrpc::Reservation,
    pub(super) back_waiters: Mutex<HashMap<u32, oneshot::Sender<Result<Bytes, RpcError>>>>,
    pub(super) next_xid: AtomicU32,
    /// The Responder owns the connection's deadlines (RDMA Reads, backward calls);
    /// [`server_timer`] sleeps until `armed` and is woken through `timer` for an earlier one.
    armed: Mutex<Option<Instant>>,
    timer: Notify,
    /// Calls past the Responder's hands whose reply is not yet posted ([`Posting`]).
    pub(super) posting: AtomicU32,
}

impl ServerConn {
    /// A call found no memory for `what`: a warning, unless the connection had closed while
    /// the call waited (its share refuses everything then; nothing was short).
    fn no_memory(&self, e: &oncrpc::BudgetError, what: &str) {
        if matches!(e, oncrpc::BudgetError::Closed { .. }) {
            tracing::debug!(peer = %self.peer,
                "the connection closed while a call waited for memory for {what}");
        } else {
            tracing::warn!(peer = %self.peer, error = %e,
                "no memory for {what}; closing the connection");
        }
    }

    /// Wake the timer if the Responder's next deadline is earlier than what it sleeps until.
    /// Called with the Responder locked (as the timer sets `armed`), so no deadline is missed.
    pub(super) fn arm(&self, resp: &Responder) {
        let Some(next) = resp.next_deadline() else {
            return;
        };
        let mut armed = self.armed.lock();
        if armed.is_none_or(|a| next < a) {
            *armed = Some(next);
            self.timer.notify_one();
        }
    }
}

/// A connection's one timer: sleeps until the Responder's next deadline and hands it `now`
/// ([`Responder::handle_timeout`]); performs what it returns and tells the callers of the
/// backward calls whose time is up. With nothing pending it wakes once every `idle`.
async fn server_timer(sc: Arc<ServerConn>, idle: Duration) {
    loop {
        let until = {
            let r = sc.resp.lock();
            let until = r.next_deadline().unwrap_or_else(|| Instant::now() + idle);
            *sc.armed.lock() = Some(until);
            until
        };
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => {}
            () = sc.timer.notified() => continue,
        }
        let due = sc.resp.lock().handle_timeout(Instant::now());
        for xid in due.back_calls {
            if let Some(tx) = sc.back_waiters.lock().remove(&xid) {
                let _ = tx.send(Err(RpcError::Timeout));
            }
        }
        perform(due.actions, &sc.link, &sc.resp, None).await;
    }
}

/// An RPC-over-RDMA server.
pub struct RdmaServer {
    local: SocketAddr,
    shared: Arc<ServerShared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RdmaServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaServer")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RdmaServer {
    /// Listen on `addr` and serve `dispatcher`; `ulbs` are the Upper-Layer Bindings of the
    /// programs that may use chunks.
    pub async fn bind(
        addr: SocketAddr,
        dispatcher: Dispatcher,
        ulbs: Vec<Arc<dyn UpperLayerBinding>>,
        config: TransportConfig,
    ) -> Result<Self, DriverError> {
        let dev = config.device();
        let mut listener = dev.listen(addr).await?;
        let local = listener.local_addr();
        let shared = Arc::new(ServerShared {
            dispatcher,
            ulbs: Arc::new(ulbs.into_iter().map(|u| (u.program(), u)).collect()),
            lost: Mutex::new(LostReplies::new()),
            counters: ServerCounters::default(),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            quiescing: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            budget: config
                .budget
                .clone()
                .unwrap_or_else(oncrpc::MemoryBudget::machine_default),
            cfg: config,
        });
        let sh = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok(req) = listener.accept().await {
                let sh = sh.clone();
                let dev = dev.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_connection(dev, req, sh).await {
                        tracing::debug!(error = %e, "RPC-over-RDMA connection ended");
                    }
                });
            }
        });
        Ok(RdmaServer {
            local,
            shared,
            task,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn counters(&self) -> &ServerCounters {
        &self.shared.counters
    }

    /// The memory budget the connections draw from.
    pub fn budget(&self) -> &Arc<oncrpc::MemoryBudget> {
        &self.shared.budget
    }

    /// Stop serving without losing a reply (a clean shutdown): accept no more connections
    /// (one accepted meanwhile is closed before it serves a call), then drain every
    /// connection at once ([`ServerConnection::drain`]): new calls are dropped unanswered,
    /// calls already accepted are answered and their replies' work requests complete, then
    /// the connection closes. Bounded by `deadline`; the report says what was left.
    pub async fn quiesce(&self, deadline: Instant) -> QuiesceReport {
        self.task.abort();
        let conns: Vec<ServerConnection> = {
            let conns = self.shared.conns.lock();
            self.shared.quiescing.store(true, Ordering::Release);
            conns
                .values()
                .map(|c| ServerConnection::new(c.clone()))
                .collect()
        };
        let connections = drain_all(conns, deadline).await;
        QuiesceReport {
            connections,
            refused: self.shared.refused.load(Ordering::Relaxed),
        }
    }

    /// The connections currently established.
    pub fn connections(&self) -> Vec<ServerConnection> {
        self.shared
            .conns
            .lock()
            .values()
            .map(|c| ServerConnection::new(c.clone()))
            .collect()
    }
}

async fn serve_connection(
    dev: Device,
    req: verbs::ConnectRequest,
    sh: Arc<ServerShared>,
) -> Result<(), DriverError> {
    let cfg = &sh.cfg.rpc;
    let peer_pd = PrivateData::decode(req.private_data());
    let mut params: Params = cfg.negotiate(peer_pd).into();
    // cel-05 §3.3: a server that may speak version 2 posts receives of at least 4096 bytes
    // (the size it announces as RBSIZ); the default (8192) is above that floor already.
    params.inline_recv = params.inline_recv.max(cfg.recv_buffer_size(false) as usize);
    let peer = req.peer_addr();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq();
    let rcq = dev.create_cq();
    let qp = dev.create_qp(&pd, &scq, &rcq);
    let lost = sh.lost.lock().take(peer.ip());
    let mut resp = Responder::new(cfg.clone(), params, sh.ulbs.clone(), lost);
    resp.set_read_timeout(Some(sh.cfg.rdma_timeout));
    let budget = sh.budget.connection();
    if cfg.rrc.enabled {
        // Responder-provided Read chunks are registered in the connection's protection
        // domain, for remote read only, with the provider's random STags, and held in the
        // connection's memory budget until they are invalidated.
        resp.set_registrar(Box::new(BudgetedRegistrar {
            inner: super::link::VerbsRegistrar::new(pd.clone()),
            budget: budget.clone(),
            held: HashMap::new(),
        }));
    }
    let nrecv = resp.receives_needed();
    // The receive buffers are the first thing a connection costs: refuse it when they do not
    // fit in the budget (backpressure on new connections; the ones already served go on).
    let recv_reservation = match budget.try_reserve(nrecv * params.inline_recv) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "RPC-over-RDMA connection refused: memory budget");
            let _ = req.reject(&[]).await;
            return Ok(());
        }
    };
    let recv_bufs = recv_pool(&pd, nrecv, params.inline_recv)?;
    // Receives go up before the connection is accepted: the grant is backed by posted buffers.
    for (i, mr) in recv_bufs.iter().enumerate() {
        qp.post_recv(RecvWr::new(i as u64, mr.sge(0, mr.len() as u32)))?;
    }
    let conn = req.accept(&qp, sh.cfg.conn_params()).await?;
    sh.counters.connections.fetch_add(1, Ordering::Relaxed);
    let router = Arc::new(Router::default());
    let router_task = tokio::spawn(router.clone().run(scq.clone()));
    let link = Arc::new(Link {
        qp,
        conn,
        recv_bufs,
        router,
        router_task,
        read_sinks: SinkPool::default(),
    });
    let resp = Arc::new(Mutex::new(resp));
    {
        let (resp, sh) = (resp.clone(), sh.clone());
        let (weak_link, rt) = (Arc::downgrade(&link), tokio::runtime::Handle::current());
        *link.router.on_reply_failed.lock() = Some(Box::new(move |xid| {
            // RFC 8166 §4.5.4: the connection is already gone (the Send was flushed); §4.5.3:
            // the retransmission on the next connection is answered with ERR_CHUNK.
            let actions = resp.lock().reply_failed(xid);
            // Its `Close` is performed all the same (the connection may not have noticed yet).
            if let Some(link) = weak_link.upgrade() {
                let resp = resp.clone();
                rt.spawn(async move { perform(actions, &link, &resp, None).await });
            }
            let lost = resp.lock().take_lost();
            sh.lost.lock().record(peer.ip(), lost);
        }));
    }
    let conn_id = sh.next_conn.fetch_add(1, Ordering::Relaxed);
    let sc = Arc::new(ServerConn {
        link: link.clone(),
        resp: resp.clone(),
        peer,
        budget,
        _recv: recv_reservation,
        back_waiters: Mutex::new(HashMap::new()),
        next_xid: AtomicU32::new(rand::random::<u32>()),
        armed: Mutex::new(None),
        timer: Notify::new(),
        posting: AtomicU32::new(0),
    });
    let refused = {
        let mut conns = sh.conns.lock();
        let q = sh.quiescing.load(Ordering::Acquire);
        if !q {
            conns.insert(conn_id, sc.clone());
        }
        q
    };
    if refused {
        // The server quiesces: this connection came too late to be drained with the others,
        // and has served nothing. Its client retries on the next instance.
        sh.refused.fetch_add(1, Ordering::Relaxed);
        // The replies this peer lost before (taken for this connection) stay remembered.
        let lost = resp.lock().take_lost();
        sh.lost.lock().record(peer.ip(), lost);
        link.conn.disconnect().await;
        link.router_task.abort();
        link.router.close();
        return Ok(());
    }
    let timer_task = tokio::spawn(server_timer(sc.clone(), sh.cfg.rdma_timeout));
    let ctx = Arc::new(CallContext {
        peer: Some(peer),
        local: Some(link.conn.local_addr()),
        transport: oncrpc::TransportKind::Rdma,
        back: Some(oncrpc::BackHandle(Arc::new(RdmaBack(Arc::downgrade(&sc))))),
    });
    // Receives are handled in the provider's context (see `pump_receives`); this task waits
    // for the first failed one.
    let failed = Arc::new(tokio::sync::Notify::new());
    {
        let dead = std::sync::atomic::AtomicBool::new(false);
        let (f, weak_sc, rt) = (
            failed.clone(),
            Arc::downgrade(&sc),
            tokio::runtime::Handle::current(),
        );
        let (sh, ctx) = (sh.clone(), ctx.clone());
        let installed = rcq.set_handler(Box::new(move |c| {
            if dead.load(Ordering::Acquire) {
                return;
            }
            let Some(sc) = weak_sc.upgrade() else { return };
            if !on_server_receive(&sc, &sh, &ctx, &rt, &c) {
                dead.store(true, Ordering::Release);
                f.notify_one();
            }
        }));
        if installed {
            failed.notified().await;
        }
    }
    sh.conns.lock().remove(&conn_id);
    timer_task.abort();
    let lost = {
        let mut r = resp.lock();
        // No call starts RDMA Reads from now on, no backward call is accepted, and no
        // deadline is left to wait for (the timer is gone).
        r.connection_closed();
        r.take_lost()
    };
    // After the Responder is closed: a backward call either was accepted before (its waiter
    // is in the map by then, and ends here) or is refused.
    sc.back_waiters.lock().clear();
    sh.lost.lock().record(peer.ip(), lost);
    // Calls waiting for memory (their Read chunks' sinks, their replies) end at once instead
    // of being given it once other calls of this connection let theirs go.
    sc.budget.close();
    link.conn.disconnect().await;
    link.router_task.abort();
    // Calls still waiting for an RDMA Read (a peer that never answered) end now, so their
    // sinks and memory go back at once rather than whenever the tasks are next polled; and a
    // wait begun after this point ends at once (nothing routes its completion any more).
    link.router.close();
    // Replies flushed by the disconnect that the router did not get to (it may be cancelled
    // mid-way; what it did report is already recorded).
    while let Some(c) = scq.try_next() {
        link.router.note_status(c.status);
        if c.wr_id & REPLY_WR != 0
            && link.router.reply_lost(c.status)
            && let Some(f) = &*link.router.on_reply_failed.lock()
        {
            f(c.wr_id as u32);
        }
    }
    Ok(())
}

/// One receive completion of a server connection; `false` if the connection failed.
fn on_server_receive(
    sc: &Arc<ServerConn>,
    sh: &Arc<ServerShared>,
    ctx: &Arc<CallContext>,
    rt: &tokio::runtime::Handle,
    c: &verbs::Completion,
) -> bool {
    if c.status != WcStatus::Success {
        return false;
    }
    let link = &sc.link;
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
    // Replies lost on an earlier connection of this peer (RFC 8166 §4.5.3).
    let lost = sh.lost.lock().take(sc.peer.ip());
    let (inc, hints) = {
        let mut r = sc.resp.lock();
        if !lost.is_empty() {
            r.note_lost(lost);
        }
        let inc = r.on_receive_with(msg, c.invalidated_rkey);
        let hints = hints_for(&r, &inc);
        (inc, hints)
    };
    let (sc, sh, ctx) = (sc.clone(), sh.clone(), ctx.clone());
    let mut fut = Box::pin(async move {
        handle_incoming(inc, hints, &sc, &sh, ctx).await;
    });
    // A call that finishes at once (no RDMA Read to wait for, a service that answers without
    // waiting) is handled here, with no task to spawn and wake; the others continue in their
    // own task (polled again there, with its waker) so that calls proceed concurrently.
    // (rdma-core runs this on its completion thread: enter the runtime for what the service
    // calls, such as `spawn_blocking`.)
    let _rt = rt.enter();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        rt.spawn(fut);
    }
    true
}

/// A call's hints as it is handed to the Upper Layer. Alone: it is the only call the Responder
/// holds (none other executing, no RDMA Read pulling another's chunks). A call whose Read
/// chunks were pulled first is judged when the pull is done, so that a lone NFS WRITE with
/// its data in a Read chunk finishes on the calling task as it does over TCP, instead of on a
/// blocking thread.
fn hints_for(r: &Responder, inc: &Incoming) -> CallHints {
    let u = r.unfinished();
    let alone = matches!(inc, Incoming::Call(_)) && u.executing == 1 && u.pulling == 0;
    CallHints::alone_if(alone)
}

/// What the RDMA Reads of a call brought.
enum Read {
    /// The whole call, pulled around its one Read chunk, and the chunk's length.
    Framed(Bytes, usize),
    /// Each Read chunk's contents.
    Chunks(Vec<Bytes>),
}

async fn handle_incoming(
    mut inc: Incoming,
    mut hints: CallHints,
    sc: &ServerConn,
    sh: &ServerShared,
    ctx: Arc<CallContext>,
) {
    let (link, resp) = (&*sc.link, &*sc.resp);
    let timeout = sh.cfg.rdma_timeout;
    // The reply a call may produce: one inline message and what the client offered for it,
    // reserved before the call runs, so that a client that never takes its replies cannot
    // make the server build more of them than its budget holds (capped at the connection's
    // share: a reply beyond it reserves again when it is built).
    // The inline part is what the Responder may Send on this connection (the client's receive
    // size bounds it), not the configured send size, which may be far larger.
    let reply_estimate = |offered: usize| {
        let inline = resp.lock().inline_send();
        (offered.saturating_add(inline)).min(sc.budget.limit())
    };
    // Memory this call holds (its Read-chunk sinks and its reply), given back when the call
    // is done.
    let mut held = Vec::new();
    loop {
        match inc {
            Incoming::Nothing => return,
            Incoming::BackReply { xid, message } => {
                if let Some(tx) = sc.back_waiters.lock().remove(&xid) {
                    let _ = tx.send(Ok(message));
                }
                // A backward credit came back: queued backward calls may go now.
                let a = resp.lock().poll_back();
                perform(a, link, resp, None).await;
                return;
            }
            Incoming::Respond(actions) => {
                // (A notification may have let parked replies go: their pull deadlines.)
                sc.arm(&resp.lock());
                perform(actions, link, resp, None).await;
                return;
            }
            Incoming::NeedReads(p) => {
                // The sinks are what a client's header makes the server allocate: take them
                // from the connection's budget first, waiting for memory other calls give back
                // (calls queue), and close the connection if none comes in time.
                let want: usize = p
                    .reads
                    .iter()
                    .map(|c| c.segments.iter().map(|s| s.length as usize).sum::<usize>())
                    .sum::<usize>()
                    + p.frame()
                        .map_or(0, |(_, pre, post)| pre.len() + post.len() + 3)
                    // With them, the call's reply (one reservation: a call never holds part
                    // of its memory while it waits for the rest).
                    + reply_estimate(p.reply_offered_len());
                match sc.budget.reserve(want, timeout).await {
                    Ok(r) => held.push(r),
                    // The connection closed while the call waited: it is dropped.
                    Err(oncrpc::BudgetError::Closed { .. }) => {
                        let a = resp.lock().reads_failed(p);
                        perform(a, link, resp, None).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(peer = %sc.peer, error = %e,
                            "no memory for a call's Read chunks; closing the connection");
                        // The call cannot be pulled: the Responder drops it and closes.
                        let a = resp.lock().reads_failed(p);
                        perform(a, link, resp, None).await;
                        return;
                    }
                }
                // The Responder owns the Reads' deadline (`TransportConfig::rdma_timeout`): a
                // peer that does not answer them in time loses the connection, which ends
                // the waits below.
                // (A call that waited for its memory while the connection closed posts nothing:
                // its Reads would be flushed, or never completed.)
                let refused = {
                    let mut r = resp.lock();
                    let started = r.reads_started(&p, Instant::now());
                    sc.arm(&r);
                    !started
                };
                if refused {
                    let a = resp.lock().reads_failed(p);
                    perform(a, link, resp, None).await;
                    return;
                }
                let read = match p.frame() {
                    // One chunk in the middle of the call (an NFS WRITE's data): pull it into
                    // a buffer that gets the rest of the call around it.
                    Some((_, pre, post)) => link
                        .read_chunk_framed(&p.reads[0].segments, pre, post)
                        .await
                        .map(|(message, n)| Read::Framed(message, n)),
                    None => {
                        let mut data = Vec::with_capacity(p.reads.len());
                        let mut failed = None;
                        for c in &p.reads {
                            match link.read_chunk(&c.segments).await {
                                Ok(d) => data.push(d),
                                Err(e) => {
                                    failed = Some(e);
                                    break;
                                }
                            }
                        }
                        match failed {
                            Some(e) => Err(e),
                            None => Ok(Read::Chunks(data)),
                        }
                    }
                };
                inc = match read {
                    Ok(Read::Framed(message, n)) => {
                        let mut r = resp.lock();
                        let inc = r.complete_reads_framed(p, message, n);
                        hints = hints_for(&r, &inc);
                        inc
                    }
                    Ok(Read::Chunks(data)) => {
                        let mut r = resp.lock();
                        let inc = r.complete_reads(p, data);
                        hints = hints_for(&r, &inc);
                        inc
                    }
                    Err(e) => {
                        tracing::info!(peer = %sc.peer, error = %e,
                            "RDMA Read of a Read chunk failed; closing the connection");
                        // RFC 8166 §4.5.3: RDMA operational errors are fatal to the connection
                        // (the Responder answers with `Close`).
                        let a = resp.lock().reads_failed(p);
                        perform(a, link, resp, None).await;
                        return;
                    }
                };
            }
            Incoming::Call(call) => {
                if held.is_empty() {
                    match sc
                        .budget
                        .reserve(reply_estimate(call.token.offered_len()), timeout)
                        .await
                    {
                        Ok(r) => held.push(r),
                        Err(e) => {
                            sc.no_memory(&e, "a call's reply");
                            // RFC 8166 §4.5.4: a reply that cannot be sent closes the connection.
                            let xid = call.token.xid;
                            let a = resp.lock().send_failed(Some(xid), false);
                            perform(a, link, resp, Some(xid)).await;
                            return;
                        }
                    }
                }
                {
                    let r = resp.lock();
                    let s = r.stats();
                    sh.counters.calls.fetch_add(1, Ordering::Relaxed);
                    sh.counters
                        .max_in_progress
                        .fetch_max(s.max_in_progress, Ordering::Relaxed);
                    sh.counters
                        .over_credit
                        .store(s.over_credit, Ordering::Relaxed);
                }
                let reply = sh
                    .dispatcher
                    .dispatch_hinted(call.message, ctx.clone(), call.policy, hints)
                    .await;
                let xid = call.token.xid;
                let (actions, _posting) = {
                    let mut r = resp.lock();
                    let a = r.reply(call.token, reply);
                    // A responder-provided Read chunk's pull deadline.
                    sc.arm(&r);
                    // From the Responder's hands to the end of `perform` the reply is the
                    // driver's: counted under the Responder's lock, so a drain sees the call
                    // in one count or the other, never in neither.
                    (a, Posting::new(sc))
                };
                // The call's sinks are done with (what the reply still uses of them is counted
                // with the reply): what the call reserved shrinks to the reply.
                let pre = held.pop();
                held.clear();
                // A reply's buffers stay in the send queue until the peer takes them (one that
                // never reads keeps them there): they come out of the connection's budget, and
                // are given back when the transport drops the last of them.
                let actions = match hold_in_budget(actions, &sc.budget, timeout, pre).await {
                    Ok(a) => a,
                    Err(e) => {
                        sc.no_memory(&e, "a reply");
                        // RFC 8166 §4.5.4: a reply that cannot be sent closes the connection
                        // (no operational error: the retransmission is executed again).
                        let a = resp.lock().send_failed(Some(xid), false);
                        perform(a, link, resp, Some(xid)).await;
                        return;
                    }
                };
                perform(actions, link, resp, Some(xid)).await;
                let lost = resp.lock().take_lost();
                sh.lost.lock().record(sc.peer.ip(), lost);
                return;
            }
        }
    }
}

/// Perform the Responder's actions in order, every one of them: RDMA Writes and Sends are
/// posted, `Close` closes the connection. A Write or Send that cannot be posted is reported to
/// the Responder ([`Responder::send_failed`]), whose answer (a `Close`) replaces what was left
/// of the reply. `xid` is the call a reply answers (its Send is posted unsignaled and reported
/// through the router if it fails later); `None` for messages that are not replies.
pub(super) async fn perform(
    actions: Vec<responder::Action>,
    link: &Link,
    resp: &Mutex<Responder>,
    xid: Option<u32>,
) {
    use responder::Action;
    let mut todo = std::collections::VecDeque::from(actions);
    while let Some(a) = todo.pop_front() {
        let r = match a {
            // A reply's RDMA Writes and its Send, posted together: on soft-iWARP they then
            // leave in one `writev` (each post of its own went out at once, in a `writev` of
            // its own, as the first answers of a batch do). The reply relies only on the
            // Writes being posted before the Send (RDMA Writes are ordered with respect to a
            // later Send: RFC 8166, "RDMA Transport Requirements"), which one list keeps.
            Action::Write { segment, data } if xid.is_some() => {
                let mut wrs = vec![link.write_wr(segment, data)];
                while let Some(Action::Write { .. }) = todo.front() {
                    if let Some(Action::Write { segment, data }) = todo.pop_front() {
                        wrs.push(link.write_wr(segment, data));
                    }
                }
                if let (Some(x), Some(Action::Send { .. })) = (xid, todo.front())
                    && link.qp.state() != verbs::QpState::Error
                    && let Some(Action::Send { data, invalidate }) = todo.pop_front()
                {
                    wrs.push(reply_wr(data, invalidate, x));
                }
                link.qp.post_send_list(wrs)
            }
            Action::Write { segment, data } => link.write(segment, data),
            // A reply posted to a QP already in error would only be flushed, after the
            // connection's receive handler has stopped listening for it: count it failed now.
            Action::Send { .. } if link.qp.state() == verbs::QpState::Error => {
                Err(verbs::VerbsError::Disconnected)
            }
            Action::Send { data, invalidate } => match xid {
                Some(x) => link.post_reply(data, invalidate, x),
                None => link.send(data, invalidate).await,
            },
            Action::Close => {
                // RFC 8166 §4.5.4: a reply that cannot be sent closes the connection.
                tracing::info!(xid = ?xid, "the Responder closes the connection");
                link.conn.disconnect().await;
                return;
            }
        };
        if let Err(e) = r {
            tracing::info!(error = %e, xid = ?xid, "reply could not be sent; closing the connection");
            // RFC 8166 §4.5.3: the XID is answered with RDMA_ERR_CHUNK after a reconnect only
            // when an RDMA operational error broke the connection (see `Router::reply_lost`).
            let op_error = link.router.op_error.load(Ordering::Relaxed);
            todo = resp.lock().send_failed(xid, op_error).into();
        }
    }
}
