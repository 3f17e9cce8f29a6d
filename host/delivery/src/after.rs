//! A claim-after delivery (`claim = "after"`), from the read of its key to its settlement: run
//! first, publish the outputs with their message ids, then write the key settled (one write,
//! no lease, no heartbeat). A host that loses that write finished second: another host
//! settled the key, and the output stream dropped this run's outputs as duplicates of that
//! host's (their ids are the same).
//!
//! Attempts are the server's delivery count (there is no record before the first outcome).
//! The final ack may be plain: the stored record makes a lost ack a redelivery that is acked,
//! not a re-run. A delivery whose publish fails part-way records that the key's window outputs
//! may be stored ([`ClaimRecord::unknown_effects`]); a key dead-lettered on a route with
//! outputs keeps that mark, so a change to fenced effects refuses while it is dead. A guest's
//! reject of a key no publish was attempted for leaves no mark. The mark names the version
//! that published part-way ([`ClaimRecord::effects_by`]): a delivery of another version does
//! not finish the key (issue 42, finding 8: a promotion or a new live version between two
//! runs would mix two versions' outputs under the same ids); it waits while that version is
//! still offered to the route's hosts and dead-letters the key once it is gone
//! ([`crate::pinned`]).
//!
//! The host runs [`run`] over JetStream and its Wasm guests (its pipeline's `after.rs`), the
//! simulation over its model: the seam is [`AfterDelivery`].

use std::future::Future;
use std::time::Duration;

use crate::before::Handled;
use crate::claim::after::{found, Found};
use crate::claim::{ClaimError, ClaimRecord, ClaimStore, Claimer, OutputRef};
use crate::outcome::{DedupLayer, MessageOutcome};
use crate::pinned::{self, Missing};
use crate::revert::{self, Fix};
use crate::settle::{LetterRefused, Retries, Settlement};

/// The nak delay of a replayed message whose key read lags its reset.
pub const STALE_RETRY: Duration = Duration::from_millis(200);

/// One delivery of a claim-after route, with the I/O settling it needs.
pub trait AfterDelivery: Sync {
    /// The store the key's record lives in.
    type Store: ClaimStore;
    /// What a successful handler returns, laid out as it will be published.
    type Outputs: Send;

    /// The claimer of this host (its owner id, and the store read and written).
    fn claimer(&self) -> &Claimer<Self::Store>;

    /// The key's name in the claim store.
    fn claim_key(&self) -> &str;

    /// The revision a proven replay reset the key at (0 for other messages).
    fn fresh_from(&self) -> u64;

    /// How many times the server delivered the message (this delivery included): the attempt.
    fn delivered(&self) -> u64;

    /// The message's sequence in the source stream, written into the key's record
    /// ([`ClaimRecord::source_sequence`]); `None` when not known.
    fn source_sequence(&self) -> Option<u64> {
        None
    }

    /// The digest of the handler version that runs it (recorded with the outcome).
    fn digest(&self) -> &str;

    /// Whether the route may publish outputs at all (a dead key is marked only then).
    fn may_publish(&self) -> bool;

    /// Counts how the delivery ended; an [`MessageOutcome::Error`] lengthens the outage
    /// backoff of the next [`AfterDelivery::outage_delay`].
    fn count(&self, outcome: MessageOutcome);

    /// Counts a repeat caught at `layer`.
    fn hit(&self, layer: DedupLayer);

    /// Hands the delivery back to the server; nothing of this delivery is recorded (a plain
    /// ack).
    fn settle(&self, how: Settlement) -> impl Future<Output = ()> + Send;

    /// Hands the delivery back once its key's settled record is stored: an ack as the route
    /// asks (plain, or confirmed by the server).
    fn settle_recorded(&self, how: Settlement) -> impl Future<Output = ()> + Send;

    /// The nak delay after an infrastructure error already counted (the outage backoff).
    fn outage_delay(&self) -> Duration;

    /// The nak delay after an infrastructure error not counted (a dead letter not stored).
    fn release_delay(&self) -> Duration;

    /// The nak delay of a message whose handler found no free instance.
    fn pool_full_delay(&self) -> Duration;

