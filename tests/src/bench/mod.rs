//! Benchmarks (not tests): each reports figures and ratios against a baseline measured in the
//! same run, because these machines are noisy.

pub mod fairness;
pub mod hotload;
pub mod invoke;
pub mod languages;
pub mod pipeline;

use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::HeaderMap;

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

/// Publishes `n` copies of `payload` to `subject` with message ids `<prefix>-<i>`, keeping up
/// to 1024 acks outstanding.
pub async fn publish_many(
    js: &Context,
    subject: &str,
    prefix: &str,
    n: usize,
    payload: &[u8],
) -> anyhow::Result<()> {
    let mut acks = Vec::with_capacity(1024);
    for i in 0..n {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{prefix}-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.to_string(), h, payload.to_vec().into())
                .await?,
        );
        if acks.len() == 1024 {
            for a in acks.drain(..) {
                a.await?;
            }
        }
    }
    for a in acks {
        a.await?;
    }
    Ok(())
}
