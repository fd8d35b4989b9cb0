//! A raw-TCP request/response baseline with the same sizes, depth and tasks as
//! [`stress_client`](super::stress_client), for comparison.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::stress::{StressParams, StressResult, Tally, result};

/// Raw-TCP baseline responder: frames are `[u32 req_len][u32 ack_len][req bytes]`, answered
/// with `[u32 ack_len][ack bytes]`. Returns the task and the bound address.
pub async fn tcp_baseline_server(
    addr: SocketAddr,
) -> std::io::Result<(JoinHandle<()>, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    let h = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let (mut r, mut w) = s.into_split();
                let mut buf = Vec::new();
                loop {
                    let mut hdr = [0u8; 8];
                    if r.read_exact(&mut hdr).await.is_err() {
                        return;
                    }
                    let req = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
                    let ack = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                    if req > (1 << 20) || ack > (1 << 20) {
                        return;
                    }
                    buf.resize(req, 0);
                    if r.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let mut out = Vec::with_capacity(4 + ack);
                    out.extend_from_slice(&(ack as u32).to_be_bytes());
                    out.resize(4 + ack, 0);
                    if w.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((h, local))
}

/// Raw-TCP baseline client with the same sizes, depth, tasks and duration as [`stress_client`](super::stress_client):
/// one TCP connection per task.
pub async fn tcp_baseline_client(
    server: SocketAddr,
    p: StressParams,
) -> std::io::Result<StressResult> {
    let start = Instant::now();
    let deadline = start + p.duration;
    let mut hs = Vec::new();
    for _ in 0..p.tasks {
        let s = TcpStream::connect(server).await?;
        s.set_nodelay(true)?;
        let (mut r, mut w) = s.into_split();
        let mut frame = Vec::with_capacity(8 + p.req_size);
        frame.extend_from_slice(&(p.req_size as u32).to_be_bytes());
        frame.extend_from_slice(&(p.ack_size as u32).to_be_bytes());
        frame.resize(8 + p.req_size, 0x55);
        let sent_at = Arc::new(Mutex::new(VecDeque::<Instant>::new()));
        let permits = Arc::new(tokio::sync::Semaphore::new(p.depth.max(1)));
        let (sa, pw) = (Arc::clone(&sent_at), Arc::clone(&permits));
        let writer = tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let Ok(permit) = pw.acquire().await else {
                    break;
                };
                permit.forget();
                sa.lock().push_back(Instant::now());
                if w.write_all(&frame).await.is_err() {
                    break;
                }
                n += 1;
            }
            // The responder answers everything, then sees EOF and closes: the reader stops there.
            let _ = w.shutdown().await;
            n
        });
        hs.push(tokio::spawn(async move {
            let mut t = Tally::default();
            let mut buf = Vec::new();
            loop {
                let left =
                    deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
                let mut hdr = [0u8; 4];
                match tokio::time::timeout(left, r.read_exact(&mut hdr)).await {
                    Ok(Ok(_)) => {}
                    _ => break,
                }
                let len = u32::from_be_bytes(hdr) as usize;
                buf.resize(len, 0);
                if r.read_exact(&mut buf).await.is_err() {
                    break;
                }
                if let Some(t0) = sent_at.lock().pop_front() {
                    t.rtt_sum += t0.elapsed();
                }
                t.acks += 1;
                permits.add_permits(1);
            }
            t.requests = writer.await.unwrap_or(0);
            t
        }));
    }
    let mut total = Tally::default();
    for h in hs {
        if let Ok(t) = h.await {
            total.requests += t.requests;
            total.acks += t.acks;
            total.rtt_sum += t.rtt_sum;
        }
    }
    Ok(result(&p, &total, start.elapsed()))
}