    /// How attempt `attempt`'s failure is retried (attempts, and its backoff).
    fn retries(&self, attempt: u32) -> Retries;

    /// The key's record cannot be read as a record (`reason` says why and what fixes it):
    /// dead-letters the delivery, never run, and settles it.
    fn unreadable(&self, reason: &str) -> impl Future<Output = ()> + Send;

    /// Runs the handler on attempt `attempt`; an error says why it ended without an outcome
    /// (a shutdown cancelled it: not the handler's fault).
    fn invoke(
        &self,
        attempt: u32,
    ) -> impl Future<Output = Result<Handled<Self::Outputs>, String>> + Send;

    /// Why `outputs` can never be stored (larger than the server accepts), if so.
    fn oversized(&self, outputs: &Self::Outputs) -> Option<String>;

    /// Publishes `outputs`, each with its message id; an error says why not all were stored.
    fn publish(
        &self,
        outputs: Self::Outputs,
    ) -> impl Future<Output = Result<Vec<OutputRef>, String>> + Send;

    /// After a failed publish: why no retry can store the outputs until an operator acts
    /// (the server refused an output subject for lack of permission), the dead letter's
    /// reason. `None`, the default, when a retry may pass.
    fn refused_for_good(&self) -> Option<String> {
        None
    }

    /// Stores the delivery's dead letter for `reason`, on attempt `attempt`.
    fn dead_letter(
        &self,
        reason: &str,
        attempt: u32,
    ) -> impl Future<Output = Result<(), LetterRefused>> + Send;
    /// Whether version `digest`, which began the key's effects, is still offered to the
    /// route's hosts (its live version or a running candidate); an error says why that could
    /// not be read ([`crate::pinned::missing`]).
    fn offered(&self, digest: &str) -> impl Future<Output = Result<bool, String>> + Send;

    /// A nak delay jittered below `ceiling`.
    fn jittered(&self, ceiling: Duration) -> Duration;

    /// Why the key is dead-lettered when version `digest`, which began its effects, is gone
    /// ([`crate::pinned::gone`], with the route's name and the key).
    fn pinned_gone(&self, digest: &str) -> String;
}

/// What a claim-after delivery read of its key before running.
#[derive(Clone, Copy)]
struct Read<'a> {
    /// The attempt: the server's delivery count.
    attempt: u32,
    /// The attempts the key's record counts (0 for a fresh key). A failed publish is the
    /// infrastructure's failure and spends none, as a claim-before release does not: a mark
    /// that counted the delivery would spend a claim-before route's attempts after
    /// `setup --change-route` (seed 6613 `--claim-after`).
    counted: u32,
    /// The revision of a record found before running (a key a replay reset, or one whose
    /// publish failed part-way): the settled record replaces it, where a fresh key's is
    /// created.
    reset: Option<u64>,
    /// The key's record says its window outputs may be stored.
    effects: bool,
    /// The version that began the key's effects, as its record names it: a dead letter of the
    /// key keeps naming it, so that a replay runs only on that version.
    began: Option<&'a str>,
}

