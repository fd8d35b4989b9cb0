//! `oxrdma decode FILE`: decode a pcap/pcapng capture (the decoder is `tools::decode`; this
//! module parses the arguments and prints).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use tools::decode::{self, Filter, timeline};

use super::{CmdResult, parse_u32};

/// Decode iWARP (MPA/DDP/RDMAP), RPC-over-RDMA v1/v2 with RPC and NFS, and RDS (TCP and
/// iWARP) from a capture file.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The capture: classic pcap or pcapng (oxrdma's own, or tcpdump's).
    file: PathBuf,
    /// Detailed view: every field of every layer.
    #[arg(short = 'V', long = "detail")]
    detail: bool,
    /// JSON output (one document).
    #[arg(long)]
    json: bool,
    /// Per-RPC timeline (call, chunks, RDMA Reads/Writes, reply, elapsed) and latency per
    /// procedure.
    #[arg(long)]
    rpc: bool,
    /// Only this TCP stream (numbered from 0 in order of appearance, as tshark's tcp.stream).
    #[arg(long)]
    stream: Option<u32>,
    /// Only this XID (decimal or 0x hex).
    #[arg(long, value_parser = parse_u32)]
    xid: Option<u32>,
    /// Only this procedure or NFSv4 operation (READ, "NFSv3 WRITE", COMPOUND, SEQUENCE, ...).
    #[arg(long = "proc", value_name = "NAME")]
    proc_: Option<String>,
}

pub async fn run(a: DecodeArgs) -> CmdResult {
    let d = decode::decode_path(&a.file)?;
    let filter = Filter {
        stream: a.stream,
        xid: a.xid,
        proc_: a.proc_.clone(),
    };
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    if a.rpc {
        let (mut rpcs, _) = timeline::build(&d.messages);
        rpcs.retain(|r| {
            a.stream.is_none_or(|s| s == r.stream)
                && a.xid.is_none_or(|x| x == r.xid)
                && a.proc_.as_ref().is_none_or(|p| {
                    r.proc_name.as_ref().is_some_and(|n| {
                        n.eq_ignore_ascii_case(p)
                            || n.rsplit(' ')
                                .next()
                                .is_some_and(|l| l.eq_ignore_ascii_case(p))
                    })
                })
        });
        let lat = timeline::latencies(&rpcs);
        if a.json {
            serde_json::to_writer_pretty(
                &mut out,
                &serde_json::json!({ "rpcs": rpcs, "latency": lat }),
            )?;
            writeln!(out)?;
        } else {
            let t0 = d.messages.first().map_or(0.0, |m| m.time);
            for r in &rpcs {
                writeln!(out, "{}", timeline::render(r, t0))?;
            }
            writeln!(out)?;
            write!(out, "{}", timeline::render_latencies(&lat))?;
        }
        out.flush()?;
        return Ok(());
    }
    let shown: Vec<&decode::Message> = d.messages.iter().filter(|m| filter.matches(m)).collect();
    if a.json {
        serde_json::to_writer_pretty(
            &mut out,
            &serde_json::json!({
                "frames": d.frames,
                "streams": d.streams,
                "messages": shown,
            }),
        )?;
        writeln!(out)?;
    } else {
        let t0 = d.messages.first().map_or(0.0, |m| m.time);
        for m in &shown {
            if a.detail {
                writeln!(out, "{}", decode::text::detailed(m, t0))?;
            } else {
                writeln!(out, "{}", decode::text::line(m, t0))?;
            }
        }
    }
    out.flush()?;
    let gaps = d
        .messages
        .iter()
        .filter(|m| matches!(m.body, decode::Body::Gap { .. }))
        .count();
    eprintln!(
        "{} frames, {} TCP streams, {} messages ({} shown), {} gaps",
        d.frames.frames,
        d.streams.len(),
        d.messages.len(),
        shown.len(),
        gaps
    );
    Ok(())
}
