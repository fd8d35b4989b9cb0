//! The rows of `nfs bench` (and of its NFSv4 half): one measurement each, with the calls
//! behind it, so that a measurement taken in rounds (`BenchConfig::rounds`) adds up to one row
//! per cell; and the round-trip-time window of one pass.

use std::sync::Arc;
use std::time::Duration;

use oncrpc::rtt::{RttSnapshot, RttTable};
use serde::Serialize;

use crate::nfs_bench::NfsVersion;

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `rdma`, `tcp` or `raw-tcp`.
    pub transport: &'static str,
    /// The NFS version (`3`, `4.1`, `4.2`; none for the raw TCP stream).
    pub nfs: Option<NfsVersion>,
    /// `WRITE`, `READ`, `GETATTR` or `STREAM`.
    pub op: &'static str,
    /// I/O size, bytes (none for GETATTR).
    pub io: Option<u32>,
    /// MB/s (10^6 bytes), for data ops.
    #[serde(rename = "mb_per_s", serialize_with = "crate::json::opt3")]
    pub mbs: Option<f64>,
    /// Calls per second.
    #[serde(rename = "ops_per_s", serialize_with = "crate::json::f3")]
    pub ops: f64,
    /// Median call latency, microseconds.
    #[serde(serialize_with = "crate::json::opt3")]
    pub p50_us: Option<f64>,
    /// 99th percentile call latency, microseconds.
    #[serde(serialize_with = "crate::json::opt3")]
    pub p99_us: Option<f64>,
    /// Median round-trip time, microseconds: from each call's transmission to its reply's
    /// arrival at the transport (`oncrpc::rtt`; what a capture on the wire sees, and what
    /// `mountstats` calls RTT), where `p50_us` is the caller's whole wait (its execute time).
    /// None when the transport does not measure it.
    #[serde(serialize_with = "crate::json::opt3")]
    pub rtt_p50_us: Option<f64>,
    /// 99th percentile round-trip time, microseconds.
    #[serde(serialize_with = "crate::json::opt3")]
    pub rtt_p99_us: Option<f64>,
    /// Measured in rounds: the median of the rounds' own call rates. A round that a stall of
    /// the machine fell on is slow, and it moves the sum (`ops`) by the whole stall but the
    /// median by one place at most.
    #[serde(
        rename = "ops_per_s_median_round",
        serialize_with = "crate::json::opt3",
        skip_serializing_if = "Option::is_none"
    )]
    pub ops_median_round: Option<f64>,
    /// What the figures were computed from, so that rounds can be added up (none for the best
    /// of the raw TCP streams of a run without rounds).
    #[serde(skip)]
    pub(crate) sample: Option<Sample>,
}

/// The calls behind a [`Row`]: counts, time and latencies.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    calls: u64,
    bytes: Option<u64>,
    el: Duration,
    /// The calls' latencies; none for a raw TCP stream, whose writes are not calls.
    hist: Option<hdrhistogram::Histogram<u64>>,
    rtt: Option<RttSnapshot>,
    /// Calls per second of each round added up into this sample.
    round_rates: Vec<f64>,
}

impl Sample {
    /// One round: `calls` calls (moving `bytes`, for data) in `el`.
    fn new(
        calls: u64,
        bytes: Option<u64>,
        el: Duration,
        hist: Option<hdrhistogram::Histogram<u64>>,
    ) -> Self {
        Sample {
            calls,
            bytes,
            el,
            hist,
            rtt: None,
            round_rates: vec![calls as f64 / secs(el)],
        }
    }

