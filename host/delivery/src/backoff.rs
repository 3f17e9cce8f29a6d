//! How long a message waits before its next delivery when it could not run now: after an
//! infrastructure error (an outage backoff, rule 20), when the instance pool was full, and when
//! its key is busy elsewhere. Ceilings only: the caller draws the jitter ([`jittered`]), from
//! its own randomness (the host's, or the simulation's seeded generator).

use std::time::Duration;

/// First nak delay after an infrastructure error (rule 20).
pub const INFRA_RETRY_FIRST: Duration = Duration::from_secs(1);

/// Longest nak delay after infrastructure errors: with the server's delivery bound (default
/// 100) a message survives hours of outage instead of 100 seconds. A config's duplicate-window
/// rule counts it (the longest gap between two runs of a key that publish).
pub const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How many deliveries count as one more failure in a row for [`outage_ceiling`].
const DELIVERIES_PER_FAILURE: u64 = 4;

/// Longest nak delay of a message whose guest found the instance pool full: a local, passing
/// condition (a reload's old and new versions both hold instances for a moment, a burst on
/// another route), not an outage: waiting minutes for it left messages idle long after the
/// pool had room. 100 deliveries at this ceiling still last over 15 minutes, and a pool full
/// that long is alerted on (`DedupGuestTraps`).
pub const POOL_FULL_RETRY_MAX: Duration = Duration::from_secs(10);

/// The outage backoff's ceiling for the `delivered`-th delivery of a message while its route's
/// errors in a row number `streak`: [`infra_retry_ceiling`] of the route's run of errors, but
/// no more than the message's deliveries (a burst of messages failing at once in a short
/// outage is a long run, not a long outage), and at least a quarter of them (a message failing
/// alone while the route's others succeed, one output stream gone, still backs off: the
/// server's delivery bound lasts hours for it too). One transient error after a run of
/// successes waits seconds, however often the message was delivered for benign reasons.
pub fn outage_ceiling(streak: u64, delivered: u64) -> Duration {
    if crate::revert::reverted(crate::revert::Fix::OutageBackoff) {
        return INFRA_RETRY_FIRST;
    }
    let failures = streak
        .min(delivered)
        .max(delivered / DELIVERIES_PER_FAILURE)
        .max(1);
    infra_retry_ceiling(failures)
}

/// The nak delay ceiling after the `failures`-th infrastructure error in a row (store
/// unavailable, publish refused for a transient reason, stream missing): doubling from 1 s up
/// to [`OUTAGE_BACKOFF_MAX`]. A fixed short retry turns an outage into a storm and burns the
/// server's delivery bound (rule 20).
pub fn infra_retry_ceiling(failures: u64) -> Duration {
    let doublings = failures.clamp(1, 32) as u32 - 1;
    INFRA_RETRY_FIRST
        .saturating_mul(1u32 << doublings.min(20))
        .min(OUTAGE_BACKOFF_MAX)
}

/// `ceiling` with jitter: between half and all of it, `unit` (in `0.0..=1.0`, drawn by the
/// caller) saying where, so that hosts recovering from one outage do not come back in step.
pub fn jittered(ceiling: Duration, unit: f64) -> Duration {
    ceiling.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
}

/// The nak delay of a message whose guest found the pool full, from its jittered
/// [`infra_retry_ceiling`] of its deliveries: at most [`POOL_FULL_RETRY_MAX`].
pub fn pool_full(jittered_retry: Duration) -> Duration {
    jittered_retry.min(POOL_FULL_RETRY_MAX)
}

