//! `oxrdma nfs bench`: parses the arguments, draws the progress bar and prints the report of
//! `tools::nfs_bench` (NFSv3 and NFSv4.1/4.2 over RPC-over-RDMA and TCP, in-process server).

use std::path::PathBuf;

use clap::Args;
use tools::nfs_bench::{self, BenchConfig};

use super::CmdResult;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Make the temporary export under this directory [default: the system temp directory].
    #[arg(long, value_name = "D")]
    dir: Option<PathBuf>,
    /// Bytes moved per READ/WRITE measurement, in MiB (4 KiB I/O moves at most 16 MiB).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    size_mb: u64,
    /// GETATTR calls per transport.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    getattrs: u64,
    /// READ/WRITE calls kept in flight, as a client's readahead and write-behind do (GETATTR
    /// stays at one). Latency is per call either way.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=128))]
    depth: u64,
    /// The READ/WRITE I/O sizes to measure, comma separated (4k, 8k, 64k, 1m).
    #[arg(long, value_name = "SIZES", value_delimiter = ',', default_values_t = IoSize::ALL)]
    io: Vec<IoSize>,
    /// The NFS transports to measure, in this order (the raw TCP stream is always measured).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = Transport::ALL)]
    transports: Vec<Transport>,
    /// The NFS versions to measure over each transport, in this order (3, 4.1, 4.2): NFSv4
    /// through one session whose COMPOUNDs are SEQUENCE, PUTFH and the operation.
    #[arg(long = "nfs-version", value_name = "LIST", value_delimiter = ',', default_values_t = NfsVersion::DEFAULT)]
    nfs_version: Vec<NfsVersion>,
    /// How the RPC-over-RDMA client asks for large replies, comma separated: the rdma
    /// transport is measured once per mode, in this order (rows rdma, rdma-rc, rdma-so):
    /// write-chunk (RFC 8166), read-chunk (responder-provided Read chunks, version 2; the
    /// server announces them), send-only. With write-chunk and read-chunk a ratio line
    /// compares READ 1 MiB.
    #[arg(long, value_name = "MODES", value_delimiter = ',', default_value = "write-chunk",
          value_parser = |s: &str| s.parse::<rpcrdma::rrc::ReplyMode>())]
    reply_mode: Vec<rpcrdma::rrc::ReplyMode>,
    /// The server's RPC-over-RDMA receive buffer size in bytes (its inline threshold,
    /// announced as RFC 8797 private data and, to version 2 clients, as RBSIZ) [default: 8192].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1024..=1048576))]
    inline: Option<u32>,
    /// Split every measurement into this many rounds, the transports and the raw TCP stream
    /// alternating between them (A B B A …); each row adds its rounds up, and also gives the
    /// median of the rounds' own call rates (JSON `ops_per_s_median_round`), which the ratio
    /// lines then use. On a machine that stalls (a busy VM host), a stall moves a sum by its
    /// whole length but a median by one round at most.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    rounds: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// An NFS transport the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Transport {
    Rdma,
    Tcp,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::Rdma, Transport::Tcp];
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        })
    }
}

/// An NFS version, as `--nfs-version` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NfsVersion {
    #[value(name = "3")]
    V3,
    #[value(name = "4.1")]
    V41,
    #[value(name = "4.2")]
    V42,
}

impl NfsVersion {
    const DEFAULT: [NfsVersion; 2] = [NfsVersion::V3, NfsVersion::V41];

    /// The bench's name for it.
    pub fn bench(self) -> nfs_bench::NfsVersion {
        match self {
            NfsVersion::V3 => nfs_bench::NfsVersion::V3,
            NfsVersion::V41 => nfs_bench::NfsVersion::V41,
            NfsVersion::V42 => nfs_bench::NfsVersion::V42,
        }
    }
}

impl std::fmt::Display for NfsVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.bench().name())
    }
}

/// An I/O size the bench measures READ and WRITE at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum IoSize {
    #[value(name = "4k")]
    K4,
    #[value(name = "8k")]
    K8,
    #[value(name = "64k")]
    K64,
    #[value(name = "1m")]
    M1,
}

impl IoSize {
    const ALL: [IoSize; 3] = [IoSize::K4, IoSize::K64, IoSize::M1];

