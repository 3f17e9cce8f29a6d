//! The claim protocol (DESIGN.md §2): ownership is decided only by the result of a write; the
//! winner holds the key through its [`Lease`] (see [`super::lease`]).

use std::sync::Arc;
use std::time::Duration;

use super::lease::{landed, Lease};
use super::record::{now_ms, ClaimRecord, ClaimState};
use super::store::{ClaimError, ClaimStore};

/// How many create/read/update rounds one claim tries before giving up for now.
const MAX_ROUNDS: usize = 8;
/// The nak delay when a claim keeps racing with other writers.
const CONTENDED_RETRY: Duration = Duration::from_millis(200);

/// What trying to claim a key found.
pub enum ClaimOutcome<S: ClaimStore> {
    /// This host owns the key now.
    Acquired(Box<Lease<S>>),
    /// The key was completed already, or coalesced by a delivery of this very message or of a
    /// later one of the key: a duplicate.
    Completed,
    /// The key failed permanently and was dead-lettered already.
    DeadLettered,
    /// Another owner holds a live lease; try again after the delay.
    Busy {
        /// Roughly when the other lease lapses.
        retry_in: Duration,
    },
}

/// Claims keys for one host instance.
pub struct Claimer<S: ClaimStore> {
    store: Arc<S>,
    owner: String,
    lease: Duration,
    skew: Duration,
}

impl<S: ClaimStore> Claimer<S> {
    /// A claimer writing as `owner`, with leases of `lease` and a reclaim margin of `skew`.
    pub fn new(store: Arc<S>, owner: impl Into<String>, lease: Duration, skew: Duration) -> Self {
        Self {
            store,
            owner: owner.into(),
            lease,
            skew,
        }
    }

