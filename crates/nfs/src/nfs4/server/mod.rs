//! The NFSv4.1/4.2 COMPOUND executor (RFC 8881 §16.2, §18; RFC 7862 §15) over the exports of
//! a [`crate::gate::ExportTable`], sharing the NFSv3 server's file operations
//! ([`crate::fsops`]), file handles and export access rules.
//!
//! - `compound`: the COMPOUND loop: minor versions, SEQUENCE and the session limits, the
//!   current and saved filehandles and the current stateid, the reply cache.
//! - `session`: EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION, BIND_CONN_TO_SESSION,
//!   DESTROY_CLIENTID, RECLAIM_COMPLETE, BACKCHANNEL_CTL, TEST_STATEID, FREE_STATEID.
//! - `fh`: filehandles, the pseudo root, LOOKUP/LOOKUPP, SECINFO.
//! - `files`: the namespace and attribute operations (GETATTR, SETATTR, VERIFY, ACCESS,
//!   CREATE, REMOVE, RENAME, LINK, READLINK, READDIR).
//! - `io`: OPEN, CLOSE, OPEN_DOWNGRADE, READ, WRITE, COMMIT, LOCK/LOCKT/LOCKU, SEEK,
//!   ALLOCATE, DEALLOCATE.
//! - `v40`: minor version 0 (RFC 7530): its COMPOUND loop, SETCLIENTID and the other
//!   4.0-only operations, the seqid ordering of owners.
//! - [`program`]: the NFS program answering versions 3 and 4 together.
//! - `callbacks`: the connections' back channels and the sending of due callbacks.
//!
//! The state tables ([`super::state`]) sit behind one mutex, taken only around state calls,
//! never across file-system work.

mod callbacks;
mod compound;
mod fh;
mod files;
mod io;
pub mod program;
mod session;
mod v40;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncrpc::Credential;

use super::state::{ConnId, ServerIdentity, State, StateConfig};
use super::types::{Opaque1024, ServerOwner4, Verifier4};
use crate::gate::ExportTable;

pub use compound::Garbage;

/// Settings of the NFSv4 service.
#[derive(Debug, Clone)]
pub struct Nfs4Config {
    /// Bounds and times of the state tables (lease 90 s by default).
    pub state: StateConfig,
    /// Largest READ and WRITE (`maxread`, `maxwrite`): 1 MiB.
    pub max_io: u32,
}

impl Default for Nfs4Config {
    fn default() -> Self {
        Nfs4Config {
            state: StateConfig::default(),
            max_io: crate::fsops::MAX_IO,
        }
    }
}

impl Nfs4Config {
    /// These settings with a grace period of `grace` (RFC 8881 §8.4.2: at least one lease
    /// period after a restart; zero when the caller knows no client can have state to
    /// reclaim, as in tests).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.state.grace = grace;
        self
    }
}

/// One COMPOUND call as the executor sees it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The procedure's arguments (`COMPOUND4args`).
    pub args: &'a Bytes,
    /// The RPC credential, before any export's squashing.
    pub cred: &'a Credential,
    /// The caller (`None` for in-process calls, which no client list restricts).
    pub peer: Option<SocketAddr>,
    /// The transport connection.
    pub conn: ConnId,
}

/// The NFSv4.1 server: state, exports, write verifier and identity.
#[derive(Debug)]
pub struct Nfs4Server {
    table: Arc<ExportTable>,
    state: Mutex<State>,
    cfg: Nfs4Config,
    write_verf: Verifier4,
    /// The READDIR cookie verifier: new for every instance.
    cookie_verf: Verifier4,
    identity: ServerIdentity,
    read_bufs: Arc<oncrpc::BufPool>,
    /// The connections' backward directions, for callbacks.
    routes: callbacks::Routes,
    /// NFSv4.0 open- and lock-owners: last seqid and reply (RFC 7530 §9.1.7).
    owners40: Mutex<v40::Owners40>,
}

/// Idle pooled READ buffers kept.
const POOLED_READ_KEEP: usize = 32;

impl Nfs4Server {
    /// Serve the exports of `table`.
    pub fn new(table: Arc<ExportTable>, cfg: Nfs4Config) -> Arc<Self> {
        let now_wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let boot = (now_wall.as_secs() as u32) ^ rand::random::<u32>();
        // The same verifier as NFSv3's: one per server instance, kept across a clean restart.
        let write_verf = table.write_verifier();
        let cookie_verf = crate::verifier::fresh();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".to_string());
        // RFC 8881 §2.5: one server owner for every address of this server instance, so a
        // client that reaches it twice (TCP and RDMA) sees one server and may trunk; another
        // instance on the same host (another port, other exports) has another owner.
        let identity = ServerIdentity {
            owner: ServerOwner4 {
                minor_id: 0,
                major_id: Opaque1024::from_slice(format!("oxrdma:{host}:{boot:08x}").as_bytes()),
            },
            scope: format!("oxrdma:{host}").into_bytes(),
            impl_domain: b"oxrdma.invalid".to_vec(),
            impl_name: format!("oxrdma {}", env!("CARGO_PKG_VERSION")).into_bytes(),
        };
        Arc::new(Nfs4Server {
            table,
            state: Mutex::new(State::new(cfg.state.clone(), boot, Instant::now())),
            cfg,
            write_verf,
            cookie_verf,
            identity,
            read_bufs: oncrpc::BufPool::new(POOLED_READ_KEEP),
            routes: callbacks::Routes::default(),
            owners40: Mutex::default(),
        })
    }

    /// The state tables (locked).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The write verifier of this server instance (WRITE and COMMIT, RFC 8881 §18.32.3).
    pub fn write_verifier(&self) -> Verifier4 {
        self.write_verf
    }

    /// Expire the leases that ran out (RFC 8881 §8.3), and unbind the connections that closed
    /// since the last call from their sessions; returns when to call again.
    pub fn expire(&self, now: Instant) -> Option<Instant> {
        // Swept before the state is locked (the routes' lock is never taken inside it).
        let closed = self.routes.sweep();
        let mut st = self.state();
        for conn in closed {
            // RFC 8881 §2.10.13.1: a session whose back channel's connection is gone says so
            // (SEQ4_STATUS_CB_PATH_DOWN_SESSION) until the client binds another; and the
            // session's set of connections does not grow with every reconnection.
            st.conn_closed(conn);
        }
        let gone = st.poll(now);
        if !gone.is_empty() {
            tracing::info!(clients = gone.len(), "NFSv4 leases expired");
        }
        st.next_deadline()
    }

    /// A connection closed: its session bindings go ([`Nfs4Server::expire`] finds the closed
    /// connections itself; this is for a caller that learns of a close first).
    pub fn conn_closed(&self, conn: ConnId) {
        self.state().conn_closed(conn);
    }
}
