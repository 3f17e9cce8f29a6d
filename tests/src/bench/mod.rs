//! Benchmarks (not tests): each reports figures and ratios against a baseline measured in the
//! same run, because these machines are noisy.

pub mod invoke;
pub mod pipeline;

use std::time::Duration;

/// Latency summary of a sample.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
}

/// Sorts `samples` and returns the median and the 99th percentile.
pub fn percentiles(samples: &mut [Duration]) -> Percentiles {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// Microseconds with one decimal.
pub fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}
