//! Print perftest-like rows: `cargo run --release -p tools --example perf -- [write|read|send] [tcp|loopback] [size...]`.

use tools::perf::{PerfConfig, PerfOp, PerfTransport, run};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let op = match args.first().map(String::as_str) {
        Some("read") => PerfOp::Read,
        Some("send") => PerfOp::Send,
        _ => PerfOp::Write,
    };
    let transport = match args.get(1).map(String::as_str) {
        Some("loopback") => PerfTransport::Loopback,
        _ => PerfTransport::Tcp,
    };
    let sizes: Vec<usize> = args.iter().skip(2).filter_map(|s| s.parse().ok()).collect();
    let cfg = PerfConfig {
        op,
        transport,
        sizes: if sizes.is_empty() {
            vec![4096, 65536, 1 << 20]
        } else {
            sizes
        },
        iterations: 2000,
        latency_iterations: 200,
        soft: verbs::SoftIwarpConfig {
            rx_chunk: std::env::var("RX_CHUNK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(256 * 1024),
            ..Default::default()
        },
        ..Default::default()
    };
    let r = run(&cfg).await?;
    println!("{:?} over {:?}", r.op, r.transport);
    println!(
        "{:>10} {:>8} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12} {:>6}",
        "#bytes",
        "#iters",
        "BW peak",
        "BW avg",
        "t_min",
        "t_typ",
        "t_max",
        "t_p99",
        "TCP MB/s",
        "ratio"
    );
    for row in r.rows {
        let tcp = row.tcp_mbs.unwrap_or(f64::NAN);
        println!(
            "{:>10} {:>8} {:>12.1} {:>12.1} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.1} {:>6.2}",
            row.bytes,
            row.iterations,
            row.bw_peak_mbs,
            row.bw_avg_mbs,
            row.t_min.as_secs_f64() * 1e6,
            row.t_typical.as_secs_f64() * 1e6,
            row.t_max.as_secs_f64() * 1e6,
            row.t_p99.as_secs_f64() * 1e6,
            tcp,
            row.bw_avg_mbs / tcp
        );
    }
    Ok(())
}
