//! # rpcrdma — RPC-over-RDMA Version One (RFC 8166 / 5666bis, RFC 8167, RFC 8797)
//!
//! What it does:
//! - [`header`]: the transport header codec (RDMA_MSG, RDMA_NOMSG, RDMA_ERROR; RDMA_MSGP and
//!   RDMA_DONE recognised so they can be refused), checked and never panicking.
//! - [`privdata`]: RFC 8797 connection private data (inline sizes, Send With Invalidate).
//! - [`ulb`]: the Upper-Layer Binding contract (DDP-eligibility, maximum reply size, chunk limits).
//!
//! What it does not do: RPC-over-RDMA version 2, the Read-Read transfer model, RDMA_MSGP
//! padding; it never reduces an item its Upper-Layer Binding did not mark DDP-eligible.

pub mod driver;
pub mod engine;
pub mod header;
pub mod privdata;
pub mod requester;
pub mod responder;
pub mod ulb;

pub use driver::{RdmaClient, RdmaServer, ServerConnection, TransportConfig, connect};
