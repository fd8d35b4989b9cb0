//! Round-trip times per procedure, measured by a client transport.
//!
//! The split nfs-utils' `mountstats` and `nfsiostat` make: a call's *round-trip time* runs from
//! its (last) transmission to its reply's arrival at the transport, as a capture on the wire
//! sees it; its *execute time* — what the caller of [`crate::client::RpcTransport::call`]
//! measures — adds the client's own encoding, queueing (waiting for a credit or a slot),
//! reply processing and task wake-ups. A transport that measures it keeps an [`RttTable`] and
//! hands it out through [`crate::client::RpcTransport::rtt`]; a bench takes a
//! [`RttTable::snapshot`] before and after a pass and reads the difference
//! ([`RttSnapshot::since`]).
//!
//! Bounds: one histogram (about 26 KB: 1 µs to 100 s at two significant digits) per
//! (program, version, procedure) this client calls, so at most [`MAX_KEYS`] of them; calls to
//! further procedures are counted in [`RttSnapshot::unrecorded`] and not timed.

use std::collections::HashMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// Procedures timed per table; the rest are counted only.
pub const MAX_KEYS: usize = 64;

/// (program, version, procedure).
pub type ProcKey = (u32, u32, u32);

fn new_hist() -> Histogram<u64> {
    // Microseconds, 1 µs .. 100 s, two significant digits (1 % resolution).
    Histogram::new_with_bounds(1, 100_000_000, 2)
        .unwrap_or_else(|_| Histogram::new(2).unwrap_or_else(|_| unreachable!("2 digits is valid")))
}

#[derive(Debug, Default)]
struct Inner {
    procs: HashMap<ProcKey, Histogram<u64>>,
    unrecorded: u64,
}

/// Round-trip times of one client's calls, per procedure (see the module text).
#[derive(Debug, Default)]
pub struct RttTable {
    inner: Mutex<Inner>,
}

impl RttTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// One call of `key` that took `rtt` from its transmission to its reply.
    pub fn record(&self, key: ProcKey, rtt: Duration) {
        let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1);
        let mut g = self.inner.lock();
        let n = g.procs.len();
        match g.procs.get_mut(&key) {
            Some(h) => h.saturating_record(us),
            None if n < MAX_KEYS => {
                let mut h = new_hist();
                h.saturating_record(us);
                g.procs.insert(key, h);
            }
            None => g.unrecorded += 1,
        }
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> RttSnapshot {
        let g = self.inner.lock();
        RttSnapshot {
            procs: g.procs.clone(),
            unrecorded: g.unrecorded,
        }
    }
}

/// What an [`RttTable`] held at one moment, or the difference of two such moments.
#[derive(Debug, Clone, Default)]
pub struct RttSnapshot {
    procs: HashMap<ProcKey, Histogram<u64>>,
    /// Calls not timed because the table already held [`MAX_KEYS`] procedures.
    pub unrecorded: u64,
}

impl RttSnapshot {
    /// The calls recorded after `earlier` (a snapshot of the same table taken before this one).
    pub fn since(&self, earlier: &RttSnapshot) -> RttSnapshot {
        let mut procs = HashMap::new();
        for (k, h) in &self.procs {
            let mut d = h.clone();
            if let Some(e) = earlier.procs.get(k) {
                // `e` is an earlier state of the same histogram: every count in it is also in
                // `h`, so subtracting cannot underflow; on a mismatched pair keep `h` whole.
                if d.subtract(e).is_err() {
                    d = h.clone();
                }
            }
            if !d.is_empty() {
                procs.insert(*k, d);
            }
        }
        RttSnapshot {
            procs,
            unrecorded: self.unrecorded.saturating_sub(earlier.unrecorded),
        }
    }

    /// The calls of this snapshot and of `other` together (two windows of the same or of
    /// different tables, for example one measurement taken in rounds).
    pub fn merged(&self, other: &RttSnapshot) -> RttSnapshot {
        let mut procs = self.procs.clone();
        for (k, h) in &other.procs {
            match procs.get_mut(k) {
                // Same bounds and precision (`new_hist`): adding cannot fail.
                Some(mine) => {
                    let _ = mine.add(h);
                }
                None => {
                    procs.insert(*k, h.clone());
                }
            }
        }
        RttSnapshot {
            procs,
            unrecorded: self.unrecorded.saturating_add(other.unrecorded),
        }
    }

