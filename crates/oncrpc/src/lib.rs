//! # oncrpc — ONC RPC version 2 (RFC 5531) for oxrdma
//!
//! What it does:
//! - [`message`]: call and reply headers with every `accept_stat`, `reject_stat` and
//!   `auth_stat`; checked decoding (never panics) and exact encoding.
//! - [`auth`]: AUTH_NONE and AUTH_SYS, and enough of RPCSEC_GSS (RFC 2203) to tell the service
//!   (none, integrity, privacy) of a call, because RPC-over-RDMA must not reduce payloads under
//!   integrity or privacy (RFC 8166 §9.2.2).
//! - [`service`]: the transport-neutral server side. A [`service::Program`] handles calls; the
//!   [`service::Dispatcher`] routes them and produces PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL,
//!   GARBAGE_ARGS, SYSTEM_ERR, RPC_MISMATCH and AUTH_ERROR replies.
//! - [`client`]: the transport-neutral client side ([`client::RpcTransport`], [`client::CallRequest`]).
//!
//! What it does not do: RPC-over-RDMA (crate `rpcrdma` implements the same traits over RDMA),
//! RPCSEC_GSS context establishment or wrapping, and UDP.

pub mod auth;
pub mod client;
pub mod message;
pub mod service;

pub use auth::{AuthSys, Credential, OpaqueAuth};
pub use client::{CallRequest, ReplyExpectation, RpcError, RpcTransport};
pub use message::{AcceptStat, AuthStat, CallHeader, MessageHeader, RejectedReply, ReplyHeader};
pub use service::{Call, CallContext, Dispatcher, Outcome, Program, ReplyMessage, TransportKind};
