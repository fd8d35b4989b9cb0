//! `oxrdma conform rdma://HOST:PORT`: the RPC-over-RDMA conformance suite (`tools::conform`);
//! this module parses the arguments and prints.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tools::conform::{self, ConformConfig, NfsTarget, Outcome};

use super::{CmdResult, parse_u32};

/// Run the RPC-over-RDMA conformance cases (RFC 8166, RFC 8797, cel-05 version 2, RFC 8267)
/// against a server; prints a table, optionally JUnit XML. Exit status 1 when a case fails.
#[derive(Debug, Args)]
pub struct ConformArgs {
    /// The server: rdma://HOST:PORT.
    target: String,
    /// The verbs provider of the requester: siw (soft-iWARP, the default) or
    /// rdma-core[:DEVICE] (builds with the rdma-core feature). Overrides --provider.
    #[arg(long, value_name = "siw|rdma-core[:DEV]")]
    transport: Option<String>,
    /// Write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Seconds to wait for each reply.
    #[arg(long, default_value_t = 5)]
    wait: u64,
    /// RPC program whose NULL the transport cases call (default NFS, 100003).
    #[arg(long, value_parser = parse_u32, default_value = "100003")]
    prog: u32,
    /// Its version.
    #[arg(long, default_value_t = 3)]
    vers: u32,
    /// MOUNT v3 over TCP (HOST:PORT): enables the NFS binding cases.
    #[arg(long, value_name = "HOST:PORT")]
    mount: Option<String>,
    /// The export to MNT.
    #[arg(long, default_value = "/")]
    export: String,
    /// A regular file in the export's root that the READ cases read (never written).
    #[arg(long, value_name = "NAME")]
    nfs_file: Option<String>,
    /// Only cases whose id contains this (repeatable).
    #[arg(long = "case", value_name = "ID")]
    only: Vec<String>,
}

fn device(spec: Option<&str>) -> Result<verbs::Device, String> {
    match spec {
        None => Ok(verbs::Device::default_device()),
        Some("siw") | Some("soft-iwarp") => Ok(verbs::Device::soft_iwarp()),
        Some(s) => verbs::Device::from_spec(s).map_err(|e| format!("--transport {s}: {e}")),
    }
}

pub async fn run(a: ConformArgs) -> CmdResult {
    let target = conform::parse_target(&a.target)?;
    let dev = device(a.transport.as_deref())?;
    let mut cfg = ConformConfig::new(target);
    cfg.wait = Duration::from_secs(a.wait.max(1));
    cfg.prog = a.prog;
    cfg.vers = a.vers;
    cfg.only = a.only;
    if let Some(m) = &a.mount {
        cfg.nfs = Some(NfsTarget {
            mount: conform::parse_target(m)?,
            export: a.export.clone(),
            file: a.nfs_file.clone(),
        });
    }
    let results = conform::run(dev, cfg).await?;
    print!("{}", conform::table(&a.target, &results));
    if let Some(f) = &a.junit {
        std::fs::write(f, conform::junit_xml(&a.target, &results))
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    if results.iter().any(|c| c.outcome == Outcome::Fail) {
        return Err("some cases failed".into());
    }
    Ok(())
}