    /// The instance id written into records.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub(super) fn record(
        &self,
        nonce: u64,
        attempt: u32,
        digest: &str,
        previous: Option<&ClaimRecord>,
    ) -> ClaimRecord {
        let now = now_ms();
        // A version that began the key's effects runs it again, whatever the caller chose
        // (`ClaimRecord::effects_by`); the pipeline checks it is installed.
        let effects_by = previous.and_then(|p| p.effects_by.clone());
        ClaimRecord {
            state: ClaimState::InProgress,
            owner: self.owner.clone(),
            nonce,
            attempt,
            lease_expires_ms: now + self.lease.as_millis() as u64,
            digest: effects_by.clone().unwrap_or_else(|| digest.to_string()),
            effects_by,
            unknown_effects: previous.is_some_and(|p| p.unknown_effects),
            // A run publishes its outputs under this key's own ids.
            outputs_as: None,
            // Its calls keep the idempotency keys of the name they were first sent under.
            calls_as: previous.and_then(|p| p.calls_as.clone()),
            reason: previous.and_then(|p| p.reason.clone()),
            permanent: false,
            retry_at_ms: None,
            fencing_token: None,
            source_sequence: None,
            outputs: Vec::new(),
            batch_outputs: None,
            created_ms: previous.map_or(now, |p| p.created_ms),
            updated_ms: now,
        }
    }

    /// Tries to claim `key` to run the component `digest`.
    pub async fn claim(&self, key: &str, digest: &str) -> Result<ClaimOutcome<S>, ClaimError> {
        self.claim_fresh(key, digest, 0).await
    }

    /// [`Claimer::claim`] for a message whose key was written at revision `fresh_from` before
    /// it was published (a dead-letter replay resets the key first): a record read below that
    /// revision comes from a lagging replica (KV reads are direct gets) and is read again; if
    /// every read lags, the answer is Busy, never the stale record's "dead-lettered".
    pub async fn claim_fresh(
        &self,
        key: &str,
        digest: &str,
        fresh_from: u64,
    ) -> Result<ClaimOutcome<S>, ClaimError> {
        self.claim_message(key, digest, fresh_from, None).await
    }

    /// [`Claimer::claim_fresh`] for the message at `source_sequence` in the source stream:
    /// every record this claim writes names it ([`ClaimRecord::source_sequence`]).
    pub async fn claim_message(
        &self,
        key: &str,
        digest: &str,
        fresh_from: u64,
        source_sequence: Option<u64>,
    ) -> Result<ClaimOutcome<S>, ClaimError> {
        (self.claim_pinning(key, digest, fresh_from, source_sequence, false)).await
    }

    /// [`Claimer::claim_message`] for a window route's message, whose outputs leave the host
    /// one by one: the claim write itself names `digest` as the version that begins the key's
    /// effects ([`ClaimRecord::effects_by`], when no earlier run named one), so no further
    /// write is needed before the first output goes out ([`Lease::begin_effects`]). A run that
    /// ends without publishing (a retry, a trap, a coalesce, a dead letter, success with no
    /// outputs) clears that name with its outcome; a host that dies mid-run leaves it, so the
    /// key's next run is that version's (or the key is dead-lettered once that version is
    /// gone), since nobody can tell whether it had published.
    ///
    /// With [`Fix::EffectsMark`](crate::revert::Fix::EffectsMark) reverted (test-only), no
    /// version is named, as before that fix.
    pub async fn claim_window_message(
        &self,
        key: &str,
        digest: &str,
        fresh_from: u64,
        source_sequence: Option<u64>,
    ) -> Result<ClaimOutcome<S>, ClaimError> {
        let pin = !crate::revert::reverted(crate::revert::Fix::EffectsMark);
        (self.claim_pinning(key, digest, fresh_from, source_sequence, pin)).await
    }

    /// [`Claimer::claim_message`]; with `pin`, the claim names its version as the one that
    /// begins the key's effects when no earlier run did ([`Claimer::claim_window_message`]).
    async fn claim_pinning(
        &self,
        key: &str,
        digest: &str,
        fresh_from: u64,
        source_sequence: Option<u64>,
        pin: bool,
    ) -> Result<ClaimOutcome<S>, ClaimError> {
        let nonce: u64 = rand::random();
        let record = |attempt: u32, previous: Option<&ClaimRecord>| {
            let mut record = ClaimRecord {
                source_sequence,
                ..self.record(nonce, attempt, digest, previous)
            };
            if pin && record.effects_by.is_none() {
                record.effects_by = Some(record.digest.clone());
            }
            record
        };
        // Whether this claim, not an earlier run, names the version (its outcome clears the
        // name unless outputs went out).
        let pinned_here =
            |previous: Option<&ClaimRecord>| pin && previous.is_none_or(|p| p.effects_by.is_none());
        let mut stale = 0;
        let mut deleted = false;
        for _ in 0..MAX_ROUNDS {
            let fresh = record(1, None);
            match self.create(key, &fresh, std::mem::take(&mut deleted)).await {
                Ok(revision) => {
                    return Ok(ClaimOutcome::Acquired(Box::new(self.lease(
                        key,
                        fresh,
                        revision,
                        pinned_here(None),
                    ))))
                }
                Err(ClaimError::Conflict) => {}
                Err(e @ ClaimError::Unavailable(_)) => {
                    // The create may have landed although its answer was lost (rule 13).
                    return match landed(self.store.as_ref(), key, &fresh).await {
                        Some(revision) => Ok(ClaimOutcome::Acquired(Box::new(self.lease(
                            key,
                            fresh,
                            revision,
                            pinned_here(None),
                        )))),
                        None => Err(e),
                    };
                }
                Err(e) => return Err(e),
            }
            // The read only tells what to try next; ownership comes from the write below.
            let Some((current, revision)) = self.store.get(key).await? else {
                deleted = true;
                continue;
            };
            if revision < fresh_from
                && !crate::revert::reverted(crate::revert::Fix::ReplayResetRevision)
            {
                stale += 1;
                if stale < super::record::STALE_READS {
                    continue;
                }
                return Ok(ClaimOutcome::Busy {
                    retry_in: CONTENDED_RETRY,
                });
            }
            let mine = current.owner == self.owner && current.nonce == nonce;
            if mine && current.state == ClaimState::InProgress {
                // Our own create timed out on the client but succeeded on the server.
                return Ok(ClaimOutcome::Acquired(Box::new(self.lease(
                    key,
                    current,
                    revision,
                    pinned_here(None),
                ))));
            }
            match current.state {
                // Skipped for a newer message, not run: a later message with its key runs;
                // this very message, or an older one of the key, does not
                // ([`coalesced_elsewhere`]).
                ClaimState::Completed
                    if current.is_coalesced()
                        && !crate::revert::reverted(crate::revert::Fix::CoalescedNotCompleted)
                        && !coalesced_elsewhere(&current, source_sequence) => {}
                ClaimState::Completed => return Ok(ClaimOutcome::Completed),
                ClaimState::Failed if current.permanent => return Ok(ClaimOutcome::DeadLettered),
                ClaimState::Failed => {
                    // Not before its backoff (rule 15), however many copies are delivered.
                    let due = current.retry_at_ms.unwrap_or(0);
                    let now = now_ms();
                    if due > now {
                        let retry_in = Duration::from_millis(due - now);
                        return Ok(ClaimOutcome::Busy { retry_in });
                    }
                }
                ClaimState::InProgress if current.lease_lapsed(now_ms(), self.skew) => {}
                ClaimState::InProgress => {
                    let left = current.lease_expires_ms.saturating_sub(now_ms());
                    let retry_in = Duration::from_millis(left) + self.skew;
                    return Ok(ClaimOutcome::Busy { retry_in });
                }
            }
            // A coalesced key never ran: its next run is not a further attempt.
            let attempt = current.attempt + u32::from(!current.is_coalesced());
            let next = record(attempt, Some(&current));
            match self.store.update(key, &next, revision).await {
                Ok(revision) => {
                    let lease = self.lease(key, next, revision, pinned_here(Some(&current)));
                    return Ok(ClaimOutcome::Acquired(Box::new(lease)));
                }
                Err(ClaimError::Conflict) => continue,
                Err(e @ ClaimError::Unavailable(_)) => {
                    return match landed(self.store.as_ref(), key, &next).await {
                        Some(revision) => {
                            let lease =
                                self.lease(key, next, revision, pinned_here(Some(&current)));
                            Ok(ClaimOutcome::Acquired(Box::new(lease)))
                        }
                        None => Err(e),
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ClaimOutcome::Busy {
            retry_in: CONTENDED_RETRY,
        })
    }

    /// Creates `key`; `over_deleted` when a create was refused yet the key reads as absent
    /// (its last write was a deletion).
    pub(super) async fn create(
        &self,
        key: &str,
        record: &ClaimRecord,
        over_deleted: bool,
    ) -> Result<u64, ClaimError> {
        match over_deleted {
            false => self.store.create(key, record).await,
            true => self.store.create_over_deleted(key, record).await,
        }
    }

    /// The lease of a claim written as `record` at `revision`; `pinned_here`: the claim named
    /// its version as the one that begins the key's effects ([`Claimer::claim_window_message`]).
    fn lease(&self, key: &str, record: ClaimRecord, revision: u64, pinned_here: bool) -> Lease<S> {
        Lease::new(self.store.clone(), key, self.lease, record, revision).pinned_here(pinned_here)
    }
}

/// Whether coalesced `record` settles the message at `source_sequence`: it names that very
/// message, or a later one of the key. Another delivery of this message skipped it (a newer
/// message of its entity waits) and acked, or will; or a later message with its key was
/// skipped for one newer still, which runs after this one's update. It is settled, as a
/// completed key is: run, this delivery could start beside the entity's next message once
/// that ack lands, since acks go by stream sequence and the work queue then deletes the
/// message whatever delivery holds it (the simulation's seed 10901 `--fenced --coalesce`: a
/// host paused past the ack wait between its coalesce write and its ack). A stale copy of an
/// older message of the key that reclaimed it would record it coalesced again under its own
/// sequence, and the named message's redelivery would then no longer count it settled. Only a
/// later message of the key reclaims it: the entity's newest may carry the key, and must run.
///
/// With [`crate::revert::Fix::CoalescedMessageSettled`] reverted (test-only): never, as before
/// that fix. The older messages have no switch of their own: with only the named message
/// settled, no simulation seed fails (40,000 seeds in every mode before partitions had
/// windows; seed 3707 `--coalesce` then showed one reclaiming the key and running after its
/// entity's newest message, with a since removed check reverted too), so the unit test
/// `an_older_message_of_a_key_coalesced_under_a_later_one_is_a_duplicate` is its test.
fn coalesced_elsewhere(record: &ClaimRecord, source_sequence: Option<u64>) -> bool {
    let (Some(ours), Some(named)) = (source_sequence, record.source_sequence) else {
        return false;
    };
    ours <= named && !crate::revert::reverted(crate::revert::Fix::CoalescedMessageSettled)
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "pin_tests.rs"]
mod pin_tests;
