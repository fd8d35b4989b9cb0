//! Hostile clients against an in-process NFS server with a small memory budget and a short
//! `rdma_timeout` (issue 20), each through `tools::proxy::FaultProxy`:
//! - Long Calls whose Read chunks are never delivered: the budget holds, the server closes
//!   the connection after the timeout and its memory is back at once;
//! - connections that connect and stall: the budget holds, connections beyond it are
//!   refused;
//! - clients at full credits that never read their replies, over RPC-over-RDMA and over
//!   TCP: what the server holds for them is bounded.
//!
//! In every case a well-behaved client on another connection is served meanwhile. The
//! budget's use is sampled while the hostile clients run, besides its own recorded peak. No
//! timing assertions: every wait is on an event (the budget's counters, a connection ending),
//! with a generous bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use nfs::ulb::NfsBinding;
use oncrpc::{MemoryBudget, RpcTransport, TcpClient, TcpServer};
use rpcrdma::{RdmaServer, TransportConfig};
use tools::hostile::{Hostiles, Polite, Target};

const MIB: usize = 1 << 20;
/// The server's RDMA timeout in these tests (the default is 30 s).
const RDMA_TIMEOUT: Duration = Duration::from_secs(2);
/// TCP server: replies waiting per connection, and calls in flight.
const TCP_QUEUED: usize = 2 * MIB;
const TCP_IN_FLIGHT: usize = 8;

struct Server {
    _tmp: tempfile::TempDir,
    _served: nfs::serve::Served,
    rdma: RdmaServer,
    tcp: TcpServer,
    budget: Arc<MemoryBudget>,
    target: Target,
}

async fn server(budget: Arc<MemoryBudget>) -> Server {
    server_with(budget, None).await
}

/// A server whose TCP listener closes connections that take none of their replies for
/// `send_timeout` (`None`: never).
async fn server_with(budget: Arc<MemoryBudget>, send_timeout: Option<Duration>) -> Server {
    let tmp = tempfile::tempdir().unwrap();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut sc = nfs::serve::ServeConfig::new(tmp.path());
    sc.tcp = Some(local);
    sc.portmap = None;
    sc.rdma = None;
    let served = nfs::serve::start(sc).await.unwrap();
    let cfg = TransportConfig {
        budget: Some(budget.clone()),
        rdma_timeout: RDMA_TIMEOUT,
        ..TransportConfig::default()
    };
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(NfsBinding::new());
    let rdma = RdmaServer::bind(local, (*served.nfs_dispatcher()).clone(), vec![ulb], cfg)
        .await
        .unwrap();
    // The NFS port's settings (`nfs serve`), drawing from the same budget as RDMA.
    let tcp = TcpServer::bind(
        local,
        served.nfs_dispatcher(),
        nfs::serve::nfs_tcp_config(Some(budget.clone()), send_timeout)
            .with_max_in_flight(TCP_IN_FLIGHT)
            .with_max_queued_reply_bytes(TCP_QUEUED),
    )
    .await
    .unwrap();
    let target = Target::mount(rdma.local_addr(), tcp.local_addr(), "data", MIB)
        .await
        .unwrap();
    // The TCP connection that mounted counts in the budget until the server sees it close:
    // the tests' idle values are taken after it has.
    eventually("the mounting client gone", || budget.connections() == 0).await;
    Server {
        _tmp: tmp,
        _served: served,
        rdma,
        tcp,
        budget,
        target,
    }
}

