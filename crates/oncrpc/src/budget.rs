//! Memory budgets a server keeps whatever its clients do.
//!
//! A [`MemoryBudget`] is one server's limit on the bytes that clients can make it hold: receive
//! buffers, Read-chunk sinks, replies waiting for their RDMA Writes, backchannel state, receive
//! queues. Each connection draws from it through a [`ConnBudget`], which has a limit of its own,
//! so one client cannot take the whole server's share. A byte count is held by a
//! [`Reservation`] and given back when the reservation is dropped, so memory returns to the
//! budget the moment the buffer it stands for is released (a closed connection drops its
//! reservations with its state, not when some later call arrives).
//!
//! The budget only counts; it does not allocate. A transport asks for a reservation *before* it
//! allocates what a peer asked for, and applies backpressure when the answer is no (fewer
//! credits, a queued call, a refused connection) — never an abort. [`ConnBudget::under_pressure`]
//! tells when to start granting less.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// The connection's own limit would be exceeded.
    #[error(
        "connection memory budget exceeded: {requested} bytes requested, {used} of {limit} in use"
    )]
    Connection {
        requested: usize,
        used: usize,
        limit: usize,
    },
    /// The server-wide limit would be exceeded.
    #[error("server memory budget exceeded: {requested} bytes requested, {used} of {limit} in use")]
    Server {
        requested: usize,
        used: usize,
        limit: usize,
    },
    /// The connection is closed ([`ConnBudget::close`]): it reserves nothing more.
    #[error("connection closed: {requested} bytes requested")]
    Closed { requested: usize },
}

/// A server-wide byte budget shared by all of its connections.
pub struct MemoryBudget {
    limit: usize,
    per_connection: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    refusals: AtomicU64,
    connections: AtomicUsize,
    /// Woken whenever a reservation is given back, for [`ConnBudget::reserve`].
    freed: tokio::sync::Notify,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limit", &self.limit)
            .field("per_connection", &self.per_connection)
            .field("used", &self.used())
            .field("peak", &self.peak())
            .finish()
    }
}

/// Smallest per-connection share a budget gives (enough for one 1 MiB NFS WRITE and its
/// receive buffers).
pub const MIN_PER_CONNECTION: usize = 4 << 20;

impl MemoryBudget {
    /// A budget of `limit` bytes for the whole server, at most `per_connection` of them for any
    /// one connection (clamped to `limit`).
    pub fn new(limit: usize, per_connection: usize) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit,
            per_connection: per_connection.min(limit),
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refusals: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// A budget that never refuses (clients and tests that do not need one).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, usize::MAX)
    }

    /// `limit` for the server, with the per-connection share derived from it: an eighth of the
    /// limit, at least [`MIN_PER_CONNECTION`] and at most 256 MiB.
    pub fn with_limit(limit: usize) -> Arc<Self> {
        let per = (limit / 8).clamp(MIN_PER_CONNECTION, 256 << 20);
        Self::new(limit, per)
    }

    /// The default for a server on this machine: a quarter of physical memory
    /// (`/proc/meminfo` MemTotal), or 1 GiB where that cannot be read.
    pub fn machine_default() -> Arc<Self> {
        Self::with_limit(machine_default_limit())
    }

    /// The server-wide limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The limit of each connection in bytes.
    pub fn per_connection(&self) -> usize {
        self.per_connection
    }

    /// Bytes reserved now, over all connections.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes ever reserved at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Reservations refused so far (each a moment of backpressure).
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Connections that hold a [`ConnBudget`] now.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// A new connection's share of this budget.
    pub fn connection(self: &Arc<Self>) -> Arc<ConnBudget> {
        self.connections.fetch_add(1, Ordering::Relaxed);
        Arc::new(ConnBudget {
            server: self.clone(),
            used: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        })
    }

    fn take(&self, n: usize) -> Result<(), BudgetError> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(n).filter(|&v| v <= self.limit);
            let Some(next) = next else {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return Err(BudgetError::Server {
                    requested: n,
                    used: cur,
                    limit: self.limit,
                });
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        self.freed.notify_waiters();
    }
}

/// One connection's share of a [`MemoryBudget`].
pub struct ConnBudget {
    server: Arc<MemoryBudget>,
    used: AtomicUsize,
    /// Set by [`ConnBudget::close`]: every reservation asked for from then on is refused.
    closed: AtomicBool,
}

impl fmt::Debug for ConnBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnBudget")
            .field("used", &self.used())
            .field("limit", &self.limit())
            .finish()
    }
}

