//! Plain copies of a host's counters: per route for the console's feed ([`RouteCounts`]),
//! summed over routes for the demo and tests ([`StatsSnapshot`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One route's cumulative counters and current gauges: what a host publishes for the console
/// ([`crate::feed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteCounts {
    /// Deliveries by `outcome` label.
    #[serde(default)]
    pub outcomes: BTreeMap<String, u64>,
    /// Repeats caught, by `layer` label.
    #[serde(default)]
    pub hits: BTreeMap<String, u64>,
    /// Outputs published.
    #[serde(default)]
    pub outputs: u64,
    /// Messages being handled now.
    #[serde(default)]
    pub in_flight: u64,
    /// Free guest slots now.
    #[serde(default)]
    pub free_slots: u64,
    /// Messages the route's consumer has not delivered yet (last read).
    #[serde(default)]
    pub pending: u64,
    /// Messages delivered and not acknowledged yet (last read).
    #[serde(default)]
    pub ack_pending: u64,
    /// Guest run times so far, counted per bucket of [`super::latency::BOUNDS_US`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guest_time: Vec<u64>,
    /// Time the host added to each delivery (its handling minus the guest's run) so far,
    /// counted per bucket of [`super::latency::BOUNDS_US`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_time: Vec<u64>,
}

/// A copy of the host's counters summed over routes (the demo summary, tests).
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
