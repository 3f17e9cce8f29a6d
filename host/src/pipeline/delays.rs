//! How long a message waits before its next delivery when it could not run now: after an
//! infrastructure error (an outage backoff, rule 20), when the instance pool was full, and
//! when its key is busy elsewhere.

use std::time::Duration;

/// First nak delay after an infrastructure error (rule 20).
const INFRA_RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest nak delay after infrastructure errors: with the server's delivery bound (default
/// 100) a message survives hours of outage instead of 100 seconds.
pub(super) const INFRA_RETRY_MAX: Duration = Duration::from_secs(300);

/// The nak delay after an infrastructure error (store unavailable, publish refused for a
/// transient reason, stream missing) on the `delivered`-th delivery: doubling from 1 s up to
/// [`INFRA_RETRY_MAX`], with jitter (between half and all of it) so that hosts recovering
/// from one outage do not come back in step. A fixed short retry turns an outage into a
/// storm and burns the server's delivery bound (rule 20).
pub(super) fn infra_retry(delivered: u64) -> Duration {
    infra_retry_ceiling(delivered).mul_f64(rand::random_range(0.5..=1.0))
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

/// The nak delay [`infra_retry`] jitters below, for the `delivered`-th delivery (the
/// simulation draws its own jitter).
pub fn infra_retry_ceiling(delivered: u64) -> Duration {
    let doublings = delivered.clamp(1, 32) as u32 - 1;
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
