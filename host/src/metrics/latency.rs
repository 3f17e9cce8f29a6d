//! A small latency histogram for the console's charts: fixed 1-2-5 buckets from 50 µs to
//! 30 s (plus one above), counted with atomics on the message path. Hosts publish the
//! cumulative counts in their feed ([`crate::feed`]); the console subtracts two snapshots to get
//! an interval's distribution and reads its percentiles with [`quantile`]. Twenty numbers per
//! series keep a snapshot small whatever the traffic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Each bucket's upper bound, in microseconds; one more bucket holds everything above.
pub const BOUNDS_US: [u64; 19] = [
    50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000,
];
/// How many buckets a histogram has ([`BOUNDS_US`] and the one above).
pub const BUCKETS: usize = BOUNDS_US.len() + 1;

/// Counts of observations per bucket, since the host started.
#[derive(Debug)]
pub struct LatencyBuckets([AtomicU64; BUCKETS]);

impl Default for LatencyBuckets {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl LatencyBuckets {
    /// Counts one observation.
    pub fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let i = BOUNDS_US.partition_point(|bound| *bound < us);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts per bucket now.
    pub fn counts(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// The lower and upper bound of bucket `i`, in milliseconds (the last bucket's upper bound
/// is taken as twice its lower one).
pub fn bucket_range_ms(i: usize) -> (f64, f64) {
    let lower = if i == 0 { 0 } else { BOUNDS_US[i - 1] };
    let upper = BOUNDS_US.get(i).copied().unwrap_or(lower * 2);
    (lower as f64 / 1000.0, upper as f64 / 1000.0)
}

/// The `q` quantile (0..=1) of a distribution given as counts per bucket, in milliseconds,
/// interpolated linearly inside its bucket; `None` when nothing was counted.
pub fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
    let mut below = 0u64;
    for (i, n) in counts.iter().enumerate() {
        if *n > 0 && (below + n) as f64 >= rank {
            let (lower, upper) = bucket_range_ms(i);
            let inside = (rank - below as f64) / *n as f64;
            return Some(lower + (upper - lower) * inside);
        }
        below += n;
    }
    Some(bucket_range_ms(counts.len().saturating_sub(1)).1)
}

/// `now - before`, bucket by bucket (a missing or shorter `before` counts as zeros).
pub fn difference(now: &[u64], before: &[u64]) -> Vec<u64> {
    now.iter()
        .enumerate()
        .map(|(i, n)| n.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_percentiles_read_back_inside_it() {
        let b = LatencyBuckets::default();
        for _ in 0..98 {
            b.observe(Duration::from_micros(700)); // (0.5, 1] ms
        }
        b.observe(Duration::from_millis(40)); // (20, 50] ms
        b.observe(Duration::from_secs(100)); // above 30 s
        let counts = b.counts();
        assert_eq!(counts.len(), BUCKETS);
        assert_eq!((counts[4], counts[9], counts[BUCKETS - 1]), (98, 1, 1));
        let p50 = quantile(&counts, 0.5).unwrap();
        assert!((0.5..=1.0).contains(&p50), "{p50}");
        let p99 = quantile(&counts, 0.99).unwrap();
        assert!((20.0..=50.0).contains(&p99), "{p99}");
        assert_eq!(quantile(&[0; BUCKETS], 0.5), None);
        let later = {
            b.observe(Duration::from_micros(10));
            b.counts()
        };
        assert_eq!(difference(&later, &counts)[0], 1);
        assert_eq!(difference(&later, &[]).iter().sum::<u64>(), 101);
    }
}
