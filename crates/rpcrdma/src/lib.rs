//! rpcrdma (design overview to be written with the crate).

pub mod ulb;
