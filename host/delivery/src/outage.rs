//! A route's outage backoff on one host (rule 20): how many of its deliveries in a row ended in
//! an infrastructure error, and the nak delay that follows from that run and a message's own
//! deliveries ([`backoff::outage_ceiling`]). The host keeps one per route beside its metrics;
//! the simulation one per simulated host; both count every delivery's end here and draw their
//! delays from here, so the streak is counted and read the same way in both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backoff::{self, jittered};
use crate::outcome::MessageOutcome;

/// A route's run of infrastructure errors in a row on one host.
#[derive(Debug, Default)]
pub struct OutageStreak(AtomicU64);

impl OutageStreak {
    /// A route with no errors yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts how one delivery ended: an error lengthens the run, a lost claim says nothing
    /// about the infrastructure (taken over), any other outcome ends the run. It grows with
    /// this, not with a message's delivery count, which also counts benign redeliveries (a
    /// busy key, a host killed while running it): after those, one transient error waited
    /// minutes.
    #[inline]
    pub fn count(&self, outcome: MessageOutcome) {
        match outcome {
            MessageOutcome::Error => {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            MessageOutcome::LostClaim => {}
            _ => self.0.store(0, Ordering::Relaxed),
        }
    }

    /// How many of the route's deliveries in a row ended in an infrastructure error.
    #[inline]
    pub fn errors(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The nak delay of the `delivered`-th delivery of a message after an infrastructure
    /// error already counted ([`OutageStreak::count`]): [`backoff::outage_ceiling`] of the run
    /// and the deliveries, jittered at `unit` (in `0.0..=1.0`, the caller's randomness).
    pub fn retry(&self, delivered: u64, unit: f64) -> Duration {
        jittered(backoff::outage_ceiling(self.errors(), delivered), unit)
    }

    /// [`OutageStreak::retry`] for an error not counted yet (it is counted once the delivery
    /// has ended, after its nak delay was chosen).
    pub fn retry_uncounted(&self, delivered: u64, unit: f64) -> Duration {
        let errors = self.errors().saturating_add(1);
        jittered(backoff::outage_ceiling(errors, delivered), unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_counts_errors_in_a_row_and_any_other_outcome_but_a_lost_claim_ends_it() {
        let s = OutageStreak::new();
        for _ in 0..3 {
            s.count(MessageOutcome::Error);
        }
        s.count(MessageOutcome::LostClaim);
        assert_eq!(s.errors(), 3);
        s.count(MessageOutcome::Busy);
        assert_eq!(s.errors(), 0);
        s.count(MessageOutcome::Error);
        assert_eq!(s.errors(), 1);
    }

    #[test]
    fn a_long_run_lengthens_the_delay_and_one_error_after_successes_waits_seconds() {
        let s = OutageStreak::new();
        s.count(MessageOutcome::Error);
        assert!(s.retry(9, 1.0) <= Duration::from_secs(4));
        for _ in 0..300 {
            s.count(MessageOutcome::Error);
        }
        assert!(s.retry(12, 0.0) >= backoff::OUTAGE_BACKOFF_MAX / 2);
        let fresh = OutageStreak::new();
        assert!(fresh.retry_uncounted(1, 1.0) <= Duration::from_secs(1));
        assert!(fresh.retry_uncounted(40, 0.0) >= fresh.retry(40, 0.0));
    }
}
