//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p rpcrdma MODULE::`.

mod common;

mod budget;
mod call_hints;
mod cancel;
mod engine;
mod engine_props;
mod header_props;
mod header_v2;
mod loopback;
mod pipelined_null;
mod quiesce;
mod quiesce_soft_iwarp;
mod responder_timers;
mod rrc;
mod rrc_soft_iwarp;
mod tshark;
mod v2_engine;
mod v2_exchange;
mod v2_responder;
mod v2_soft_iwarp;
