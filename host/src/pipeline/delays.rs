//! How long a message waits before its next delivery when it could not run now: the ceilings
//! of [`dedup_delivery::backoff`] (the simulation runs the same ones), with this host's route
//! counts and jitter.

use std::time::Duration;

pub use dedup_delivery::backoff::{busy_delay, infra_retry_ceiling};
use dedup_delivery::backoff::{jittered, pool_full};

use crate::metrics::RouteMetrics;

/// Longest nak delay after infrastructure errors ([`dedup_delivery::backoff::OUTAGE_BACKOFF_MAX`]).
pub(super) const INFRA_RETRY_MAX: Duration = dedup_delivery::backoff::OUTAGE_BACKOFF_MAX;

/// The nak delay after an infrastructure error on `route` for the `delivered`-th delivery of
/// a message: the outage backoff of the route's errors in a row and the message's deliveries
/// ([`OutageStreak::retry`](dedup_delivery::outage::OutageStreak::retry), which the
/// simulation runs too), with this host's jitter.
pub(super) fn outage_retry(route: &RouteMetrics, delivered: u64) -> Duration {
    route.outages().retry(delivered, unit())
}

/// [`outage_retry`] for an error not counted in the route's run yet.
pub(super) fn outage_retry_uncounted(route: &RouteMetrics, delivered: u64) -> Duration {
    route.outages().retry_uncounted(delivered, unit())
}

/// The nak delay of a message whose guest found the pool full ([`pool_full`]).
pub(super) fn pool_full_retry(delivered: u64) -> Duration {
    pool_full(jitter(infra_retry_ceiling(delivered)))
}

/// `ceiling` with this host's jitter ([`jittered`]).
fn jitter(ceiling: Duration) -> Duration {
    jittered(ceiling, unit())
}

/// Where between half and all of a ceiling a delay falls: this host's randomness.
fn unit() -> f64 {
    rand::random_range(0.0..=1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routes_errors_in_a_row_lengthen_its_messages_outage_backoff() {
        let metrics = crate::metrics::Metrics::new();
        let route = metrics.route("r");
        route.outcome(crate::metrics::MessageOutcome::Error);
        assert!(outage_retry(&route, 9) <= Duration::from_secs(4));
        for _ in 0..300 {
            route.outcome(crate::metrics::MessageOutcome::Error);
        }
        assert!(outage_retry(&route, 12) >= INFRA_RETRY_MAX / 2);
        assert!(outage_retry_uncounted(&route, 1) <= Duration::from_secs(1));
    }
}
