//! A held claim's lease (DESIGN.md §2): every write to a held key goes through its [`Lease`],
//! one at a time, and a lost lease stays lost.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::Mutex;

use super::held::HeldRevision;
use super::record::virtual_clock::monotonic_ms;
use super::record::{now_ms, ClaimRecord, ClaimState, OutputRef};
use super::store::{ClaimError, ClaimStore};
use crate::revert::{self, Fix};

/// How many reads a lease write refused for a conflict makes to learn what the key became.
const READ_BACKS: usize = 3;

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
    /// The claim named its version as the one that begins the key's effects
    /// ([`super::Claimer::claim_window_message`]) and no output has gone out yet: the outcome
    /// clears the name.
    pin_tentative: bool,
}

/// Ownership of one claimed key. Every write to the key goes through here, one at a time, so
/// heartbeats and the final write never race each other.
pub struct Lease<S: ClaimStore> {
    store: Arc<S>,
    key: String,
    lease: Duration,
    attempt: u32,
    fencing_token: u64,
    /// [`ClaimRecord::calls_as`] of the claim.
    calls_as: Option<String>,
    /// When the lease lapses by this host's clock ([`monotonic_ms`]): [`LOST`] once lost,
    /// [`SETTLED`] once the outcome is recorded. Kept beside the state, not in it, so the
    /// lapse is seen while a write hangs holding the state's lock.
    lapses_at_ms: AtomicU64,
    /// The revision of the last landed write, kept beside the state for what fences its
    /// own writes on the claim (the call journal) without taking the state's lock.
    held: HeldRevision,
    state: Mutex<LeaseState>,
}

/// [`Lease::lapses_at_ms`] of a lost lease.
const LOST: u64 = 0;
/// [`Lease::lapses_at_ms`] of a settled lease: it never runs out.
const SETTLED: u64 = u64::MAX;

impl<S: ClaimStore> Lease<S> {
    /// The lease of a claim whose write `record` landed at `revision` just now (its
    /// `lease_expires_ms` set when it was sent).
    pub(super) fn new(
        store: Arc<S>,
        key: &str,
        lease: Duration,
        record: ClaimRecord,
        revision: u64,
    ) -> Self {
        // The lease runs from when the claim was sent, as its record says to every other
        // host, not from when its answer came back: what is left of it by this host's wall
        // clock, counted on the monotonic one from now.
        let left = (record.lease_expires_ms.saturating_sub(now_ms())).min(lease.as_millis() as u64);
        // Reverted (test-only): counted from when the answer came back.
        let left = match revert::reverted(Fix::LeaseFromSend) {
            true => lease.as_millis() as u64,
            false => left,
        };
        let lapses_at_ms = monotonic_ms() + left;
        let written_at_ms = lapses_at_ms.saturating_sub(lease.as_millis() as u64);
        Lease {
            lapses_at_ms: AtomicU64::new(lapses_at_ms),
            held: HeldRevision::new(revision),
            store,
            key: key.to_string(),
            lease,
            attempt: record.attempt,
            fencing_token: revision,
            calls_as: record.calls_as.clone(),
            state: Mutex::new(LeaseState {
                record,
                revision,
                written_at_ms,
                lost: false,
                settled: false,
                pin_tentative: false,
            }),
        }
    }

    /// Marks that the claim itself named its version as the one that begins the key's effects
    /// (`yes`): an outcome written before [`Lease::begin_effects`] clears the name.
    pub(super) fn pinned_here(mut self, yes: bool) -> Self {
        self.state.get_mut().pin_tentative = yes;
        self
    }

    /// The attempt number this claim runs (1-based, across hosts).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The revision of the write that won the claim: grows with every reclaim.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The claim's revision as this lease's last landed write left it, kept up to date by
    /// every later write (heartbeats included): what the call journal's writes are fenced
    /// by ([`HeldRevision`]). Holds none once the lease is lost or settled.
    pub fn held_revision(&self) -> HeldRevision {
        self.held.clone()
    }

    /// The claim key the key's outbound calls take their idempotency keys from, when not its
    /// own ([`ClaimRecord::calls_as`]: a renamed route's key keeps its old name's).
    pub fn calls_as(&self) -> Option<&str> {
        self.calls_as.as_deref()
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
    /// confirms the lease. Free when the record says so already (a window route's claim names
    /// its version: [`super::Claimer::claim_window_message`]; or a re-run of that version) and
    /// the lease is fresh. Nothing may be published unless it returns `Ok`.
    ///
    /// With [`Fix::EffectsMark`](crate::revert::Fix::EffectsMark) reverted (test-only), it only
    /// confirms the lease: no version is marked, as before that fix.
    pub async fn begin_effects(&self) -> Result<(), LeaseLost> {
        let marked = {
            let state = self.state.lock().await;
            state.record.effects_by.as_ref() == Some(&state.record.digest)
        };
        if marked || crate::revert::reverted(crate::revert::Fix::EffectsMark) {
            self.confirm().await?;
            // Outputs may go out from here: the name stays with whatever outcome follows.
            self.state.lock().await.pin_tentative = false;
            return Ok(());
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
        // A write sent once the lease lapsed by this host's clock could land after another
        // host, seeing the lapse, went ahead: not sent. The outcome too: a host paused past
        // its lease that wakes with its work done must not complete the key after the
        // entity's next message started (an exclusive route's order; the simulation's seed
        // 27819 `--fenced --exclusive`); the key's next delivery, or its dead letter, decides.
        let lapses_at = self.lapses_at_ms.load(Ordering::Acquire);
        let exempt = last && revert::reverted(Fix::OutcomeWriteFenced); // test-only
        if monotonic_ms() >= lapses_at && !exempt {
            return Err(WriteError::Lost(self.lapsed(&mut state).await));
        }
        let mut next = state.record.clone();
        change(&mut next);
        if last && state.pin_tentative {
            // No output went out: the version the claim named begins nothing, and the key's
            // next run may be any version's (`Claimer::claim_window_message`).
            next.effects_by = None;
        }
        next.fencing_token = Some(self.fencing_token);
        next.updated_ms = now_ms();
        let started = monotonic_ms();
        let written = match put(next.clone(), state.revision).await {
            Ok(revision) => Ok(revision),
            // Reverted (test-only): any conflict loses the lease, read back or not.
            Err(ClaimError::Conflict) if revert::reverted(Fix::LateWriteAdopted) => {
                state.lost = true;
                self.held.clear();
                self.lapses_at_ms.store(LOST, Ordering::Release);
                return Err(WriteError::Lost(LeaseLost::Reclaimed));
            }
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
                            self.held.clear();
                            self.lapses_at_ms.store(LOST, Ordering::Release);
                            return Err(WriteError::Lost(LeaseLost::Reclaimed));
                        }
                    };
                    // Reverted (test-only): a stale read is taken for the key's state.
                    let stale = revision <= state.revision;
                    if stale && !revert::reverted(Fix::StaleReadAfterConflict) {
                        continue; // a lagging replica
                    }
                    let theirs = &state.record;
                    if !stale
                        && current.state == ClaimState::InProgress
                        && current.owner == theirs.owner
                        && current.nonce == theirs.nonce
                        && current.fencing_token == Some(self.fencing_token)
                    {
                        state.record = current;
                        state.revision = revision;
                        self.held.set(revision);
                        return Err(WriteError::Adopted);
                    }
                    state.lost = true;
                    self.held.clear();
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
        match last {
            true => self.held.clear(),
            false => self.held.set(revision),
        }
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
                self.held.clear();
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
