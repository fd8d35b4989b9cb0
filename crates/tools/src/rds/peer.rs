//! The jobs of `oxrdma rds peer`, one RDS node talking to one remote node (a kernel `rds_tcp`
//! peer in the interop lab): prove the connection with pings to port 0, echo, ping with checked
//! echoes, blocking sends that respect the remote congestion map, and in-order receives.
//!
//! The payload of datagram SEQ (0-based) of SIZE ≥ 8 bytes is SEQ as 8 big-endian bytes, then
//! byte i = (SEQ + i) & 0xff, the format of the interop lab's `guest/rds-peer.py`.
//!
//! Each job returns what it measured; the CLI prints it.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rds::{RdsError, RdsSocket, RdsStack, SendError};

/// Why a job failed: the RDS stack's error, or what the job found wrong (said in words).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The RDS stack failed.
    #[error(transparent)]
    Rds(#[from] RdsError),
    /// A send failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The job's check failed.
    #[error("{0}")]
    Failed(String),
}

fn failed(s: String) -> PeerError {
    PeerError::Failed(s)
}

/// The payload of datagram `seq` (the format of the interop lab's `guest/rds-peer.py`).
pub fn payload(seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size)
        .map(|i| (seq.wrapping_add(i as u64) & 0xff) as u8)
        .collect();
    if let Some(head) = v.get_mut(..8) {
        head.copy_from_slice(&seq.to_be_bytes());
    }
    v
}

/// Checks a datagram against [`payload`]: its sequence number, or what is wrong with it.
pub fn check(data: &[u8], size: usize) -> Result<Option<u64>, String> {
    if data.len() != size {
        return Err(format!("length {} != {size}", data.len()));
    }
    let Some(head) = data.get(..8) else {
        return Ok(None);
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(head);
    let seq = u64::from_be_bytes(b);
    if data == payload(seq, size).as_slice() {
        Ok(Some(seq))
    } else {
        Err(format!("payload mismatch (seq {seq})"))
    }
}

/// The first pong of [`connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connected {
    /// From the first ping to the first pong.
    pub after: Duration,
    /// Round trip of the ping that was answered.
    pub rtt: Duration,
}

/// Pings the remote node's port 0 until it answers: the connection is up and the remote node
/// has taken it (it may refuse a connection while it still tears down an earlier one). `via`
/// only names the TCP address in the error.
pub async fn connect(
    stack: &RdsStack,
    remote: Ipv4Addr,
    via: SocketAddrV4,
    limit: Duration,
) -> Result<Connected, PeerError> {
    let t0 = Instant::now();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        let each = left.min(Duration::from_secs(5));
        if each.is_zero() {
            return Err(failed(format!(
                "no pong from {remote} via {via} within {:.0} s",
                limit.as_secs_f64()
            )));
        }
        let r = super::ping(stack, remote, 1, Duration::ZERO, each).await?;
        if let Some(rtt) = r.rtts.first().copied().flatten() {
            return Ok(Connected {
                after: t0.elapsed(),
                rtt,
            });
        }
    }
}

/// Sends every datagram on `sock` back to its sender until `count` (0: never) or `stop`;
/// returns how many it echoed.
pub async fn echo(
    sock: &RdsSocket,
    count: u64,
    stop: impl Future<Output = ()>,
) -> Result<u64, PeerError> {
    let mut done = 0u64;
    let run = async {
        while count == 0 || done < count {
            let (data, src) = sock.recv_from().await?;
            sock.send_to(src, data).await?;
            done += 1;
        }
        Ok::<_, PeerError>(())
    };
    tokio::select! {
        r = run => r?,
        _ = stop => {}
    }
    Ok(done)
}

/// Echoes every datagram on `sock` until sending fails (a side job for as long as a node runs).
pub async fn echo_forever(sock: RdsSocket) {
    while let Ok((data, src)) = sock.recv_from().await {
        if sock.send_to(src, data).await.is_err() {
            break;
        }
    }
}

/// What [`ping`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingStats {
    /// Datagrams echoed and checked.
    pub count: u64,
    /// Their size.
    pub size: usize,
    /// Datagrams per second over the whole run.
    pub msg_per_s: f64,
    /// Mean round trip, microseconds.
    pub avg_rtt_us: f64,
}

