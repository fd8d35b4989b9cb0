//! The tools behind `oxrdma rds ping`, `rds stress` and `rds peer`, on the `rds` crate: the CLI
//! calls these and prints the structured results.
//!
//! - [`ping`](mod@ping): rds-ping (zero-length pings to port 0, one round-trip time each);
//! - [`stress`]: rds-stress request/ack load, with `rdma_size` rds-stress `-D` (an RDMA Write
//!   into a buffer each request advertises, counted as mbi/mbo);
//! - [`baseline`]: a raw-TCP request/response with the same sizes, depth and tasks;
//! - [`peer`]: the jobs of `rds peer` against a remote node (the interop lab's datagram format);
//! - [`info`]: the short in-process exchange before `rds info` shows [`rds::RdsStack::info`].

pub mod baseline;
pub mod info;
pub mod peer;
pub mod ping;
pub mod stress;

pub use baseline::{tcp_baseline_client, tcp_baseline_server};
pub use ping::{PingReport, ping};
pub use stress::{
    StressParams, StressResult, StressServer, stress_client, stress_server, stress_server_rdma,
};
