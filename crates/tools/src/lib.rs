//! # tools — what oxrdma measures, stresses and tests with
//!
//! What it does: the tools that sit on top of the protocol crates and are not protocols
//! themselves — bandwidth and latency measurement, stress and torture runs, benchmarks, and test
//! peers. The `oxrdma` CLI parses arguments, calls into this crate and prints what it returns.
//!
//! - [`torture`]: `nfs torture`, a fault-injection campaign of mixed NFSv3 operations with
//!   connection drops from either side, checked against a model of the file tree.
//! - [`soak`]: `nfs torture --soak`, many RPC-over-RDMA connections at full credits, sampled
//!   (ops/s, server RSS, open registrations, credits in use).
//! - [`hostile`]: `nfs torture --hostile`, hostile clients (Long Calls never answered, stalled
//!   connections, replies never read) through [`proxy`] beside a well-behaved client.
//! - [`proxy`]: a fault-injecting TCP relay (stall a direction, stop reading a side, drop the
//!   connection) that turns any client, soft-iWARP or ONC RPC over TCP, into a hostile one.
//!
//! What it does not do: implement any protocol (those stay in `xdr`, `oncrpc`, `verbs`,
//! `rpcrdma`, `rds` and `nfs`), parse command lines or print (the CLI does).

pub mod hostile;
pub mod proxy;
pub mod soak;
pub mod torture;