/// The nak delay of a busy key: the wait its record asks for (`retry_in`), computed from times
/// another host wrote, so bounded by what this host's config allows (a lease plus the skew
/// margin, the largest backoff, or the longest outage backoff of a released key): a skewed
/// clock never parks a message for longer. A copy of a key released for an outage waits with
/// it: polling sooner would only spend the copy's deliveries (`server_max_deliver`), and once
/// those are spent the copy would be dead-lettered for nothing.
pub fn busy_delay(retry_in: Duration, lease_and_skew: Duration, max_backoff: Duration) -> Duration {
    if crate::revert::reverted(crate::revert::Fix::BusyDelayCoversOutage) {
        return retry_in.min(lease_and_skew.max(max_backoff));
    }
    retry_in.min(lease_and_skew.max(max_backoff).max(OUTAGE_BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_backs_off_with_the_routes_errors_in_a_row_and_a_lone_message_with_its_deliveries()
    {
        // One transient error on a message delivered 9 times for benign reasons: seconds.
        assert!(outage_ceiling(1, 9) <= Duration::from_secs(4));
        // Many messages failing at once in a short outage: each waits by its own deliveries.
        assert!(outage_ceiling(301, 1) <= Duration::from_secs(1));
        // A long outage: minutes, as each message's deliveries mount.
        assert!(outage_ceiling(301, 12) >= OUTAGE_BACKOFF_MAX);
        // A message failing alone while the route's others succeed still backs off.
        let total: Duration = (1..=100).map(|d| jittered(outage_ceiling(0, d), 0.0)).sum();
        assert!(total > Duration::from_secs(3600), "{total:?}");
    }

    #[test]
    fn infrastructure_retries_back_off_exponentially_up_to_minutes() {
        for failures in 1..200u64 {
            let full = INFRA_RETRY_FIRST
                .saturating_mul(1 << (failures.min(21) - 1))
                .min(OUTAGE_BACKOFF_MAX);
            assert_eq!(infra_retry_ceiling(failures), full, "{failures}");
            for unit in [0.0, 0.3, 1.0] {
                let d = jittered(full, unit);
                assert!(d >= full / 2 && d <= full, "{failures}: {d:?} of {full:?}");
            }
        }
        assert_eq!(infra_retry_ceiling(0), INFRA_RETRY_FIRST);
        // The server's default bound of 100 deliveries lasts hours, not 100 seconds.
        let total: Duration = (1..=100)
            .map(|f| jittered(infra_retry_ceiling(f), 0.0))
            .sum();
        assert!(total > Duration::from_secs(3 * 3600), "{total:?}");
    }

    #[test]
    fn a_full_pool_is_retried_within_seconds_yet_outlasts_the_delivery_bound_for_minutes() {
        let wait = |d: u64, unit| pool_full(jittered(infra_retry_ceiling(d), unit));
        for delivered in 1..200 {
            assert!(wait(delivered, 1.0) <= POOL_FULL_RETRY_MAX);
        }
        assert!(wait(1, 1.0) <= INFRA_RETRY_FIRST);
        let total: Duration = (1..=100).map(|d| wait(d, 0.0)).sum();
        assert!(total > Duration::from_secs(6 * 60), "{total:?}");
    }

    #[test]
    fn a_busy_key_waits_as_long_as_its_record_asks_up_to_the_outage_backoff() {
        let (lease, backoff) = (Duration::from_secs(32), Duration::from_secs(60));
        let wait = |ask| busy_delay(ask, lease, backoff);
        assert_eq!(wait(Duration::from_millis(250)), Duration::from_millis(250));
        // A key released for an outage asks for up to the outage backoff: its copies wait
        // that long instead of spending their deliveries every few seconds.
        assert_eq!(wait(OUTAGE_BACKOFF_MAX), OUTAGE_BACKOFF_MAX);
        assert_eq!(wait(infra_retry_ceiling(40)), infra_retry_ceiling(40));
        // A record written by a host whose clock is hours ahead does not park the copy.
        assert_eq!(wait(Duration::from_secs(7200)), OUTAGE_BACKOFF_MAX);
        // A host whose own lease or backoff is longer waits that long at most.
        let long = Duration::from_secs(900);
        assert_eq!(busy_delay(Duration::from_secs(7200), long, backoff), long);
        assert_eq!(busy_delay(Duration::from_secs(7200), lease, long), long);
    }
}
