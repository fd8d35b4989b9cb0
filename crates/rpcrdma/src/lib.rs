//! # rpcrdma — RPC-over-RDMA versions 1 (RFC 8166, RFC 8167, RFC 8797) and 2 (draft-cel-05)
//!
//! What it does:
//! - [`header`]: the transport header codec (RDMA_MSG, RDMA_NOMSG, RDMA_ERROR; RDMA_MSGP
//!   recognised so it can be refused with RDMA_ERR_CHUNK, RDMA_DONE so it can be dropped). The decoder never
//!   panics; every error says how to answer it (ERR_VERS, ERR_CHUNK or silent discard).
//! - [`header_v2`] and [`props`]: the version 2 transport header of
//!   draft-cel-nfsv4-rpcrdma-version-two-05 (every procedure, the direction and remote
//!   invalidation fields, every error with its body) and its transport properties (RBSIZ, BRS,
//!   the experimental range, property-subset bitmaps), sharing version 1's chunk types. The
//!   decoder never panics and names the error the draft prescribes.
//! - [`version`]: version negotiation (cel-05 §8) as sans-IO state: the requester's probe and
//!   fallback with a bounded memory of version-1-only servers, the responder's per-connection
//!   version lock, and the version 2 transport properties that set the inline thresholds.
//! - [`privdata`]: RFC 8797 connection private data (inline sizes, Send With Invalidate), as
//!   Linux sends it.
//! - [`requester`] and [`responder`]: sans-IO engines. They take received messages, completions
//!   and `now`, and return actions (Send, RDMA Write, deliver, complete, close). Memory
//!   registration goes through the [`engine::Registrar`] trait, implemented by the verbs driver
//!   (and by an in-memory registrar for tests and fuzzing). They implement credits (one until
//!   the first reply, never above min(requested, granted), reset on reconnect), inline
//!   thresholds, every message form (Short, Chunked with Read and Write chunks, Long Call via a
//!   Position-Zero Read chunk, Long Reply via the Reply chunk), XDR round-up, DDP-eligibility
//!   checks against the [`ulb::UpperLayerBinding`], chunk-complexity limits, fencing of memory
//!   before an RPC completes (also on timeout, and when the caller drops the call's future),
//!   RPCSEC_GSS integrity/privacy (no reduction), the error rules of RFC 8166 §4.5 (including RDMA_ERR_CHUNK for XIDs whose reply was lost),
//!   retransmission with the same XID after a reconnect, and the backward direction (RFC 8167)
//!   with its own XIDs and credits, only after the Upper Layer enabled it.
//! - [`call_policy`]: the Requester's per-call decisions, sans-IO: whether a call may be
//!   reduced (not under RPCSEC_GSS integrity or privacy, nor for programs whose binding has no
//!   DDP-eligible item) and the larger Reply chunk of a short Reply chunk retry (RFC 8267 §3.1).
//! - [`lost`]: which failed reply Sends count as lost (RFC 8166 §4.5.3) and the per-peer
//!   registry of lost XIDs a server keeps between connections, sans-IO.
//! - Deadlines belong to the engines: the Requester's call timeouts
//!   (`Requester::next_deadline` / `poll_timeouts`), the Responder's RDMA Read and
//!   backward-call deadlines (`Responder::next_deadline` / `handle_timeout`). The memory of
//!   version-1-only servers is the Requester's too (`Requester::remember_versions_in`).
//! - [`driver`]: thin tokio drivers over the `verbs` crate that do I/O only: post work
//!   requests, move completions into the engines, perform every action the engines return
//!   (one exhaustive `perform` per role, `Close` included), sleep until the engine's next
//!   deadline and hand it `now`, and wake waiters. By role: `driver/link.rs` (the queue pair,
//!   its completion router, memory registration, sink buffers), `driver/server.rs`
//!   ([`RdmaServer`] serves an `oncrpc::Dispatcher`; [`ServerConnection`] makes backward
//!   calls; one timer task per connection), `driver/client.rs` ([`RdmaClient`] implements
//!   `oncrpc::RpcTransport`; one timer task), `driver/mod.rs` ([`TransportConfig`],
//!   [`connect`] for `rdma://` (this crate) or `tcp://` (`oncrpc::TcpClient`) URLs). Received
//!   messages are handled in the provider's context (a receive-queue handler, as Linux's
//!   reply handler runs from the completion), and the client's calls and replies go through
//!   an inbox that whoever holds the requester drains, so no thread sleeps on it.
//! - [`ulb`]: the Upper-Layer Binding contract (DDP-eligibility, maximum reply size, chunk
//!   limits, reply item positions).
//!
//! - Version 2 in both engines: the Responder checks the version first, locks a connection to
//!   the version of its first valid call and answers every client in its own version; the
//!   Requester probes (one message of at most 1 KB), falls back to version 1 on the same
//!   connection and remembers version-1-only servers; remote invalidation through
//!   `rdma_inv_handle`; the version 2 errors where their conditions occur, and the Requester's
//!   SHOULD retries after READ_CHUNKS (a Position-Zero Read chunk) and WRITE_CHUNKS (a Reply
//!   chunk); property messages both ways (each side sends RDMA2_CONNPROP once, with its
//!   receive buffer size as RBSIZ, and keeps one receive for the peer's; a peer's RBSIZ raises
//!   the send limit, and a version 2 call that fits it whole goes inline unreduced; REQPROP
//!   gets RESPROP). `CONFORMANCE.md` has the table.
//! - [`rrc`]: responder-provided Read chunks (draft-cel-nfsv4-rpcrdma-reliable-reply-02) on
//!   version 2: an experimental property announces them, an RDMA2_OPTIONAL carries the
//!   pull-completion notification; the Responder sends replies too large for inline and the
//!   Reply chunk as a Position-Zero Read chunk and keeps a bounded XID table of them with a
//!   pull deadline; the Requester pulls them and always notifies. Off by default.
//!
//! What it does not do: RDMA_MSGP padding, Write chunks in the backward direction, or reduction of any item its Upper-Layer
//! Binding did not mark DDP-eligible. Requesters refuse calls of programs without a binding
//! (`RpcError::NoBinding`, RFC 8166 §6); Responders still answer inline calls of such
//! programs (see `docs/traceability.md`).

pub mod call_policy;
pub mod driver;
pub mod engine;
pub mod header;
pub mod header_v2;
pub mod lost;
pub mod privdata;
pub mod props;
pub mod requester;
pub mod responder;
pub mod rrc;
pub mod ulb;
pub mod version;

pub use driver::{
    DrainReport, QuiesceReport, RdmaClient, RdmaServer, ServerConnection, TransportConfig, connect,
};