    /// `other` (another round of the same cell) added to this one: calls, bytes and times
    /// summed, latencies and round-trip times from both histograms.
    fn add(&mut self, other: &Sample) {
        self.calls += other.calls;
        self.bytes = self.bytes.zip(other.bytes).map(|(a, b)| a + b);
        self.el += other.el;
        self.round_rates.extend_from_slice(&other.round_rates);
        if let (Some(mine), Some(theirs)) = (self.hist.as_mut(), other.hist.as_ref()) {
            // Both from `hist()`: same bounds and precision, so adding cannot fail.
            let _ = mine.add(theirs);
        }
        self.rtt = match (self.rtt.take(), other.rtt.as_ref()) {
            (Some(a), Some(b)) => Some(a.merged(b)),
            (a, b) => a.or_else(|| b.cloned()),
        };
    }
}

/// Seconds of `el`, never zero (a rate's divisor).
fn secs(el: Duration) -> f64 {
    el.as_secs_f64().max(1e-9)
}

impl PartialEq for Sample {
    // (Round-trip snapshots are left out: they are derived from the same calls.)
    fn eq(&self, o: &Self) -> bool {
        (self.calls, self.bytes, self.el) == (o.calls, o.bytes, o.el) && self.hist == o.hist
    }
}

impl Row {
    /// This row with the round-trip times of the calls in `rtt` (one pass's calls).
    pub(crate) fn with_rtt(mut self, rtt: Option<&RttSnapshot>) -> Self {
        if let Some(r) = rtt {
            self.rtt_p50_us = r.quantile_us(0.5);
            self.rtt_p99_us = r.quantile_us(0.99);
        }
        if let Some(s) = self.sample.as_mut() {
            s.rtt = rtt.cloned();
        }
        self
    }

    /// Whether `other` measures the same thing (transport, version, operation, I/O size).
    fn same_cell(&self, other: &Row) -> bool {
        (self.transport, self.nfs, self.op, self.io)
            == (other.transport, other.nfs, other.op, other.io)
    }

    /// This row and `other` (another round of the same cell) as one measurement
    /// ([`Sample::add`]), its figures computed again.
    fn absorb(&mut self, other: &Row) {
        let Some(theirs) = other.sample.as_ref() else {
            return;
        };
        let Some(mut s) = self.sample.take() else {
            return;
        };
        s.add(theirs);
        *self = row_of(self.transport, self.nfs, self.op, self.io, s);
    }
}

/// Rows of several rounds, one per cell in the order first measured, each the sum of its
/// rounds.
pub(crate) fn add_up_rounds(rows: Vec<Row>) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in rows {
        match out.iter_mut().find(|o| o.same_cell(&r)) {
            Some(o) => o.absorb(&r),
            None => out.push(r),
        }
    }
    out
}

/// The round-trip times a transport recorded during one pass.
pub(crate) struct RttWindow {
    table: Option<Arc<RttTable>>,
    before: Option<RttSnapshot>,
}

impl RttWindow {
    /// Start counting `transport`'s calls from now.
    pub(crate) fn open(transport: &Arc<dyn oncrpc::RpcTransport>) -> Self {
        let table = transport.rtt();
        let before = table.as_ref().map(|t| t.snapshot());
        RttWindow { table, before }
    }

    /// The calls answered since [`RttWindow::open`].
    pub(crate) fn close(&self) -> Option<RttSnapshot> {
        Some(self.table.as_ref()?.snapshot().since(self.before.as_ref()?))
    }
}

