//! Every integration test of this crate, in one test binary (one link instead of one per
//! file: CI's build time and disk). Each file below is a module; run one with
//! `cargo nextest run -p xdr MODULE::`.

mod props;
