//! # nfs — NFS on RPC-over-RDMA for oxrdma
//!
//! (overview completed below with the crate)

#![forbid(unsafe_code)]

mod xdr_util;

pub mod mount;
pub mod nfs3;
pub mod portmap;
pub mod server;
pub mod vfs;

pub use xdr_util::{Void, decode_exact, encode_to_bytes};
