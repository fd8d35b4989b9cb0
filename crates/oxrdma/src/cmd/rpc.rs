//! `oxrdma rpc …`: a NULL-only ONC RPC server and a NULL round-trip benchmark.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use oncrpc::{Dispatcher, RpcClient, RpcTransport, null_program};

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

/// Latencies are recorded in nanoseconds, from 1 ns to 60 s, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|_| Histogram::new(3).unwrap())
}

enum Stop {
    Calls(u64),
    At(Instant),
}

struct BenchResult {
    target: Endpoint,
    calls: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
    hist: Histogram<u64>,
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
        println!("{}", to_json(&results, &a));
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
    let client = RpcClient::new(transport.clone(), a.prog, a.vers);
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
    Ok(run_bench(target, &transport, &client, a.depth, stop).await)
}

async fn run_bench(
    target: Endpoint,
    _transport: &Arc<dyn RpcTransport>,
    client: &RpcClient,
    depth: u32,
    stop: Stop,
) -> BenchResult {
    let issued = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(stop);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(depth as usize);
    for _ in 0..depth {
        let client = client.clone();
        let issued = issued.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let mut errors = 0u64;
            let mut first_error = None;
            loop {
                let go = match &*stop {
                    Stop::Calls(n) => issued.fetch_add(1, Ordering::Relaxed) < *n,
                    Stop::At(t) => Instant::now() < *t,
                };
                if !go {
                    break;
                }
                let t0 = Instant::now();
                let r = client.null().await;
                let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                match r {
                    Ok(()) => hist.saturating_record(ns.max(1)),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (hist, errors, first_error)
        }));
    }
    let mut hist = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for w in workers {
        match w.await {
            Ok((h, e, fe)) => {
                let _ = hist.add(&h);
                errors += e;
                if first_error.is_none() {
                    first_error = fe;
                }
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("bench worker failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed();
    BenchResult {
        target,
        calls: hist.len() + errors,
        errors,
        first_error,
        elapsed,
        hist,
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

struct Summary {
    rate: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

fn summarize(r: &BenchResult) -> Summary {
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let ok = r.hist.len();
    let q = |p: f64| {
        if ok == 0 {
            0.0
        } else {
            us(r.hist.value_at_quantile(p))
        }
    };
    Summary {
        rate: ok as f64 / secs,
        p50: q(0.50),
        p90: q(0.90),
        p99: q(0.99),
        p999: q(0.999),
        max: if ok == 0 { 0.0 } else { us(r.hist.max()) },
    }
}

/// RDMA ÷ TCP for rate and latency, when both transports were measured.
struct Ratio {
    rate: f64,
    p50: f64,
    p99: f64,
}

fn ratio(results: &[BenchResult]) -> Option<Ratio> {
    let tcp = results
        .iter()
        .find(|r| matches!(r.target, Endpoint::Tcp(_)))?;
    let rdma = results
        .iter()
        .find(|r| matches!(r.target, Endpoint::Rdma(_)))?;
    let (t, r) = (summarize(tcp), summarize(rdma));
    let div = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    Some(Ratio {
        rate: div(r.rate, t.rate),
        p50: div(r.p50, t.p50),
        p99: div(r.p99, t.p99),
    })
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
        let s = summarize(r);
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
    if let Some(x) = ratio(results) {
        println!(
            "rdma ÷ tcp: calls/s {:.2}×, p50 {:.2}×, p99 {:.2}×",
            x.rate, x.p50, x.p99
        );
    }
}

fn run_json(r: &BenchResult, a: &BenchArgs) -> String {
    let s = summarize(r);
    format!(
        concat!(
            "{{\"target\":\"{}\",\"prog\":{},\"vers\":{},\"depth\":{},\"calls\":{},",
            "\"errors\":{},\"seconds\":{:.3},\"calls_per_sec\":{:.1},",
            "\"latency_us\":{{\"p50\":{:.1},\"p90\":{:.1},\"p99\":{:.1},\"p99_9\":{:.1},\"max\":{:.1}}}}}"
        ),
        r.target,
        a.prog,
        a.vers,
        a.depth,
        r.calls,
        r.errors,
        r.elapsed.as_secs_f64(),
        s.rate,
        s.p50,
        s.p90,
        s.p99,
        s.p999,
        s.max
    )
}

/// One run: its object. Several: `{"runs":[…],"rdma_over_tcp":{…}}` (the ratio only when
/// both transports were measured).
fn to_json(results: &[BenchResult], a: &BenchArgs) -> String {
    if let [r] = results {
        return run_json(r, a);
    }
    let runs: Vec<String> = results.iter().map(|r| run_json(r, a)).collect();
    let ratio = match ratio(results) {
        Some(x) => format!(
            ",\"rdma_over_tcp\":{{\"calls_per_sec\":{:.3},\"p50\":{:.3},\"p99\":{:.3}}}",
            x.rate, x.p50, x.p99
        ),
        None => String::new(),
    };
    format!("{{\"runs\":[{}]{ratio}}}", runs.join(","))
}
