//! `oxrdma nfs torture`: the fault-injection campaign and the soak of `tools::torture` and
//! `tools::soak`. Parses and prints only.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tools::soak::{SoakConfig, SoakSample};
use tools::torture::{TortureConfig, TortureReport, Transport};

use super::CmdResult;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    Tcp,
    Rdma,
    Both,
}

#[derive(Debug, Args)]
pub struct TortureArgs {
    /// Transport(s) of the campaign.
    #[arg(long, value_enum, default_value = "both")]
    transport: Which,
    /// Operations per transport.
    #[arg(long, default_value_t = 10_000)]
    ops: u64,
    /// Connection drops per transport (client side, server side before and after executing).
    #[arg(long, default_value_t = 50)]
    drops: u64,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop issuing operations after SECS per transport.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    time_limit: u64,
    /// Run the server without its duplicate request cache (to see what the campaign finds
    /// then; exits 1 when it finds problems).
    #[arg(long)]
    no_drc: bool,
    /// Soak instead: SECS of RPC-over-RDMA connections at full credits, sampled as it runs.
    #[arg(long, value_name = "SECS")]
    soak: Option<u64>,
    /// Soak: connections.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Soak: calls in flight per connection [default: the credit limit].
    #[arg(long)]
    depth: Option<usize>,
    /// Soak: seconds between samples.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    interval: u64,
    /// Soak against a running server: its RPC-over-RDMA address (needs --tcp) [default: a
    /// server in this process].
    #[arg(long, value_name = "ADDR", requires = "tcp")]
    rdma: Option<SocketAddr>,
    /// Soak: the running server's NFS/MOUNT TCP address.
    #[arg(long, value_name = "ADDR", requires = "rdma")]
    tcp: Option<SocketAddr>,
    /// Soak: the running server's PID, whose RSS is sampled.
    #[arg(long, value_name = "PID", requires = "rdma")]
    server_pid: Option<u32>,
}

fn print_report(t: Transport, r: &TortureReport) {
    println!(
        "{t}: ops {} completed {} failed {} mismatches {} | drops client {} server-before {} \
         server-after {} | rdma reconnects {} | {:.1}s",
        r.ops,
        r.completed,
        r.failed,
        r.mismatches,
        r.drops_client,
        r.drops_server_before,
        r.drops_server_after,
        r.reconnects,
        r.elapsed.as_secs_f64()
    );
    println!(
        "{t}: final tree: {} files ({} bytes) compared over NFS and on disk, {} differ",
        r.files_checked, r.bytes_checked, r.final_mismatches
    );
    let d = &r.drc;
    println!(
        "{t}: drc hits {} misses {} in-progress drops {} evictions {} mismatches {} entries {}",
        d.hits, d.misses, d.in_progress_drops, d.evictions, d.mismatches, d.entries
    );
    let kinds: Vec<String> = r.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("{t}: by kind: {}", kinds.join(", "));
    for p in &r.problems {
        println!("{t}: problem: {p}");
    }
}

fn print_sample(s: &SoakSample) {
    println!(
        "t={:>5.0}s ops={:>10} ops/s={:>8.0} rss_kib={} registrations={} outstanding={} errors={}",
        s.elapsed.as_secs_f64(),
        s.ops,
        s.ops_per_sec,
        s.rss_kib.map_or("-".into(), |r| r.to_string()),
        s.registrations,
        s.outstanding,
        s.errors
    );
}

pub async fn torture(a: TortureArgs) -> CmdResult {
    if let Some(secs) = a.soak {
        let cfg = SoakConfig {
            server: a.rdma.zip(a.tcp).map(|(r, t)| (r, t, a.server_pid)),
            connections: a.connections,
            depth: a.depth,
            duration: Duration::from_secs(secs),
            interval: Duration::from_secs(a.interval.max(1)),
        };
        let r = tools::soak::run(&cfg, print_sample).await?;
        println!(
            "soak: {} connections x {} calls in flight; RSS of {}",
            r.connections, r.depth, r.rss_of
        );
        println!(
            "soak: ops {} errors {} reconnects {}",
            r.ops, r.errors, r.reconnects
        );
        println!(
            "soak: credits used (calls sent) {} returned (replies) {} outstanding {}",
            r.credits_used, r.credits_returned, r.outstanding
        );
        println!("soak: registrations open at the end {}", r.registrations);
        if let (Some(m1), Some(max)) = (r.rss_minute_one, r.rss_max_after) {
            println!(
                "soak: RSS at minute 1 {m1} KiB, max after {max} KiB ({:.3}x)",
                max as f64 / m1.max(1) as f64
            );
        }
        return Ok(());
    }
    let transports = match a.transport {
        Which::Tcp => vec![Transport::Tcp],
        Which::Rdma => vec![Transport::Rdma],
        Which::Both => vec![Transport::Rdma, Transport::Tcp],
    };
    let mut bad = false;
    for t in transports {
        let cfg = TortureConfig {
            transport: t,
            ops: a.ops,
            drops: a.drops,
            seed: a.seed,
            time_limit: Duration::from_secs(a.time_limit),
            drc: if a.no_drc {
                None
            } else {
                TortureConfig::default().drc
            },
            ..TortureConfig::default()
        };
        let r = tools::torture::run(&cfg).await?;
        print_report(t, &r);
        bad |= r.failed > 0 || r.mismatches > 0 || r.final_mismatches > 0 || r.completed != r.ops;
    }
    if bad {
        return Err("torture found problems".into());
    }
    Ok(())
}
