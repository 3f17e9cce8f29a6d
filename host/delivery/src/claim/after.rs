//! The writes of claim-after routes (`claim = "after"`): no lease; the key is written once,
//! settled, after the handler ran and its outputs were published. A key a dead-letter replay
//! reset ([`ClaimRecord::reset_for_replay`]) is replaced at the revision read before running;
//! a fresh key is created.

use std::borrow::Cow;

use super::lease::landed;
use super::record::{ClaimRecord, ClaimState, OutputRef};
use super::store::{ClaimError, ClaimStore};
use super::Claimer;

/// What a claim-after delivery does with its key's record, read before running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Completed already (a resend, a redelivery): ack without running.
    Completed,
    /// Failed for good already: terminate without running.
    FailedForGood,
    /// The read lags the revision the key was reset at (a replay's): read again later.
    Stale,
    /// Run; `reset` is the revision of a record to replace (a replay's reset), `None` for a
    /// fresh key.
    Run {
        /// The revision the settled record must replace.
        reset: Option<u64>,
    },
}

/// Decides what a claim-after delivery does with `read`, its key's record and revision;
/// `fresh_from` is the revision a replay reset the key at (0 for other messages).
pub fn found(read: Option<&(ClaimRecord, u64)>, fresh_from: u64) -> Found {
    match read {
        Some((_, revision))
            if *revision < fresh_from
                && !crate::revert::reverted(crate::revert::Fix::ReplayResetRevision) =>
        {
            Found::Stale
        }
        Some((r, _)) if r.state == ClaimState::Completed => Found::Completed,
        Some((r, _)) if r.state == ClaimState::Failed && r.permanent => Found::FailedForGood,
        Some((_, revision)) => Found::Run {
            reset: Some(*revision),
        },
        None => Found::Run { reset: None },
    }
}

impl<S: ClaimStore> Claimer<S> {
    /// The record of a key settled without a lease (a claim-after route): completed with
    /// where its outputs were stored, or failed for good with the reason.
    pub fn settled(
        &self,
        digest: &str,
        attempt: u32,
        outcome: Result<Vec<OutputRef>, String>,
    ) -> ClaimRecord {
        let mut record = self.record(rand::random(), attempt, digest, None);
        record.lease_expires_ms = 0;
        match outcome {
            Ok(outputs) => {
                record.state = ClaimState::Completed;
                record.outputs = outputs;
            }
            Err(reason) => {
                record.state = ClaimState::Failed;
                record.permanent = true;
                record.reason = Some(reason);
            }
        }
        record
    }

    /// The record of a claim-after key dead-lettered (failed for good) with `reason`, after
    /// `digest` ran it. `effects` says that window outputs of the key may be stored (a
    /// publish under the key was attempted, see [`Claimer::publish_failed`], or cannot be
    /// ruled out): the record then says so ([`ClaimRecord::unknown_effects`]) and a change to
    /// fenced effects refuses while it is dead. This record names no version of its own: which
    /// version published is not known here (another delivery, maybe of another version, did),
    /// so a replay's re-run is not pinned to the version that only rejected; a caller that read
    /// the version that began the key's effects (a publish-failed mark's) keeps it
    /// (`after::give_up`).
    pub fn dead_lettered(
        &self,
        digest: &str,
        attempt: u32,
        reason: String,
        effects: bool,
    ) -> ClaimRecord {
        let mut record = self.settled(digest, attempt, Err(reason));
        record.unknown_effects = effects;
        record
    }

    /// The record a claim-after delivery of `digest` leaves when publishing its outputs
    /// failed part-way (`reason`): failed, not for good (the delivery is retried), marked as
    /// a key whose window outputs may be stored ([`ClaimRecord::unknown_effects`]), so the
    /// key is marked if it is later dead-lettered by another delivery or copy that publishes
    /// nothing. A key has no other record before its outcome. The mark names `digest` as the
    /// version that began the key's effects ([`ClaimRecord::effects_by`]): no other version
    /// finishes the key (`dedup_delivery::after`; with
    /// [`Fix::EffectsMark`](crate::revert::Fix::EffectsMark) reverted, test-only, it names
    /// none). `attempt` is the attempts the key's record already counts, not the delivery's
    /// number: a failed publish spends none (`after::mark_attempt`).
    pub fn publish_failed(&self, digest: &str, attempt: u32, reason: String) -> ClaimRecord {
        let mut record = self.settled(digest, attempt, Err(reason));
        record.permanent = false;
        record.unknown_effects = true;
        if !crate::revert::reverted(crate::revert::Fix::EffectsMark) {
            record.effects_by = Some(digest.to_string());
        }
        record
    }