    fn bytes(self) -> u32 {
        match self {
            IoSize::K4 => 4096,
            IoSize::K8 => 8192,
            IoSize::K64 => 64 << 10,
            IoSize::M1 => 1 << 20,
        }
    }
}

impl std::fmt::Display for IoSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoSize::K4 => "4k",
            IoSize::K8 => "8k",
            IoSize::K64 => "64k",
            IoSize::M1 => "1m",
        })
    }
}

/// A progress bar on stderr, fed by the bench.
struct Bar(indicatif::ProgressBar);

impl Bar {
    fn new(total: u64) -> Self {
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} {msg:28} [{bar:30}] {bytes}/{total_bytes} {elapsed}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        Bar(pb)
    }
}

impl nfs_bench::Progress for Bar {
    fn set_message(&self, msg: String) {
        self.0.set_message(msg);
    }

    fn inc(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

pub async fn bench(a: BenchArgs) -> CmdResult {
    let cfg = BenchConfig {
        dir: a.dir.clone().unwrap_or_else(std::env::temp_dir),
        size_mb: a.size_mb,
        getattrs: a.getattrs,
        depth: a.depth,
        io: a.io.iter().map(|s| s.bytes()).collect(),
        transports: a
            .transports
            .iter()
            .map(|t| match t {
                Transport::Rdma => nfs_bench::Transport::Rdma,
                Transport::Tcp => nfs_bench::Transport::Tcp,
            })
            .collect(),
        versions: a.nfs_version.iter().map(|v| v.bench()).collect(),
        reply_modes: a.reply_mode.clone(),
        inline: a.inline,
        rounds: a.rounds,
    };
    let pb = Bar::new(cfg.progress_total());
    let report = nfs_bench::run(&cfg, &pb).await;
    pb.0.finish_and_clear();
    let report = report?;
    let (rows, ratio_raw, ratio_nfs) = (&report.rows, report.ratio_raw, report.ratio_nfs);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "NFS sequential I/O, {} MiB per READ/WRITE run (4 KiB: at most 16 MiB), {} READ/WRITE call(s) in flight, {} GETATTRs one at a time{}",
        a.size_mb,
        a.depth,
        a.getattrs,
        if a.rounds > 1 {
            format!(", in {} rounds alternating the transports", a.rounds)
        } else {
            String::new()
        }
    );
    let rounds = a.rounds > 1;
    println!(
        "{:<9} {:<4} {:<8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}{}",
        "transport",
        "nfs",
        "op",
        "io",
        "MB/s",
        "ops/s",
        "p50[us]",
        "p99[us]",
        "rtt-p50",
        "rtt-p99",
        if rounds { "  med-round-ops/s" } else { "" }
    );
    let opt = |v: Option<f64>, p: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.p$}"));
    for r in rows {
        println!(
            "{:<9} {:<4} {:<8} {:>8} {:>10} {:>10.0} {:>10} {:>10} {:>10} {:>10}{}",
            r.transport,
            r.nfs.map_or("-", |v| v.name()),
            r.op,
            r.io.map_or_else(|| "-".to_string(), |v| v.to_string()),
            opt(r.mbs, 1),
            r.ops,
            opt(r.p50_us, 1),
            opt(r.p99_us, 1),
            opt(r.rtt_p50_us, 1),
            opt(r.rtt_p99_us, 1),
            if rounds {
                format!("  {:>15}", opt(r.ops_median_round, 0))
            } else {
                String::new()
            },
        );
    }
    println!(
        "p50/p99: the caller's whole wait per call; rtt: from the call's transmission to its reply's arrival at the transport (what a capture sees)"
    );
    println!(
        "ratio READ-1MiB rdma/raw-tcp {}  (target >= 0.80; NFS version {})",
        opt(ratio_raw, 2),
        cfg.versions.first().map_or("-", |v| v.name())
    );
    println!(
        "ratio READ-1MiB rdma/nfs-tcp {}  (target >= 1.00)",
        opt(ratio_nfs, 2)
    );
    if report.ratio_read_chunk.is_some() {
        println!(
            "ratio READ-1MiB rdma-rc/rdma (read-chunk / write-chunk) {}",
            opt(report.ratio_read_chunk, 2)
        );
    }
    Ok(())
}
