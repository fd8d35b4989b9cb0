//! NFSv4.1 server state as a sans-IO core (RFC 8881 §2.4, §2.10, §8, §9): client records,
//! sessions with their slot tables and reply caches, open and lock stateids, share
//! reservations, byte-range locks, leases and the grace period.
//!
//! It never looks at a clock or a file: every call takes `now`, files are named by a
//! [`FileKey`], and the driver calls [`State::poll`] at [`State::next_deadline`] to expire
//! leases. Every table is bounded by [`StateConfig`]: a client that would grow one past its bound
//! gets NFS4ERR_RESOURCE (or, for new clients, NFS4ERR_DELAY), never unbounded memory.

mod callbacks;
mod clients;
mod locks;
mod opens;
mod slots;
mod v40;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use callbacks::{CallbackConfig, CallbackCounts, CbOutcome, CbPath, CbSend, CbWhat};
pub use clients::Principal;
pub use clients::ServerIdentity;
pub use locks::{LockError, LockRange, LockType};
pub use opens::OpenResult;
pub use slots::{SeqOutcome, SlotRef};

use super::status::{Nfsstat4, Res4};
use super::types::{SessionId4, Stateid4};

/// A file as the state tables know it: the export's fsid and the inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub fsid: u64,
    pub ino: u64,
}

/// A transport connection, as the driver numbers them.
pub type ConnId = u64;

/// Bounds and times of the state tables.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Lease time (RFC 8881 §8.3): a client that sends nothing for this long loses its state.
    pub lease: Duration,
    /// Grace period after a restart (RFC 8881 §8.4.2): only reclaims are accepted.
    pub grace: Duration,
    /// Most client records (confirmed and unconfirmed).
    pub max_clients: usize,
    /// Most sessions per client.
    pub max_sessions_per_client: usize,
    /// Most slots a session's fore channel gets (`ca_maxrequests`).
    pub max_slots: u32,
    /// Most operations in one COMPOUND (`ca_maxoperations`).
    pub max_ops: u32,
    /// Largest request and reply (`ca_maxrequestsize`, `ca_maxresponsesize`).
    pub max_request: u32,
    pub max_response: u32,
    /// Largest reply kept in a slot's reply cache (`ca_maxresponsesize_cached`).
    pub max_response_cached: u32,
    /// Most open and lock stateids per client.
    pub max_stateids_per_client: usize,
    /// Most byte-range locks per client.
    pub max_locks_per_client: usize,
    /// Bounds and times of the callbacks ([`CallbackConfig`]).
    pub callbacks: CallbackConfig,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lease: Duration::from_secs(90),
            grace: Duration::from_secs(90),
            max_clients: 1024,
            max_sessions_per_client: 16,
            max_slots: 64,
            max_ops: 64,
            max_request: (1 << 20) + 4096,
            max_response: (1 << 20) + 4096,
            max_response_cached: 8 * 1024,
            max_stateids_per_client: 16 * 1024,
            max_locks_per_client: 16 * 1024,
            callbacks: CallbackConfig::default(),
        }
    }
}

/// Kinds of stateid (RFC 8881 §8.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    Open,
    Lock,
}

/// What one stateid stands for.
#[derive(Debug, Clone)]
struct StateEntry {
    kind: StateKind,
    clientid: u64,
    file: FileKey,
    seqid: u32,
    /// The open- or lock-owner (opaque, scoped by the client).
    owner: Vec<u8>,
    /// Open stateids: share access and deny. Lock stateids: unused.
    access: u32,
    deny: u32,
    /// Lock stateids: the open stateid they came from.
    open_other: Option<[u8; 12]>,
}

/// The whole server state.
#[derive(Debug)]
pub struct State {
    cfg: StateConfig,
    /// Distinguishes this server instance's clientids and stateids from an earlier one's.
    boot: u32,
    started: Instant,
    next_id: u64,
    clients: HashMap<u64, clients::Client>,
    /// Client owner id -> clientids of its confirmed and unconfirmed records.
    owners: HashMap<Vec<u8>, clients::OwnerRecords>,
    sessions: HashMap<SessionId4, slots::Session>,
    states: HashMap<[u8; 12], StateEntry>,
    locks: locks::LockTable,
    cb: callbacks::Callbacks,
    /// Clients and stateids whose lease expired (or whose 4.0 client rebooted), remembered
    /// for a while so they are NFS4ERR_EXPIRED rather than unknown.
    expired: v40::Expired,
}

