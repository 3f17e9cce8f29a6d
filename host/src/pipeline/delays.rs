//! How long a message waits before its next delivery when it could not run now: after an
//! infrastructure error (an outage backoff, rule 20), when the instance pool was full, and
//! when its key is busy elsewhere.

use std::time::Duration;

use crate::metrics::RouteMetrics;

/// First nak delay after an infrastructure error (rule 20).
const INFRA_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest nak delay after infrastructure errors: with the server's delivery bound (default
/// 100) a message survives hours of outage instead of 100 seconds.
/// The config's duplicate-window rule counts it ([`crate::config::Config::longest_rerun_gap`]).
pub(super) const INFRA_RETRY_MAX: Duration = crate::config::OUTAGE_BACKOFF_MAX;

/// How many deliveries count as one more failure in a row for [`outage_retry`].
const DELIVERIES_PER_FAILURE: u64 = 4;

/// The nak delay after an infrastructure error on `route` for the `delivered`-th delivery of
/// a message: [`infra_retry`] of the message's deliveries while the route keeps failing
/// ([`RouteMetrics::outage_streak`]), so an outage backs off further with every delivery,
/// and one transient error after a run of successes waits seconds, however often the
/// message was delivered for benign reasons (a busy key, hosts killed while running it). A
/// message that keeps failing while the route's others succeed (one output stream gone)
/// still backs off, by a quarter of its deliveries: the server's delivery bound lasts hours
/// for it too.
pub(super) fn outage_retry(route: &RouteMetrics, delivered: u64) -> Duration {
    backoff(route.outage_streak(), delivered)
}

/// [`outage_retry`] for an error not counted in the route's run yet.
pub(super) fn outage_retry_uncounted(route: &RouteMetrics, delivered: u64) -> Duration {
    backoff(route.outage_streak() + 1, delivered)
}

/// [`infra_retry`] of the route's run of `streak` errors, but no more than the message's
/// deliveries (a burst of messages failing at once in a short outage is a long run, not a
/// long outage), and at least a quarter of them (a message failing alone still backs off).
fn backoff(streak: u64, delivered: u64) -> Duration {
    let failures = streak
        .min(delivered)
        .max(delivered / DELIVERIES_PER_FAILURE)
        .max(1);
    infra_retry(failures)
}

/// The nak delay after the `failures`-th infrastructure error in a row (store unavailable,
/// publish refused for a transient reason, stream missing): doubling from 1 s up to
/// [`INFRA_RETRY_MAX`], with jitter (between half and all of it) so that hosts recovering
/// from one outage do not come back in step. A fixed short retry turns an outage into a
/// storm and burns the server's delivery bound (rule 20).
pub(super) fn infra_retry(failures: u64) -> Duration {
    infra_retry_ceiling(failures).mul_f64(rand::random_range(0.5..=1.0))
}

/// Longest nak delay of a message whose guest found the instance pool full: a local, passing
/// condition (a reload's old and new versions both hold instances for a moment, a burst on
/// another route), not an outage: waiting minutes for it left messages idle long after the
/// pool had room. 100 deliveries at this ceiling still last over 15 minutes, and a pool full
/// that long is alerted on (`DedupGuestTraps`).
const POOL_FULL_RETRY_MAX: Duration = Duration::from_secs(10);

/// The nak delay of a message whose guest found the pool full: [`infra_retry`], up to
/// [`POOL_FULL_RETRY_MAX`].
pub(super) fn pool_full_retry(delivered: u64) -> Duration {
    infra_retry(delivered).min(POOL_FULL_RETRY_MAX)
}

/// The nak delay [`infra_retry`] jitters below, after the `failures`-th error in a row (the
/// simulation draws its own jitter).
pub fn infra_retry_ceiling(failures: u64) -> Duration {
    let doublings = failures.clamp(1, 32) as u32 - 1;
    INFRA_RETRY_FIRST
        .saturating_mul(1u32 << doublings.min(20))
        .min(INFRA_RETRY_MAX)
}