    /// Calls timed, over every procedure.
    pub fn count(&self) -> u64 {
        self.procs.values().map(Histogram::len).sum()
    }

    /// Calls timed of one procedure.
    pub fn count_of(&self, key: ProcKey) -> u64 {
        self.procs.get(&key).map_or(0, Histogram::len)
    }

    /// The procedures timed.
    pub fn keys(&self) -> impl Iterator<Item = ProcKey> + '_ {
        self.procs.keys().copied()
    }

    /// The round-trip time at quantile `q` (0..=1) of one procedure, in microseconds.
    pub fn quantile_us_of(&self, key: ProcKey, q: f64) -> Option<f64> {
        let h = self.procs.get(&key).filter(|h| !h.is_empty())?;
        Some(h.value_at_quantile(q) as f64)
    }

    /// The round-trip time at quantile `q` (0..=1) over every procedure, in microseconds.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        let mut all = new_hist();
        for h in self.procs.values() {
            // Same bounds and precision: adding cannot fail.
            let _ = all.add(h);
        }
        (!all.is_empty()).then(|| all.value_at_quantile(q) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_per_procedure_and_subtracts_an_earlier_snapshot() {
        let t = RttTable::new();
        for us in [10, 20, 30] {
            t.record((100003, 3, 1), Duration::from_micros(us));
        }
        let before = t.snapshot();
        for _ in 0..9 {
            t.record((100003, 3, 6), Duration::from_micros(200));
        }
        t.record((100003, 3, 1), Duration::from_micros(1000));
        let d = t.snapshot().since(&before);
        assert_eq!(d.count(), 10);
        assert_eq!(d.count_of((100003, 3, 6)), 9);
        assert_eq!(d.count_of((100003, 3, 1)), 1);
        // Two significant digits: within 1 % (the bucket's highest value).
        let near = |v: Option<f64>, want: f64| {
            let v = v.expect("a value");
            assert!(v >= want && v <= want * 1.01, "{v} for {want}");
        };
        near(d.quantile_us_of((100003, 3, 1), 0.5), 1000.0);
        near(d.quantile_us_of((100003, 3, 6), 0.5), 200.0);
        // Nine of ten calls at 200 µs: the median over both is theirs.
        near(d.quantile_us(0.5), 200.0);
        near(before.quantile_us_of((100003, 3, 1), 0.5), 20.0);
        assert_eq!(before.quantile_us_of((100003, 3, 6), 0.5), None);
    }

    #[test]
    fn merged_snapshots_hold_the_calls_of_both() {
        let (a, b) = (RttTable::new(), RttTable::new());
        for _ in 0..3 {
            a.record((100003, 3, 1), Duration::from_micros(10));
        }
        for _ in 0..5 {
            b.record((100003, 3, 1), Duration::from_micros(1000));
        }
        b.record((100003, 3, 6), Duration::from_micros(50));
        let m = a.snapshot().merged(&b.snapshot());
        assert_eq!(m.count(), 9);
        assert_eq!(m.count_of((100003, 3, 1)), 8);
        assert_eq!(m.count_of((100003, 3, 6)), 1);
        // Five of the eight GETATTRs took 1 ms: the median of the merged histogram is one.
        let p50 = m.quantile_us_of((100003, 3, 1), 0.5).expect("a value");
        assert!((1000.0..=1010.0).contains(&p50), "{p50}");
        // The other way round is the same set of calls.
        assert_eq!(b.snapshot().merged(&a.snapshot()).count(), 9);
    }

    #[test]
    fn sub_microsecond_and_huge_times_are_kept_in_range() {
        let t = RttTable::new();
        t.record((1, 1, 0), Duration::from_nanos(300));
        t.record((1, 1, 0), Duration::from_secs(100_000));
        let s = t.snapshot();
        assert_eq!(s.count(), 2);
        assert_eq!(s.quantile_us(0.0), Some(1.0));
        assert!(s.quantile_us(1.0).unwrap() >= 99_000_000.0);
    }

    #[test]
    fn at_most_max_keys_procedures_are_timed() {
        let t = RttTable::new();
        for p in 0..(MAX_KEYS as u32 + 5) {
            t.record((1, 1, p), Duration::from_micros(5));
        }
        let s = t.snapshot();
        assert_eq!(s.keys().count(), MAX_KEYS);
        assert_eq!(s.unrecorded, 5);
        assert_eq!(s.count(), MAX_KEYS as u64);
    }
}
