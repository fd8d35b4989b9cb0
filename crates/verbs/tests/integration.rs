//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p verbs MODULE::`.

mod common;

mod capture;
mod close_flush;
mod cm;
mod cq_handler;
mod errors;
mod ops;
mod proptest_wire;
mod read_ahead;
