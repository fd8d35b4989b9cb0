//! # tools — what oxrdma measures, stresses and tests with
//!
//! What it does: the tools that sit on top of the protocol crates and are not protocols
//! themselves — bandwidth and latency measurement, stress and torture runs, benchmarks, and test
//! peers. The `oxrdma` CLI parses arguments, calls into this crate and prints what it returns.
//!
//! - [`perf`]: `oxrdma perf`, perftest-style RDMA Write/Read/Send bandwidth and latency with the
//!   raw-TCP ceiling of the same path, in one process or two (a control exchange in the MPA
//!   private data: [`perf::control`]).
//! - [`rds`](mod@rds): `rds ping`, `rds stress` (with a raw-TCP baseline and rds-stress `-D`),
//!   and the jobs of `rds peer` against a kernel node.
//! - [`iwpeer`]: the iwpeer protocol of the interop lab (`iwarp peer`): the 32-byte control
//!   header codec, the responder's verdicts (sans-IO) and a thin driver over `verbs`.
//! - [`nfs_bench`]: `nfs bench`, NFSv3 and NFSv4.1/4.2 sequential READ/WRITE and GETATTR over
//!   RDMA and TCP against an in-process server, with the raw TCP ceiling; [`nfs4_bench`] is
//!   its NFSv4 half.
//! - [`rpc_bench`]: `rpc bench`, NULL round trips at a depth, RDMA ÷ TCP.
//! - [`torture`]: `nfs torture`, a fault-injection campaign of mixed NFSv3 operations with
//!   connection drops from either side, checked against a model of the file tree.
//! - [`soak`]: `nfs torture --soak`, many RPC-over-RDMA connections at full credits, sampled
//!   (ops/s, server RSS, open registrations, credits in use).
//! - [`hostile`]: `nfs torture --hostile`, hostile clients (Long Calls never answered, stalled
//!   connections, replies never read) through [`proxy`] beside a well-behaved client.
//! - [`decode`]: `oxrdma decode`, a pcap/pcapng decoder for iWARP (MPA/DDP/RDMAP),
//!   RPC-over-RDMA versions 1 and 2 with the RPC and NFS messages under them, and RDS over TCP
//!   and iWARP, with TCP reassembly, gap reports and a per-XID timeline.
//! - [`conform`]: `oxrdma conform`, a black-box conformance suite for RPC-over-RDMA servers
//!   (RFC 8166, RFC 8797, cel-05 version 2, RFC 8267) with its own requester; a table and JUnit XML.
//! - [`proxy`]: a fault-injecting TCP relay (stall a direction, stop reading a side, drop the
//!   connection) that turns any client, soft-iWARP or ONC RPC over TCP, into a hostile one.
//!
//! Results are plain structs; those the CLI prints as `--json` derive `serde::Serialize` (field
//! names and shape as the CLI has always printed them, figures rounded to the same decimals).
//! Tool-private wire formats (the perf control exchange, the iwpeer header) are checked decoders
//! that never panic, with proptests and, for iwpeer, a fuzz target.
//!
//! What it does not do: implement any of the real protocols (those stay in `xdr`, `oncrpc`,
//! `verbs`, `rpcrdma`, `rds` and `nfs`), parse command lines or print (the CLI does).

mod bench_rows;
pub mod conform;
pub mod decode;
pub mod hostile;
pub mod iwpeer;
mod json;
pub mod nfs4_bench;
pub mod nfs_bench;
pub mod nfs_connect;
pub mod perf;
pub mod proxy;
mod raw_tcp;
pub mod rds;
pub mod rpc_bench;
pub mod soak;
pub mod torture;
