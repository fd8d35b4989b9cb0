//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p tools MODULE::`. `pools.rs` is a binary of its own: it counts every
//! buffer pool of its process.

#[path = "../../verbs/tests/common/mod.rs"]
mod verbs_common;

mod conform;
mod conform_props;
mod decode_iwarp;
mod decode_nfs;
mod decode_rds;
mod decode_rpcrdma;
mod decode_tshark;
mod hostile;
mod iwpeer_hdr;
mod iwpeer_peer;
mod rds_tools;
mod torture;