    /// Creates `key` as `record` (from [`Claimer::settled`]): `true` if this write made it,
    /// `false` if the key existed (another host settled it first). A create whose answer was
    /// lost counts as made when the store holds exactly `record` (rule 13).
    pub async fn create_settled(
        &self,
        key: &str,
        record: &ClaimRecord,
    ) -> Result<bool, ClaimError> {
        let mut deleted = false;
        loop {
            return match self.create(key, record, deleted).await {
                Ok(_) => Ok(true),
                // Read from the leader: a lagging replica could hide the mark written over.
                Err(ClaimError::Conflict) => match self.store().get_from_leader(key).await {
                    Ok(Some((current, _))) if current == *record => Ok(true),
                    // Nobody settled it: written over (see `update_settled`).
                    Ok(Some((current, revision))) if unsettled(&current) => {
                        let record = keeping_mark(record, &current);
                        self.update_settled(key, &record, revision).await
                    }
                    Ok(Some(_)) => Ok(false),
                    // Refused, yet not found: the key's last write was a deletion.
                    Ok(None) if !deleted => {
                        deleted = true;
                        continue;
                    }
                    Ok(None) => Err(ClaimError::Unavailable(format!(
                        "`{key}` can neither be created nor read"
                    ))),
                    // Unknown whether the key settles: retried, never taken as a duplicate.
                    Err(e) => Err(e),
                },
                Err(e @ ClaimError::Unavailable(_)) => self.landed_or(key, record, e).await,
                Err(e) => Err(e),
            };
        }
    }

