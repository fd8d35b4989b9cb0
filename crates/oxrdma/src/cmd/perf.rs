//! `oxrdma perf write|read|send`: perftest-style (ib_write_bw / ib_write_lat / ib_read_bw /
//! ib_send_bw …) bandwidth and latency over soft-iWARP, with the raw-TCP ceiling of the same path
//! measured in the same run and the ratio between the two.
//!
//! - `--self` (the default): both ends in this process over 127.0.0.1.
//! - `--listen ADDR`: the server end (one client, then exit); prints `listening on ADDR`.
//! - `--connect ADDR`: the client end, which runs the measurements and prints the table. The
//!   control exchange (rkey/addr/len, Send credits, raw-TCP sink port) travels in the MPA private
//!   data; it is described in `tools::perf::control`.
//!
//! Without `--lat` the bandwidth columns are printed (perftest's `*_bw`), with `--lat` the
//! latency columns (perftest's `*_lat`). `--sweep` runs 2 B .. 8 MiB in powers of two (perftest's
//! `-a`).

use std::net::SocketAddr;

use clap::{Args, ValueEnum};
use tools::perf::{self, PerfConfig, PerfJson, PerfOp, PerfReport, us};

use super::CmdResult;

/// The operation to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpArg {
    /// RDMA Write (ib_write_bw / ib_write_lat).
    Write,
    /// RDMA Read (ib_read_bw / ib_read_lat).
    Read,
    /// Send / Receive (ib_send_bw / ib_send_lat).
    Send,
}

#[derive(Debug, Args)]
pub struct PerfArgs {
    /// Operation.
    #[arg(value_enum)]
    op: OpArg,
    /// Message size in bytes (default 65536, or 2 with --lat).
    #[arg(short = 's', long, value_name = "N", conflicts_with = "sweep")]
    size: Option<usize>,
    /// Sweep message sizes 2 B .. 8 MiB in powers of two (perftest -a).
    #[arg(short = 'a', long)]
    sweep: bool,
    /// Iterations per size (default 1000).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1000)]
    iters: usize,
    /// Measure latency instead of bandwidth.
    #[arg(long)]
    lat: bool,
    /// Work requests in flight during bandwidth tests (perftest -t), 1 ..= 128.
    #[arg(short = 't', long, value_name = "N", default_value_t = 16)]
    window: usize,
    /// Run the client end against `oxrdma perf … --listen` at ADDR.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["listen", "self_"])]
    connect: Option<SocketAddr>,
    /// Run the server end on ADDR (port 0 picks one), for one client.
    #[arg(long, value_name = "ADDR", conflicts_with = "self_")]
    listen: Option<SocketAddr>,
    /// Both ends in this process over 127.0.0.1 (the default).
    #[arg(long = "self", id = "self_")]
    self_: bool,
    /// MPA CRC-32C on.
    #[arg(long)]
    crc: bool,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
    /// With --self: the address both ends use (an address of the RDMA device with
    /// `--provider rdma-core`).
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    self_addr: std::net::IpAddr,
}

/// Run `oxrdma perf`.
pub async fn run(a: PerfArgs) -> CmdResult {
    if let Some(addr) = a.listen {
        return perf::serve_on(verbs::Device::default_device(), addr, |bound| {
            use std::io::Write;
            println!("listening on {bound}");
            let _ = std::io::stdout().flush();
        })
        .await
        .map_err(Into::into);
    }
    if a.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let sizes = if a.sweep {
        (1..=23).map(|s| 1usize << s).collect()
    } else {
        vec![a.size.unwrap_or(if a.lat { 2 } else { 65536 })]
    };
    if sizes.iter().any(|s| *s == 0 || *s > u32::MAX as usize) {
        return Err("--size must be 1 ..= 4 GiB".into());
    }
    let cfg = PerfConfig {
        op: perf_op(a.op),
        sizes,
        iterations: if a.lat { 0 } else { a.iters },
        latency_iterations: if a.lat { a.iters } else { 0 },
        window: a.window.clamp(1, 128),
        crc: a.crc,
        tcp_ceiling: !a.lat,
        device: Some(verbs::Device::default_device()).filter(verbs::Device::is_rdma_core),
        self_ip: a.self_addr,
        ..Default::default()
    };
    let (report, place) = match a.connect {
        Some(addr) => (perf::run_client(&cfg, addr).await?, format!("to {addr}")),
        None => (
            perf::run(&cfg).await?,
            format!("in-process, {}", a.self_addr),
        ),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&PerfJson::new(&report, a.lat, a.crc))?
        );
    } else {
        print_table(&report, &a, &place);
    }
    Ok(())
}

fn perf_op(op: OpArg) -> PerfOp {
    match op {
        OpArg::Write => PerfOp::Write,
        OpArg::Read => PerfOp::Read,
        OpArg::Send => PerfOp::Send,
    }
}

const RULE: &str = "---------------------------------------------------------------------------------------------------------------";

fn print_table(r: &PerfReport, a: &PerfArgs, place: &str) {
    println!("{RULE}");
    println!(
        "                    {} {} Test ({}, {place})",
        perf_op(a.op).name(),
        if a.lat { "Latency" } else { "BW" },
        verbs::Device::default_device().describe()
    );
    println!(
        " Window: {}   CRC: {}   Iterations: {}",
        a.window.clamp(1, 128),
        if a.crc { "on" } else { "off" },
        a.iters
    );
    println!("{RULE}");
    if a.lat {
        println!(
            " {:<10} {:<12} {:>12} {:>12} {:>16} {:>12} {:>22}",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "99% percentile[usec]"
        );
        for row in &r.rows {
            println!(
                " {:<10} {:<12} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>22.2}",
                row.bytes,
                row.lat_iterations,
                us(row.t_min),
                us(row.t_max),
                us(row.t_typical),
                us(row.t_avg),
                us(row.t_p99)
            );
        }
    } else {
        println!(
            " {:<10} {:<12} {:>16} {:>19} {:>14} {:>14} {:>7}",
            "#bytes",
            "#iterations",
            "BW peak[MB/sec]",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
            "TCP[MB/sec]",
            "ratio"
        );
        for row in &r.rows {
            let tcp = row.tcp_mbs.unwrap_or(f64::NAN);
            println!(
                " {:<10} {:<12} {:>16.2} {:>19.2} {:>14.6} {:>14.2} {:>7.3}",
                row.bytes,
                row.iterations,
                row.bw_peak_mbs,
                row.bw_avg_mbs,
                row.msg_rate_mpps,
                tcp,
                row.ratio()
            );
        }
    }
    println!("{RULE}");
}
