//! # verbs — RDMA verbs for oxrdma
//!
//! An async, rdma-core-shaped verbs API and the providers that implement it:
//!
//! * **soft-iWARP over TCP** ([`Device::soft_iwarp`]): MPA (RFC 5044) with the enhanced
//!   connection setup of RFC 6581, DDP (RFC 5041) and RDMAP (RFC 5040), following the behaviour
//!   of Linux `siw` (facts in `shared/facts/iwarp-and-linux-siw.md`);
//! * **in-memory loopback** ([`Device::loopback`]): the same protocol stack over in-process
//!   pipes of a [`LoopbackFabric`] — no sockets, fast and deterministic, for upper-layer tests;
//! * **rdma-core** (cargo feature `rdma-core`, `Device::rdma_core`, module `hw`): a real RDMA
//!   device — a NIC, or the kernel's siw / rxe — through libibverbs and librdmacm, behind the
//!   same types. [`Device::from_spec`] picks a provider by name (the CLI's `--provider`) and
//!   [`Device::default_device`] is what upper layers use when configured with none.
//!
//! ## Shape of the API
//!
//! ```text
//! Device ─ alloc_pd() ─► ProtectionDomain ─ register(Vec<u8>, Access) / register_len(n, Access)
//!        │                                   ─► MemoryRegion: lkey() rkey() addr() read() write() invalidate() reregister()
//!        ├ create_cq() ─► CompletionQueue: poll(max) / try_next() / async next() -> Completion
//!        │                                  or set_handler(f): f(Completion) where it is made
//!        ├ create_qp(&pd, &send_cq, &recv_cq) ─► QueuePair: post_send(SendWr) post_recv(RecvWr) state()
//!        ├ async listen(addr) ─► Listener ─ async accept() ─► ConnectRequest
//!        │        ConnectRequest: private_data() ird() ord() peer_addr() crc() peer_to_peer()
//!        │                        async accept(&qp, ConnParams) ─► Connection | async reject(&[u8])
//!        └ async connect(&qp, addr, ConnParams) ─► Connection | Err(VerbsError::Rejected(private data))
//! Connection: qp() peer_private_data() ird() ord() async next_event() -> CmEvent
//!             async disconnect() async closed()
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), verbs::VerbsError> {
//! use verbs::{Access, ConnParams, Device, RecvWr, SendOp, SendWr};
//! let dev = Device::soft_iwarp();
//! let pd = dev.alloc_pd();
//! let (scq, rcq) = (dev.create_cq(), dev.create_cq());
//! let qp = dev.create_qp(&pd, &scq, &rcq);
//! let buf = pd.register_len(4096, Access::LOCAL_WRITE)?;
//! qp.post_recv(RecvWr::new(1, buf.sge(0, 4096)))?; // before connecting is fine
//! let conn = dev.connect(&qp, "127.0.0.1:4791".parse().unwrap(), ConnParams::default()).await?;
//! let src = pd.register(b"hello".to_vec(), Access::LOCAL_WRITE)?;
//! qp.post_send(SendWr::new(2, SendOp::RdmaWrite { remote_addr: 0, rkey: 0x1234_5601 }, vec![src.sge(0, 5)]))?;
//! let wc = scq.next().await;
//! conn.disconnect().await;
//! # let _ = wc; Ok(()) }
//! ```
//!
//! Semantics follow rdma-core / rdma_cm on iWARP:
//! * STag = 24-bit random index << 8 | 8-bit key; `lkey == rkey`; [`MemoryRegion::reregister`]
//!   rotates the key; invalidated, deregistered (dropped) or foreign-PD STags fail remote access.
//! * Tagged offsets are zero-based: address region bytes as `mr.addr() + offset`.
//! * Send and RDMA Write complete when handed to the transport; RDMA Read completes when the
//!   whole response was placed; an RDMA Read takes one local SGE (the sink STag). Unsignaled WRs
//!   complete only on error.
//! * Receives can be posted before connecting. A Send arriving with no posted receive is a DDP
//!   "no buffer" error: the receiver sends a Terminate (iWARP has no RNR retry, like siw), so
//!   upper layers must use credits.
//! * Any protection or format error produces a Terminate with the RFC 5040/5041/5044 layer, type
//!   and code, nothing of the failing segment is placed, both QPs go to [`QpState::Error`], every
//!   outstanding WR completes with [`WcStatus::WrFlushError`] (a Read refused by the peer
//!   completes with [`WcStatus::RemoteAccessError`]), both sides see
//!   [`CmEvent::TerminateSent`] / [`CmEvent::TerminateReceived`] and then
//!   [`CmEvent::Disconnected`].
//! * Private data (≤ 256 bytes) travels in both directions; IRD/ORD ≤ 128 are negotiated with
//!   the RFC 6581 words (ORD never exceeds the peer's IRD); Reads beyond ORD wait in the send
//!   queue; Read Requests beyond IRD are Terminated. `ConnParams::peer_to_peer` runs the RFC 6581
//!   RTR exchange (Write, Read or Send RTR); MPA revision 1 peers are accepted.
//! * Events: [`CmEvent::Established`] first, then Terminate/Error events, then `Disconnected`.
//!   Dropping a [`Connection`] disconnects it (like destroying the rdma_cm id).
//!
//! ## Structure
//! The public types ([`Device`], [`ProtectionDomain`], [`CompletionQueue`], [`QueuePair`],
//! [`Connection`]) hand each call to their provider (module `provider`):
//! * soft-iWARP (`provider::soft`): protocol logic is sans-IO — [`wire`] holds the checked
//!   decoders, `handshake` the MPA setup, [`engine`] the RDMAP/DDP state machine of one QP.
//!   Around them a thin tokio driver: the connection manager, one reader and one writer task per
//!   connection, and the transmit scheduling. TCP_NODELAY, FPDUs of at most the TCP MSS
//!   rounded down to 8, vectored writes straight from registered memory and, without CRC,
//!   payload read from the socket straight into the target region;
//! * loopback (`provider::loopback`): the same driver over in-process pipes;
//! * rdma-core (`provider::rdma_core`, feature `rdma-core`), behind one internal interface.
//!
//! Connections can be captured to pcap files ([`ConnParams::capture_dir`],
//! [`SoftIwarpConfig::capture_dir`] or `OXRDMA_PCAP_DIR`) that tshark decodes as MPA/DDP/RDMAP
//! from the SYN on ([`capture`]). Bandwidth and latency measurement lives in the `tools` crate.
//!
//! ## What it does not do
//! No MPA markers (refused with R, like siw), no memory windows, atomics or immediate data (siw
//! has none), no shared receive queues, no multi-SGE Read sinks, IPv6 endpoints are written as
//! IPv4 in captures. The rdma-core provider has its own list (`provider::rdma_core`): no captures, CRC and
//! peer-to-peer mode are the kernel driver's business, and its tagged offsets are virtual
//! addresses (always address regions through [`MemoryRegion::addr`]).

pub mod capture;
mod conn;
pub mod cq;
mod device;
pub mod mem;
mod provider;
mod qp;
pub mod wire;

/// The soft-iWARP engine: the sans-IO RDMAP/DDP state machine of one queue pair. Public
/// because the fuzz targets and property tests drive its receive path ([`engine::RxHarness`]);
/// the provider module around it is internal.
pub use provider::soft::engine;

pub use conn::{CmEvent, ConnParams, ConnStats, ConnectRequest, Connection, Listener};
pub use cq::{
    Completion, CompletionQueue, CqHandler, Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
pub use device::{Device, Provider};
pub use engine::{QpState, RtrKind};
pub use mem::{Access, MemoryRegion, ProtectionDomain};
pub use provider::loopback::LoopbackFabric;
#[cfg(feature = "rdma-core")]
pub use provider::rdma_core::{RdmaCoreConfig, RdmaCoreDevice, rdma_core_devices};
pub use provider::soft::{SoftIwarpConfig, TxSchedule};
pub use qp::QueuePair;
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
    /// No usable RDMA device (rdma-core provider), with the reason.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// I/O error (message kept as text so the error stays `Clone`).
    #[error("I/O: {0}")]
    Io(String),
}

impl From<std::io::Error> for VerbsError {
    fn from(e: std::io::Error) -> Self {
        VerbsError::Io(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    /// Upper layers share these across tasks.
    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<Device>();
        send_sync::<ProtectionDomain>();
        send_sync::<MemoryRegion>();
        send_sync::<CompletionQueue>();
        send_sync::<QueuePair>();
        send_sync::<Connection>();
        send::<Listener>();
        send::<ConnectRequest>();
        send_sync::<VerbsError>();
    }
}