/// Samples `budget.used()` until dropped; the most seen.
struct Sampler {
    max: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(budget: &Arc<MemoryBudget>) -> Self {
        let (max, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (b, m, s) = (budget.clone(), max.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(b.used(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        Sampler { max, stop, task }
    }

    async fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.max.load(Ordering::Relaxed)
    }
}

/// Wait (bounded: 60 s) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached within 60 s");
}

fn assert_within(budget: &MemoryBudget, sampled: usize) {
    assert!(
        sampled <= budget.limit() && budget.peak() <= budget.limit(),
        "sampled {sampled}, peak {} over the limit {}",
        budget.peak(),
        budget.limit()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_never_answered_time_out_and_give_their_memory_back() {
    // 12 MiB for the server, 4 MiB per connection: each hostile connection's 64 WRITEs of
    // 1 MiB would need 64 MiB of sinks.
    let s = server(MemoryBudget::new(12 * MIB, 4 * MIB)).await;
    let b = &s.budget;
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    let (idle, idle_conns) = (b.used(), b.connections());
    assert_eq!(idle_conns, 1);
    let sampler = Sampler::start(b);
    let h = Hostiles::long_calls(&s.target, 2).await.unwrap();
    assert_eq!(h.connected(), 2);
    // The hostile calls hold sinks, waiting for Read Responses that never come.
    eventually("hostile sinks held", || b.used() >= idle + MIB).await;
    // The well-behaved client is served meanwhile.
    assert_eq!(polite.rounds(5).await, (15, 0));
    // After the RDMA timeout the server closes both connections...
    assert_eq!(h.wait_closed(Duration::from_secs(60)).await, 2);
    // ...and their memory is back as soon as they are gone: the budget is at its idle value.
    eventually("hostile connections released", || {
        b.connections() == idle_conns
    })
    .await;
    assert_eq!(b.used(), idle);
    assert_eq!(h.release().await, 0, "no hostile WRITE completed");
    assert_within(b, sampler.finish().await);
    assert_eq!(polite.rounds(2).await, (6, 0));
    assert_eq!(polite.client().reconnects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_stay_in_the_budget_and_the_rest_are_refused() {
    // Receive buffers are 66 × 4 KiB = 264 KiB per connection: 2 MiB has room for seven.
    let s = server(MemoryBudget::new(2 * MIB, 2 * MIB)).await;
    let b = &s.budget;
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    let (idle, idle_conns) = (b.used(), b.connections());
    let sampler = Sampler::start(b);
    let refusals = b.refusals();
    let h = Hostiles::stalled(&s.target, 10).await.unwrap();
    assert!(h.connected() >= 1, "some hostile connections fit");
    assert!(
        h.refused() >= 1,
        "the connections beyond the budget are refused"
    );
    assert!(b.refusals() > refusals);
    assert_eq!(h.connected() + h.refused(), 10);
    assert_eq!(b.connections(), idle_conns + h.connected());
    // The well-behaved client, connected before them, is still served.
    assert_eq!(polite.rounds(5).await, (15, 0));
    h.release().await;
    eventually("stalled connections released", || {
        b.connections() == idle_conns
    })
    .await;
    assert_eq!(b.used(), idle);
    assert_within(b, sampler.finish().await);
    assert_eq!(polite.client().reconnects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_never_read_over_rdma_are_bounded_by_the_budget() {
    let s = server(MemoryBudget::new(12 * MIB, 4 * MIB)).await;
    let b = &s.budget;
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    let (idle, idle_conns) = (b.used(), b.connections());
    let sampler = Sampler::start(b);
    let refusals = b.refusals();
    let h = Hostiles::unread(&s.target, 2).await.unwrap();
    assert_eq!(h.connected(), 2);
    // The unread replies fill the hostile connections' shares: later replies must wait.
    eventually("hostile replies held up to the connection's share", || {
        b.refusals() > refusals
    })
    .await;
    assert_eq!(polite.rounds(5).await, (15, 0));
    h.release().await;
    eventually("hostile connections released", || {
        b.connections() == idle_conns
    })
    .await;
    assert_eq!(b.used(), idle);
    assert_within(b, sampler.finish().await);
    assert_eq!(polite.client().reconnects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_never_read_over_tcp_are_bounded_per_connection() {
    let s = server(MemoryBudget::new(64 * MIB, 16 * MIB)).await;
    let st = s.tcp.stats().clone();
    let h = Hostiles::unread_tcp(&s.target, 2, 64).await.unwrap();
    assert_eq!(h.connected(), 2);
    // The server stops reading their calls once their replies pile up.
    eventually("reader paused", || st.read_pauses() >= 2).await;
    // A well-behaved TCP client (and the RDMA one) are served meanwhile.
    let t: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(s.tcp.local_addr()).await.unwrap());
    let nfs = nfs::client::Nfs3Client::new(t);
    for _ in 0..3 {
        let r = nfs.read(&s.target.file, 0, MIB as u32).await.unwrap();
        assert_eq!(r.into_result().unwrap().data.0.len(), MIB);
    }
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    assert_eq!(polite.rounds(3).await, (9, 0));
    // Per hostile connection, the replies of the calls admitted before the reader paused:
    // the in-flight limit for the first burst (before any reply was seen), then the queue
    // bound; plus the well-behaved client's one reply (a READ reply is 1 MiB and about 200
    // bytes of header).
    let reply = MIB + 4096;
    let bound = (2 * TCP_IN_FLIGHT + 1) * reply;
    assert!(
        st.peak_queued_reply_bytes() <= bound,
        "peak {} over {bound}",
        st.peak_queued_reply_bytes()
    );
    h.release().await;
    eventually("queued replies dropped with their connections", || {
        st.queued_reply_bytes() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_never_read_over_tcp_stay_in_the_shared_budget() {
    // One budget for both transports: 12 MiB, 4 MiB per connection. Each hostile connection
    // asks for 64 READs of 1 MiB (64 MiB of replies) and reads none of them.
    let s = server(MemoryBudget::new(12 * MIB, 4 * MIB)).await;
    let b = &s.budget;
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    let (idle, idle_conns) = (b.used(), b.connections());
    let st = s.tcp.stats().clone();
    let sampler = Sampler::start(b);
    let h = Hostiles::unread_tcp(&s.target, 2, 64).await.unwrap();
    assert_eq!(h.connected(), 2);
    assert_eq!(
        b.connections(),
        idle_conns + 2,
        "TCP connections hold a share"
    );
    // Their readers stop (at the per-connection pace or for want of memory, whichever comes
    // first) with what they hold in the budget: at least the 2 MiB pace each (every queued
    // reply and executing call is reserved at no less than its size).
    eventually("hostile TCP replies held in the budget", || {
        st.read_pauses() >= 2 && b.used() >= idle + 2 * TCP_QUEUED
    })
    .await;
    // A well-behaved TCP client and the RDMA one are served meanwhile.
    let t: Arc<dyn RpcTransport> = Arc::new(TcpClient::connect(s.tcp.local_addr()).await.unwrap());
    let nfs = nfs::client::Nfs3Client::new(t);
    for _ in 0..3 {
        let r = nfs.read(&s.target.file, 0, MIB as u32).await.unwrap();
        assert_eq!(r.into_result().unwrap().data.0.len(), MIB);
    }
    assert_eq!(polite.rounds(5).await, (15, 0));
    assert_eq!(h.closed(), 0, "backpressure, not a closed connection");
    h.release().await;
    drop(nfs);
    eventually("hostile connections released", || {
        b.connections() == idle_conns
    })
    .await;
    assert_within(b, sampler.finish().await);
    // With every client gone, nothing is left reserved.
    drop(polite);
    eventually("every connection's memory back", || {
        b.connections() == 0 && b.used() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_client_that_takes_no_replies_is_closed_and_its_memory_returned() {
    let s = server_with(MemoryBudget::new(12 * MIB, 4 * MIB), Some(RDMA_TIMEOUT)).await;
    let b = &s.budget;
    let mut polite = Polite::connect(&s.target, "polite").await.unwrap();
    let (idle, idle_conns) = (b.used(), b.connections());
    let sampler = Sampler::start(b);
    let h = Hostiles::unread_tcp(&s.target, 2, 64).await.unwrap();
    assert_eq!(h.connected(), 2);
    eventually("hostile TCP replies held", || b.used() >= 4 * MIB).await;
    // Their replies stay untaken: after the send timeout the server closes both and their
    // memory is back, while the hostile clients still hold their ends. (A client may
    // reconnect and retransmit meanwhile, through a proxy connection that relays: its READs
    // are answered and its new connection holds no more than its receive buffer.)
    eventually("hostile connections closed and their memory back", || {
        b.used() < idle + MIB
    })
    .await;
    assert_eq!(polite.rounds(5).await, (15, 0));
    h.release().await;
    eventually("hostile clients gone", || b.connections() == idle_conns).await;
    assert_within(b, sampler.finish().await);
    drop(polite);
    eventually("every connection's memory back", || {
        b.connections() == 0 && b.used() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_call_to_a_client_that_reads_nothing_times_out() {
    // Room for every unread reply: the Sends queue up behind them instead of the server
    // closing the connection for want of memory.
    let s = server(MemoryBudget::new(256 * MIB, 256 * MIB)).await;
    let b = &s.budget;
    let h = Hostiles::unread(&s.target, 1).await.unwrap();
    eventually("unread replies queued beyond what the sockets hold", || {
        b.used() >= 32 * MIB
    })
    .await;
    let conns = s.rdma.connections();
    assert_eq!(conns.len(), 1);
    conns[0].enable_backchannel();
    // RFC 8167 backward call (NFSv4.1 CB_NULL shape): it cannot be sent, and must not wait
    // longer than its timeout for that.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        conns[0].back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(2)),
    )
    .await
    .expect("back_call returns at its own timeout");
    assert!(matches!(r, Err(oncrpc::RpcError::Timeout)), "{r:?}");
    // A second one queues behind the first's credit and times out the same way.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        conns[0].back_call(0x4000_0000, 1, 0, |_| {}, Duration::from_secs(2)),
    )
    .await
    .expect("back_call returns at its own timeout");
    assert!(matches!(r, Err(oncrpc::RpcError::Timeout)), "{r:?}");
    drop(conns);
    h.release().await;
    eventually("memory returned", || b.connections() == 0).await;
    assert_eq!(b.used(), 0);
}
