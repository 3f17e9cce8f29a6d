//! An exclusive partition's message behind one the server gave up on. A partition hands out
//! one message at a time (`max_ack_pending = 1`), but once the server gives up on a message
//! (the consumer's `server_max_deliver` reached, the last delivery's ack wait run out) it
//! hands out the next, although the given-up message's owner may still run it under a live
//! lease: a host paused, or whose progress acks were lost. So before a queued message is
//! claimed, the earlier messages of its entity still in the queue (given up, not yet lettered
//! or dropped) are looked up by their keys' records: while one is in progress under a live
//! lease this message waits, naked with a delay near that lease's end before any claim (no
//! attempt is counted); once the lease lapsed or the key settled it goes ahead. The
//! undeliverable-message handler letters the given-up message on the same decision
//! ([`crate::undeliverable::decide`]), so the entity's runs never overlap. The other side
//! of the race (a delivery claimed after the server moved past it) is [`crate::partition`].
//!
//! The host reads its queue and claim store over JetStream (its pipeline's `ahead.rs`), the
//! simulation its model: the seam is [`Ahead`], a delivery not claimed yet
//! ([`crate::before::Unclaimed`]) that can read what is ahead of it.

use std::future::Future;
use std::time::Duration;

use crate::before::Unclaimed;
use crate::claim::record::now_ms;
use crate::claim::{ClaimError, ClaimRecord};
use crate::outcome::MessageOutcome;
use crate::revert::{self, Fix};
use crate::settle::Settlement;
use crate::undeliverable::{decide, GivenUp};

/// A queued delivery of an exclusive route, not claimed yet, that can read what is ahead of
/// it in its partition.
pub trait Ahead: Unclaimed {
    /// The claim records (`None`: never claimed) of the keys of the earlier messages of this
    /// delivery's entity still in its partition of the queue, read from the claim store's
    /// leader (a lagging replica could show a lease that has since been renewed as lapsed).
    fn given_up(&self)
        -> impl Future<Output = Result<Vec<Option<ClaimRecord>>, ClaimError>> + Send;

    /// The claims' clock skew margin.
    fn skew(&self) -> Duration;

    /// What is ahead could not be read (`error`): counts and reports it, and returns the nak
    /// delay (the outage backoff, counting this error).
    fn unread(&self, error: &ClaimError) -> Duration;
}

/// Whether queued delivery `a` may go on to its claim; when it may not, it was settled (naked
/// to wait for what is ahead, or for the store to answer).
pub async fn clear<A: Ahead>(a: &A) -> bool {
    let records = match a.given_up().await {
        Ok(records) => records,
        Err(e) => {
            let delay = a.unread(&e);
            a.settle(Settlement::Nak(delay)).await;
            return false;
        }
    };
    let Some(retry_in) = wait(&records, now_ms(), a.skew()) else {
        return true;
    };
    // Never ack, never claim: the given-up message's owner may still finish it first.
    a.count(MessageOutcome::Busy);
    a.settle(Settlement::Nak(a.busy_delay(retry_in))).await;
    false
}

/// How long a queued message waits behind the given-up messages ahead of it whose keys'
/// records are `ahead`, at `now_ms` with skew margin `skew`: until the last live lease among
/// them lapses; `None` when none is live (settled, lapsed, never claimed).
pub fn wait(ahead: &[Option<ClaimRecord>], now_ms: u64, skew: Duration) -> Option<Duration> {
    if revert::reverted(Fix::AheadWait) {
        return None;
    }
    ahead
        .iter()
        .flatten()
        // Whether a key is running does not depend on which message it is.
        .filter(|r| matches!(decide(Some(r), None, now_ms, skew), GivenUp::Running { .. }))
        .map(|r| {
            let lapses = r.lease_expires_ms.saturating_add(skew.as_millis() as u64);
            Duration::from_millis(lapses.saturating_sub(now_ms).max(1))
        })
        .max()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::claim::ClaimState;

    fn record(state: ClaimState, permanent: bool, lease_expires_ms: u64) -> ClaimRecord {
        ClaimRecord {
            lease_expires_ms,
            ..crate::claim::record::sample(state, permanent)
        }
    }

    #[test]
    fn a_live_lease_ahead_holds_the_message_until_it_lapses_and_nothing_else_does() {
        let skew = Duration::from_millis(200);
        let live = Some(record(ClaimState::InProgress, false, 10_500));
        let later = Some(record(ClaimState::InProgress, false, 11_000));
        let lapsed = Some(record(ClaimState::InProgress, false, 9_000));
        let done = Some(record(ClaimState::Completed, false, 20_000));
        let failed = Some(record(ClaimState::Failed, false, 20_000));
        let dead = Some(record(ClaimState::Failed, true, 20_000));
        let at = |ahead: &[Option<ClaimRecord>]| wait(ahead, 10_000, skew);
        let one = std::slice::from_ref(&live);
        assert_eq!(at(one), Some(Duration::from_millis(700)));
        assert_eq!(at(&[live, None, later]), Some(Duration::from_millis(1_200)));
        assert_eq!(at(&[lapsed, done, failed, dead, None]), None);
        assert_eq!(at(&[]), None);
    }

    /// A delivery that logs how it was settled.
    struct Fake {
        ahead: Result<Vec<Option<ClaimRecord>>, ()>,
        log: Mutex<Vec<String>>,
    }

    impl Unclaimed for Fake {
        async fn settle(&self, how: Settlement) {
            self.log.lock().unwrap().push(format!("{how:?}"));
        }

        fn count(&self, outcome: MessageOutcome) {
            self.log.lock().unwrap().push(outcome.label().into());
        }

        fn busy_delay(&self, retry_in: Duration) -> Duration {
            retry_in * 2
        }

        fn claim_failed(&self, _: &ClaimError) -> Duration {
            unreachable!("no claim is made")
        }

        async fn dead_letter(&self, _: &str) {
            unreachable!("nothing is lettered")
        }
    }

    impl Ahead for Fake {
        async fn given_up(&self) -> Result<Vec<Option<ClaimRecord>>, ClaimError> {
            self.ahead
                .clone()
                .map_err(|()| ClaimError::Unavailable("down".into()))
        }

        fn skew(&self) -> Duration {
            Duration::ZERO
        }

        fn unread(&self, _: &ClaimError) -> Duration {
            self.log.lock().unwrap().push("unread".into());
            Duration::from_secs(3)
        }
    }

    fn fake(ahead: Result<Vec<Option<ClaimRecord>>, ()>) -> Fake {
        Fake {
            ahead,
            log: Mutex::new(Vec::new()),
        }
    }

    #[tokio::test]
    async fn a_message_behind_a_live_lease_is_naked_unclaimed_and_one_behind_nothing_goes_on() {
        let soon = now_ms() + 60_000;
        let live = fake(Ok(vec![Some(record(ClaimState::InProgress, false, soon))]));
        assert!(!clear(&live).await);
        let log = live.log.lock().unwrap().clone();
        assert_eq!(log[0], "busy");
        assert!(log[1].starts_with("Nak("), "{log:?}");
        let clear_ahead = fake(Ok(vec![
            None,
            Some(record(ClaimState::Completed, false, 0)),
        ]));
        assert!(clear(&clear_ahead).await);
        assert!(clear_ahead.log.lock().unwrap().is_empty());
        let unread = fake(Err(()));
        assert!(!clear(&unread).await);
        assert_eq!(*unread.log.lock().unwrap(), ["unread", "Nak(3s)"]);
    }
}