/// Sends `count` numbered datagrams of `size` from port `port` to `remote`:`to`, waits for each
/// echo and checks it.
pub async fn ping(
    stack: &RdsStack,
    remote: Ipv4Addr,
    (port, to): (u16, u16),
    (count, size): (u64, usize),
    timeout: Duration,
) -> Result<PingStats, PeerError> {
    if size > rds::wire::MAX_MSG_LEN {
        return Err(failed(format!(
            "--size is at most {} bytes",
            rds::wire::MAX_MSG_LEN
        )));
    }
    let sock = stack.bind(port)?;
    let dest = SocketAddrV4::new(remote, to);
    let t0 = Instant::now();
    let mut rtt_sum = Duration::ZERO;
    for seq in 0..count {
        let t = Instant::now();
        send_within(&sock, dest, Bytes::from(payload(seq, size)), timeout).await?;
        let echo = wait_from(&sock, dest, timeout.saturating_sub(t.elapsed()))
            .await?
            .ok_or_else(|| {
                failed(format!(
                    "ping {size}: no echo for #{seq} within {timeout:?}"
                ))
            })?;
        match check(&echo, size) {
            Ok(Some(s)) if s != seq => {
                return Err(failed(format!("ping {size}: echo #{seq} carries seq {s}")));
            }
            Ok(_) => {}
            Err(why) => return Err(failed(format!("ping {size}: echo #{seq}: {why}"))),
        }
        rtt_sum += t.elapsed();
    }
    let dt = t0.elapsed().as_secs_f64().max(1e-6);
    Ok(PingStats {
        count,
        size,
        msg_per_s: count as f64 / dt,
        avg_rtt_us: rtt_sum.as_secs_f64() * 1e6 / count.max(1) as f64,
    })
}

/// The next datagram from `from`, skipping any other (late echoes of an earlier node).
async fn wait_from(
    sock: &RdsSocket,
    from: SocketAddrV4,
    timeout: Duration,
) -> Result<Option<Bytes>, PeerError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match sock.recv_timeout(left).await? {
            Some((data, src)) if src == from => return Ok(Some(data)),
            Some(_) => continue,
            None => return Ok(None),
        }
    }
}

async fn send_within(
    sock: &RdsSocket,
    dest: SocketAddrV4,
    data: Bytes,
    timeout: Duration,
) -> Result<(), PeerError> {
    tokio::time::timeout(timeout, sock.send_to(dest, data))
        .await
        .map_err(|_| failed(format!("send to {dest} blocked for {timeout:?}")))??;
    Ok(())
}

/// How [`send`] paces itself and how long it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendPacing {
    /// Pause after each send returns (zero: as fast as the send buffer and the remote
    /// congestion map allow).
    pub interval: Duration,
    /// How long each send may wait for congestion to clear, and TCP for the last byte.
    pub timeout: Duration,
    /// How long to stay up after the last send was delivered.
    pub linger: Duration,
}

/// What [`send`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendStats {
    /// Datagrams sent.
    pub count: u64,
    /// Their size.
    pub size: usize,
    /// Datagrams per second while sending.
    pub msg_per_s: f64,
    /// MB/s (10^6 bytes) while sending.
    pub mb_per_s: f64,
    /// Sends the remote node's congestion map held back (a non-blocking Linux send gets
    /// ENOBUFS for them).
    pub congested_waits: u64,
    /// Sends that waited for our own send buffer.
    pub sndbuf_waits: u64,
}

