//! Counters of a running server, kept by a [`Program`] wrapper around NFS and MOUNT: calls per
//! program and procedure and per transport, the bytes of their arguments and results, and the
//! calls executing now (over RPC-over-RDMA each of those holds one of its connection's
//! credits until its reply is sent, RFC 8166 §3.3.1).
//!
//! The wrapper is also how a clean shutdown drains the server: after [`ServerStats::drain`]
//! new calls are dropped unanswered (the client retransmits them to the next server instance,
//! as after any lost connection) and [`ServerStats::wait_idle`] returns once every call that
//! was already executing has produced its reply.
//!
//! What is not counted: the port mapper, and the bytes of the RPC and RPC-over-RDMA headers
//! (the counts are of the procedures' arguments and results, chunk payloads included).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use oncrpc::service::BoxFuture;
use oncrpc::{Call, Outcome, Program, TransportKind};
use tokio::sync::Notify;

use crate::{mount, nfs3};

/// The transports counters are kept per.
pub const TRANSPORTS: [&str; 3] = ["tcp", "rdma", "local"];

fn transport_index(t: TransportKind) -> usize {
    match t {
        TransportKind::Tcp => 0,
        TransportKind::Rdma => 1,
        _ => 2,
    }
}

/// NFSv3 procedure names, by number.
const NFS3_PROCS: [&str; 22] = nfs3::proc_::NAMES;

/// MOUNT v3 procedure names, by number (RFC 1813 Appendix I).
const MOUNT3_PROCS: [&str; 6] = mount::proc_::NAMES;

/// NFSv4 procedure names (RFC 8881 §16).
const NFS4_PROCS: [&str; 2] = ["NULL", "COMPOUND"];

const NFS4_BASE: usize = NFS3_PROCS.len();
const MOUNT_BASE: usize = NFS4_BASE + NFS4_PROCS.len();
const OTHER: usize = MOUNT_BASE + MOUNT3_PROCS.len();
/// Counter slots per transport: every procedure above, and one for anything else.
const SLOTS: usize = OTHER + 1;

/// NFSv4 operations counted: every operation number up to NFSv4.2's last (RFC 8881 §16,
/// RFC 7862, RFC 8276).
const NFS4_OPS: usize = crate::nfs4::consts::op::REMOVEXATTR as usize + 1;

/// The counter slot of a call.
fn slot(prog: u32, vers: u32, proc_: u32) -> usize {
    let p = proc_ as usize;
    match (prog, vers) {
        (nfs3::PROGRAM, 3) if p < NFS3_PROCS.len() => p,
        (nfs3::PROGRAM, 4) if p < NFS4_PROCS.len() => NFS4_BASE + p,
        (mount::PROGRAM, 3) if p < MOUNT3_PROCS.len() => MOUNT_BASE + p,
        _ => OTHER,
    }
}

/// The program and procedure a slot counts.
fn slot_name(s: usize) -> (&'static str, &'static str) {
    if s < NFS4_BASE {
        ("nfs3", NFS3_PROCS[s])
    } else if s < MOUNT_BASE {
        ("nfs4", NFS4_PROCS[s - NFS4_BASE])
    } else if s < OTHER {
        ("mount3", MOUNT3_PROCS[s - MOUNT_BASE])
    } else {
        ("other", "other")
    }
}

/// One transport's counters.
#[derive(Debug)]
struct PerTransport {
    calls: [AtomicU64; SLOTS],
    /// NFSv4 operations inside COMPOUNDs, by operation number.
    ops: [AtomicU64; NFS4_OPS],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    executing: AtomicU64,
}

impl Default for PerTransport {
    fn default() -> Self {
        PerTransport {
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            executing: AtomicU64::new(0),
        }
    }
}

/// The counters of one server (every transport and program it serves).
#[derive(Debug, Default)]
pub struct ServerStats {
    per: [PerTransport; 3],
    /// Per transport, as `per`.
    draining: [AtomicBool; 3],
    /// Per transport, as `per`.
    dropped_draining: [AtomicU64; 3],
    idle: Notify,
}

/// Calls of one procedure over one transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCount {
    pub transport: &'static str,
    pub program: &'static str,
    pub procedure: &'static str,
    pub calls: u64,
}

/// What one transport carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportTotals {
    pub transport: &'static str,
    pub calls: u64,
    /// Argument bytes received (chunk payloads included).
    pub bytes_in: u64,
    /// Result bytes sent (chunk payloads included).
    pub bytes_out: u64,
    /// Calls executing now.
    pub executing: u64,
}

impl ServerStats {
    /// Fresh counters.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// `program`, counted here.
    pub fn counted(self: &Arc<Self>, program: Arc<dyn Program>) -> Arc<dyn Program> {
        Arc::new(Counted {
            inner: program,
            stats: self.clone(),
        })
    }

