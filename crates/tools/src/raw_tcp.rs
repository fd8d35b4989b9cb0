//! The raw TCP ceiling of `nfs bench`: the same loopback, no NFS, no RPC: one client
//! writing 1 MiB buffers to a sink as fast as it takes them.

use std::io;

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
    let mut best = 0f64;
    for _ in 0..RAW_RUNS {
        best = best.max(raw_tcp_once(total, pb).await?);
    }
    Ok(Row {
        transport: "raw-tcp",
        nfs: None,
        op: "STREAM",
        io: Some(1 << 20),
        mbs: Some(best / 1e6),
        ops: best / f64::from(1u32 << 20),
        p50_us: None,
        p99_us: None,
        rtt_p50_us: None,
        rtt_p99_us: None,
        ops_median_round: None,
        sample: None,
    })
}

/// One round's raw TCP stream of `total` bytes (rounded up to whole 1 MiB writes), as a row
/// that adds up with the other rounds' (`nfs bench --rounds`).
pub(crate) async fn raw_tcp_round(total: u64, pb: &dyn Progress) -> Result<Row, BoxErr> {
    pb.set_message("raw TCP stream 1 MiB".to_string());
    let total = total.div_ceil(1 << 20).max(1) << 20;
    let rate = raw_tcp_once(total, pb).await?;
    let el = std::time::Duration::from_secs_f64(total as f64 / rate.max(1.0));
    Ok(crate::bench_rows::stream_row(total, el))
}

/// One raw TCP stream of `total` bytes; returns bytes per second.
async fn raw_tcp_once(total: u64, pb: &dyn Progress) -> Result<f64, BoxErr> {
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
    Ok(sent as f64 / el.as_secs_f64().max(1e-9))
}
