//! `rpc bench`: NULL round trips on one RPC client, `depth` calls in flight (one task each),
//! until a number of calls or a deadline; calls per second and latency percentiles, and the
//! ratio RDMA ÷ TCP when both transports were measured. The CLI connects (its endpoints) and
//! prints; the JSON forms derive from [`Run`] and [`Runs`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use oncrpc::RpcClient;
use serde::Serialize;

/// The server a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// ONC RPC over TCP.
    Tcp(SocketAddr),
    /// RPC-over-RDMA.
    Rdma(SocketAddr),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "tcp://{a}"),
            Target::Rdma(a) => write!(f, "rdma://{a}"),
        }
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many calls.
    Calls(u64),
    /// At this instant.
    At(Instant),
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// The server.
    pub target: Target,
    /// Calls made (answered or failed).
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// The first failure, in words.
    pub first_error: Option<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Latency of every answered call, nanoseconds.
    pub hist: Histogram<u64>,
}

/// Latencies are recorded in nanoseconds, from 1 ns to 60 s, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3)
        .or_else(|_| Histogram::new(3))
        .unwrap_or_else(|_| unreachable!("3 significant digits is a valid histogram"))
}

/// Make NULL calls on `client`, `depth` at a time, until `stop`.
pub async fn run(target: Target, client: &RpcClient, depth: u32, stop: Stop) -> BenchResult {
    let issued = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(stop);
    let start = Instant::now();
    let mut workers = Vec::with_capacity(depth as usize);
    for _ in 0..depth {
        let client = client.clone();
        let issued = issued.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut hist = new_histogram();
            let mut errors = 0u64;
            let mut first_error = None;
            loop {
                let go = match &*stop {
                    Stop::Calls(n) => issued.fetch_add(1, Ordering::Relaxed) < *n,
                    Stop::At(t) => Instant::now() < *t,
                };
                if !go {
                    break;
                }
                let t0 = Instant::now();
                let r = client.null().await;
                let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                match r {
                    Ok(()) => hist.saturating_record(ns.max(1)),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (hist, errors, first_error)
        }));
    }
    let mut hist = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for w in workers {
        match w.await {
            Ok((h, e, fe)) => {
                let _ = hist.add(&h);
                errors += e;
                if first_error.is_none() {
                    first_error = fe;
                }
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("bench worker failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed();
    BenchResult {
        target,
        calls: hist.len() + errors,
        errors,
        first_error,
        elapsed,
        hist,
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// Rate and latency of one run, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Answered calls per second.
    #[serde(skip)]
    pub rate: f64,
    /// Median.
    #[serde(serialize_with = "crate::json::f1")]
    pub p50: f64,
    /// 90th percentile.
    #[serde(serialize_with = "crate::json::f1")]
    pub p90: f64,
    /// 99th percentile.
    #[serde(serialize_with = "crate::json::f1")]
    pub p99: f64,
    /// 99.9th percentile.
    #[serde(rename = "p99_9", serialize_with = "crate::json::f1")]
    pub p999: f64,
    /// Maximum.
    #[serde(serialize_with = "crate::json::f1")]
    pub max: f64,
}

impl BenchResult {
    /// Rate and latency percentiles (zeros when no call was answered).
    pub fn summary(&self) -> Summary {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let ok = self.hist.len();
        let q = |p: f64| {
            if ok == 0 {
                0.0
            } else {
                us(self.hist.value_at_quantile(p))
            }
        };
        Summary {
            rate: ok as f64 / secs,
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: if ok == 0 { 0.0 } else { us(self.hist.max()) },
        }
    }
}

/// RDMA ÷ TCP for rate and latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratio {
    /// Calls per second.
    #[serde(rename = "calls_per_sec", serialize_with = "crate::json::f3")]
    pub rate: f64,
    /// Median latency.
    #[serde(serialize_with = "crate::json::f3")]
    pub p50: f64,
    /// 99th percentile latency.
    #[serde(serialize_with = "crate::json::f3")]
    pub p99: f64,
}

/// RDMA ÷ TCP, when both transports were measured.
pub fn ratio(results: &[BenchResult]) -> Option<Ratio> {
    let tcp = results
        .iter()
        .find(|r| matches!(r.target, Target::Tcp(_)))?;
    let rdma = results
        .iter()
        .find(|r| matches!(r.target, Target::Rdma(_)))?;
    let (t, r) = (tcp.summary(), rdma.summary());
    let div = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
    Some(Ratio {
        rate: div(r.rate, t.rate),
        p50: div(r.p50, t.p50),
        p99: div(r.p99, t.p99),
    })
}

/// The JSON form of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The server.
    pub target: Target,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Calls in flight.
    pub depth: u32,
    /// Calls made.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Wall time.
    #[serde(serialize_with = "crate::json::f3")]
    pub seconds: f64,
    /// Answered calls per second.
    #[serde(serialize_with = "crate::json::f1")]
    pub calls_per_sec: f64,
    /// Latency percentiles.
    pub latency_us: Summary,
}

impl Run {
    /// `r` as measured with program `prog` version `vers` at `depth`.
    pub fn new(r: &BenchResult, prog: u32, vers: u32, depth: u32) -> Self {
        let s = r.summary();
        Run {
            target: r.target,
            prog,
            vers,
            depth,
            calls: r.calls,
            errors: r.errors,
            seconds: r.elapsed.as_secs_f64(),
            calls_per_sec: s.rate,
            latency_us: s,
        }
    }
}

/// The JSON form of several runs: `{"runs":[…],"rdma_over_tcp":{…}}` (the ratio only when both
/// transports were measured).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Runs {
    /// Every run.
    pub runs: Vec<Run>,
    /// RDMA ÷ TCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma_over_tcp: Option<Ratio>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(target: Target, ns: &[u64]) -> BenchResult {
        let mut hist = new_histogram();
        for &n in ns {
            hist.record(n).unwrap();
        }
        BenchResult {
            target,
            calls: ns.len() as u64,
            errors: 0,
            first_error: None,
            elapsed: Duration::from_secs(1),
            hist,
        }
    }

    #[test]
    fn json_shape_is_the_cli_s() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let tcp = result(Target::Tcp(a), &[2000, 2000, 2000, 2000]);
        let rdma = result(Target::Rdma(a), &[1000, 1000]);
        let run = serde_json::to_string(&Run::new(&tcp, 7, 1, 8)).unwrap();
        assert_eq!(
            run,
            concat!(
                r#"{"target":"tcp://127.0.0.1:1","prog":7,"vers":1,"depth":8,"calls":4,"#,
                r#""errors":0,"seconds":1.0,"calls_per_sec":4.0,"#,
                r#""latency_us":{"p50":2.0,"p90":2.0,"p99":2.0,"p99_9":2.0,"max":2.0}}"#
            )
        );
        let results = [tcp, rdma];
        let runs = Runs {
            runs: results.iter().map(|r| Run::new(r, 7, 1, 8)).collect(),
            rdma_over_tcp: ratio(&results),
        };
        let j = serde_json::to_string(&runs).unwrap();
        assert!(
            j.ends_with(r#""rdma_over_tcp":{"calls_per_sec":0.5,"p50":0.5,"p99":0.5}}"#),
            "{j}"
        );
        let one = Runs {
            runs: vec![Run::new(&results[0], 7, 1, 8)],
            rdma_over_tcp: ratio(&results[..1]),
        };
        assert!(
            !serde_json::to_string(&one)
                .unwrap()
                .contains("rdma_over_tcp")
        );
    }
}