/// The nak delay of a busy key: the wait its record asks for (`retry_in`), computed from
/// times another host wrote, so bounded by what this host's config allows (a lease plus the
/// skew margin, the largest backoff, or the longest outage backoff of a released key): a
/// skewed clock never parks a message for longer. A copy of a key released for an outage
/// waits with it: polling sooner would only spend the copy's deliveries
/// (`server_max_deliver`), and once those are spent the copy would be dead-lettered for
/// nothing.
pub fn busy_delay(retry_in: Duration, lease_and_skew: Duration, max_backoff: Duration) -> Duration {
    retry_in.min(lease_and_skew.max(max_backoff).max(INFRA_RETRY_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_backs_off_with_the_routes_errors_in_a_row_and_a_lone_message_with_its_deliveries()
    {
        let metrics = crate::metrics::Metrics::new();
        let route = metrics.route("r");
        // One transient error on a message delivered 9 times for benign reasons: seconds.
        route.outcome(crate::metrics::MessageOutcome::Error);
        assert!(outage_retry(&route, 9) <= Duration::from_secs(4));
        // Many messages failing at once in a short outage: each waits by its own deliveries.
        for _ in 0..300 {
            route.outcome(crate::metrics::MessageOutcome::Error);
        }
        assert!(outage_retry(&route, 1) <= Duration::from_secs(1));
        // A long outage: minutes, as each message's deliveries mount.
        assert!(outage_retry(&route, 12) >= INFRA_RETRY_MAX / 2);
        // A message failing alone while the route's others succeed still backs off.
        route.outcome(crate::metrics::MessageOutcome::Processed);
        let total: Duration = (1..=100).map(|d| outage_retry(&route, d)).sum();
        assert!(total > Duration::from_secs(3600), "{total:?}");
    }

    #[test]
    fn infrastructure_retries_back_off_exponentially_up_to_minutes() {
        for delivered in 1..200 {
            let d = infra_retry(delivered);
            let full = INFRA_RETRY_FIRST
                .saturating_mul(1 << (delivered.min(21) - 1))
                .min(INFRA_RETRY_MAX);
            assert!(d >= full / 2 && d <= full, "{delivered}: {d:?} of {full:?}");
        }
        assert!(infra_retry(0) <= INFRA_RETRY_FIRST);
        assert!(infra_retry(10) >= INFRA_RETRY_MAX / 2);
        // The server's default bound of 100 deliveries lasts hours, not 100 seconds.
        let total: Duration = (1..=100).map(infra_retry).sum();
        assert!(total > Duration::from_secs(3 * 3600), "{total:?}");
    }

    #[test]
    fn a_full_pool_is_retried_within_seconds_yet_outlasts_the_delivery_bound_for_minutes() {
        for delivered in 1..200 {
            assert!(pool_full_retry(delivered) <= POOL_FULL_RETRY_MAX);
        }
        assert!(pool_full_retry(1) <= INFRA_RETRY_FIRST);
        let total: Duration = (1..=100).map(pool_full_retry).sum();
        assert!(total > Duration::from_secs(6 * 60), "{total:?}");
    }

    #[test]
    fn a_busy_key_waits_as_long_as_its_record_asks_up_to_the_outage_backoff() {
        let (lease, backoff) = (Duration::from_secs(32), Duration::from_secs(60));
        let wait = |ask| busy_delay(ask, lease, backoff);
        assert_eq!(wait(Duration::from_millis(250)), Duration::from_millis(250));
        // A key released for an outage asks for up to the outage backoff: its copies wait
        // that long instead of spending their deliveries every few seconds.
        assert_eq!(wait(INFRA_RETRY_MAX), INFRA_RETRY_MAX);
        assert_eq!(wait(infra_retry_ceiling(40)), infra_retry_ceiling(40));
        // A record written by a host whose clock is hours ahead does not park the copy.
        assert_eq!(wait(Duration::from_secs(7200)), INFRA_RETRY_MAX);
        // A host whose own lease or backoff is longer waits that long at most.
        let long = Duration::from_secs(900);
        assert_eq!(busy_delay(Duration::from_secs(7200), long, backoff), long);
        assert_eq!(busy_delay(Duration::from_secs(7200), lease, long), long);
    }
}