pub(crate) fn hist() -> hdrhistogram::Histogram<u64> {
    // 1 ns .. 100 s, 3 significant digits.
    hdrhistogram::Histogram::new_with_bounds(1, 100_000_000_000, 3).unwrap_or_else(|_| {
        hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!("3 digits is valid"))
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn row(
    transport: &'static str,
    version: NfsVersion,
    op: &'static str,
    io: Option<u32>,
    bytes: Option<u64>,
    n: u64,
    el: Duration,
    h: &hdrhistogram::Histogram<u64>,
) -> Row {
    let sample = Sample::new(n, bytes, el, Some(h.clone()));
    row_of(transport, Some(version), op, io, sample)
}

fn row_of(
    transport: &'static str,
    nfs: Option<NfsVersion>,
    op: &'static str,
    io: Option<u32>,
    s: Sample,
) -> Row {
    let secs = secs(s.el);
    let latency = |q| s.hist.as_ref().map(|h| h.value_at_quantile(q) as f64 / 1e3);
    let rtt = |q| s.rtt.as_ref().and_then(|r| r.quantile_us(q));
    Row {
        transport,
        nfs,
        op,
        io,
        mbs: s.bytes.map(|b| b as f64 / 1e6 / secs),
        ops: s.calls as f64 / secs,
        p50_us: latency(0.5),
        p99_us: latency(0.99),
        rtt_p50_us: rtt(0.5),
        rtt_p99_us: rtt(0.99),
        ops_median_round: median(&s.round_rates),
        sample: Some(s),
    }
}

/// A raw TCP stream of `bytes` in 1 MiB writes that took `el`: a `raw-tcp` `STREAM` row
/// (no latencies: the stream's writes are not calls).
pub(crate) fn stream_row(bytes: u64, el: Duration) -> Row {
    let sample = Sample::new(bytes >> 20, Some(bytes), el, None);
    row_of("raw-tcp", None, "STREAM", Some(1 << 20), sample)
}

/// The median of two or more rates (the mean of the middle two for an even count).
fn median(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_add_up_per_cell() {
        let mut h1 = hist();
        for _ in 0..3 {
            h1.record(10_000).unwrap();
        }
        let mut h2 = hist();
        for _ in 0..5 {
            h2.record(1_000_000).unwrap();
        }
        let r = |t, h: &hdrhistogram::Histogram<u64>, n, ms| {
            let el = Duration::from_millis(ms);
            row(
                t,
                NfsVersion::V3,
                "READ",
                Some(4096),
                Some(n * 4096),
                n,
                el,
                h,
            )
        };
        // rdma: 3 calls in 1 s, then 5 calls in 3 s; tcp once, between them.
        let rows = add_up_rounds(vec![
            r("rdma", &h1, 3, 1000),
            r("tcp", &h1, 3, 500),
            r("rdma", &h2, 5, 3000),
        ]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].transport, rows[1].transport), ("rdma", "tcp"));
        // 8 calls in 4 s, 8 × 4096 bytes: not the mean of the two rounds' rates (1.5 and 3).
        assert!((rows[0].ops - 2.0).abs() < 1e-9, "{}", rows[0].ops);
        let mbs = rows[0].mbs.expect("bytes");
        assert!((mbs - 8.0 * 4096.0 / 4.0 / 1e6).abs() < 1e-12, "{mbs}");
        // Five of the eight calls took 1 ms: the median is from both histograms.
        let p50 = rows[0].p50_us.expect("p50");
        assert!((1000.0..=1001.0).contains(&p50), "{p50}");
        assert_eq!(rows[1].ops, 6.0);
        // The rounds' own rates were 3 and 5/3 calls/s; one round has no median.
        let med = rows[0].ops_median_round.expect("two rounds");
        assert!((med - (3.0 + 5.0 / 3.0) / 2.0).abs() < 1e-9, "{med}");
        assert_eq!(rows[1].ops_median_round, None);
        assert_eq!(median(&[5.0, 1.0, 100.0]), Some(5.0));
        // Raw TCP rounds: 2 MiB in 1 s, then 6 MiB in 1 s; no latencies either way.
        let raw = add_up_rounds(vec![
            stream_row(2 << 20, Duration::from_secs(1)),
            stream_row(6 << 20, Duration::from_secs(1)),
        ]);
        assert_eq!(raw.len(), 1);
        let mbs = raw[0].mbs.expect("bytes");
        assert!((mbs - 8.0 * 1048576.0 / 2.0 / 1e6).abs() < 1e-9, "{mbs}");
        assert_eq!(raw[0].ops_median_round, Some(4.0));
        assert_eq!((raw[0].p50_us, raw[0].p99_us), (None, None));
    }
}
