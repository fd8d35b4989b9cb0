//! # verbs — RDMA verbs for oxrdma
//!
//! An async, rdma-core-shaped verbs API and the providers that implement it:
//!
//! * **soft-iWARP over TCP** ([`Device::soft_iwarp`]): MPA (RFC 5044) with the enhanced
//!   connection setup of RFC 6581, DDP (RFC 5041) and RDMAP (RFC 5040), interoperable in
//!   behaviour with Linux `siw`;
//! * **in-memory loopback** ([`Device::loopback`]): the same protocol stack over in-process
//!   pipes of a [`LoopbackFabric`] — no sockets, fast and deterministic, for upper-layer tests.
//!
//! ## Shape of the API
//!
//! ```text
//! Device ── alloc_pd() ─► ProtectionDomain ── register(buf, Access) ─► MemoryRegion (lkey/rkey, read/write)
//!        ── create_cq() ─► CompletionQueue (poll / async next)
//!        ── create_qp(&pd, &send_cq, &recv_cq) ─► QueuePair (post_send / post_recv)
//!        ── listen(addr) ─► Listener ── accept() ─► ConnectRequest ── accept(&qp, ConnParams) ─► Connection
//!                                                                   └─ reject(private_data)
//!        ── connect(&qp, addr, ConnParams) ─► Connection | Err(VerbsError::Rejected(private_data))
//! Connection: peer_private_data(), ird()/ord(), next_event() -> CmEvent, disconnect()
//! ```
//!
//! Semantics follow rdma-core / rdma_cm on iWARP:
//! * STag = 24-bit random index << 8 | 8-bit key; `lkey == rkey`; [`MemoryRegion::reregister`]
//!   rotates the key; invalidated, deregistered or foreign-PD STags fail remote access.
//! * Send and RDMA Write complete when handed to the transport; RDMA Read completes when the
//!   whole response was placed. Unsignaled WRs complete only on error.
//! * Receives can be posted before connecting. A Send arriving with no posted receive is a DDP
//!   "no buffer" error: the receiver sends a Terminate (iWARP has no RNR retry, like siw).
//! * Any protection or format error produces a Terminate with the RFC 5040/5041/5044 layer, type
//!   and code, no data is placed, both QPs go to [`QpState::Error`], every outstanding WR
//!   completes with [`WcStatus::WrFlushError`] (a Read refused by the peer completes with
//!   [`WcStatus::RemoteAccessError`]), and the stream is closed.
//! * Private data (≤ 256 bytes) travels in both directions; IRD/ORD ≤ 128 are negotiated with
//!   RFC 6581 words; Reads beyond ORD wait in the send queue; Read Requests beyond IRD are
//!   Terminated.
//! * Tagged offsets are zero-based: address region bytes as `mr.addr() + offset`.
//!
//! Protocol logic is sans-IO: [`wire`] holds checked decoders, `handshake` the MPA setup and the
//! engine the RDMAP/DDP state machine; `cm` is the thin tokio driver (one reader and one writer
//! task per connection, vectored writes, TCP_NODELAY). Connections can be captured to pcap files
//! ([`ConnParams::capture_dir`], [`SoftIwarpConfig::capture_dir`] or `OXRDMA_PCAP_DIR`).
//!
//! ## What it does not do
//! No MPA markers (refused, like siw), no memory windows, atomics or immediate data (siw has
//! none), no shared receive queues, no IPv6 in captures (written as IPv4), and no rdma-core
//! provider yet (the `rdma-core` feature only pulls in `sideway`).

pub mod cm;
pub mod cq;
pub mod engine;
pub mod handshake;
pub mod mem;
pub mod pcap;
pub mod perf;
pub mod wire;

pub use cm::{
    CmEvent, ConnParams, ConnectRequest, Connection, Device, Listener, LoopbackFabric, Provider,
    QueuePair, SoftIwarpConfig,
};
pub use cq::{
    Completion, CompletionQueue, Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
pub use engine::{QpState, RtrKind};
pub use mem::{Access, MemoryRegion, ProtectionDomain};
pub use wire::ddp::Terminate;

use bytes::Bytes;

/// Errors of the verbs API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A malformed argument (WR, registration, parameters).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The QP or connection is not in a state that allows the call.
    #[error("invalid state: {0}")]
    InvalidState(&'static str),
    /// Offset/length outside a memory region.
    #[error("out of bounds")]
    OutOfBounds,
    /// The peer rejected the connection; its private data.
    #[error("connection rejected by peer")]
    Rejected(Bytes),
    /// Connection setup timed out (10 s initiator / 5 s responder, like siw).
    #[error("timed out")]
    Timeout,
    /// The stream closed.
    #[error("disconnected")]
    Disconnected,
    /// The peer violated the protocol during setup.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A wire decode error.
    #[error("wire: {0}")]
    Wire(#[from] wire::WireError),
    /// I/O error (message kept as text so the error stays `Clone`).
    #[error("I/O: {0}")]
    Io(String),
}

impl From<std::io::Error> for VerbsError {
    fn from(e: std::io::Error) -> Self {
        VerbsError::Io(e.to_string())
    }
}
