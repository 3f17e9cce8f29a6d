//! The series of fenced group commits ([`crate::fenced::group`]), part of
//! [`super::Metrics`]: how many batches a host sent to each fenced stream, how they ended, and
//! how many messages' commits each carried. Labels: `stream` (a configured output stream) and
//! `result` (a fixed set).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    stream: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabel {
    stream: String,
}

/// How a fenced batch ended (decided by [`dedup_delivery::group`]).
pub use dedup_delivery::group::BatchResult;

type CommitHistograms = Family<StreamLabel, Histogram, fn() -> Histogram>;

/// Commits per batch: 1 to 512 in powers of two.
fn commits_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// The families, registered once per [`super::Metrics`]; clones share them.
#[derive(Clone)]
pub struct BatchSeries {
    batches: Family<ResultLabels, Counter>,
    commits: CommitHistograms,
}

impl Default for BatchSeries {
    fn default() -> Self {
        Self {
            batches: Family::default(),
            commits: CommitHistograms::new_with_constructor(commits_histogram as fn() -> _),
        }
    }
}

impl BatchSeries {
    /// Registers every family in `registry` (prefixed as the registry is).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "fenced_batches",
            "Atomic batches of fenced commits sent to a stream, by result: committed, refused (sent again commit by commit), unanswered",
            self.batches.clone(),
        );
        registry.register(
            "fenced_batch_commits",
            "Messages' commits per fenced batch (group commit)",
            self.commits.clone(),
        );
    }

    /// Records one batch of `commits` commits to `stream`, ended as `result`.
    pub fn batch(&self, stream: &str, commits: usize, result: BatchResult) {
        self.batches
            .get_or_create(&ResultLabels {
                stream: stream.to_string(),
                result: result.label(),
            })
            .inc();
        self.commits
            .get_or_create(&StreamLabel {
                stream: stream.to_string(),
            })
            .observe(commits as f64);
    }
}
