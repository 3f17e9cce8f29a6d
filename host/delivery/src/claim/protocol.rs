//! The claim protocol (DESIGN.md §2): ownership is decided only by the result of a write,
//! every write to a held key goes through its [`Lease`], and a lost lease stays lost.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::Mutex;

use super::record::virtual_clock::monotonic_ms;
use super::record::{now_ms, ClaimRecord, ClaimState, OutputRef};
use super::store::{ClaimError, ClaimStore};

/// How many create/read/update rounds one claim tries before giving up for now.
const MAX_ROUNDS: usize = 8;
/// How many reads a lease write refused for a conflict makes to learn what the key became.
const READ_BACKS: usize = 3;
/// The nak delay when a claim keeps racing with other writers.
const CONTENDED_RETRY: Duration = Duration::from_millis(200);

/// What trying to claim a key found.
pub enum ClaimOutcome<S: ClaimStore> {
    /// This host owns the key now.
    Acquired(Box<Lease<S>>),
    /// The key was completed already: a duplicate.
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
        let nonce: u64 = rand::random();
        let record = |attempt: u32, previous: Option<&ClaimRecord>| ClaimRecord {
            source_sequence,
            ..self.record(nonce, attempt, digest, previous)
        };
        let mut stale = 0;
        let mut deleted = false;
        for _ in 0..MAX_ROUNDS {
            let fresh = record(1, None);
            match self.create(key, &fresh, std::mem::take(&mut deleted)).await {
                Ok(revision) => {
                    return Ok(ClaimOutcome::Acquired(Box::new(
                        self.lease(key, fresh, revision),
                    )))
                }
                Err(ClaimError::Conflict) => {}
                Err(e @ ClaimError::Unavailable(_)) => {
                    // The create may have landed although its answer was lost (rule 13).
                    return match landed(self.store.as_ref(), key, &fresh).await {
                        Some(revision) => Ok(ClaimOutcome::Acquired(Box::new(
                            self.lease(key, fresh, revision),
                        ))),
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
            if revision < fresh_from {
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
                return Ok(ClaimOutcome::Acquired(Box::new(
                    self.lease(key, current, revision),
                )));
            }
            match current.state {
                // Skipped for a newer message, not run: a later message with its key runs.
                ClaimState::Completed if current.is_coalesced() => {}
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
                    return Ok(ClaimOutcome::Acquired(Box::new(
                        self.lease(key, next, revision),
                    )));
                }
                Err(ClaimError::Conflict) => continue,
                Err(e @ ClaimError::Unavailable(_)) => {
                    return match landed(self.store.as_ref(), key, &next).await {
                        Some(revision) => Ok(ClaimOutcome::Acquired(Box::new(
                            self.lease(key, next, revision),
                        ))),
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

    fn lease(&self, key: &str, record: ClaimRecord, revision: u64) -> Lease<S> {
        let written_at_ms = monotonic_ms();
        Lease {
            lapses_at_ms: AtomicU64::new(written_at_ms + self.lease.as_millis() as u64),
            store: self.store.clone(),
            key: key.to_string(),
            lease: self.lease,
            attempt: record.attempt,
            fencing_token: revision,
            state: Mutex::new(LeaseState {
                record,
                revision,
                written_at_ms,
                lost: false,
                settled: false,
            }),
        }
    }
}

/// The revision of `written` if the store holds exactly that record: a write whose answer was
/// lost may still have landed (DESIGN.md §2 rules 2 and 13). The record carries the owner,
/// a nonce and the write's timestamp, so no other writer can have produced an equal one.
pub(super) async fn landed<S: ClaimStore>(
    store: &S,
    key: &str,
    written: &ClaimRecord,
) -> Option<u64> {
    match store.get(key).await {
        Ok(Some((current, revision))) if current == *written => Some(revision),
        _ => None,
    }
}

/// Why one lease write did not happen.
enum WriteError {
    /// The lease is lost, or the store did not answer.
    Lost(LeaseLost),
    /// The key held a later record of this very lease: its revision is adopted, write again.
    Adopted,
}

/// The reason of a write given up after adopting a late revision.
const ADOPTED: &str =
    "an earlier write of this claim landed late; its revision is adopted, write again";

/// Why a renewing write was not made, or not trusted: the lease lapsed by this host's clock.
const LAPSED: &str = "the lease lapsed by this host's clock (no write landed in time); the work stops, and another host may run the key";

/// Why a lease can no longer be used.
#[derive(Debug, Error)]
pub enum LeaseLost {
    /// Another host reclaimed the key (or it changed under us): stop, publish nothing,
    /// write nothing, ack nothing.
    #[error("the claim was taken over by another owner")]
    Reclaimed,
    /// The store did not answer; whether the write landed is unknown.
    #[error("claim store unavailable: {0}")]
    Unavailable(String),
}

struct LeaseState {
    record: ClaimRecord,
    revision: u64,
    /// When the last write that landed was sent (its lease runs from then at the latest).
    written_at_ms: u64,
    lost: bool,
    /// The outcome is recorded: later heartbeats have nothing to renew.
    settled: bool,
}

/// Ownership of one claimed key. Every write to the key goes through here, one at a time, so
/// heartbeats and the final write never race each other.
pub struct Lease<S: ClaimStore> {
    store: Arc<S>,
    key: String,
    lease: Duration,
    attempt: u32,
    fencing_token: u64,
    /// When the lease lapses by this host's clock ([`monotonic_ms`]): [`LOST`] once lost,
    /// [`SETTLED`] once the outcome is recorded. Kept beside the state, not in it, so the
    /// lapse is seen while a write hangs holding the state's lock.
    lapses_at_ms: AtomicU64,
    state: Mutex<LeaseState>,
}

/// [`Lease::lapses_at_ms`] of a lost lease.
const LOST: u64 = 0;
/// [`Lease::lapses_at_ms`] of a settled lease: it never runs out.
const SETTLED: u64 = u64::MAX;

impl<S: ClaimStore> Lease<S> {
    /// The attempt number this claim runs (1-based, across hosts).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The revision of the write that won the claim: grows with every reclaim.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The KV key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The reason stored by the previous failed attempt, if any.
    pub async fn previous_reason(&self) -> Option<String> {
        self.state.lock().await.record.reason.clone()
    }

    /// The version (component digest) this claim runs: the caller's choice, or the version
    /// that may have begun the key's effects (`ClaimRecord::effects_by`).
    pub async fn digest(&self) -> String {
        self.state.lock().await.record.digest.clone()
    }

    /// Records, before the first window output leaves the host, that this claim's version
    /// begins the key's effects (`ClaimRecord::effects_by`): a renewal write, so it also
    /// confirms the lease. Free when the record says so already (a re-run of that version)
    /// and the lease is fresh. Nothing may be published unless it returns `Ok`.
    pub async fn begin_effects(&self) -> Result<(), LeaseLost> {
        let marked = {
            let state = self.state.lock().await;
            state.record.effects_by.as_ref() == Some(&state.record.digest)
        };
        if marked {
            return self.confirm().await;
        }
        let lease = self.lease.as_millis() as u64;
        let mark = |r: &mut ClaimRecord| {
            r.effects_by = Some(r.digest.clone());
            r.lease_expires_ms = now_ms() + lease;
        };
        self.write(mark, false).await
    }

    async fn write(&self, change: impl Fn(&mut ClaimRecord), last: bool) -> Result<(), LeaseLost> {
        // Twice at most: once more after adopting the revision of an earlier write of ours
        // that landed after its answer was lost (and after the read-back that looked for it).
        for _ in 0..2 {
            let (store, key) = (self.store.clone(), self.key.clone());
            let put = |next: ClaimRecord, revision| async move {
                store.update(&key, &next, revision).await
            };
            match self.write_once(&change, last, put).await {
                Err(WriteError::Adopted) => continue,
                Err(WriteError::Lost(lost)) => return Err(lost),
                Ok(()) => return Ok(()),
            }
        }
        Err(LeaseLost::Unavailable(ADOPTED.into()))
    }

    /// Writes the next record with `put(record, expected revision)`, which returns the new
    /// revision: a plain update, or a fenced commit that carries outputs with it. Every write
    /// to the key goes through here, one at a time.
    async fn write_via<F, Fut>(
        &self,
        change: impl FnOnce(&mut ClaimRecord),
        last: bool,
        put: F,
    ) -> Result<(), LeaseLost>
    where
        F: FnOnce(ClaimRecord, u64) -> Fut,
        Fut: Future<Output = Result<u64, ClaimError>>,
    {
        self.write_once(change, last, put)
            .await
            .map_err(|e| match e {
                WriteError::Lost(lost) => lost,
                // The commit cannot be sent twice: the caller retries the message.
                WriteError::Adopted => LeaseLost::Unavailable(ADOPTED.into()),
            })
    }

    async fn write_once<F, Fut>(
        &self,
        change: impl FnOnce(&mut ClaimRecord),
        last: bool,
        put: F,
    ) -> Result<(), WriteError>
    where
        F: FnOnce(ClaimRecord, u64) -> Fut,
        Fut: Future<Output = Result<u64, ClaimError>>,
    {
        let mut state = self.state.lock().await;
        if state.lost {
            return Err(WriteError::Lost(LeaseLost::Reclaimed));
        }
        if state.settled {
            return Ok(());
        }
        // A renewing write (not the outcome) sent once the lease lapsed by this host's clock
        // could land after another host, seeing the lapse, went ahead: not sent.
        let lapses_at = self.lapses_at_ms.load(Ordering::Acquire);
        if !last && monotonic_ms() >= lapses_at {
            return Err(WriteError::Lost(self.lapsed(&mut state).await));
        }
        let mut next = state.record.clone();
        change(&mut next);
        next.fencing_token = Some(self.fencing_token);
        next.updated_ms = now_ms();
        let started = monotonic_ms();
        let written = match put(next.clone(), state.revision).await {
            Ok(revision) => Ok(revision),
            Err(ClaimError::Conflict) => {
                // The key moved past the revision we hold. Ours still, at a later revision:
                // an earlier write of this lease landed after its read-back (rule 13 with a
                // late answer). Adopt it. A read at or below the revision we hold comes from a
                // lagging replica (KV reads are direct gets): read again, and if every read
                // lags, say unknown, never lost: a healthy lease is not given up on a stale
                // read (the simulation's finding, docs/src/how/simulation.md).
                for _ in 0..READ_BACKS {
                    let (current, revision) = match self.store.get(&self.key).await {
                        Ok(Some(found)) => found,
                        Err(_) => continue,
                        Ok(None) => {
                            state.lost = true; // deleted: not ours any more
                            self.lapses_at_ms.store(LOST, Ordering::Release);
                            return Err(WriteError::Lost(LeaseLost::Reclaimed));
                        }
                    };
                    if revision <= state.revision {
                        continue; // a lagging replica
                    }
                    let theirs = &state.record;
                    if current.state == ClaimState::InProgress
                        && current.owner == theirs.owner
                        && current.nonce == theirs.nonce
                        && current.fencing_token == Some(self.fencing_token)
                    {
                        state.record = current;
                        state.revision = revision;
                        return Err(WriteError::Adopted);
                    }
                    state.lost = true;
                    self.lapses_at_ms.store(LOST, Ordering::Release);
                    return Err(WriteError::Lost(LeaseLost::Reclaimed));
                }
                return Err(WriteError::Lost(LeaseLost::Unavailable(
                    "the claim changed, but no read shows what it became".into(),
                )));
            }
            // The write may have landed; only its answer was lost (a leader change, typically).
            Err(e) => landed(self.store.as_ref(), &self.key, &next)
                .await
                .ok_or_else(|| WriteError::Lost(LeaseLost::Unavailable(e.to_string()))),
        };
        let revision = written?;
        state.record = next;
        state.revision = revision;
        if !last && monotonic_ms() >= lapses_at {
            // Landed, but answered only after the lease lapsed by this host's clock: another
            // host may have gone ahead meanwhile, so the lease counts as lapsed all the same.
            return Err(WriteError::Lost(LeaseLost::Unavailable(LAPSED.into())));
        }
        state.written_at_ms = started;
        state.settled = last;
        let lapses_at = match last {
            true => SETTLED,
            false => started + self.lease.as_millis() as u64,
        };
        self.lapses_at_ms.store(lapses_at, Ordering::Release);
        Ok(())
    }

    /// Why a renewing write is refused once the lease lapsed locally: taken over, if a read
    /// shows another owner's later record; otherwise [`LAPSED`].
    async fn lapsed(&self, state: &mut LeaseState) -> LeaseLost {
        if let Ok(Some((current, revision))) = self.store.get(&self.key).await {
            let ours = current.owner == state.record.owner
                && current.fencing_token == Some(self.fencing_token);
            if revision > state.revision && !ours {
                state.lost = true;
                self.lapses_at_ms.store(LOST, Ordering::Release);
                return LeaseLost::Reclaimed;
            }
        }
        LeaseLost::Unavailable(LAPSED.into())
    }

    /// Extends the lease (a heartbeat).
    pub async fn renew(&self) -> Result<(), LeaseLost> {
        let lease = self.lease.as_millis() as u64;
        self.write(|r| r.lease_expires_ms = now_ms() + lease, false)
            .await
    }

    /// How long the lease has left by this host's own clock: a whole lease from when the last
    /// successful write was sent, zero once lost. Another host may reclaim the key once it is
    /// zero (after the skew margin), so work under it must stop then even when the store
    /// cannot say so: a host cut off from the server gets no answer at all. A settled lease
    /// never runs out (its outcome is recorded). Never waits: a write that hangs holding the
    /// lease's lock must not hide the lapse.
    pub fn left_locally(&self) -> Duration {
        match self.lapses_at_ms.load(Ordering::Acquire) {
            LOST => Duration::ZERO,
            SETTLED => Duration::MAX,
            at => Duration::from_millis(at.saturating_sub(monotonic_ms())),
        }
    }

    /// Makes sure the lease is still ours before effects leave the host: free while the last
    /// successful write is recent (nobody may reclaim before the lease plus the skew margin
    /// has passed), otherwise a renewal write that fails if the key was taken over.
    pub async fn confirm(&self) -> Result<(), LeaseLost> {
        {
            let state = self.state.lock().await;
            if state.lost {
                return Err(LeaseLost::Reclaimed);
            }
            if monotonic_ms().saturating_sub(state.written_at_ms)
                < self.lease.as_millis() as u64 / 2
            {
                return Ok(());
            }
        }
        self.renew().await
    }

    /// Records success, with where its outputs were stored. After this the key is done
    /// forever (within the bucket's max age).
    pub async fn complete(&self, outputs: Vec<OutputRef>) -> Result<(), LeaseLost> {
        self.write(
            |r| {
                r.state = ClaimState::Completed;
                r.reason = None;
                r.outputs = outputs.clone();
            },
            true,
        )
        .await
    }

    /// Records the key completed without running (a coalescing route's message with a newer
    /// one of its entity waiting); a later message with the same key runs.
    pub async fn coalesce(&self) -> Result<(), LeaseLost> {
        self.write(
            |r| {
                r.state = ClaimState::Completed;
                r.reason = Some(super::record::COALESCED_REASON.to_string());
            },
            true,
        )
        .await
    }

    /// Records success through `commit(record, expected revision)`, which must write the
    /// completed record together with the `outputs` outputs (a fenced batch) and return the
    /// record's new revision. A commit refused because the key moved loses the lease; one
    /// whose answer was lost is recognized by reading the record back (rule 13).
    pub async fn complete_with<F, Fut>(&self, outputs: u32, commit: F) -> Result<(), LeaseLost>
    where
        F: FnOnce(ClaimRecord, u64) -> Fut,
        Fut: Future<Output = Result<u64, ClaimError>>,
    {
        let change = |r: &mut ClaimRecord| {
            r.state = ClaimState::Completed;
            r.reason = None;
            r.batch_outputs = Some(outputs);
        };
        self.write_via(change, true, commit).await
    }

    /// Records a failed attempt that may be retried, not before `retry_in` from now.
    pub async fn fail(&self, reason: &str, retry_in: Duration) -> Result<(), LeaseLost> {
        self.write_failure(reason, Some(retry_in), self.attempt)
            .await
    }

    /// Records a permanent failure (dead-lettered or terminated): never retried.
    pub async fn give_up(&self, reason: &str) -> Result<(), LeaseLost> {
        self.write_failure(reason, None, self.attempt).await
    }

    /// Gives the key back without counting this attempt: the guest did not reach an outcome
    /// because of the infrastructure (a publish or store outage, a full instance pool, a
    /// shutdown). The next claim runs the same attempt number again, after `retry_in`.
    pub async fn release(&self, reason: &str, retry_in: Duration) -> Result<(), LeaseLost> {
        self.write_failure(reason, Some(retry_in), self.attempt - 1)
            .await
    }

    async fn write_failure(
        &self,
        reason: &str,
        retry_in: Option<Duration>,
        attempt: u32,
    ) -> Result<(), LeaseLost> {
        self.write(
            |r| {
                r.state = ClaimState::Failed;
                r.reason = Some(reason.to_string());
                r.permanent = retry_in.is_none();
                r.retry_at_ms = retry_in.map(|d| now_ms() + d.as_millis() as u64);
                r.attempt = attempt;
            },
            true,
        )
        .await
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
