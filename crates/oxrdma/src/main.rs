//! `oxrdma`: the command-line tool for oxrdma (RPC-over-RDMA, NFS/RDMA, RDS, soft-iWARP).
//!
//! Each command group lives in its own module under `cmd/` and is one variant of [`Command`];
//! adding a group means one `mod` line in `cmd/mod.rs`, one variant and one match arm here.
//! Transports are chosen with per-transport flags (see [`endpoint`]).
//!
//! The CLI parses arguments and prints, nothing more: protocols live in the protocol crates, and
//! measurement, stress, torture and test-peer logic (perf, `rds` ping/stress/peer jobs, the
//! iwpeer protocol, `nfs bench`, `rpc bench`, `nfs torture`) in the `tools` crate, whose result
//! structs give the `--json` output through `serde_json`.

mod cmd;
mod endpoint;
mod memtrim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: the data path allocates per message on one thread and
/// frees on another (a reply's buffer is made by the receive path and dropped by the caller),
/// which glibc serves with arena locks. Measured with `oxrdma rpc bench --depth 64`: see the
/// README's results.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "oxrdma",
    version,
    about = "RPC-over-RDMA, NFS/RDMA, RDS and soft-iWARP in Rust"
)]
struct Cli {
    /// More log output on stderr: -v info, -vv debug, -vvv trace. RUST_LOG, when set, wins.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// RDMA provider for every RDMA endpoint of the command: `soft-iwarp` (the default,
    /// userspace iWARP over TCP), or `rdma-core` / `rdma-core:DEVICE` (a real device or kernel
    /// siw/rxe through libibverbs and librdmacm; needs a build with `--features rdma-core`).
    #[arg(long, global = true, env = "OXRDMA_PROVIDER", value_name = "SPEC")]
    provider: Option<String>,

    /// RPC-over-RDMA version every client of the command offers: 1, 2 (draft-cel-nfsv4-
    /// rpcrdma-version-two-05), or auto (probe with version 2, fall back to version 1 on the
    /// same connection and remember the server) [default: 1]. Servers always accept both.
    #[arg(long, global = true, env = "OXRDMA_RPCRDMA_VERSION", value_name = "1|2|auto",
          value_parser = |s: &str| s.parse::<rpcrdma::version::VersionPolicy>())]
    rpcrdma_version: Option<rpcrdma::version::VersionPolicy>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// ONC RPC (RFC 5531): a NULL server and a NULL round-trip benchmark.
    #[command(subcommand)]
    Rpc(cmd::rpc::RpcCommand),
    /// RDS (Reliable Datagram Sockets): rds-ping, rds-stress, a listening node and info.
    #[command(subcommand)]
    Rds(cmd::rds::RdsCommand),
    /// Soft-iWARP tools: an iwpeer-protocol peer for interop with kernel siw.
    #[command(subcommand)]
    Iwarp(cmd::iwarp::IwarpCommand),
    /// NFSv3 over RPC-over-RDMA and TCP: a server over a local directory, a client self-test
    /// and a benchmark.
    #[command(subcommand)]
    Nfs(cmd::nfs::NfsCommand),
    /// perftest-style RDMA Write/Read/Send bandwidth and latency with the raw-TCP ceiling.
    Perf(cmd::perf::PerfArgs),
    /// Decode a pcap/pcapng capture: iWARP, RPC-over-RDMA v1/v2 with RPC and NFS, RDS.
    Decode(cmd::decode::DecodeArgs),
    /// Test an RPC-over-RDMA server's conformance (RFC 8166, RFC 8797, cel-05, RFC 8267).
    Conform(cmd::conform::ConformArgs),
}

fn init_tracing(verbose: u8) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.is_empty() => EnvFilter::new(s),
        _ => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs redirected to files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(memtrim::on_park)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oxrdma: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(p) = cli.rpcrdma_version {
        let _ = rpcrdma::version::set_default_policy(p);
    }
    if let Some(spec) = cli.provider.as_deref() {
        match verbs::Device::from_spec(spec) {
            Ok(dev) => {
                tracing::info!("RDMA provider: {}", dev.describe());
                let _ = verbs::Device::set_default(dev);
            }
            Err(e) => {
                eprintln!("oxrdma: --provider {spec}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // The command runs as a task on the runtime's worker threads, not on this thread inside
    // `block_on`: a thread that parks whenever the command waits must be woken by another for
    // every reply, which on the project's VM added ~40 µs to each one-at-a-time call (nfs bench
    // GETATTR p50 75-79 µs on the main thread; see README).
    let result = runtime.block_on(async move {
        let command = tokio::spawn(async move {
            match cli.command {
                Command::Rpc(c) => cmd::rpc::run(c).await,
                Command::Rds(c) => cmd::rds::run(c).await,
                Command::Iwarp(c) => cmd::iwarp::run(c).await,
                Command::Nfs(c) => cmd::nfs::run(c).await,
                Command::Perf(a) => cmd::perf::run(a).await,
                Command::Decode(a) => cmd::decode::run(a).await,
                Command::Conform(a) => cmd::conform::run(a).await,
            }
        });
        match command.await {
            Ok(r) => r,
            Err(e) => Err(format!("the command's task failed: {e}").into()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oxrdma: {e}");
            ExitCode::FAILURE
        }
    }
}
