//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p oxrdma MODULE::`.

mod conform_cli;
mod decode_cli;
mod iwarp_peer;
mod nfs_cli;
mod perf_cli;
mod pynfs;
mod rds_cli;
mod rds_peer;
mod rpc_cli;
mod rpc_rdma;