/// Runs claim-after delivery `a` to its end: a key settled already is a duplicate (ack, or
/// term); otherwise the handler runs and its outcome settles with one write.
pub async fn run<A: AfterDelivery>(a: &A) {
    // A read, not a claim: skip a key settled already (a resend, a redelivery).
    let read = match a.claimer().store().get(a.claim_key()).await {
        Ok(read) => read,
        Err(e @ ClaimError::Corrupt { .. }) => {
            let reason = format!("{e}; delete the key from the claim bucket to run it again");
            return a.unreadable(&reason).await;
        }
        Err(e) => {
            tracing::warn!("claim store unavailable, will retry: {e}");
            return nak_outage(a).await;
        }
    };
    let reset = match found(read.as_ref(), a.fresh_from()) {
        Found::Completed => {
            a.count(MessageOutcome::Duplicate);
            return a.settle(Settlement::Ack).await;
        }
        Found::FailedForGood => {
            a.count(MessageOutcome::Duplicate);
            return a.settle(Settlement::Term).await;
        }
        Found::Stale => {
            tracing::debug!("the key's read lags its replay's reset, will read again");
            return a.settle(Settlement::Nak(STALE_RETRY)).await;
        }
        Found::Run { reset } => reset,
    };
    let r = Read {
        attempt: u32::try_from(a.delivered()).unwrap_or(u32::MAX),
        counted: read.as_ref().map_or(0, |(r, _)| r.attempt),
        reset,
        effects: read.as_ref().is_some_and(|(r, _)| r.may_have_effects()),
        began: read.as_ref().and_then(|(r, _)| r.effects_by.as_deref()),
    };
    // A version that published part-way finishes the key, or nobody does.
    if let Some(began) = r.began.filter(|v| !pinned::may_run(a.digest(), Some(v))) {
        return elsewhere(a, &r, began).await;
    }
    let handled = match a.invoke(r.attempt).await {
        Ok(handled) => handled,
        Err(e) => {
            tracing::warn!("guest task ended without an outcome: {e}");
            return nak_outage(a).await;
        }
    };
    let failed = match handled {
        Handled::Succeeded(outputs) => return complete(a, &r, outputs).await,
        Handled::PoolFull { .. } => {
            a.count(MessageOutcome::Error);
            return a.settle(Settlement::Nak(a.pool_full_delay())).await;
        }
        Handled::Trapped {
            reason,
            permanent: true,
        }
        | Handled::Rejected { reason } => return give_up(a, &r, &reason).await,
        // A claim-after retry waits the route's backoff: with no record, a guest's own
        // delay would not hold across hosts.
        Handled::Retry { reason, .. }
        | Handled::Trapped {
            reason,
            permanent: false,
        } => reason,
    };
    let retries = a.retries(r.attempt);
    if r.attempt >= retries.max {
        let max = retries.max;
        let reason = format!("{failed} (attempt {} of {max}, none left)", r.attempt);
        return give_up(a, &r, &reason).await;
    }
    tracing::info!("attempt failed, will retry: {failed}");
    a.count(MessageOutcome::Retried);
    a.settle(Settlement::Nak(retries.backoff)).await
}

/// Counts an infrastructure error and naks with the outage backoff.
async fn nak_outage<A: AfterDelivery>(a: &A) {
    a.count(MessageOutcome::Error);
    a.settle(Settlement::Nak(a.outage_delay())).await
}

/// Publishes the outputs, then writes the key completed (or finds that another host settled
/// it first), then acks.
async fn complete<A: AfterDelivery>(a: &A, r: &Read<'_>, outputs: A::Outputs) {
    if let Some(reason) = a.oversized(&outputs) {
        return give_up(a, r, &reason).await;
    }
    let published = match a.publish(outputs).await {
        Ok(published) => published,
        Err(e) => {
            if let Some(reason) = a.refused_for_good() {
                // Outputs before the refused one may be stored: the record says so.
                let r = Read {
                    effects: true,
                    ..*r
                };
                return give_up(a, &r, &reason).await;
            }
            tracing::warn!("{e}, will retry");
            a.count(MessageOutcome::Error);
            publish_failed(a, r, &e).await;
            return a.settle(Settlement::Nak(a.outage_delay())).await;
        }
    };
    let record = a.claimer().settled(a.digest(), r.attempt, Ok(published));
    record_outcome(a, r, record, MessageOutcome::Processed, Settlement::Ack).await
}

/// Records that the publish failed part-way (`e`): the key's window outputs may be stored,
/// which a later dead letter of the key must say (a claim-after key has no other record
/// before its outcome). Once per key: a record saying so already is left as it is. A write
/// that fails is only logged: the delivery is retried anyway.
async fn publish_failed<A: AfterDelivery>(a: &A, r: &Read<'_>, e: &str) {
    if r.effects {
        return;
    }
    let reason = format!("publishing the outputs failed part-way: {e}");
    let claimer = a.claimer();
    let record = ClaimRecord {
        source_sequence: a.source_sequence(),
        ..claimer.publish_failed(a.digest(), mark_attempt(r), reason)
    };
    let written = claimer
        .record_settled(a.claim_key(), &record, r.reset)
        .await;
    if let Err(e) = written {
        tracing::warn!("cannot record that the key's outputs may be stored: {e}");
    }
}

