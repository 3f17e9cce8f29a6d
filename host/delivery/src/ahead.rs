//! An exclusive partition's queued delivery and the messages of its entity ahead of it. A
//! partition hands out a window of messages at once (`max_ack_pending`), never gives one up
//! (no delivery bound: the host counts attempts in the claim record and dead-letters itself),
//! and the work queue deletes a copy once it is acked or terminated, that is once its run
//! ended and was recorded, or it was found settled, skipped or lettered. Copies of one entity
//! are stored in source order on one queue subject. So before its claim a queued delivery
//! reads the first message on its subject:
//! - itself: nothing of its entity is ahead, it goes on to its claim;
//! - an earlier one: a message of its entity is running, waiting for a retry, or handed out
//!   and not claimed yet. It waits, unclaimed, and reads again: held at first (woken early
//!   when a delivery of its subject on this host ends), then, past [`Ahead::hold`], naked
//!   (no attempt is counted; a partition has no delivery bound);
//! - a later one, or none: its copy is gone (acked by another delivery of it, a stale copy
//!   from a paused host's buffer): acked, never claimed.
//!
//! Read before the claim, the answer holds until the claim lands as long as no other delivery
//! of the copy exists, that is within the ack wait of this one: nothing earlier is ever stored
//! on the subject. Past it, another delivery may have ended the copy without a record of its
//! key (dead-lettered before a claim, or its record since expired), and the entity's next
//! message may have run: a claim won that late reads again ([`still_first`]) and runs only if
//! its copy is still first.
//!
//! The host reads its queue over JetStream (its pipeline's `ahead.rs`), the simulation its
//! model: the seam is [`Ahead`], a delivery not claimed yet ([`crate::before::Unclaimed`]).

use std::future::Future;
use std::time::Duration;

use crate::before::Unclaimed;
use crate::claim::{ClaimError, ClaimStore, Lease};
use crate::outcome::MessageOutcome;
use crate::revert::{self, Fix};
use crate::settle::Settlement;

/// The shortest wait behind an earlier message before the subject is read again.
pub const BEHIND_FIRST: Duration = Duration::from_millis(2);

/// The longest wait behind an earlier message before the subject is read again, and the nak
/// delay of a delivery that waited [`Ahead::hold`].
pub const BEHIND_MAX: Duration = Duration::from_secs(1);

/// A queued delivery of an exclusive route, not claimed yet, that can read the first message
/// on its queue subject.
pub trait Ahead: Unclaimed {
    /// This delivery's sequence in the work queue.
    fn sequence(&self) -> u64;

    /// The sequence of the first message on this delivery's queue subject, `None` when there
    /// is none, read from the stream's leader.
    fn first(&self) -> impl Future<Output = Result<Option<u64>, ClaimError>> + Send;

    /// The subject could not be read (`error`): counts and reports it, and returns the nak
    /// delay (the outage backoff, counting this error).
    fn unread(&self, error: &ClaimError) -> Duration;

    /// Waits `delay`, or less: until a delivery of this subject on this host ends (then
    /// `true`).
    fn behind(&self, delay: Duration) -> impl Future<Output = bool> + Send;

    /// How long the delivery may be held behind an earlier message (well within its ack
    /// wait) before it is naked.
    fn hold(&self) -> Duration;

    /// Whether the earlier copy at `earlier`, still ahead once the hold ran out, is one its
    /// partition no longer hands out (at or below its ack floor: acked and never deleted, or
    /// given up by an older host): then it is looked past from now on, reported, and the
    /// delivery reads again. An unreadable partition reads as `false`.
    fn passed(&self, earlier: u64) -> impl Future<Output = bool> + Send;
}

/// Where a queued delivery stands on its queue subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// First: nothing of its entity is ahead.
    First,
    /// Behind the earlier message at this sequence.
    Behind(u64),
    /// Its copy is no longer in the queue.
    Gone,
}

/// Where the delivery at `sequence` stands when the first message on its subject is `first`.
pub fn place(sequence: u64, first: Option<u64>) -> Place {
    match first {
        Some(f) if f == sequence => Place::First,
        Some(f) if f < sequence && !revert::reverted(Fix::AheadWait) => Place::Behind(f),
        Some(f) if f < sequence => Place::First,
        _ => Place::Gone,
    }
}

/// How long a delivery that has waited `waited` behind an earlier message (since a delivery of
/// its subject on this host last ended) waits before it reads again: a quarter of that,
/// between [`BEHIND_FIRST`] and [`BEHIND_MAX`], so that it follows a short run closely and
/// reads rarely behind a long one.
pub fn behind_delay(waited: Duration) -> Duration {
    (waited / 4).clamp(BEHIND_FIRST, BEHIND_MAX)
}

