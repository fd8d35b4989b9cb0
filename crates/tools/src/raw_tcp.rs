//! The raw TCP ceiling of `nfs bench`: the same loopback, no NFS, no RPC: one client
//! writing 1 MiB buffers to a sink as fast as it takes them.

use std::io;
use std::time::Duration;

use crate::nfs_bench::{BenchError as BoxErr, Progress, Row, localhost};

/// Raw TCP streams per run; the best is the ceiling (single short streams on loopback varied
/// 2x between runs here, with the two tasks sometimes sharing a worker thread).
pub const RAW_RUNS: u64 = 3;

/// The bytes each raw TCP stream moves: the run's size, at least 1 GiB.
pub(crate) fn raw_bytes(size: u64) -> u64 {
    size.max(1 << 30)
}

/// The raw TCP ceiling: the best of [`RAW_RUNS`] streams of `total` bytes over one loopback
/// connection each, in 1 MiB writes.
pub(crate) async fn bench_raw_tcp(total: u64, pb: &dyn Progress) -> Result<Row, BoxErr> {
    pb.set_message("raw TCP stream 1 MiB".to_string());
    let mut best = Duration::MAX;
    for _ in 0..RAW_RUNS {
        best = best.min(raw_tcp_once(total, pb).await?);
    }
    Ok(crate::bench_rows::stream_row(total, best))
}

/// One round's raw TCP stream of `total` bytes (whole MiB: `BenchConfig::raw_round_bytes`),
/// as a row that adds up with the other rounds' (`nfs bench --rounds`).
pub(crate) async fn raw_tcp_round(total: u64, pb: &dyn Progress) -> Result<Row, BoxErr> {
    pb.set_message("raw TCP stream 1 MiB".to_string());
    let el = raw_tcp_once(total, pb).await?;
    Ok(crate::bench_rows::stream_row(total, el))
}

/// One raw TCP stream of `total` bytes, in 1 MiB writes; returns how long it took.
async fn raw_tcp_once(total: u64, pb: &dyn Progress) -> Result<Duration, BoxErr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(localhost(0)).await?;
    let at = l.local_addr()?;
    let sink = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                return Ok::<u64, io::Error>(got);
            }
            got += n as u64;
        }
    });
    let mut s = tokio::net::TcpStream::connect(at).await?;
    s.set_nodelay(true)?;
    let buf = vec![0x5a_u8; 1 << 20];
    let t0 = std::time::Instant::now();
    let mut sent = 0u64;
    while sent < total {
        s.write_all(&buf).await?;
        sent += buf.len() as u64;
        pb.inc(buf.len() as u64);
    }
    s.shutdown().await?;
    drop(s);
    let got = sink.await??;
    let el = t0.elapsed();
    if got != sent {
        return Err(format!("raw TCP: {got} of {sent} bytes arrived").into());
    }
    Ok(el)
}
