//! The JSON form of a [`PerfReport`] (what `oxrdma perf --json` prints): one object with the
//! operation, the test (`bw` or `lat`), whether CRC was on and one row per size. Figures keep six
//! decimals; a figure that is not a number (no raw-TCP ceiling measured) is `null`.

use serde::Serialize;

use super::{PerfReport, PerfRow, us};

/// `{"op":…,"test":"bw"|"lat","crc":…,"rows":[…]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfJson {
    /// perftest's name of the operation ([`super::PerfOp::name`]).
    pub op: &'static str,
    /// `bw` or `lat`.
    pub test: &'static str,
    /// MPA CRC-32C was on.
    pub crc: bool,
    /// One row per size.
    pub rows: Vec<PerfJsonRow>,
}

/// One size: bandwidth or latency columns.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PerfJsonRow {
    /// Bandwidth (MB/s = 10^6 bytes per second).
    Bw {
        /// Message size.
        bytes: usize,
        /// Messages measured.
        iterations: usize,
        /// Peak bandwidth.
        bw_peak_mbs: Option<f64>,
        /// Average bandwidth.
        bw_avg_mbs: Option<f64>,
        /// Millions of messages per second.
        msg_rate_mpps: Option<f64>,
        /// Raw TCP on the same path.
        tcp_mbs: Option<f64>,
        /// Average bandwidth ÷ raw TCP.
        ratio: Option<f64>,
    },
    /// Latency, microseconds.
    Lat {
        /// Message size.
        bytes: usize,
        /// Operations measured.
        iterations: usize,
        /// Minimum.
        t_min_us: Option<f64>,
        /// Maximum.
        t_max_us: Option<f64>,
        /// Median.
        t_typical_us: Option<f64>,
        /// Mean.
        t_avg_us: Option<f64>,
        /// 99th percentile.
        t_p99_us: Option<f64>,
    },
}

/// `x` with six decimals, or `None` when it is not a finite number (JSON has no NaN).
fn num(x: f64) -> Option<f64> {
    x.is_finite().then(|| (x * 1e6).round() / 1e6)
}

impl PerfJson {
    /// The JSON form of `r`: latency rows when `lat`, bandwidth rows otherwise.
    pub fn new(r: &PerfReport, lat: bool, crc: bool) -> Self {
        let row = |row: &PerfRow| {
            if lat {
                PerfJsonRow::Lat {
                    bytes: row.bytes,
                    iterations: row.lat_iterations,
                    t_min_us: num(us(row.t_min)),
                    t_max_us: num(us(row.t_max)),
                    t_typical_us: num(us(row.t_typical)),
                    t_avg_us: num(us(row.t_avg)),
                    t_p99_us: num(us(row.t_p99)),
                }
            } else {
                PerfJsonRow::Bw {
                    bytes: row.bytes,
                    iterations: row.iterations,
                    bw_peak_mbs: num(row.bw_peak_mbs),
                    bw_avg_mbs: num(row.bw_avg_mbs),
                    msg_rate_mpps: num(row.msg_rate_mpps),
                    tcp_mbs: row.tcp_mbs.and_then(num),
                    ratio: num(row.ratio()),
                }
            }
        };
        PerfJson {
            op: r.op.name(),
            test: if lat { "lat" } else { "bw" },
            crc,
            rows: r.rows.iter().map(row).collect(),
        }
    }
}