/// Sends `count` numbered datagrams of `size` from `port` to `remote`:`to` with blocking sends
/// (waiting while the remote port is congested), then keeps the node up until TCP has
/// delivered them.
pub async fn send(
    stack: &RdsStack,
    remote: Ipv4Addr,
    (port, to): (u16, u16),
    (count, size): (u64, usize),
    pacing: SendPacing,
) -> Result<SendStats, PeerError> {
    let SendPacing {
        interval,
        timeout,
        linger,
    } = pacing;
    if size > rds::wire::MAX_MSG_LEN {
        return Err(failed(format!(
            "--size is at most {} bytes",
            rds::wire::MAX_MSG_LEN
        )));
    }
    let sock = stack.bind(port)?;
    let dest = SocketAddrV4::new(remote, to);
    let t0 = Instant::now();
    let (mut congested, mut buffer_full) = (0u64, 0u64);
    for seq in 0..count {
        if seq > 0 && !interval.is_zero() {
            // A pause after each send, not a schedule from the start: a send that congestion
            // held back is not followed by a burst that catches up.
            tokio::time::sleep(interval).await;
        }
        let data = Bytes::from(payload(seq, size));
        let w = tokio::time::timeout(timeout, sock.send_to_counted(dest, data))
            .await
            .map_err(|_| failed(format!("send to {dest} blocked for {timeout:?}")))??;
        congested += u64::from(w.congested > 0);
        buffer_full += u64::from(w.buffer_full > 0);
    }
    let dt = t0.elapsed().as_secs_f64().max(1e-6);
    // Keep the node up until TCP has taken everything off our hands, then a while longer.
    let deadline = Instant::now() + timeout;
    while !stack.idle_to(remote) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle = stack.idle_to(remote);
    tokio::time::sleep(linger).await;
    if !idle {
        return Err(failed(format!(
            "send {size}: TCP had not delivered everything after {timeout:?}"
        )));
    }
    Ok(SendStats {
        count,
        size,
        msg_per_s: count as f64 / dt,
        mb_per_s: (count as f64 * size as f64) / dt / 1e6,
        congested_waits: congested,
        sndbuf_waits: buffer_full,
    })
}

/// What [`recv`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecvStats {
    /// Datagrams received in order.
    pub count: u64,
    /// Their size.
    pub size: usize,
    /// Datagrams per second from the first one on.
    pub msg_per_s: f64,
    /// MB/s (10^6 bytes) from the first one on.
    pub mb_per_s: f64,
}

/// After `delay`, receives `count` numbered datagrams of `size` on `sock` and checks they
/// arrive complete and in order.
pub async fn recv(
    sock: &RdsSocket,
    (count, size): (u64, usize),
    delay: Duration,
    timeout: Duration,
) -> Result<RecvStats, PeerError> {
    tokio::time::sleep(delay).await;
    let mut t0 = None;
    for i in 0..count {
        let Some((data, _)) = sock.recv_timeout(timeout).await? else {
            return Err(failed(format!("recv: got {i} of {count} datagrams")));
        };
        t0.get_or_insert_with(Instant::now);
        match check(&data, size) {
            Ok(Some(s)) if s != i => {
                return Err(failed(format!("recv #{i}: seq {s} out of order")));
            }
            Ok(_) => {}
            Err(why) => return Err(failed(format!("recv #{i}: {why}"))),
        }
    }
    let dt = t0.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-6);
    Ok(RecvStats {
        count,
        size,
        msg_per_s: count as f64 / dt,
        mb_per_s: (count as f64 * size as f64) / dt / 1e6,
    })
}

/// Waits (at most `limit`) until the stack has nothing queued to `remote`: a send returns once
/// the message is queued, and shutting the node down drops what is still queued (as closing a
/// Linux RDS socket does).
pub async fn drain(stack: &RdsStack, remote: Ipv4Addr, limit: Duration) {
    let t0 = Instant::now();
    while !stack.idle_to(remote) && t0.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_the_lab_format() {
        // guest/rds-peer.py: struct.pack("!Q", seq) + bytes((seq + i) & 0xff for i in 8..size)
        let p = payload(0x0102, 12);
        assert_eq!(p, [0, 0, 0, 0, 0, 0, 1, 2, 0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(payload(3, 4), [3, 4, 5, 6]);
        assert_eq!(check(&p, 12), Ok(Some(0x0102)));
        assert_eq!(check(&p, 11), Err("length 12 != 11".to_string()));
        let mut bad = p.clone();
        bad[11] ^= 1;
        assert!(check(&bad, 12).is_err());
        assert_eq!(check(&payload(9, 3), 3), Ok(None));
    }
}
