//! rds-ping: zero-length pings to a node's port 0, timed until each pong.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rds::{RdsError, RdsStack};

/// Result of [`ping`] (rds-ping style).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingReport {
    /// Pinged node.
    pub dest: Ipv4Addr,
    /// Pings sent.
    pub sent: u32,
    /// Pongs received.
    pub received: u32,
    /// Round-trip time per ping (`None` = no pong within the timeout).
    pub rtts: Vec<Option<Duration>>,
}

/// Sends `count` zero-length pings to `dest`'s port 0, one every `interval`, and reports the
/// round-trip time of each pong (from port 0, no payload).
pub async fn ping(
    stack: &RdsStack,
    dest: Ipv4Addr,
    count: u32,
    interval: Duration,
    timeout: Duration,
) -> Result<PingReport, RdsError> {
    let sock = stack.bind(0)?;
    let target = SocketAddrV4::new(dest, 0);
    let mut rtts = Vec::new();
    for i in 0..count {
        if i > 0 {
            tokio::time::sleep(interval).await;
        }
        let t0 = Instant::now();
        tokio::time::timeout(timeout, sock.send_to(target, Bytes::new()))
            .await
            .map_err(|_| RdsError::Io(std::io::ErrorKind::TimedOut.into()))??;
        let left = timeout.saturating_sub(t0.elapsed());
        let got = tokio::time::timeout(left, async {
            loop {
                let (p, src) = sock.recv_from().await?;
                if src == target && p.is_empty() {
                    return Ok::<_, RdsError>(());
                }
            }
        })
        .await;
        rtts.push(match got {
            Ok(Ok(())) => Some(t0.elapsed()),
            _ => None,
        });
    }
    Ok(PingReport {
        dest,
        sent: count,
        received: rtts.iter().filter(|r| r.is_some()).count() as u32,
        rtts,
    })
}

impl PingReport {
    /// Percentage of pings without a pong.
    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * f64::from(self.sent.saturating_sub(self.received)) / f64::from(self.sent)
        }
    }

    /// Minimum, mean and maximum round trip in microseconds (`None` without any pong).
    pub fn rtt_min_avg_max_us(&self) -> Option<(f64, f64, f64)> {
        let got: Vec<f64> = self
            .rtts
            .iter()
            .flatten()
            .map(|d| d.as_secs_f64() * 1e6)
            .collect();
        if got.is_empty() {
            return None;
        }
        let min = got.iter().copied().fold(f64::INFINITY, f64::min);
        let max = got.iter().copied().fold(0.0, f64::max);
        let avg = got.iter().sum::<f64>() / got.len() as f64;
        Some((min, avg, max))
    }
}