/// Whether queued delivery `a` may go on to its claim; when it may not, it was settled (naked
/// to wait for what is ahead or for the queue to answer, or acked, its copy gone).
pub async fn clear<A: Ahead>(a: &A) -> bool {
    // Held so far, and since a delivery of the subject here last ended: the one it woke
    // for may not be deleted yet when it reads again.
    let (mut held, mut waited) = (Duration::ZERO, Duration::ZERO);
    // Whether an earlier copy was checked against its partition's ack floor yet.
    let mut checked = false;
    loop {
        let first = match a.first().await {
            Ok(first) => first,
            Err(e) => {
                let delay = a.unread(&e);
                a.settle(Settlement::Nak(delay)).await;
                return false;
            }
        };
        match place(a.sequence(), first) {
            Place::First => return true,
            // Never claim: the earlier message's run, or its next delivery's, comes first.
            Place::Behind(_) if held < a.hold() => {
                let delay = behind_delay(waited);
                let woken = a.behind(delay).await;
                held += delay;
                waited = if woken {
                    Duration::ZERO
                } else {
                    waited + delay
                };
            }
            // A copy nobody will be handed again would hold its entity forever.
            Place::Behind(earlier) if !checked => {
                checked = true;
                if a.passed(earlier).await {
                    (held, waited) = (Duration::ZERO, Duration::ZERO);
                }
            }
            Place::Behind(_) => {
                a.count(MessageOutcome::Busy);
                a.settle(Settlement::Nak(BEHIND_MAX)).await;
                return false;
            }
            // Settled by another delivery of it: nothing is left to do.
            Place::Gone => {
                a.count(MessageOutcome::Duplicate);
                a.settle(Settlement::Ack).await;
                return false;
            }
        }
    }
}

