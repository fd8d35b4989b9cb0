//! ONC RPC over TCP (RFC 5531 §11 record marking): an async server and an async client.
//!
//! Both are thin tokio drivers around the sans-IO [`crate::record::RecordDecoder`] and the
//! transport-neutral [`crate::Dispatcher`] / [`crate::RpcTransport`].

mod back;
mod client;
mod conn_memory;
mod replies;
mod server;

pub use back::MAX_BACK_OUTSTANDING;
pub use client::{ClientConfig, MAX_BACK_CALLS, TcpClient};
pub use server::{
    DEFAULT_MAX_QUEUED_REPLY_BYTES, DEFAULT_REPLY_ESTIMATE, ReplyBound, ServerConfig, TcpServer,
    TcpServerStats, serve_connection, serve_tcp,
};

use bytes::BytesMut;

/// Smallest read the drivers ask the socket for.
const READ_CHUNK: usize = 64 * 1024;
/// Largest single reservation the drivers make for a fragment that is still arriving: a peer
/// announcing a huge fragment does not make us allocate it up front.
const MAX_RESERVE: usize = 1 << 20;

/// Make room in `buf` for the next read, guided by how much the decoder still wants.
fn reserve_for_read(buf: &mut BytesMut, decoder: &crate::record::RecordDecoder) {
    let wanted = decoder.wanted(buf);
    buf.reserve(wanted.clamp(READ_CHUNK, MAX_RESERVE));
}