    /// Writes `key` as `record` (from [`Claimer::settled`]) over the record a claim-after run
    /// read at `revision` (a key a replay reset to run again): `true` if this write made it,
    /// `false` if the key moved meanwhile (another host settled it first). An update whose
    /// answer was lost counts as made when the store holds exactly `record` (rule 13). A key
    /// that moved to a record settling nothing (another delivery's publish failed part-way and
    /// marked it, or the read before running lagged such a mark) is written over at its
    /// revision, keeping the mark on a failed record: otherwise this delivery would be acked
    /// as a duplicate while the key, its outputs stored, never reads completed.
    pub async fn update_settled(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<bool, ClaimError> {
        let (mut record, mut revision) = (Cow::Borrowed(record), revision);
        loop {
            return match self.store().update(key, &record, revision).await {
                Ok(_) => Ok(true),
                Err(ClaimError::Conflict) => match self.store().get_from_leader(key).await {
                    Ok(Some((current, _))) if current == *record => Ok(true),
                    Ok(Some((current, at))) if at > revision && unsettled(&current) => {
                        record = Cow::Owned(keeping_mark(&record, &current).into_owned());
                        revision = at;
                        continue;
                    }
                    // Unknown whether the key settles: retried, never taken as a duplicate.
                    Err(e) => Err(e),
                    _ => Ok(false),
                },
                Err(e @ ClaimError::Unavailable(_)) => self.landed_or(key, &record, e).await,
                Err(e) => Err(e),
            };
        }
    }

    /// A settled write whose answer was lost: made if the store holds exactly `record`
    /// (rule 13), else the error `e`.
    async fn landed_or(
        &self,
        key: &str,
        record: &ClaimRecord,
        e: ClaimError,
    ) -> Result<bool, ClaimError> {
        match landed(self.store().as_ref(), key, record).await {
            Some(_) => Ok(true),
            None => Err(e),
        }
    }

    /// Writes `key`'s settled `record` as [`found`] decided: over the reset record at
    /// revision `reset`, or created. `true` if this write made it, `false` if another host
    /// settled the key first.
    pub async fn record_settled(
        &self,
        key: &str,
        record: &ClaimRecord,
        reset: Option<u64>,
    ) -> Result<bool, ClaimError> {
        match reset {
            Some(revision) if !crate::revert::reverted(crate::revert::Fix::ReplayReplaces) => {
                self.update_settled(key, record, revision).await
            }
            _ => self.create_settled(key, record).await,
        }
    }
}

/// Whether a claim-after key's `record` settles nothing because a delivery's publish failed
/// part-way and marked it. A replay's reset is not such a record: the reset is the operator's,
/// for the replayed message to run; a delivery that read the key before it (a late copy of the
/// old run) must lose to it, or its dead record would end the replay unrun.
fn unsettled(record: &ClaimRecord) -> bool {
    !crate::revert::reverted(crate::revert::Fix::PublishFailedMark)
        && record.state == ClaimState::Failed
        && !record.permanent
        && !record.replayable()
}

/// `record`, written over `current`: a failed record keeps the mark saying window outputs of
/// the key may be stored.
fn keeping_mark<'a>(record: &'a ClaimRecord, current: &ClaimRecord) -> Cow<'a, ClaimRecord> {
    let mark = current.may_have_effects() && !record.may_have_effects();
    match mark && record.state == ClaimState::Failed {
        true => Cow::Owned(ClaimRecord {
            unknown_effects: true,
            ..record.clone()
        }),
        false => Cow::Borrowed(record),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::claim::memory::MemoryClaimStore;
    use crate::claim::ClaimOutcome;

    /// A claim-after dead letter that may have left window outputs is marked (a change to
    /// fenced effects refuses it), yet names no version: a replay's re-claim (after the route
    /// moved to claim-before) runs the version it chooses, not the one that rejected.
    /// Another delivery's publish failed and marked the key after this one read it (or the
    /// read lagged the mark): the settled write replaces the mark, and a dead record keeps it.
    #[tokio::test]
    async fn a_settled_write_replaces_a_mark_it_did_not_read() {
        let store = Arc::new(MemoryClaimStore::new());
        let claimer =
            |o: &str| Claimer::new(store.clone(), o, Duration::from_secs(10), Duration::ZERO);
        let (a, b) = (claimer("a"), claimer("b"));
        let mark = b.publish_failed("d", 1, "refused".into());
        assert!(b.create_settled("k", &mark).await.unwrap());
        let done = a.settled("d", 1, Ok(Vec::new()));
        assert!(a.create_settled("k", &done).await.unwrap(), "read none");
        assert_eq!(store.get("k").await.unwrap().unwrap().0, done);

        let first = b.publish_failed("d", 1, "refused".into());
        assert!(b.create_settled("j", &first).await.unwrap());
        let at = store.get("j").await.unwrap().unwrap().1;
        let second = b.publish_failed("d", 2, "refused again".into());
        assert!(b.update_settled("j", &second, at).await.unwrap());
        let dead = a.dead_lettered("d", 3, "rejected".into(), false);
        assert!(
            a.update_settled("j", &dead, at).await.unwrap(),
            "read lagged"
        );
        let stored = store.get("j").await.unwrap().unwrap().0;
        assert!(stored.permanent && stored.may_have_effects(), "{stored:?}");
    }

    /// A late delivery of the old run that read the key before a replay reset it loses to the
    /// reset: its dead record would end the replayed message unrun (the review's finding).
    #[tokio::test]
    async fn a_late_settled_write_loses_to_a_replays_reset() {
        let store = Arc::new(MemoryClaimStore::new());
        let claimer = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
        let dead = claimer.dead_lettered("old", 1, "rejected".into(), false);
        assert!(claimer.create_settled("k", &dead).await.unwrap());
        let (mut reset, revision) = store.get("k").await.unwrap().unwrap();
        reset.reset_for_replay(7);
        store.update("k", &reset, revision).await.unwrap();
        let late = claimer.dead_lettered("old", 2, "rejected again".into(), false);
        assert!(!claimer.create_settled("k", &late).await.unwrap());
        assert!(!claimer.update_settled("k", &late, revision).await.unwrap());
        assert_eq!(store.get("k").await.unwrap().unwrap().0, reset);
    }

    #[tokio::test]
    async fn a_claim_after_dead_letter_marks_effects_without_pinning_its_version() {
        let store = Arc::new(MemoryClaimStore::new());
        let claimer = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
        let dead = claimer.dead_lettered("rejecting", 1, "rejected".into(), true);
        assert!(dead.may_have_effects());
        assert_eq!(dead.effects_by, None);
        let plain = claimer.dead_lettered("rejecting", 1, "rejected".into(), false);
        assert!(!plain.may_have_effects());
        assert!(claimer.create_settled("k", &dead).await.unwrap());
        let (mut reset, revision) = store.get("k").await.unwrap().unwrap();
        reset.reset_for_replay(7);
        store.update("k", &reset, revision).await.unwrap();
        let ClaimOutcome::Acquired(lease) = claimer.claim("k", "fixed").await.unwrap() else {
            panic!("the replayed key is claimed")
        };
        assert_eq!(lease.digest().await, "fixed");
        let claimed = store.get("k").await.unwrap().unwrap().0;
        assert!(claimed.unknown_effects, "the mark stays with the key");
    }
}
