//! `oxrdma nfs torture`: the fault-injection campaign, the soak and the hostile clients of
//! `tools::torture`, `tools::soak` and `tools::hostile`. Parses and prints only.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use tools::hostile::{HostileConfig, HostileKind, KindReport};
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
    /// Hostile clients instead, through a fault-injecting proxy, against the running server
    /// of --rdma/--tcp while a well-behaved client runs: long-calls (Read chunks never
    /// delivered), stalled (connections that connect and stall), unread (RPC-over-RDMA
    /// replies never read), unread-tcp (NFS over TCP replies never read), or all of them.
    /// Prints the server's resident memory (--server-pid) per kind and its peak (VmHWM).
    #[arg(long, value_name = "KIND", requires = "rdma")]
    hostile: Option<String>,
    /// Hostile: connections of the stalled kind (the other kinds use --connections).
    #[arg(long, value_name = "N", default_value_t = 100)]
    stalled: usize,
    /// Hostile: how long the stalled and unread clients hold their connections (the
    /// long-calls ones are held until the server closes them, at most this long).
    #[arg(long, value_name = "SECS", default_value_t = 40)]
    hold: u64,
    /// Hostile: the server's --max-memory, to print beside its memory (not sent anywhere).
    #[arg(long, value_name = "SIZE")]
    max_memory: Option<String>,
}

fn parse_kinds(s: &str) -> Result<Vec<HostileKind>, String> {
    if s == "all" {
        return Ok(HostileKind::ALL.to_vec());
    }
    s.split(',')
        .map(|k| {
            HostileKind::parse(k.trim()).ok_or_else(|| {
                format!("{k:?}: one of long-calls, stalled, unread, unread-tcp, all")
            })
        })
        .collect()
}

fn kib(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |k| format!("{k} KiB"))
}

fn print_kind(k: &KindReport) {
    println!(
        "hostile {}: connected {} refused {} closed by the server {} hostile calls completed {} \
         | well-behaved client: {} ok, {} failed | server RSS before {} max {} | {:.1}s",
        k.kind,
        k.connected,
        k.refused,
        k.closed_by_server,
        k.hostile_calls_ok,
        k.polite_ok,
        k.polite_failed,
        kib(k.rss_before_kib),
        kib(k.rss_max_kib),
        k.elapsed.as_secs_f64()
    );
}

async fn hostile(a: &TortureArgs, kinds: Vec<HostileKind>) -> CmdResult {
    let (Some(rdma), Some(tcp)) = (a.rdma, a.tcp) else {
        return Err("--hostile needs --rdma and --tcp (a running `oxrdma nfs serve`)".into());
    };
    let cfg = HostileConfig {
        kinds,
        rdma,
        tcp,
        pid: a.server_pid,
        connections: a.connections,
        stalled_connections: a.stalled,
        hold: Duration::from_secs(a.hold),
        ..HostileConfig::default()
    };
    let r = tools::hostile::run(&cfg, print_kind).await?;
    println!(
        "hostile: server budget {} | peak RSS (VmHWM) {} | RSS at the end {}",
        a.max_memory.as_deref().unwrap_or("(not given)"),
        kib(r.hwm_kib),
        kib(r.rss_end_kib)
    );
    if r.kinds.iter().any(|k| k.polite_failed > 0) {
        return Err("the well-behaved client was not served".into());
    }
    Ok(())
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
    if let Some(kinds) = &a.hostile {
        return hostile(&a, parse_kinds(kinds)?).await;
    }
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