    /// Every procedure called at least once, per transport, in procedure order.
    pub fn procedures(&self) -> Vec<ProcCount> {
        let mut out = Vec::new();
        for (t, per) in self.per.iter().enumerate() {
            for (s, c) in per.calls.iter().enumerate() {
                let calls = c.load(Ordering::Relaxed);
                if calls > 0 {
                    let (program, procedure) = slot_name(s);
                    out.push(ProcCount {
                        transport: TRANSPORTS[t],
                        program,
                        procedure,
                        calls,
                    });
                }
            }
        }
        out
    }

    /// NFSv4 operations called at least once, per transport (program "nfs4", procedure the
    /// operation's name), in operation order. A COMPOUND's operations are counted as its
    /// arguments list them, also those after one that failed.
    pub fn nfs4_operations(&self) -> Vec<ProcCount> {
        let mut out = Vec::new();
        for (t, per) in self.per.iter().enumerate() {
            for (op, c) in per.ops.iter().enumerate() {
                let calls = c.load(Ordering::Relaxed);
                if calls > 0 {
                    out.push(ProcCount {
                        transport: TRANSPORTS[t],
                        program: "nfs4",
                        procedure: crate::nfs4::consts::op::name(op as u32),
                        calls,
                    });
                }
            }
        }
        out
    }

    /// Per-transport totals (every transport, also those that carried nothing).
    pub fn totals(&self) -> Vec<TransportTotals> {
        self.per
            .iter()
            .enumerate()
            .map(|(t, per)| TransportTotals {
                transport: TRANSPORTS[t],
                calls: per.calls.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
                bytes_in: per.bytes_in.load(Ordering::Relaxed),
                bytes_out: per.bytes_out.load(Ordering::Relaxed),
                executing: per.executing.load(Ordering::Acquire),
            })
            .collect()
    }

    /// Calls executing now over every transport.
    pub fn executing(&self) -> u64 {
        self.per
            .iter()
            .map(|p| p.executing.load(Ordering::Acquire))
            .sum()
    }

    /// From now on drop new calls unanswered (a clean shutdown has begun).
    pub fn drain(&self) {
        for d in &self.draining {
            d.store(true, Ordering::Release);
        }
    }

    /// [`ServerStats::drain`] for the calls of every transport but RPC-over-RDMA, whose
    /// transport drops new calls itself while it answers those it accepted
    /// (`rpcrdma::RdmaServer::quiesce`): a call it accepted before the shutdown began (one
    /// whose Read chunks it is still pulling, say) is executed and answered.
    pub fn drain_but_rdma(&self) {
        let rdma = transport_index(TransportKind::Rdma);
        for (i, d) in self.draining.iter().enumerate() {
            if i != rdma {
                d.store(true, Ordering::Release);
            }
        }
    }

    /// Calls dropped because they arrived after [`ServerStats::drain`].
    pub fn dropped_draining(&self) -> u64 {
        self.dropped_draining
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum()
    }

    /// [`ServerStats::dropped_draining`] over one transport (every kind but TCP and
    /// RPC-over-RDMA counts as "local", as in [`TRANSPORTS`]).
    pub fn dropped_draining_on(&self, transport: TransportKind) -> u64 {
        self.dropped_draining[transport_index(transport)].load(Ordering::Relaxed)
    }

    /// Calls executing now over one transport (as [`ServerStats::dropped_draining_on`]).
    pub fn executing_on(&self, transport: TransportKind) -> u64 {
        self.per[transport_index(transport)]
            .executing
            .load(Ordering::Acquire)
    }

    /// Wait until no call is executing.
    pub async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.executing() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One executing call; counted out when dropped, also when its future is.
struct Executing<'a> {
    stats: &'a ServerStats,
    t: usize,
}

impl Drop for Executing<'_> {
    fn drop(&mut self) {
        let before = self.stats.per[self.t]
            .executing
            .fetch_sub(1, Ordering::AcqRel);
        if before == 1 && self.stats.executing() == 0 {
            self.stats.idle.notify_waiters();
        }
    }
}

/// A program whose calls are counted in [`ServerStats`].
struct Counted {
    inner: Arc<dyn Program>,
    stats: Arc<ServerStats>,
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("program", &self.inner.program())
            .finish_non_exhaustive()
    }
}

