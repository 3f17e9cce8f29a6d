//! Counters of what a host did, for the demo summary, tests and monitoring.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Live counters, updated by the pipeline.
#[derive(Debug, Default)]
pub struct Stats {
    processed: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    outputs_published: AtomicU64,
    busy: AtomicU64,
    lost_claims: AtomicU64,
    errors: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Messages whose handler succeeded and that were acked.
    pub processed: u64,
    /// Messages acked (or termed) without running: their key was completed or dead-lettered.
    pub duplicates: u64,
    /// Failed attempts that were naked for a later retry.
    pub retried: u64,
    /// Messages published to the dead-letter subject and termed.
    pub dead_lettered: u64,
    /// Outputs published (including ones the output stream deduplicated).
    pub outputs_published: u64,
    /// Messages naked because another owner held a live claim.
    pub busy: u64,
    /// Claims lost to another owner mid-flight (their work was dropped).
    pub lost_claims: u64,
    /// Infrastructure errors (NATS unavailable, publish failures) that led to a nak.
    pub errors: u64,
}

/// Which counter to bump.
#[derive(Debug, Clone, Copy)]
pub enum Counter {
    /// See [`StatsSnapshot::processed`].
    Processed,
    /// See [`StatsSnapshot::duplicates`].
    Duplicate,
    /// See [`StatsSnapshot::retried`].
    Retried,
    /// See [`StatsSnapshot::dead_lettered`].
    DeadLettered,
    /// See [`StatsSnapshot::busy`].
    Busy,
    /// See [`StatsSnapshot::lost_claims`].
    LostClaim,
    /// See [`StatsSnapshot::errors`].
    Error,
}

impl Stats {
    /// Adds one to a counter.
    pub fn bump(&self, counter: Counter) {
        let c = match counter {
            Counter::Processed => &self.processed,
            Counter::Duplicate => &self.duplicates,
            Counter::Retried => &self.retried,
            Counter::DeadLettered => &self.dead_lettered,
            Counter::Busy => &self.busy,
            Counter::LostClaim => &self.lost_claims,
            Counter::Error => &self.errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` published outputs.
    pub fn add_outputs(&self, n: u64) {
        self.outputs_published.fetch_add(n, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            processed: get(&self.processed),
            duplicates: get(&self.duplicates),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            outputs_published: get(&self.outputs_published),
            busy: get(&self.busy),
            lost_claims: get(&self.lost_claims),
            errors: get(&self.errors),
        }
    }
}