impl State {
    /// Fresh state for a server instance that started at `now`; `boot` should differ between
    /// instances (the driver uses the boot time in seconds).
    pub fn new(cfg: StateConfig, boot: u32, now: Instant) -> Self {
        State {
            cfg,
            boot,
            started: now,
            next_id: 1,
            clients: HashMap::new(),
            owners: HashMap::new(),
            sessions: HashMap::new(),
            states: HashMap::new(),
            locks: locks::LockTable::default(),
            cb: callbacks::Callbacks::default(),
            expired: v40::Expired::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    /// Whether the grace period is running (RFC 8881 §8.4.2).
    pub fn in_grace(&self, now: Instant) -> bool {
        now < self.started + self.cfg.grace
    }

    /// End the grace period now (every client has said RECLAIM_COMPLETE, or by command).
    pub fn end_grace(&mut self, now: Instant) {
        if self.in_grace(now) {
            self.started = now.checked_sub(self.cfg.grace).unwrap_or(now);
        }
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// A stateid `other` unique to this instance: the boot word, then a counter.
    fn fresh_other(&mut self) -> [u8; 12] {
        let mut o = [0u8; 12];
        o[..4].copy_from_slice(&self.boot.to_be_bytes());
        o[4..].copy_from_slice(&self.fresh_id().to_be_bytes());
        o
    }

    /// Look a stateid up for a client: the checks every stateid-bearing operation makes
    /// (RFC 8881 §8.2.4, §8.2.2): a special stateid is not accepted here, another instance's
    /// is NFS4ERR_STALE_STATEID, an unknown one NFS4ERR_BAD_STATEID, another client's
    /// NFS4ERR_BAD_STATEID, a newer seqid NFS4ERR_BAD_STATEID, an older one
    /// NFS4ERR_OLD_STATEID; seqid 0 means "the current one".
    fn lookup(&self, clientid: u64, sid: &Stateid4) -> Res4<&StateEntry> {
        if sid.other[..4] != self.boot.to_be_bytes() {
            return Err(if sid.is_special() {
                Nfsstat4::BAD_STATEID
            } else {
                Nfsstat4::STALE_STATEID
            });
        }
        let e = self
            .states
            .get(&sid.other)
            .ok_or_else(|| self.unknown_stateid(sid))?;
        if e.clientid != clientid {
            return Err(Nfsstat4::BAD_STATEID);
        }
        if sid.seqid != 0 {
            if sid.seqid > e.seqid {
                return Err(Nfsstat4::BAD_STATEID);
            }
            if sid.seqid < e.seqid {
                return Err(Nfsstat4::OLD_STATEID);
            }
        }
        Ok(e)
    }

    fn stateid_of(other: [u8; 12], e: &StateEntry) -> Stateid4 {
        Stateid4 {
            seqid: e.seqid,
            other,
        }
    }

    fn stateids_of(&self, clientid: u64) -> usize {
        self.states
            .values()
            .filter(|e| e.clientid == clientid)
            .count()
    }

    /// When [`State::poll`] must next run: the earliest lease expiry.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.clients
            .values()
            .map(|c| c.renewed + self.cfg.lease)
            .min()
    }

    /// Expire the clients whose lease lapsed before `now` (RFC 8881 §8.3): their sessions,
    /// opens and locks go. Returns the clientids expired.
    pub fn poll(&mut self, now: Instant) -> Vec<u64> {
        let lease = self.cfg.lease;
        let dead: Vec<u64> = self
            .clients
            .values()
            .filter(|c| now >= c.renewed + lease)
            .map(|c| c.clientid)
            .collect();
        for &id in &dead {
            self.expire_client(id, true);
        }
        dead
    }

    /// Remove a client record and everything it holds.
    fn purge_client(&mut self, clientid: u64) {
        let Some(c) = self.clients.remove(&clientid) else {
            return;
        };
        if let Some(rec) = self.owners.get_mut(&c.ownerid) {
            if rec.confirmed == Some(clientid) {
                rec.confirmed = None;
            }
            if rec.unconfirmed == Some(clientid) {
                rec.unconfirmed = None;
            }
            if rec.confirmed.is_none() && rec.unconfirmed.is_none() {
                self.owners.remove(&c.ownerid);
            }
        }
        self.sessions.retain(|_, s| s.clientid != clientid);
        self.states.retain(|_, e| e.clientid != clientid);
        let files = self.locks.files_of(clientid);
        self.locks.remove_client(clientid);
        self.cb_forget_client(clientid);
        // Its locks are gone: owners of other clients that waited for them may lock now.
        for f in files {
            self.locks_released(f);
        }
    }

    /// Counts for status output and tests.
    pub fn counts(&self) -> StateCounts {
        StateCounts {
            clients: self.clients.len(),
            sessions: self.sessions.len(),
            opens: self
                .states
                .values()
                .filter(|e| e.kind == StateKind::Open)
                .count(),
            lock_stateids: self
                .states
                .values()
                .filter(|e| e.kind == StateKind::Lock)
                .count(),
            locks: self.locks.len(),
        }
    }
}

/// Sizes of the state tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateCounts {
    pub clients: usize,
    pub sessions: usize,
    pub opens: usize,
    pub lock_stateids: usize,
    pub locks: usize,
}

#[cfg(test)]
mod tests;
