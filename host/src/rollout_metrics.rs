//! The series of candidate versions (shadow and canary runs, differences, rollbacks), part of
//! [`crate::metrics::Metrics`]. Labels stay bounded: `route`, `version` (`live` or
//! `candidate`), `mode`, `result` and `kind` are small fixed sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    route: String,
    version: &'static str,
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    route: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    route: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

/// The families, registered once per [`crate::metrics::Metrics`].
#[derive(Default)]
pub struct RolloutSeries {
    runs: Family<RunLabels, Counter>,
    shadow: Family<ResultLabels, Counter>,
    differences: Family<KindLabels, Counter>,
    share: Family<RouteLabel, Gauge>,
    rollbacks: Family<RouteLabel, Counter>,
    promotions: Family<RouteLabel, Counter>,
}

impl RolloutSeries {
    /// Registers every family in `registry` (prefixed as the registry is).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "candidate_runs",
            "Guest runs by version (live or candidate) while a candidate exists, by mode (shadow or canary)",
            self.runs.clone(),
        );
        registry.register(
            "shadow_results",
            "Shadow comparisons by result: match, difference, noise (also seen between two live runs), skipped (no spare slot)",
            self.shadow.clone(),
        );
        registry.register(
            "shadow_differences",
            "Differences between a candidate and the live version, by kind",
            self.differences.clone(),
        );
        registry.register(
            "canary_share_percent",
            "The share of keys a canary candidate runs (0 without one)",
            self.share.clone(),
        );
        registry.register(
            "candidate_rollbacks",
            "Candidates rolled back automatically",
            self.rollbacks.clone(),
        );
        registry.register(
            "candidate_promotions",
            "Candidates promoted automatically",
            self.promotions.clone(),
        );
    }

    /// The handles of one route.
    pub fn route(&self, route: &str) -> RouteRollout {
        let label = RouteLabel {
            route: route.to_string(),
        };
        RouteRollout {
            route: route.to_string(),
            runs: self.runs.clone(),
            shadow: self.shadow.clone(),
            differences: self.differences.clone(),
            share: self.share.get_or_create(&label).clone(),
            rollbacks: self.rollbacks.get_or_create(&label).clone(),
            promotions: self.promotions.get_or_create(&label).clone(),
        }
    }
}

/// One route's candidate series.
pub struct RouteRollout {
    route: String,
    runs: Family<RunLabels, Counter>,
    shadow: Family<ResultLabels, Counter>,
    differences: Family<KindLabels, Counter>,
    share: Gauge,
    rollbacks: Counter,
    promotions: Counter,
}

impl RouteRollout {
    /// Counts a guest run of `version` (`live` or `candidate`) in `mode`.
    pub fn run(&self, version: &'static str, mode: &'static str) {
        let labels = RunLabels {
            route: self.route.clone(),
            version,
            mode,
        };
        self.runs.get_or_create(&labels).inc();
    }

    /// Counts a shadow comparison's result (`match`, `difference`, `noise`, `skipped`).
    pub fn shadow(&self, result: &'static str) {
        let labels = ResultLabels {
            route: self.route.clone(),
            result,
        };
        self.shadow.get_or_create(&labels).inc();
    }

    /// Counts one difference of `kind`.
    pub fn difference(&self, kind: &'static str) {
        let labels = KindLabels {
            route: self.route.clone(),
            kind,
        };
        self.differences.get_or_create(&labels).inc();
    }

    /// Sets the canary share in percent (0: no canary).
    pub fn canary_share(&self, percent: u8) {
        self.share.set(i64::from(percent));
    }

    /// Counts an automatic rollback.
    pub fn rollback(&self) {
        self.rollbacks.inc();
    }

    /// Counts an automatic promotion.
    pub fn promotion(&self) {
        self.promotions.inc();
    }
}
