//! `oxrdma rpc …`: a NULL-only ONC RPC server and a NULL round-trip benchmark (the measuring is
//! `tools::rpc_bench`; this module connects, parses the arguments and prints).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use oncrpc::{Dispatcher, RpcClient, null_program};
use tools::rpc_bench::{self, BenchResult, Run, Runs, Stop, Target};

use super::{CmdResult, parse_u32, wait_for_signal};
use crate::endpoint::{self, ConnectArgs, Endpoint, ListenArgs};

/// An unassigned program number in the "defined by user" range 0x20000000-0x3fffffff
/// (RFC 5531 §7.3), used by default so the NULL server never poses as a real service.
pub const TEST_PROG: u32 = 0x2000_0099;

#[derive(Debug, Subcommand)]
pub enum RpcCommand {
    /// Serve the NULL procedure (0) of a program until Ctrl-C or SIGTERM.
    ///
    /// Prints one line per endpoint, `listening tcp://ADDR prog N vers LOW-HIGH`, once it
    /// accepts calls. Other procedures get PROC_UNAVAIL, other versions PROG_MISMATCH, other
    /// programs PROG_UNAVAIL.
    ServeNull(ServeNullArgs),
    /// Measure NULL round trips: calls per second and latency percentiles at a given depth.
    ///
    /// Give --tcp ADDR, --rdma ADDR, or both (each is measured in turn, then the ratio
    /// RDMA ÷ TCP is printed); --self starts in-process servers on both transports.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct ServeNullArgs {
    #[command(flatten)]
    listen: ListenArgs,
    /// Program number (decimal or 0x hex).
    #[arg(long, default_value_t = TEST_PROG, value_parser = parse_u32)]
    prog: u32,
    /// Lowest version served.
    #[arg(long, default_value_t = 1)]
    vers: u32,
    /// Highest version served (defaults to --vers).
    #[arg(long)]
    vers_high: Option<u32>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Start NULL servers in this process on 127.0.0.1 (free ports), one over TCP and one
    /// over RPC-over-RDMA, and bench both.
    #[arg(long = "self", conflicts_with_all = ["tcp", "rdma"])]
    in_process: bool,
    /// Calls kept in flight at once (pipelined on one connection).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    depth: u32,
    /// Run for this many seconds per transport (the default is 5 when --calls is not given).
    #[arg(long, value_name = "SECS", conflicts_with = "calls")]
    duration: Option<f64>,
    /// Make exactly this many calls per transport.
    #[arg(long)]
    calls: Option<u64>,
    /// Program number (decimal or 0x hex).
    #[arg(long, default_value_t = TEST_PROG, value_parser = parse_u32)]
    prog: u32,
    /// Program version.
    #[arg(long, default_value_t = 1)]
    vers: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Run an `rpc` command.
pub async fn run(cmd: RpcCommand) -> CmdResult {
    match cmd {
        RpcCommand::ServeNull(a) => serve_null(a).await,
        RpcCommand::Bench(a) => bench(a).await,
    }
}

async fn serve_null(a: ServeNullArgs) -> CmdResult {
    let endpoints = a.listen.endpoints();
    if endpoints.is_empty() {
        return Err("give at least one endpoint, for example --tcp 127.0.0.1:20048".into());
    }
    let high = a.vers_high.unwrap_or(a.vers);
    if high < a.vers {
        return Err(format!("--vers-high {high} is below --vers {}", a.vers).into());
    }
    let dispatcher = Arc::new(Dispatcher::new().with(null_program(a.prog, a.vers, high)));
    let mut servers = Vec::new();
    for ep in endpoints {
        let s = endpoint::serve(ep, dispatcher.clone()).await?;
        println!(
            "listening {} prog {} vers {}-{}",
            s.endpoint(),
            a.prog,
            a.vers,
            high
        );
        servers.push(s);
    }
    std::io::stdout().flush()?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    for s in servers {
        s.shutdown().await;
    }
    Ok(())
}

async fn bench(a: BenchArgs) -> CmdResult {
    let mut local_servers = Vec::new();
    let targets = if a.in_process {
        let d = Arc::new(Dispatcher::new().with(null_program(a.prog, a.vers, a.vers)));
        for ep in [
            Endpoint::Tcp(([127, 0, 0, 1], 0).into()),
            Endpoint::Rdma(([127, 0, 0, 1], 0).into()),
        ] {
            local_servers.push(endpoint::serve(ep, d.clone()).await?);
        }
        local_servers.iter().map(|s| s.endpoint()).collect()
    } else {
        a.connect.endpoints()
    };
    if targets.is_empty() {
        return Err(
            "give a server (--tcp ADDR and/or --rdma ADDR) or --self for in-process servers".into(),
        );
    }
    let duration = match (a.calls, a.duration) {
        (Some(_), _) => None,
        (None, d) => {
            let secs = d.unwrap_or(5.0);
            if !(secs.is_finite() && secs > 0.0) {
                return Err("--duration must be a positive number of seconds".into());
            }
            Some(Duration::from_secs_f64(secs))
        }
    };
    let mut results = Vec::new();
    for target in targets {
        let r = bench_one(target, &a, duration).await;
        match r {
            Ok(r) => results.push(r),
            Err(e) => {
                for s in local_servers {
                    s.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    for s in local_servers {
        s.shutdown().await;
    }
    if a.json {
        println!("{}", to_json(&results, &a)?);
    } else {
        print_table(&results, &a);
    }
    let mut all_failed = false;
    for r in &results {
        if let Some(e) = &r.first_error {
            eprintln!(
                "oxrdma: {}: {} of {} calls failed; first error: {e}",
                r.target, r.errors, r.calls
            );
        }
        all_failed |= r.calls > 0 && r.errors == r.calls;
    }
    if all_failed {
        return Err("every call failed".into());
    }
    Ok(())
}

/// Connect to one endpoint, check that it serves the program, and run the benchmark.
async fn bench_one(
    target: Endpoint,
    a: &BenchArgs,
    duration: Option<Duration>,
) -> Result<BenchResult, Box<dyn std::error::Error + Send + Sync>> {
    let transport = endpoint::connect(target, a.prog, a.vers).await?;
    let client = RpcClient::new(transport, a.prog, a.vers);
    // One call first: fail fast with a clear message if the server does not serve the program.
    client
        .null()
        .await
        .map_err(|e| format!("NULL call to {target} failed: {e}"))?;
    let stop = match (a.calls, duration) {
        (Some(n), _) => Stop::Calls(n),
        (None, Some(d)) => Stop::At(Instant::now() + d),
        (None, None) => Stop::Calls(0),
    };
    Ok(rpc_bench::run(to_target(target), &client, a.depth, stop).await)
}

fn to_target(e: Endpoint) -> Target {
    match e {
        Endpoint::Tcp(a) => Target::Tcp(a),
        Endpoint::Rdma(a) => Target::Rdma(a),
    }
}

fn print_table(results: &[BenchResult], a: &BenchArgs) {
    println!(
        "oxrdma rpc bench: NULL calls (prog {} vers {}), depth {}",
        a.prog, a.vers, a.depth
    );
    let width = results
        .iter()
        .map(|r| r.target.to_string().len())
        .max()
        .unwrap_or(0)
        .max("transport".len());
    println!(
        "{:<width$} {:>10} {:>7} {:>8} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "transport",
        "calls",
        "errors",
        "secs",
        "calls/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs"
    );
    for r in results {
        let s = r.summary();
        println!(
            "{:<width$} {:>10} {:>7} {:>8.2} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            r.target.to_string(),
            r.calls,
            r.errors,
            r.elapsed.as_secs_f64(),
            s.rate,
            s.p50,
            s.p90,
            s.p99,
            s.p999,
            s.max
        );
    }
    if let Some(x) = rpc_bench::ratio(results) {
        println!(
            "rdma ÷ tcp: calls/s {:.2}×, p50 {:.2}×, p99 {:.2}×",
            x.rate, x.p50, x.p99
        );
    }
}

/// One run: its object. Several: `{"runs":[…],"rdma_over_tcp":{…}}` (the ratio only when
/// both transports were measured).
fn to_json(results: &[BenchResult], a: &BenchArgs) -> serde_json::Result<String> {
    let run = |r: &BenchResult| Run::new(r, a.prog, a.vers, a.depth);
    if let [r] = results {
        return serde_json::to_string(&run(r));
    }
    serde_json::to_string(&Runs {
        runs: results.iter().map(run).collect(),
        rdma_over_tcp: rpc_bench::ratio(results),
    })
}
