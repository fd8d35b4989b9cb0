//! # oncrpc — ONC RPC version 2 (RFC 5531) for oxrdma
//!
//! What it does:
//! - [`message`]: call and reply headers with every `accept_stat`, `reject_stat` and
//!   `auth_stat`; checked decoding (never panics) and exact encoding.
//! - [`auth`]: AUTH_NONE and AUTH_SYS, and enough of RPCSEC_GSS (RFC 2203) to tell the service
//!   (none, integrity, privacy) of a call, because RPC-over-RDMA must not reduce payloads under
//!   integrity or privacy (RFC 8166 §8.2.2.3).
//! - [`service`]: the transport-neutral server side. A [`service::Program`] handles calls; the
//!   [`service::Dispatcher`] routes them and produces PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL,
//!   GARBAGE_ARGS, SYSTEM_ERR, RPC_MISMATCH and AUTH_ERROR replies.
//! - [`client`]: the transport-neutral client side ([`client::RpcTransport`], [`client::CallRequest`])
//!   and [`client::RpcClient`], a per-program convenience wrapper over any transport.
//! - [`record`]: TCP record marking (RFC 5531 §11), a sans-IO decoder and a zero-copy framer.
//! - [`tcp`]: thin tokio drivers: [`tcp::TcpServer`] (concurrent calls per connection, bounded,
//!   graceful shutdown) and [`tcp::TcpClient`] (pipelined, XID matching, timeouts, reconnect
//!   and retransmit with the same XID).
//! - [`backchannel`]: calls from a server to its client on the client's connection (RFC 8167;
//!   NFSv4.1 back channels over TCP).
//! - [`null`]: a program that answers only NULL, for `rpcinfo`, benchmarks and tests.
//! - [`rtt`]: round-trip times per procedure as a client transport measures them (transmission
//!   to reply, as `mountstats` reports RTT apart from execute time).
//! - [`budget`]: per-server and per-connection memory budgets that every transport's server
//!   side draws from before it allocates what a peer asked for.
//! - `testing` (feature `testing`): a program that reports the hints a call came with, and the
//!   scenario every transport's server must pass with it.
//!
//! What it does not do: RPC-over-RDMA (crate `rpcrdma` implements the same traits over RDMA),
//! RPCSEC_GSS context establishment or wrapping, UDP, a duplicate request cache, and portmap
//! registration (crate `nfs`).

pub mod auth;
pub mod backchannel;
pub mod budget;
pub mod bufpool;
pub mod client;
pub mod message;
pub mod null;
pub mod record;
pub mod rtt;
pub mod service;
pub mod tcp;
#[cfg(feature = "testing")]
pub mod testing;

pub use auth::{AuthSys, Credential, OpaqueAuth};
pub use backchannel::{BackCall, BackChannel, BackHandle};
pub use budget::{BudgetError, ConnBudget, MemoryBudget, Reservation};
pub use bufpool::BufPool;
pub use client::{CallRequest, ReplyExpectation, RpcClient, RpcError, RpcTransport};
pub use message::{AcceptStat, AuthStat, CallHeader, MessageHeader, RejectedReply, ReplyHeader};
pub use null::null_program;
pub use record::{RecordDecoder, RecordError};
pub use service::{
    Call, CallContext, CallHints, Dispatcher, Outcome, Program, ReplyMessage, TransportKind,
};
pub use tcp::{
    ClientConfig, ReplyBound, ServerConfig, TcpClient, TcpServer, TcpServerStats, serve_tcp,
};