impl Drop for ConnBudget {
    fn drop(&mut self) {
        self.server.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnBudget {
    /// The connection is gone: refuse every reservation from now on, and end at once the ones
    /// waiting for memory ([`ConnBudget::reserve`], [`ConnBudget::reserve_queued`]) with
    /// [`BudgetError::Closed`]. What is already reserved stays so until it is dropped.
    ///
    /// A call of a closed connection that waited for memory would otherwise go on waiting
    /// (holding the connection's state, and so its share) and, once given memory, start work
    /// for a peer that is no longer there.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // The waiters re-check `closed` when woken (they registered before checking it).
        self.server.freed.notify_waiters();
    }

    /// Whether [`ConnBudget::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Reserve `bytes`, or say which limit refuses them. Nothing is reserved on refusal.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, BudgetError> {
        if self.is_closed() {
            return Err(BudgetError::Closed { requested: bytes });
        }
        let limit = self.limit();
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes).filter(|&v| v <= limit) else {
                self.server.refusals.fetch_add(1, Ordering::Relaxed);
                return Err(BudgetError::Connection {
                    requested: bytes,
                    used: cur,
                    limit,
                });
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if let Err(e) = self.server.take(bytes) {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return Err(e);
        }
        Ok(Reservation {
            conn: self.clone(),
            bytes,
        })
    }