/// After its claim was won, whether queued delivery `a`, delivered `age` ago, still goes on:
/// within [`Ahead::hold`] of its delivery no other delivery of its copy exists, so the read
/// before the claim still holds; later, the subject is read again (a redelivery's age is
/// `Duration::MAX`: another delivery of its copy was made). Its copy gone (ended by
/// another delivery of it with no record of its key), the claim is given back uncounted and
/// the delivery acked; behind an earlier message, or unread, given back and naked.
pub async fn still_first<A: Ahead, S: ClaimStore>(a: &A, lease: &Lease<S>, age: Duration) -> bool {
    if age < a.hold() {
        return true;
    }
    let (reason, outcome, how) = match a.first().await.map(|f| place(a.sequence(), f)) {
        Ok(Place::First) => return true,
        Ok(Place::Gone) => (
            "its queued copy was gone once claimed".to_string(),
            MessageOutcome::Duplicate,
            Settlement::Ack,
        ),
        Ok(Place::Behind(earlier)) => (
            format!("queued message {earlier} of its entity was ahead once claimed"),
            MessageOutcome::Busy,
            Settlement::Nak(BEHIND_MAX),
        ),
        Err(e) => {
            let delay = a.unread(&e);
            (e.to_string(), MessageOutcome::Error, Settlement::Nak(delay))
        }
    };
    // Not the handler's attempt: the key runs the same attempt number next time. If the write
    // fails, the claim lapses with its lease.
    if let Err(e) = lease.release(&reason, Duration::ZERO).await {
        tracing::warn!("could not give the claim back ({reason}): {e}");
    }
    if outcome != MessageOutcome::Error {
        a.count(outcome);
    }
    a.settle(how).await;
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn a_delivery_goes_on_only_when_first_on_its_subject() {
        assert_eq!(place(7, Some(7)), Place::First);
        assert_eq!(place(7, Some(3)), Place::Behind(3));
        assert_eq!(place(7, Some(9)), Place::Gone);
        assert_eq!(place(7, None), Place::Gone);
    }

    #[test]
    fn the_wait_behind_is_a_quarter_of_the_time_waited_within_bounds() {
        assert_eq!(behind_delay(Duration::ZERO), BEHIND_FIRST);
        assert_eq!(
            behind_delay(Duration::from_millis(400)),
            Duration::from_millis(100)
        );
        assert_eq!(behind_delay(Duration::from_secs(60)), BEHIND_MAX);
    }

    /// A delivery that logs how it was settled; its reads answer `first` in turn (the last
    /// one from then on).
    struct Fake {
        first: Mutex<Vec<Result<Option<u64>, ()>>>,
        log: Mutex<Vec<String>>,
    }

    impl Unclaimed for Fake {
        async fn settle(&self, how: Settlement) {
            self.log.lock().unwrap().push(format!("{how:?}"));
        }

        fn count(&self, outcome: MessageOutcome) {
            self.log.lock().unwrap().push(outcome.label().into());
        }

        fn busy_delay(&self, _: Duration) -> Duration {
            unreachable!("no claim is made")
        }

        fn claim_failed(&self, _: &ClaimError) -> Duration {
            unreachable!("no claim is made")
        }

        async fn dead_letter(&self, _: &str) {
            unreachable!("nothing is lettered")
        }
    }

    impl Ahead for Fake {
        fn sequence(&self) -> u64 {
            7
        }

        async fn first(&self) -> Result<Option<u64>, ClaimError> {
            let mut reads = self.first.lock().unwrap();
            let read = if reads.len() > 1 {
                reads.remove(0)
            } else {
                reads[0]
            };
            read.map_err(|()| ClaimError::Unavailable("down".into()))
        }

        fn unread(&self, _: &ClaimError) -> Duration {
            self.log.lock().unwrap().push("unread".into());
            Duration::from_secs(3)
        }

        async fn behind(&self, delay: Duration) -> bool {
            self.log.lock().unwrap().push(format!("wait {delay:?}"));
            false
        }

        fn hold(&self) -> Duration {
            Duration::from_millis(5)
        }

        /// Sequence 2 is a copy its partition no longer hands out.
        async fn passed(&self, earlier: u64) -> bool {
            self.log.lock().unwrap().push(format!("passed {earlier}?"));
            earlier == 2
        }
    }

    async fn settled(first: &[Result<Option<u64>, ()>]) -> (bool, Vec<String>) {
        let fake = Fake {
            first: Mutex::new(first.to_vec()),
            log: Mutex::new(Vec::new()),
        };
        let cleared = clear(&fake).await;
        (cleared, fake.log.into_inner().unwrap())
    }

    #[tokio::test]
    async fn behind_waits_then_is_naked_unclaimed_gone_is_acked_first_goes_on() {
        assert_eq!(settled(&[Ok(Some(7))]).await, (true, vec![]));
        // Held while the earlier message is there, then on once it is gone.
        let cleared = (true, vec!["wait 2ms".into()]);
        assert_eq!(settled(&[Ok(Some(3)), Ok(Some(7))]).await, cleared);
        // Held up to its hold (5 ms), then naked.
        let naked = [
            "wait 2ms",
            "wait 2ms",
            "wait 2ms",
            "passed 3?",
            "busy",
            "Nak(1s)",
        ];
        let naked = (false, naked.map(String::from).to_vec());
        assert_eq!(settled(&[Ok(Some(3))]).await, naked);
        // Past the hold, a copy its partition no longer hands out is looked past: read again.
        let looked_past = ["wait 2ms", "wait 2ms", "wait 2ms", "passed 2?"];
        let looked_past = (true, looked_past.map(String::from).to_vec());
        let reads = [
            Ok(Some(2)),
            Ok(Some(2)),
            Ok(Some(2)),
            Ok(Some(2)),
            Ok(Some(7)),
        ];
        assert_eq!(settled(&reads).await, looked_past);
        let gone = (false, vec!["duplicate".into(), "Ack".into()]);
        assert_eq!(settled(&[Ok(None)]).await, gone);
        assert!(settled(&[Ok(Some(7)), Ok(Some(9))]).await.0);
        let unread = (false, vec!["unread".into(), "Nak(3s)".into()]);
        assert_eq!(settled(&[Err(())]).await, unread);
    }

    /// A claim won on a fresh store for key `k`, and the delivery's log once [`still_first`]
    /// decided, `age` after its delivery, with reads answering `first`.
    async fn claimed_late(
        first: &[Result<Option<u64>, ()>],
        age: Duration,
    ) -> (bool, Vec<String>, crate::claim::ClaimRecord) {
        use std::sync::Arc;

        use crate::claim::memory::MemoryClaimStore;
        use crate::claim::{ClaimOutcome, Claimer};
        let store = Arc::new(MemoryClaimStore::new());
        let claimer = Claimer::new(store.clone(), "h", Duration::from_secs(30), Duration::ZERO);
        let Ok(ClaimOutcome::Acquired(lease)) = claimer.claim_fresh("k", "v1", 0).await else {
            panic!("a fresh key is won");
        };
        let fake = Fake {
            first: Mutex::new(first.to_vec()),
            log: Mutex::new(Vec::new()),
        };
        let goes_on = still_first(&fake, &lease, age).await;
        let (record, _) = store.get("k").await.unwrap().expect("the claim's record");
        (goes_on, fake.log.into_inner().unwrap(), record)
    }

    #[tokio::test]
    async fn a_claim_won_past_the_hold_reads_again_and_gives_a_gone_copy_back_uncounted() {
        use crate::claim::ClaimState;
        // Within the hold no other delivery exists: no read (it would panic on an empty list).
        let (goes_on, log, record) = claimed_late(&[], Duration::from_millis(4)).await;
        assert!(goes_on && log.is_empty());
        assert_eq!(record.state, ClaimState::InProgress);
        let late = Duration::from_millis(5);
        assert!(claimed_late(&[Ok(Some(7))], late).await.0);
        // Its copy ended meanwhile by another delivery with no record: given back, acked.
        let (goes_on, log, record) = claimed_late(&[Ok(Some(9))], late).await;
        assert!(!goes_on);
        assert_eq!(log, ["duplicate", "Ack"]);
        assert_eq!((record.state, record.attempt), (ClaimState::Failed, 0));
        assert!(!record.permanent);
        // An earlier copy of its entity: given back, naked to wait.
        let (goes_on, log, _) = claimed_late(&[Ok(Some(3))], late).await;
        assert!(!goes_on);
        assert_eq!(log, ["busy", "Nak(1s)"]);
        let (goes_on, log, record) = claimed_late(&[Err(())], late).await;
        assert!(!goes_on);
        assert_eq!(log, ["unread", "Nak(3s)"]);
        assert_eq!(record.state, ClaimState::Failed);
    }
}