impl Program for Counted {
    fn program(&self) -> u32 {
        self.inner.program()
    }
    fn versions(&self) -> (u32, u32) {
        self.inner.versions()
    }
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        let st = &self.stats;
        let t = transport_index(call.context.transport);
        if st.draining[t].load(Ordering::Acquire) {
            st.dropped_draining[t].fetch_add(1, Ordering::Relaxed);
            return Box::pin(std::future::ready(Outcome::NoReply));
        }
        let per = &st.per[t];
        per.calls[slot(call.header.prog, call.header.vers, call.header.proc_)]
            .fetch_add(1, Ordering::Relaxed);
        per.bytes_in
            .fetch_add(call.args.len() as u64, Ordering::Relaxed);
        if (call.header.prog, call.header.vers, call.header.proc_) == (nfs3::PROGRAM, 4, 1)
            && let Ok(scan) = crate::ulb::scan_compound(&call.args)
        {
            for op in scan.ops {
                if let Some(c) = per.ops.get(op as usize) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        per.executing.fetch_add(1, Ordering::AcqRel);
        let guard = Executing { stats: st, t };
        let fut = self.inner.call(call);
        Box::pin(async move {
            let out = fut.await;
            if let Outcome::Success(e) = &out {
                let reduced: usize = e.reduced.iter().map(|r| r.data.len()).sum();
                guard.stats.per[guard.t]
                    .bytes_out
                    .fetch_add((e.len() + reduced) as u64, Ordering::Relaxed);
            }
            drop(guard);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncrpc::{CallContext, CallHeader, Credential, OpaqueAuth};

    /// A program whose calls wait until `release` is notified.
    struct Slow(Arc<Notify>);

    impl Program for Slow {
        fn program(&self) -> u32 {
            nfs3::PROGRAM
        }
        fn versions(&self) -> (u32, u32) {
            (3, 3)
        }
        fn call(&self, _call: Call) -> BoxFuture<'_, Outcome> {
            let release = self.0.clone();
            Box::pin(async move {
                release.notified().await;
                Outcome::Success(xdr::Encoder::new().finish())
            })
        }
    }

    fn call(proc_: u32) -> Call {
        call_v(3, proc_, bytes::Bytes::from_static(&[0; 8]))
    }

    fn call_v(vers: u32, proc_: u32, args: bytes::Bytes) -> Call {
        Call {
            header: CallHeader {
                xid: 1,
                prog: nfs3::PROGRAM,
                vers,
                proc_,
                cred: OpaqueAuth::none(),
                verf: OpaqueAuth::none(),
            },
            credential: Credential::None,
            args,
            context: CallContext::local(),
            reply_policy: Default::default(),
            hints: Default::default(),
        }
    }

    #[tokio::test]
    async fn compound_operations_are_counted_by_name() {
        use crate::nfs4::consts::op;
        let stats = ServerStats::new();
        let release = Arc::new(Notify::new());
        release.notify_one();
        let p = stats.counted(Arc::new(Slow(release)));
        // COMPOUND4args: empty tag, minor version 1, PUTROOTFH and GETFH (no arguments).
        let mut e = xdr::Encoder::new();
        for w in [0, 1, 2, op::PUTROOTFH, op::GETFH] {
            e.put_u32(w);
        }
        let out = p.call(call_v(4, 1, e.into_bytes())).await;
        assert!(matches!(out, Outcome::Success(_)));
        let ops: Vec<_> = stats
            .nfs4_operations()
            .into_iter()
            .map(|c| (c.transport, c.procedure, c.calls))
            .collect();
        assert_eq!(ops, vec![("local", "GETFH", 1), ("local", "PUTROOTFH", 1)]);
        assert_eq!(stats.procedures()[0].procedure, "COMPOUND");
    }

    #[tokio::test]
    async fn a_drain_lets_executing_calls_finish_and_drops_new_ones() {
        let stats = ServerStats::new();
        let release = Arc::new(Notify::new());
        let p = stats.counted(Arc::new(Slow(release.clone())));
        let running = tokio::spawn({
            let p = p.clone();
            async move { p.call(call(nfs3::proc_::WRITE)).await }
        });
        while stats.executing() == 0 {
            tokio::task::yield_now().await;
        }
        stats.drain();
        assert!(matches!(
            p.call(call(nfs3::proc_::GETATTR)).await,
            Outcome::NoReply
        ));
        assert_eq!(stats.dropped_draining(), 1);
        let idle = tokio::spawn({
            let s = stats.clone();
            async move { s.wait_idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!idle.is_finished(), "a call is still executing");
        release.notify_one();
        assert!(matches!(running.await.unwrap(), Outcome::Success(_)));
        idle.await.unwrap();
        let local = &stats.totals()[2];
        assert_eq!((local.calls, local.bytes_in, local.executing), (1, 8, 0));
        assert_eq!(stats.procedures()[0].procedure, "WRITE");
    }

    #[test]
    fn every_procedure_has_its_own_slot() {
        let mut seen = std::collections::HashSet::new();
        for p in 0..22 {
            assert!(seen.insert(slot(nfs3::PROGRAM, 3, p)));
        }
        for p in 0..2 {
            assert!(seen.insert(slot(nfs3::PROGRAM, 4, p)));
        }
        for p in 0..6 {
            assert!(seen.insert(slot(mount::PROGRAM, 3, p)));
        }
        assert_eq!(seen.len(), SLOTS - 1);
        assert_eq!(slot(nfs3::PROGRAM, 3, 22), OTHER);
        assert_eq!(slot(100_000, 2, 3), OTHER);
        assert_eq!(slot_name(slot(nfs3::PROGRAM, 3, 6)), ("nfs3", "READ"));
        assert_eq!(slot_name(slot(nfs3::PROGRAM, 4, 1)), ("nfs4", "COMPOUND"));
        assert_eq!(slot_name(slot(mount::PROGRAM, 3, 5)), ("mount3", "EXPORT"));
    }
}
