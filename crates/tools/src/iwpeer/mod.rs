//! The iwpeer protocol of `interop/README.md` (the same protocol as `interop/guest/iwpeer.c`,
//! which runs over kernel siw + rdma-core), so that oxrdma's soft-iWARP provider can be checked
//! against kernel siw in both directions: the engine behind `oxrdma iwarp peer`.
//!
//! One RC connection; every message is a Send whose first 32 bytes are a big-endian control
//! header ([`Hdr`]); the client says in its HELLO which ops (send, sendinv, write, read) run,
//! with which size, how many times and who drives them.
//!
//! - [`hdr`]: the wire format (checked decoder, plain struct) and the payload pattern;
//! - [`verdict`]: the responder's verdicts on the driver's ops, sans-IO;
//! - [`peer`]: the thin driver over `verbs` ([`server`], [`client`]), which reports what it
//!   sees as [`Event`]s and returns the number of failed ops.
//!
//! What it does not do: more than one connection per run (the server returns after one, like
//! iwpeer), any op the iwpeer protocol does not name, or print (the CLI does).

use std::net::SocketAddr;
use std::time::Duration;

use verbs::ConnParams;

pub mod hdr;
pub mod peer;
pub mod verdict;

pub use hdr::{HDR_LEN, Hdr, HdrError, Op, pattern};
pub use peer::{MAX_SIZE, client, server};

/// Who drives the ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// The client drives, the server responds.
    Client,
    /// The server drives, the client responds.
    Server,
    /// The client drives first, then the server.
    Both,
}

impl Drive {
    /// The HELLO `flags` that say so.
    pub fn flags(self) -> u8 {
        match self {
            Drive::Client => hdr::DRIVE_CLIENT,
            Drive::Server => hdr::DRIVE_SERVER,
            Drive::Both => hdr::DRIVE_CLIENT | hdr::DRIVE_SERVER,
        }
    }
}

/// What both sides need.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Connection parameters (iwpeer: IRD = ORD = 1; CRC, peer-to-peer and RTR kinds, MPA
    /// revision, and the capture directory, also used for the device).
    pub params: ConnParams,
    /// Overall time limit (the connection setup, and the run after it).
    pub timeout: Duration,
    /// Client: how long to wait for the HELLO answer before nudging the server with a
    /// zero-length RDMA Write (zero: at once). See the driver's `hello_answer`.
    pub nudge: Duration,
}

/// The server: its target buffer size (the largest op size it accepts).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Target buffer size.
    pub size: u32,
    /// Common settings.
    pub peer: PeerConfig,
}

/// The client: which ops run, with which size, how many times, driven by whom.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Ops to run (the driver runs them in protocol order).
    pub ops: Vec<Op>,
    /// Payload size of every op (also the client's buffer size).
    pub size: u32,
    /// Iterations of every op.
    pub iters: u32,
    /// Who drives.
    pub drive: Drive,
    /// Common settings.
    pub peer: PeerConfig,
}

/// What a run sees, in order, for the caller to print.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The server listens on this address.
    Listening(SocketAddr),
    /// The connection is up.
    Connected {
        /// Our address.
        local: SocketAddr,
        /// The peer's address.
        peer: SocketAddr,
        /// MPA CRC-32C in use.
        crc: bool,
        /// Negotiated IRD.
        ird: u16,
        /// Negotiated ORD.
        ord: u16,
    },
    /// Detail of the run (iwpeer's `#` lines; a quiet caller drops them).
    Info(String),
    /// What the connection saw before a setup error (Terminates name the layer, type and
    /// code of a wire error); always worth printing.
    Diagnostic(String),
    /// An op this side drove passed every iteration.
    OpPassed {
        /// Op name.
        op: &'static str,
        /// Payload size.
        size: u32,
        /// Iterations.
        iters: u32,
    },
    /// An op this side drove failed.
    OpFailed {
        /// Op name.
        op: &'static str,
        /// Payload size.
        size: u32,
        /// Why.
        why: String,
    },
    /// This side, as responder, NAKed one of the peer's ops (which fails the run too).
    PeerFailed {
        /// Op name.
        op: &'static str,
        /// Length the peer gave.
        len: u32,
        /// NAK code ([`hdr::nak`]).
        code: u32,
        /// Offset or value.
        value: u32,
        /// Iteration.
        iter: u32,
    },
}

/// Why a run could not be completed (iwpeer's setup/connection errors and timeouts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// Setup, connection, protocol or timeout failure, in words.
    #[error("{0}")]
    Setup(String),
}
