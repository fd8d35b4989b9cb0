//! What a running server reports about itself (`oxrdma nfs status`, the metrics endpoint):
//! its exports, the clients connected over each transport, RPC-over-RDMA credits in use, calls
//! per procedure and bytes moved.
//!
//! [`StatusSource`] holds shared handles on the running server's parts and builds a [`Status`]
//! snapshot on demand; it keeps no listener alive (the RPC-over-RDMA one is held weakly).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use oncrpc::{MemoryBudget, TcpServerStats};

use crate::gate::ExportTable;
use crate::mountd::MountSource;
use crate::stats::{ProcCount, ServerStats, TransportTotals};
use crate::verifier::Verifier;

/// One export as served now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportStatus {
    pub path: String,
    pub fsid: u64,
    /// `spec(options)` per client specification, in file order.
    pub clients: Vec<String>,
}

/// One connected client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConn {
    /// "tcp" (NFS and MOUNT) or "rdma".
    pub transport: &'static str,
    pub peer: SocketAddr,
}

/// A snapshot of a running server.
#[derive(Debug, Clone)]
pub struct Status {
    pub version: &'static str,
    pub pid: u32,
    pub started: SystemTime,
    pub uptime: Duration,
    pub write_verifier: Verifier,
    pub listeners: Vec<(&'static str, SocketAddr)>,
    pub exports: Vec<ExportStatus>,
    /// MOUNT's list of (client host, mounted path), as DUMP reports it.
    pub mounts: Vec<(String, String)>,
    pub clients: Vec<ClientConn>,
    /// The credits each RPC-over-RDMA connection may be granted (`None`: no RDMA listener).
    pub rdma_credit_limit: Option<u32>,
    /// RPC-over-RDMA calls executing now: each holds one of its connection's credits.
    pub rdma_credits_in_use: u64,
    pub totals: Vec<TransportTotals>,
    pub procedures: Vec<ProcCount>,
    /// NFSv4 operations inside the COMPOUNDs.
    pub nfs4_operations: Vec<ProcCount>,
    pub memory_used: usize,
    pub memory_limit: usize,
}

impl Status {
    /// Connected clients over `transport`.
    pub fn connected(&self, transport: &str) -> usize {
        self.clients
            .iter()
            .filter(|c| c.transport == transport)
            .count()
    }

    /// The human-readable report `oxrdma nfs status` prints.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let started = self
            .started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let _ = writeln!(
            o,
            "oxrdma {} NFS server, pid {}, up {} s (started at Unix time {started}), write verifier {}",
            self.version,
            self.pid,
            self.uptime.as_secs(),
            self.write_verifier
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let _ = writeln!(o, "listeners:");
        for (what, a) in &self.listeners {
            let _ = writeln!(o, "  {what:<8} {a}");
        }
        let _ = writeln!(o, "exports:");
        for x in &self.exports {
            let _ = writeln!(o, "  {} fsid={} {}", x.path, x.fsid, x.clients.join(" "));
        }
        let _ = writeln!(o, "mounts (MOUNT DUMP): {}", self.mounts.len());
        for (host, path) in &self.mounts {
            let _ = writeln!(o, "  {host} {path}");
        }
        let _ = writeln!(
            o,
            "clients: {} over tcp, {} over rdma",
            self.connected("tcp"),
            self.connected("rdma")
        );
        for c in &self.clients {
            let _ = writeln!(o, "  {:<5} {}", c.transport, c.peer);
        }
        match self.rdma_credit_limit {
            Some(limit) => {
                let _ = writeln!(
                    o,
                    "rdma credits: {} in use, up to {limit} per connection",
                    self.rdma_credits_in_use
                );
            }
            None => {
                let _ = writeln!(o, "rdma credits: no RPC-over-RDMA listener");
            }
        }
        let _ = writeln!(
            o,
            "memory: {} KiB used of {} KiB",
            self.memory_used >> 10,
            self.memory_limit >> 10
        );
        let _ = writeln!(o, "transport      calls   bytes-in  bytes-out  executing");
        for t in &self.totals {
            let _ = writeln!(
                o,
                "  {:<6} {:>11} {:>10} {:>10} {:>10}",
                t.transport, t.calls, t.bytes_in, t.bytes_out, t.executing
            );
        }
        let _ = writeln!(o, "calls per procedure:");
        for p in &self.procedures {
            let _ = writeln!(
                o,
                "  {:<6} {:<7} {:<12} {:>10}",
                p.transport, p.program, p.procedure, p.calls
            );
        }
        if !self.nfs4_operations.is_empty() {
            let _ = writeln!(o, "NFSv4 operations:");
            for p in &self.nfs4_operations {
                let _ = writeln!(
                    o,
                    "  {:<6} {:<20} {:>10}",
                    p.transport, p.procedure, p.calls
                );
            }
        }
        o
    }
}

/// The handles a [`Status`] is built from.
#[derive(Debug)]
pub struct StatusSource {
    pub(crate) started_wall: SystemTime,
    pub(crate) started: Instant,
    pub(crate) table: Arc<ExportTable>,
    pub(crate) stats: Arc<ServerStats>,
    /// The TCP listeners serving NFS and MOUNT.
    pub(crate) tcp: Vec<Arc<TcpServerStats>>,
    pub(crate) rdma: Option<Weak<rpcrdma::RdmaServer>>,
    pub(crate) rdma_credit_limit: Option<u32>,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) listeners: Vec<(&'static str, SocketAddr)>,
}

impl StatusSource {
    /// The server as it is now.
    pub fn status(&self) -> Status {
        let exports = self
            .table
            .exports()
            .iter()
            .map(|x| ExportStatus {
                path: x.entry.path.display().to_string(),
                fsid: x.server.export().fsid(),
                clients: x
                    .entry
                    .clients
                    .iter()
                    .map(|r| format!("{}({})", r.spec, r.options.describe()))
                    .collect(),
            })
            .collect();
        let mut clients: Vec<ClientConn> = self
            .tcp
            .iter()
            .flat_map(|t| t.peers())
            .map(|peer| ClientConn {
                transport: "tcp",
                peer,
            })
            .collect();
        if let Some(r) = self.rdma.as_ref().and_then(Weak::upgrade) {
            clients.extend(r.connections().iter().map(|c| ClientConn {
                transport: "rdma",
                peer: c.peer(),
            }));
        }
        let totals = self.stats.totals();
        let rdma_in_use = totals
            .iter()
            .find(|t| t.transport == "rdma")
            .map_or(0, |t| t.executing);
        Status {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            started: self.started_wall,
            uptime: self.started.elapsed(),
            write_verifier: self.table.write_verifier(),
            listeners: self.listeners.clone(),
            exports,
            mounts: self.table.mounts().clone(),
            clients,
            rdma_credit_limit: self.rdma_credit_limit,
            rdma_credits_in_use: rdma_in_use,
            totals,
            procedures: self.stats.procedures(),
            nfs4_operations: self.stats.nfs4_operations(),
            memory_used: self.budget.used(),
            memory_limit: self.budget.limit(),
        }
    }
}