    /// Reserve `bytes`, waiting up to `wait` for other reservations to be given back (the
    /// queueing form of backpressure). A request larger than the connection's whole limit
    /// fails at once: no amount of waiting would satisfy it. So does every request once the
    /// connection is closed, the waiting ones included ([`ConnBudget::close`]).
    pub async fn reserve(
        self: &Arc<Self>,
        bytes: usize,
        wait: std::time::Duration,
    ) -> Result<Reservation, BudgetError> {
        // The deadline runs from the first refusal: a reservation that succeeds at once reads
        // no clock (a system call where the clock source has no vDSO, as the lab guest's HPET).
        let mut deadline = None;
        loop {
            // Register for the wake-up before trying, so a release between the failed try and
            // the wait is not missed.
            let freed = self.server.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.try_reserve(bytes) {
                Ok(r) => return Ok(r),
                Err(e) if self.never_satisfiable(&e, bytes) => return Err(e),
                Err(e) => {
                    let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + wait);
                    if tokio::time::timeout_at(until, freed).await.is_err() {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Reserve `bytes`, waiting for as long as it takes for other reservations to be given
    /// back (the caller decides when to stop waiting, by dropping the future). Fails at once
    /// only for a request no amount of waiting would satisfy: larger than the connection's
    /// or the server's whole limit, or made of a closed connection (a waiting one ends when
    /// it closes).
    pub async fn reserve_queued(
        self: &Arc<Self>,
        bytes: usize,
    ) -> Result<Reservation, BudgetError> {
        loop {
            let freed = self.server.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match self.try_reserve(bytes) {
                Ok(r) => return Ok(r),
                Err(e) if self.never_satisfiable(&e, bytes) => return Err(e),
                Err(_) => freed.await,
            }
        }
    }

    /// A refusal no amount of waiting would turn around: the connection is closed, or `bytes`
    /// is over its or the server's whole limit.
    fn never_satisfiable(&self, e: &BudgetError, bytes: usize) -> bool {
        matches!(e, BudgetError::Closed { .. }) || bytes > self.limit() || bytes > self.server.limit
    }

    /// An empty reservation on this connection, to [`Reservation::merge`] others into.
    pub fn empty(self: &Arc<Self>) -> Reservation {
        Reservation {
            conn: self.clone(),
            bytes: 0,
        }
    }

    /// Bytes this connection holds now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// This connection's limit (the server's per-connection share).
    pub fn limit(&self) -> usize {
        self.server.per_connection()
    }

    /// The budget this share is drawn from.
    pub fn server(&self) -> &Arc<MemoryBudget> {
        &self.server
    }

    /// Bytes this connection could still reserve now (the smaller of its own and the server's
    /// room).
    pub fn headroom(&self) -> usize {
        let own = self.limit().saturating_sub(self.used());
        let server = self.server.limit.saturating_sub(self.server.used());
        own.min(server)
    }

    /// True once this connection or the server has used three quarters of its limit: time to
    /// grant fewer credits and queue rather than start new work.
    pub fn under_pressure(&self) -> bool {
        let near = |used: usize, limit: usize| used > limit / 4 * 3;
        near(self.used(), self.limit()) || near(self.server.used(), self.server.limit)
    }
}

/// Bytes held against a [`ConnBudget`]; given back on drop.
pub struct Reservation {
    conn: Arc<ConnBudget>,
    bytes: usize,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Reservation {
    /// The bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Give back all but `keep` bytes now (nothing if it holds no more than that): a server
    /// that reserved for the largest reply a call could have keeps what the reply it built
    /// needs.
    pub fn shrink(&mut self, keep: usize) {
        if keep < self.bytes {
            let give = self.bytes - keep;
            self.conn.used.fetch_sub(give, Ordering::AcqRel);
            self.conn.server.give(give);
            self.bytes = keep;
        }
    }
}

impl Reservation {
    /// Move up to `n` of this reservation's bytes into a new one (of the same connection),
    /// without giving anything back: memory that changes owner (a received record handed to
    /// its call) stays counted throughout.
    pub fn split(&mut self, n: usize) -> Reservation {
        let n = n.min(self.bytes);
        self.bytes -= n;
        Reservation {
            conn: self.conn.clone(),
            bytes: n,
        }
    }

    /// The connection this reservation is drawn from.
    pub fn connection(&self) -> &Arc<ConnBudget> {
        &self.conn
    }

    /// Take `other`'s bytes into this reservation. Both must be drawn from the same
    /// connection; a reservation of another connection is given back instead (and `false`
    /// returned), so no connection's count is ever moved to another.
    pub fn merge(&mut self, mut other: Reservation) -> bool {
        if !Arc::ptr_eq(&self.conn, &other.conn) {
            return false;
        }
        self.bytes += std::mem::take(&mut other.bytes);
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.conn.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.conn.server.give(self.bytes);
    }
}

fn machine_default_limit() -> usize {
    const FALLBACK: usize = 1 << 30;
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return FALLBACK;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map(|kib| kib.saturating_mul(1024) / 4)
        .filter(|&b| b > 0)
        .unwrap_or(FALLBACK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reservations_are_bounded_per_connection_and_per_server() {
        let b = MemoryBudget::new(100, 60);
        let c1 = b.connection();
        let c2 = b.connection();
        let r1 = c1.try_reserve(50).expect("within both limits");
        assert!(matches!(
            c1.try_reserve(11),
            Err(BudgetError::Connection {
                used: 50,
                limit: 60,
                ..
            })
        ));
        let r2 = c2.try_reserve(50).expect("within both limits");
        assert!(matches!(
            c2.try_reserve(1),
            Err(BudgetError::Server {
                used: 100,
                limit: 100,
                ..
            })
        ));
        // A refused server reservation leaves the connection's count unchanged.
        assert_eq!(c2.used(), 50);
        assert_eq!(b.used(), 100);
        assert_eq!(b.refusals(), 2);
        drop(r1);
        assert_eq!((b.used(), c1.used()), (50, 0));
        assert!(c2.try_reserve(10).is_ok());
        drop(r2);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 100);
    }

    #[test]
    fn dropping_a_connection_returns_what_it_held() {
        let b = MemoryBudget::new(1000, 1000);
        let c = b.connection();
        assert_eq!(b.connections(), 1);
        let held: Vec<_> = (0..10).map(|_| c.try_reserve(10).unwrap()).collect();
        assert_eq!(b.used(), 100);
        drop(c);
        // The reservations keep the share alive until they go.
        assert_eq!(b.used(), 100);
        drop(held);
        assert_eq!((b.used(), b.connections()), (0, 0));
    }

    #[test]
    fn pressure_and_headroom_follow_the_tighter_limit() {
        let b = MemoryBudget::new(400, 100);
        let c = b.connection();
        let other = b.connection();
        assert_eq!(c.headroom(), 100);
        let _r = c.try_reserve(80).unwrap();
        assert!(c.under_pressure());
        assert!(!other.under_pressure());
        let _big: Vec<_> = (0..3)
            .map(|_| b.connection().try_reserve(100).unwrap())
            .collect();
        assert_eq!(other.headroom(), 20);
        assert!(other.under_pressure());
    }

    #[test]
    fn a_shrunk_reservation_gives_the_rest_back_at_once() {
        let b = MemoryBudget::new(100, 100);
        let c = b.connection();
        let mut r = c.try_reserve(80).unwrap();
        r.shrink(30);
        assert_eq!((r.bytes(), c.used(), b.used()), (30, 30, 30));
        r.shrink(50);
        assert_eq!(r.bytes(), 30, "shrinking never grows");
        drop(r);
        assert_eq!((c.used(), b.used(), b.peak()), (0, 0, 80));
    }

    #[test]
    fn split_and_merge_move_bytes_without_giving_them_back() {
        let b = MemoryBudget::new(100, 100);
        let c = b.connection();
        let mut recv = c.try_reserve(70).unwrap();
        let mut call = recv.split(30);
        assert_eq!((recv.bytes(), call.bytes(), b.used()), (40, 30, 70));
        assert_eq!(recv.split(1000).bytes(), 40, "never more than it holds");
        assert_eq!((recv.bytes(), b.used()), (0, 30));
        assert!(call.merge(c.try_reserve(20).unwrap()));
        assert_eq!((call.bytes(), b.used()), (50, 50));
        let mut grown = c.empty();
        assert!(grown.merge(call));
        assert_eq!((grown.bytes(), c.used(), b.used()), (50, 50, 50));
        // Another connection's bytes are not taken over: they go back to the budget.
        let other = b.connection();
        assert!(!grown.merge(other.try_reserve(10).unwrap()));
        assert_eq!((other.used(), b.used()), (0, 50));
        drop(grown);
        assert_eq!((c.used(), b.used()), (0, 0));
    }

    #[tokio::test]
    async fn a_queued_reservation_waits_without_a_deadline() {
        let b = MemoryBudget::new(100, 100);
        let c = b.connection();
        let held = c.try_reserve(90).unwrap();
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.reserve_queued(50).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap().unwrap().bytes(), 50);
        assert!(c.reserve_queued(101).await.is_err(), "never satisfiable");
    }

    #[test]
    fn overflowing_requests_are_refused_not_wrapped() {
        let b = MemoryBudget::unlimited();
        let c = b.connection();
        let _r = c.try_reserve(usize::MAX - 1).unwrap();
        assert!(c.try_reserve(2).is_err());
    }

    #[tokio::test]
    async fn a_queued_reservation_goes_through_when_memory_is_given_back() {
        let b = MemoryBudget::new(100, 100);
        let c = b.connection();
        let held = c.try_reserve(80).unwrap();
        let c2 = c.clone();
        let waiter =
            tokio::spawn(async move { c2.reserve(50, std::time::Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        drop(held);
        let r = waiter
            .await
            .unwrap()
            .expect("given room once the 80 bytes came back");
        assert_eq!(r.bytes(), 50);
        // Never satisfiable: at once, not after the wait.
        let t0 = tokio::time::Instant::now();
        assert!(
            c.reserve(101, std::time::Duration::from_secs(30))
                .await
                .is_err()
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        // Satisfiable but not within the wait: the error after the wait.
        assert!(
            c.reserve(60, std::time::Duration::from_millis(20))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn closing_a_connection_ends_its_waiting_reservations_at_once() {
        let b = MemoryBudget::new(100, 100);
        let (c, other) = (b.connection(), b.connection());
        let held = other.try_reserve(90).unwrap();
        // Both wait for memory that only `held` could give, and no deadline comes in this test.
        let (c1, c2) = (c.clone(), c.clone());
        let timed = tokio::spawn(async move { c1.reserve(50, Duration::from_secs(3600)).await });
        let queued = tokio::spawn(async move { c2.reserve_queued(50).await });
        // Let both register and find no room (a current-thread runtime: they run as this
        // task yields).
        for _ in 0..100 {
            if b.refusals() >= 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(b.refusals(), 2, "both are waiting");
        assert!(!timed.is_finished() && !queued.is_finished());
        c.close();
        assert!(c.is_closed());
        assert_eq!(
            timed.await.unwrap().unwrap_err(),
            BudgetError::Closed { requested: 50 }
        );
        assert_eq!(
            queued.await.unwrap().unwrap_err(),
            BudgetError::Closed { requested: 50 }
        );
        // Nothing more for it, whatever the room; the other connection is unaffected.
        drop(held);
        assert!(matches!(
            c.try_reserve(1),
            Err(BudgetError::Closed { requested: 1 })
        ));
        assert!(matches!(
            c.reserve(1, Duration::from_secs(3600)).await,
            Err(BudgetError::Closed { .. })
        ));
        assert_eq!(other.try_reserve(100).unwrap().bytes(), 100);
        drop((c, other));
        assert_eq!((b.used(), b.connections()), (0, 0));
    }

    #[test]
    fn the_machine_default_is_a_share_of_physical_memory() {
        let b = MemoryBudget::machine_default();
        assert!(b.limit() >= MIN_PER_CONNECTION);
        assert!(b.per_connection() >= MIN_PER_CONNECTION.min(b.limit()));
        assert!(b.per_connection() <= b.limit());
    }
}