/// The attempt a publish-failed mark records: the attempts already counted, not this
/// delivery's number.
fn mark_attempt(r: &Read<'_>) -> u32 {
    if revert::reverted(Fix::MarkSpendsNoAttempt) {
        return r.attempt;
    }
    r.counted
}

/// A key whose effects version `began` began, which this delivery's version may not finish:
/// naked while that version is still offered to the route's hosts, dead-lettered once it is
/// gone (the record keeps the key pinned to it: a replay runs only on that version, installed
/// again).
async fn elsewhere<A: AfterDelivery>(a: &A, r: &Read<'_>, began: &str) {
    match pinned::missing(began, a.offered(began).await, a.delivered()) {
        Missing::Letter => {
            // For good: the record read may come from a lagging replica, and another delivery
            // of that version may have settled the key since. Read again from the leader.
            match a.claimer().store().get_from_leader(a.claim_key()).await {
                Ok(Some((_, revision))) if Some(revision) == r.reset => {
                    give_up(a, r, &a.pinned_gone(began)).await
                }
                Ok(_) => a.settle(Settlement::Nak(STALE_RETRY)).await,
                Err(e) => {
                    tracing::warn!("claim store unavailable, will retry: {e}");
                    nak_outage(a).await
                }
            }
        }
        Missing::NotLoaded { why, ceiling } => {
            tracing::warn!("{why}, will retry");
            a.count(MessageOutcome::Busy);
            a.settle(Settlement::Nak(a.jittered(ceiling))).await
        }
        Missing::Unknown { why } => {
            tracing::warn!("{why}, will retry");
            nak_outage(a).await
        }
    }
}

/// Dead-letters the original, records the key as failed for good, terminates. A letter not
/// stored for now naks without counting an attempt; one that can never be stored still ends
/// the message, with why recorded (and the version that began the key's effects, if one did).
async fn give_up<A: AfterDelivery>(a: &A, r: &Read<'_>, reason: &str) {
    tracing::warn!("dead-lettering: {reason}");
    let recorded = match a.dead_letter(reason, r.attempt).await {
        Ok(()) => reason.to_string(),
        Err(LetterRefused::Transient(_)) => {
            return a.settle(Settlement::Nak(a.release_delay())).await;
        }
        Err(LetterRefused::ForGood(e)) => format!("{reason}; not dead-lettered: {e}"),
    };
    let effects = r.effects && a.may_publish();
    let mut record = (a.claimer()).dead_lettered(a.digest(), r.attempt, recorded, effects);
    if let Some(began) = r.began {
        record.digest = began.to_string();
        record.effects_by = Some(began.to_string());
    }
    record_outcome(a, r, record, MessageOutcome::DeadLettered, Settlement::Term).await
}

/// Writes the key's settled `record` (created, or over the record read before running).
/// Losing the write means another host settled the key first: this delivery is a duplicate
/// of its run. Then settles `how`, as the route asks.
async fn record_outcome<A: AfterDelivery>(
    a: &A,
    r: &Read<'_>,
    record: ClaimRecord,
    outcome: MessageOutcome,
    how: Settlement,
) {
    let record = ClaimRecord {
        source_sequence: a.source_sequence(),
        ..record
    };
    // Reverted (test-only): settled before the write, the order before the fix.
    let early = crate::revert::reverted(crate::revert::Fix::AfterAckOrder);
    if early {
        a.settle_recorded(how).await;
    }
    let claimer = a.claimer();
    match claimer
        .record_settled(a.claim_key(), &record, r.reset)
        .await
    {
        Ok(true) => a.count(outcome),
        Ok(false) => {
            a.count(MessageOutcome::Duplicate);
            a.hit(DedupLayer::Claim);
        }
        Err(e) => {
            tracing::warn!("recording the outcome failed, will retry: {e}");
            return nak_outage(a).await;
        }
    }
    // The settled record is stored: settle as the route asks (rule 7).
    if !early {
        a.settle_recorded(how).await
    }
}

#[cfg(test)]
#[path = "after_tests.rs"]
mod tests;
