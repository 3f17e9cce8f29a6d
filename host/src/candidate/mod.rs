//! Candidate versions: a new version of a route's handler run beside the live one before it
//! replaces it. Kept on the server (object `<route>.candidate` of the components bucket, its
//! [`Spec`] in the object's metadata), so every host serving the route runs the same candidate
//! the same way; for a route served from files, beside its file ([`files`]).
//!
//! - [`spec`]: the settings (shadow or canary, ignore paths, rollback margins, state).
//! - [`compare`]: two runs of one event, compared outcome, subject, headers and payload.
//! - [`canary`]: which keys a canary runs, and when it is worse than the live version.
//! - [`shadow`]: shadow runs on spare capacity, off the message path.
//! - [`record`]: counts and samples of differences on the server, for `dedup-host diff`.
//! - [`store`]: the candidate object and its metadata.
//! - [`files`]: candidates of routes served from files (`<route>.candidate.wasm`).

pub mod canary;
pub mod compare;
pub mod files;
pub mod record;
pub mod shadow;
pub mod spec;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

use crate::rollout_metrics::RouteRollout;
use crate::runtime::{Handler, Invocation, Outcome};
pub use spec::{Mode, Spec};

/// Shadow runs of one route at a time on one host: more would crowd the live version's
/// guests for CPU and instances.
const SHADOW_SLOTS: usize = 2;

/// Why a candidate in `mode` may not run beside route `route`'s live version, when the route
/// claims after running (`claim_after`): a claim-after key has no record before its outputs,
/// so nothing pins it to the version that began them (see the pipeline's `pinned`), and a
/// re-run after a partial publish could land on the other version (window output ids are the
/// same for every version: one version's output dropped as a duplicate, another's stored
/// twice). A shadow publishes nothing, so it may.
pub fn refusal(route: &str, claim_after: bool, mode: &Mode) -> Option<ClaimAfterCanary> {
    match (claim_after, mode) {
        (true, Mode::Canary { percent }) => Some(ClaimAfterCanary {
            route: route.to_string(),
            percent: *percent,
        }),
        _ => None,
    }
}

/// A canary refused on a claim-after route ([`refusal`]); nothing was deployed.
#[derive(Debug, thiserror::Error)]
#[error("route `{route}` claims after running (`claim = \"after\"`), so a canary ({percent}% of keys) cannot keep a key on the version that began its outputs: a re-run after a partial publish could mix two versions' effects; run the new version as a shadow first (`dedup-host deploy --route {route} --shadow FILE`, or `mode = \"shadow\"` beside a component file), then deploy it as the live version (`--component FILE`), or serve the route with `claim = \"before\"` to canary it")]
pub struct ClaimAfterCanary {
    /// The route.
    pub route: String,
    /// The canary's share of keys.
    pub percent: u8,
}

/// Whether a candidate running in `mode` runs `key` in place of the live version: a canary
/// that this host still runs (`active`) takes its share of keys ([`canary::runs_on_candidate`]);
/// a shadow takes none (it runs beside the live version, its outputs thrown away). The
/// simulation splits its keys with this function too.
pub fn runs_key(mode: &Mode, active: bool, key: &str) -> bool {
    match mode {
        Mode::Canary { percent } => active && canary::runs_on_candidate(key, *percent),
        Mode::Shadow { .. } => false,
    }
}

/// What a host asks of the candidate's object once it has decided (on its own figures).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Roll the candidate back on every host.
    RollBack {
        /// The route.
        route: String,
        /// The candidate decided on (a newer one is left alone).
        digest: String,
        /// Why.
        reason: String,
    },
    /// Make the candidate the live version on every host.
    Promote {
        /// The route.
        route: String,
        /// The candidate decided on.
        digest: String,
    },
}

/// A compiled candidate of one route, with what this host has seen of it.
pub struct Candidate {
    /// Its settings, as stored.
    pub spec: Spec,
    /// The compiled component.
    pub handler: Handler,
    route: String,
    health: canary::Health,
    /// Runs without a difference (shadow, since the last one) or candidate runs (canary).
    clean: AtomicU64,
    /// An action was asked for: this host stops running it at once.
    finished: AtomicBool,
    shadow_slots: Arc<Semaphore>,
    actions: mpsc::UnboundedSender<Action>,
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("route", &self.route)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Candidate {
    /// A candidate of `route` running `handler` per `spec`; decisions go to `actions`.
    pub fn new(
        route: &str,
        spec: Spec,
        handler: Handler,
        actions: mpsc::UnboundedSender<Action>,
    ) -> Self {
        Self {
            spec,
            handler,
            route: route.to_string(),
            health: canary::Health::default(),
            clean: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            shadow_slots: Arc::new(Semaphore::new(SHADOW_SLOTS)),
            actions,
        }
    }

    /// The candidate's digest.
    pub fn digest(&self) -> &str {
        self.handler.digest()
    }

    /// Whether this host still runs it (no rollback or promotion decided here).
    pub fn active(&self) -> bool {
        !self.finished.load(Ordering::Relaxed)
    }

    /// Whether a canary runs `key` on the candidate ([`runs_key`]).
    pub fn runs_key(&self, key: &str) -> bool {
        runs_key(&self.spec.mode, self.active(), key)
    }

    /// The canary share this host applies now (0: not a canary, or finished).
    pub fn share(&self) -> u8 {
        match self.spec.mode {
            Mode::Canary { percent } if self.active() => percent,
            _ => 0,
        }
    }

    /// Records a canary run of `digest` (the candidate's or the live version's) and acts
    /// once the candidate is worse than its margins allow, or has run clean long enough.
    pub fn observe(&self, digest: &str, invocation: &Invocation, metrics: &RouteRollout) {
        let Mode::Canary { .. } = self.spec.mode else {
            return;
        };
        if !self.active() {
            return;
        }
        let on_candidate = digest == self.digest();
        metrics.run(if on_candidate { "candidate" } else { "live" }, "canary");
        let ended = match &invocation.outcome {
            Outcome::Success(_) => canary::Ended::Success,
            Outcome::Reject { .. } => canary::Ended::Reject,
            Outcome::Retry { .. } => canary::Ended::Retry,
            Outcome::Trap(_) => canary::Ended::Trap,
        };
        let verdict =
            self.health
                .record(on_candidate, ended, invocation.elapsed, &self.spec.margins);
        if let Some(reason) = verdict {
            metrics.rollback();
            return self.finish(Action::RollBack {
                route: self.route.clone(),
                digest: self.digest().to_string(),
                reason,
            });
        }
        if on_candidate {
            self.count_clean(metrics);
        }
    }

    /// Records a shadow comparison: a difference starts the clean count again.
    pub fn shadowed(&self, differed: bool, metrics: &RouteRollout) {
        if differed {
            self.clean.store(0, Ordering::Relaxed);
        } else {
            self.count_clean(metrics);
        }
    }

    fn count_clean(&self, metrics: &RouteRollout) {
        let clean = self.clean.fetch_add(1, Ordering::Relaxed) + 1;
        if self.spec.auto_promote.is_some_and(|n| clean >= n) {
            metrics.promotion();
            self.finish(Action::Promote {
                route: self.route.clone(),
                digest: self.digest().to_string(),
            });
        }
    }

    fn finish(&self, action: Action) {
        if self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(route = %self.route, candidate = self.digest(), ?action, "candidate decided");
        // The receiver lives as long as the host watches the store; a host shutting down
        // leaves the decision to the others.
        let _ = self.actions.send(action);
    }
}
