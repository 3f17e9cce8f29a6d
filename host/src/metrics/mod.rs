//! What a host did, as Prometheus series: the one source of truth for counters (the demo's
//! summary, [`RunningHost::stats`](crate::serve::RunningHost::stats) and `/metrics` all read
//! these). Labels are bounded: `route`, `outcome`, `trap`, `layer`, `stream` and `result` on
//! the fenced batch series (`batches.rs`), `digest` only on `dedup_serving_info`; never a key.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod batches;
mod counts;
pub mod latency;
pub use batches::{BatchResult, BatchSeries};
pub use counts::{RouteCounts, StatsSnapshot};
use dedup_delivery::outage::OutageStreak;
pub use dedup_delivery::outcome::{DedupLayer, MessageOutcome};
use latency::LatencyBuckets;

/// The `route` label of messages no route takes.
pub const UNROUTED: &str = "_unrouted";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpCallLabels {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    route: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LayerLabels {
    route: String,
    layer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrapLabels {
    route: String,
    trap: String,
}

/// Labels named as the NATS exporters name them, so the host's series join theirs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabels {
    route: String,
    stream_name: String,
    consumer_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServingLabels {
    route: String,
    digest: String,
}

type Histograms = Family<RouteLabel, Histogram, fn() -> Histogram>;

/// Registers each `name, help, family;` in `registry`.
macro_rules! register {
    ($registry:ident; $($name:literal, $help:literal, $family:expr;)*) => {
        $($registry.register($name, $help, $family.clone());)*
    };
}

/// Latency buckets from 10 µs to about 84 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00001, 2.0, 24))
}

/// Every series of one host, registered in its own registry (no global state, so several
/// hosts in one process keep separate counts).
pub struct Metrics {
    registry: Registry,
    messages: Family<OutcomeLabels, Counter>,
    hits: Family<LayerLabels, Counter>,
    outputs: Family<RouteLabel, Counter>,
    traps: Family<TrapLabels, Counter>,
    deploys: Family<RouteLabel, Counter>,
    refusals: Family<RouteLabel, Counter>,
    guest_seconds: Histograms,
    claim_write_seconds: Histograms,
    end_to_end_seconds: Histograms,
    in_flight: Family<RouteLabel, Gauge>,
    free_slots: Family<RouteLabel, Gauge>,
    pending: Family<RouteLabel, Gauge>,
    ack_pending: Family<RouteLabel, Gauge>,
    bound: Family<RouteLabel, Gauge>,
    serving: Family<ServingLabels, Gauge>,
    stranded: Gauge,
    spans_dropped: Counter,
    pool_overflows: Counter,
    copies_passed: Counter,
    ready: Gauge,
    consumers: Family<ConsumerLabels, Gauge>,
    http_calls: Family<HttpCallLabels, Counter>,
    rollout: crate::rollout_metrics::RolloutSeries,
    batches: BatchSeries,
    routes: Mutex<HashMap<String, Arc<RouteMetrics>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every family registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dedup");
        let histograms = || Histograms::new_with_constructor(latency_histogram as fn() -> _);
        let m = Self {
            messages: Family::default(),
            hits: Family::default(),
            outputs: Family::default(),
            traps: Family::default(),
            deploys: Family::default(),
            refusals: Family::default(),
            guest_seconds: histograms(),
            claim_write_seconds: histograms(),
            end_to_end_seconds: histograms(),
            in_flight: Family::default(),
            free_slots: Family::default(),
            pending: Family::default(),
            ack_pending: Family::default(),
            bound: Family::default(),
            serving: Family::default(),
            stranded: Gauge::default(),
            spans_dropped: Counter::default(),
            pool_overflows: Counter::default(),
            copies_passed: Counter::default(),
            ready: Gauge::default(),
            consumers: Family::default(),
            http_calls: Family::default(),
            rollout: Default::default(),
            batches: BatchSeries::default(),
            routes: Mutex::default(),
            registry: Registry::default(),
        };
        // name, help, family: every series of the host.
        register! {
            registry;
            "messages", "Deliveries by how they ended: processed, duplicate, busy (its key in progress elsewhere, or an exclusive route's message naked while an earlier one of its entity is queued), retried, dead_lettered, lost_claim, coalesced (skipped for a newer message of its entity), error (an infrastructure error, naked with backoff)", m.messages;
            "hits", "Repeats caught, by layer: claim (key already completed or dead-lettered), output (an output the stream reported as a duplicate: a re-run's), stream (a host publish, a dead letter, the dead-letter stream's window dropped), fence (a fenced route's whole output set refused because a stale owner committed it)", m.hits;
            "outputs", "Outputs published (including ones deduplicated)", m.outputs;
            "traps", "Guest traps by kind (timeout, fuel exhausted, memory limit, guest trap, ...)", m.traps;
            "deploys", "New component versions served", m.deploys;
            "refusals", "Component versions refused", m.refusals;
            "guest_seconds", "Time a guest ran per message", m.guest_seconds;
            "claim_write_seconds", "Latency of claim writes (claim and completion)", m.claim_write_seconds;
            "end_to_end_seconds", "From the event's publish to its settlement", m.end_to_end_seconds;
            "in_flight", "Messages of a route being processed", m.in_flight;
            "free_guest_slots", "Guest slots of a route not in use", m.free_slots;
            "consumer_pending", "Messages the route's consumer has not delivered yet (read every 5 s)", m.pending;
            "consumer_ack_pending", "Messages delivered and not yet acknowledged (read every 5 s)", m.ack_pending;
            "consumer_bound", "1 while the route's consumer is bound, 0 while it is being re-created", m.bound;
            "serving_info", "The component version a route serves (value 1)", m.serving;
            "stranded_messages", "Messages the server delivers no more whose dead letter is not stored yet (the dead-letter stream was missing, full or unreachable, or no host here serves its route under the contract), as the last sweep left them; hosts retry each with a backoff up to 5 minutes, audit lists them", m.stranded;
            "spans_dropped", "Trace spans dropped: the export queue was full or an export failed", m.spans_dropped;
            "pool_overflow", "Guest instances made outside the host-wide instance pool (it was full, or a reload raised a route's memory limit past its slots): slower, never refused; lower concurrency if it keeps rising", m.pool_overflows;
            "queued_copies_passed", "Copies in an exclusive route's queue that their partition no longer hands out (acked and never deleted, or given up) and that later messages of their entity looked past instead of waiting for; each is handed to the sweep of undeliverable messages, which deletes it (its key settled) or dead-letters it", m.copies_passed;
            "host_ready", "1 while /readyz answers 200 (ready), 0 otherwise", m.ready;
            "consumer_info", "The stream and durable consumer of a route (value 1), labelled as the NATS exporters label theirs", m.consumers;
            "http_calls", "Guests' outbound HTTP calls by result: sent, replayed (answered from the journal), denied (outside the allowlist), prohibited (a private address no rule names), limit, failed, stopped (by the journal)", m.http_calls;
        }
        m.rollout.register(&mut registry);
        m.batches.register(&mut registry);
        Self { registry, ..m }
    }

    /// The series of fenced group commits (`dedup_fenced_batches_total`, ...).
    pub fn batches(&self) -> BatchSeries {
        self.batches.clone()
    }

    /// Records whether the host is ready (`dedup_host_ready`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Records that `route` reads `stream` through durable `consumer` (`dedup_consumer_info`).
    pub fn consumer_info(&self, route: &str, stream: &str, consumer: &str) {
        let labels = ConsumerLabels {
            route: route.to_string(),
            stream_name: stream.to_string(),
            consumer_name: consumer.to_string(),
        };
        self.consumers.get_or_create(&labels).set(1);
    }

    /// The count of queued copies looked past (`dedup_queued_copies_passed_total`).
    pub fn copies_passed(&self) -> Counter {
        self.copies_passed.clone()
    }

    /// The count of trace spans dropped ([`crate::telemetry`]).
    pub fn spans_dropped(&self) -> Counter {
        self.spans_dropped.clone()
    }

    /// Counts route `route`'s outbound HTTP calls by result (`dedup_http_calls_total`).
    pub fn http_calls(&self, route: &str) -> crate::runtime::http::CallObserver {
        let (family, route) = (self.http_calls.clone(), route.to_string());
        std::sync::Arc::new(move |result: crate::runtime::http::CallResult| {
            let labels = HttpCallLabels {
                route: route.clone(),
                result: result.as_str(),
            };
            family.get_or_create(&labels).inc();
        })
    }

    /// The handles of one route's series, created on first use.
    pub fn route(&self, route: &str) -> Arc<RouteMetrics> {
        let route = if route.is_empty() { UNROUTED } else { route };
        let mut routes = self.routes.lock().expect("metrics lock");
        routes
            .entry(route.to_string())
            .or_insert_with(|| Arc::new(RouteMetrics::new(self, route)))
            .clone()
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        // The runtime counts overflows for the whole process; the series catches up here.
        self.pool_overflows
            .inner()
            .fetch_max(crate::runtime::pool_overflows(), Ordering::Relaxed);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Sets how many messages are stranded: past their last delivery, their dead letter not
    /// stored yet (`crate::stranded`); the same on every host, which all read the markers.
    pub fn set_stranded(&self, n: u64) {
        self.stranded.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// How many messages were stranded when the markers were last read.
    pub fn stranded(&self) -> u64 {
        u64::try_from(self.stranded.get()).unwrap_or(0)
    }

    /// Sums every route's counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let routes = self.routes.lock().expect("metrics lock");
        let mut s = StatsSnapshot::default();
        for r in routes.values() {
            let n = |o: MessageOutcome| r.outcomes[o as usize].get();
            s.processed += n(MessageOutcome::Processed);
            s.duplicates += n(MessageOutcome::Duplicate);
            s.retried += n(MessageOutcome::Retried);
            s.dead_lettered += n(MessageOutcome::DeadLettered);
            s.busy += n(MessageOutcome::Busy);
            s.lost_claims += n(MessageOutcome::LostClaim);
            s.errors += n(MessageOutcome::Error);
            s.outputs_published += r.outputs.get();
        }
        s
    }
}

/// One route's series, resolved once so the message path does no label lookups.
pub struct RouteMetrics {
    route: String,
    outcomes: Vec<Counter>,
    hits: Vec<Counter>,
    outputs: Counter,
    traps: Family<TrapLabels, Counter>,
    deploys: Counter,
    refusals: Counter,
    guest_seconds: Histogram,
    claim_write_seconds: Histogram,
    end_to_end_seconds: Histogram,
    /// The console's copies of guest time and of the time the host added (see [`latency`]).
    guest_buckets: LatencyBuckets,
    added_buckets: LatencyBuckets,
    in_flight: Gauge,
    free_slots: Gauge,
    pending: Gauge,
    ack_pending: Gauge,
    bound: Gauge,
    serving: Family<ServingLabels, Gauge>,
    serving_digest: Mutex<Option<String>>,
    /// How many of the route's messages in a row ended in an infrastructure error (not
    /// exported; the outage backoff grows with it, see [`RouteMetrics::outages`]).
    outage_streak: OutageStreak,
    /// The route's candidate series (shadow and canary runs).
    pub rollout: crate::rollout_metrics::RouteRollout,
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

impl RouteMetrics {
    fn new(m: &Metrics, route: &str) -> Self {
        let label = RouteLabel {
            route: route.to_string(),
        };
        let outcomes = MessageOutcome::ALL
            .iter()
            .map(|o| {
                m.messages
                    .get_or_create(&OutcomeLabels {
                        route: route.to_string(),
                        outcome: o.label(),
                    })
                    .clone()
            })
            .collect();
        let hits = DedupLayer::ALL
            .iter()
            .map(|l| {
                m.hits
                    .get_or_create(&LayerLabels {
                        route: route.to_string(),
                        layer: l.label(),
                    })
                    .clone()
            })
            .collect();
        Self {
            route: route.to_string(),
            outcomes,
            hits,
            outputs: m.outputs.get_or_create(&label).clone(),
            traps: m.traps.clone(),
            deploys: m.deploys.get_or_create(&label).clone(),
            refusals: m.refusals.get_or_create(&label).clone(),
            guest_seconds: m.guest_seconds.get_or_create(&label).clone(),
            claim_write_seconds: m.claim_write_seconds.get_or_create(&label).clone(),
            end_to_end_seconds: m.end_to_end_seconds.get_or_create(&label).clone(),
            guest_buckets: LatencyBuckets::default(),
            added_buckets: LatencyBuckets::default(),
            in_flight: m.in_flight.get_or_create(&label).clone(),
            free_slots: m.free_slots.get_or_create(&label).clone(),
            pending: m.pending.get_or_create(&label).clone(),
            ack_pending: m.ack_pending.get_or_create(&label).clone(),
            bound: m.bound.get_or_create(&label).clone(),
            serving: m.serving.clone(),
            serving_digest: Mutex::new(None),
            outage_streak: OutageStreak::new(),
            rollout: m.rollout.route(route),
        }
    }

    /// Counts a delivery's end; a duplicate is also a hit of the claim layer. Also logged at
    /// info, inside the message's span (route, key, attempt), for `dedup-host dev` and for
    /// anyone who runs with `RUST_LOG=dedup_host=info`.
    pub fn outcome(&self, outcome: MessageOutcome) {
        tracing::info!(outcome = outcome.label(), "message settled");
        let error = matches!(
            outcome,
            MessageOutcome::DeadLettered | MessageOutcome::LostClaim | MessageOutcome::Error
        );
        crate::telemetry::record_outcome(outcome.label(), error);
        self.outcomes[outcome as usize].inc();
        self.outage_streak.count(outcome);
        if outcome == MessageOutcome::Duplicate {
            self.hit(DedupLayer::Claim, 1);
        }
    }

    /// How many of this route's messages in a row ended in an infrastructure error: any other
    /// outcome (but a lost claim) ends the run ([`OutageStreak::count`]).
    pub fn outage_streak(&self) -> u64 {
        self.outage_streak.errors()
    }

    /// The route's run of infrastructure errors, which sets its outage backoff (rule 20).
    pub fn outages(&self) -> &OutageStreak {
        &self.outage_streak
    }

    /// Counts `n` repeats caught by `layer`.
    pub fn hit(&self, layer: DedupLayer, n: u64) {
        if n > 0 {
            self.hits[layer as usize].inc_by(n);
        }
    }

    /// Counts published outputs.
    pub fn outputs(&self, n: u64) {
        self.outputs.inc_by(n);
    }

    /// Counts a guest trap of `kind` (a bounded set of names).
    pub fn trap(&self, kind: &str) {
        self.traps
            .get_or_create(&TrapLabels {
                route: self.route.clone(),
                trap: kind.to_string(),
            })
            .inc();
    }

    /// Records how long a guest ran.
    pub fn guest_time(&self, elapsed: Duration) {
        self.guest_seconds.observe(elapsed.as_secs_f64());
        self.guest_buckets.observe(elapsed);
    }

    /// Records the time the host spent on one delivery besides running its guest (claim,
    /// record and output writes, waits, the ack): what the host adds to the handler's time.
    pub fn added_time(&self, elapsed: Duration) {
        self.added_buckets.observe(elapsed);
    }

    /// Records one claim write's latency.
    pub fn claim_write(&self, elapsed: Duration) {
        self.claim_write_seconds.observe(elapsed.as_secs_f64());
    }

    /// Records the time from an event's publish to its settlement.
    pub fn end_to_end(&self, elapsed: Duration) {
        self.end_to_end_seconds.observe(elapsed.as_secs_f64());
    }

    /// One more message in flight until the guard is dropped.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.inc();
        InFlight(self.clone())
    }

    /// Sets the free guest slots (read at scrape time).
    pub fn set_free_slots(&self, n: usize) {
        self.free_slots.set(n as i64);
    }

    /// Sets the consumer's pending and ack-pending counts.
    pub fn set_consumer(&self, pending: u64, ack_pending: usize) {
        self.pending.set(pending as i64);
        self.ack_pending.set(ack_pending as i64);
    }

    /// Records whether the route's consumer is bound (pulling works).
    pub fn set_bound(&self, bound: bool) {
        self.bound.set(bound as i64);
    }

    /// Whether the route's consumer is bound.
    pub fn bound(&self) -> bool {
        self.bound.get() == 1
    }

    /// A new version is served (`Some`) or none is (`None`): counts a deploy and moves the
    /// `dedup_serving_info` series to the new digest.
    pub fn serving(&self, digest: Option<&str>) {
        let mut current = self.serving_digest.lock().expect("metrics lock");
        if let Some(old) = current.take() {
            self.serving.remove(&ServingLabels {
                route: self.route.clone(),
                digest: old,
            });
        }
        if let Some(digest) = digest {
            self.deploys.inc();
            self.serving
                .get_or_create(&ServingLabels {
                    route: self.route.clone(),
                    digest: digest.to_string(),
                })
                .set(1);
            *current = Some(digest.to_string());
        }
    }

    /// Counts a refused version.
    pub fn refusal(&self) {
        self.refusals.inc();
    }

    /// The route's counters and gauges now (free slots are the caller's to fill in).
    pub fn counts(&self) -> RouteCounts {
        let gauge = |g: &Gauge| u64::try_from(g.get()).unwrap_or(0);
        RouteCounts {
            outcomes: MessageOutcome::ALL
                .iter()
                .map(|o| (o.label().to_string(), self.outcomes[*o as usize].get()))
                .collect(),
            hits: DedupLayer::ALL
                .iter()
                .map(|l| (l.label().to_string(), self.hits[*l as usize].get()))
                .collect(),
            outputs: self.outputs.get(),
            in_flight: gauge(&self.in_flight),
            free_slots: gauge(&self.free_slots),
            pending: gauge(&self.pending),
            ack_pending: gauge(&self.ack_pending),
            guest_time: self.guest_buckets.counts(),
            added_time: self.added_buckets.counts(),
        }
    }
}

/// Holds one in-flight message of a route; dropping it counts the message as finished.
pub struct InFlight(Arc<RouteMetrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_streak_counts_errors_in_a_row_and_any_other_outcome_but_a_lost_claim_ends_it() {
        let m = Metrics::new();
        let a = m.route("a");
        for _ in 0..3 {
            a.outcome(MessageOutcome::Error);
        }
        a.outcome(MessageOutcome::LostClaim);
        assert_eq!(a.outage_streak(), 3);
        m.route("b").outcome(MessageOutcome::Processed);
        assert_eq!(a.outage_streak(), 3, "per route");
        a.outcome(MessageOutcome::Busy);
        assert_eq!(a.outage_streak(), 0);
        a.outcome(MessageOutcome::Error);
        assert_eq!(a.outage_streak(), 1);
    }

    #[test]
    fn counts_per_route_and_sums_them() {
        let m = Metrics::new();
        let a = m.route("a");
        a.outcome(MessageOutcome::Processed);
        a.outcome(MessageOutcome::Duplicate);
        m.route("b").outcome(MessageOutcome::Processed);
        a.serving(Some("d1"));
        a.serving(Some("d2"));
        let s = m.snapshot();
        assert_eq!((s.processed, s.duplicates), (2, 1));
        let text = m.encode();
        assert!(text.contains(r#"dedup_messages_total{route="a",outcome="processed"} 1"#));
        assert!(text.contains(r#"dedup_hits_total{route="a",layer="claim"} 1"#));
        assert!(text.contains(r#"dedup_serving_info{route="a",digest="d2"} 1"#));
        assert!(!text.contains("d1"));
        assert!(text.contains(r#"dedup_deploys_total{route="a"} 2"#));
    }
}
