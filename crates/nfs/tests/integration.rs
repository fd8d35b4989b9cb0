//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p nfs MODULE::`.

mod nfs4_util;

mod ddp_loopback;
mod drc;
mod e2e_rdma;
mod e2e_rdma_counters;
mod e2e_rrc;
mod e2e_tcp;
mod exports;
mod filecache;
mod libnfs_tools;
mod lifecycle;
mod nfs40;
mod nfs4_callback_props;
mod nfs4_callbacks;
mod nfs4_client;
mod nfs4_codec_props;
mod nfs4_exports;
mod nfs4_files;
mod nfs4_state;
mod nfs4_tcp;
mod portmap_mount;
mod rpcbind_client;
mod server_local;
mod short_reply_retry;
mod shutdown_inflight;
mod ulb;
mod xdr_props;
