//! What follows a claimed delivery's outcome, in the one order that keeps it exactly once:
//! publish, record, then ack (rule 7); record a failure, then nak; give the key back uncounted
//! after an infrastructure failure (rule 14); or dead-letter, record, then terminate. A stale
//! owner, whose claim was taken over, touches nothing: no outputs, no record, no ack or nak
//! (rule 5). The host runs these functions over the server ([`Settling`] in its pipeline), the
//! simulation over its model.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::claim::{ClaimError, ClaimRecord, ClaimStore, Lease, LeaseLost, OutputRef};
use crate::outcome::MessageOutcome;

/// How a delivery is handed back to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Its outcome is recorded: acknowledge it (plainly or confirmed, as the route asks).
    Ack,
    /// Deliver it again after this delay.
    Nak(Duration),
    /// Never deliver it again.
    Term,
}

/// Why a dead letter was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LetterRefused {
    /// The dead-letter stream did not answer or refused for now: retry the message later.
    Transient(String),
    /// It can never be stored (too big, no stream): record why, terminate.
    ForGood(String),
}

/// The world one claimed delivery settles in. The host implements it over async-nats (its
/// pipeline), the simulation over its model of the server.
pub trait Settling: Sync {
    /// The store the delivery's claim lives in.
    type Store: ClaimStore;

    /// The delivery's lease.
    fn lease(&self) -> &Lease<Self::Store>;

    /// Why the outputs can never be stored (larger than the server accepts), if so.
    fn oversized(&self) -> Option<String>;

    /// Publishes a window route's outputs, each with its message id; an error says why not
    /// all were stored (the key is released and runs again).
    fn publish(&self) -> impl Future<Output = Result<Vec<OutputRef>, String>> + Send;

    /// After a failed publish or fenced commit: why no retry can store the outputs until an
    /// operator acts (the server refused an output subject for lack of permission), the dead
    /// letter's reason. `None`, the default, when a retry may pass.
    fn refused_for_good(&self) -> Option<String> {
        None
    }

    /// Stores a fenced route's outputs and the completed `record`, expected at `revision`, as
    /// one atomic batch.
    fn commit(
        &self,
        record: ClaimRecord,
        revision: u64,
    ) -> impl Future<Output = Result<u64, ClaimError>> + Send;

    /// Records the outcome: `write` is the lease's write of the completed record; the host
    /// wraps it in its span and times it. As is by default.
    fn recording<F>(&self, write: F) -> impl Future<Output = Result<(), LeaseLost>> + Send
    where
        F: Future<Output = Result<(), LeaseLost>> + Send,
    {
        write
    }

    /// Stores the delivery's dead letter.
    fn dead_letter(&self, reason: &str) -> impl Future<Output = Result<(), LetterRefused>> + Send;

    /// Hands the delivery back to the server.
    fn settle(&self, how: Settlement) -> impl Future<Output = ()> + Send;

    /// The nak delay of a released key (the outage backoff, counting this error).
    fn release_delay(&self) -> Duration;

    /// The nak delay after a claim write that was not answered (the lease: the message comes
    /// back once it lapses).
    fn unanswered_delay(&self) -> Duration;
}

/// Success on a window route: confirm the lease, publish the outputs (raced against losing
/// the lease by the heartbeat around the work, rule 16: `published` tells it outputs may be
/// out), record completion, then ack.
pub async fn succeed<T: Settling>(
    t: &T,
    has_outputs: bool,
    published: &AtomicBool,
) -> MessageOutcome {
    if let Some(reason) = t.oversized() {
        return give_up(t, &reason).await;
    }
    if let Err(e) = t.lease().confirm().await {
        return write_failed(t, e, false).await;
    }
    published.store(has_outputs, Ordering::Relaxed);
    if crate::revert::reverted(crate::revert::Fix::SettleOrder) {
        // The order before the fix: recorded completed, then published.
        if let Err(e) = t.recording(t.lease().complete(Vec::new())).await {
            return write_failed(t, e, has_outputs).await;
        }
        if let Err(e) = t.publish().await {
            return release_or_give_up(t, &e).await;
        }
        t.settle(Settlement::Ack).await;
        return MessageOutcome::Processed;
    }
    let refs = match t.publish().await {
        Ok(refs) => refs,
        Err(e) => return release_or_give_up(t, &e).await,
    };
    if let Err(e) = t.recording(t.lease().complete(refs)).await {
        return write_failed(t, e, has_outputs).await;
    }
    // Completed is recorded: a redelivery finds it and acks.
    t.settle(Settlement::Ack).await;
    MessageOutcome::Processed
}

/// Success on a fenced route: the outputs and the completed record as one atomic batch, which
/// the server stores only while the claim is still this owner's (no confirmation write first,
/// no race against the heartbeat: the fence decides), then ack. Refused or not, nothing
/// partial is ever stored.
pub async fn commit_fenced<T: Settling>(t: &T, outputs: u32) -> MessageOutcome {
    if let Some(reason) = t.oversized() {
        // Sent, it would fail the whole batch (and every commit grouped with it).
        return give_up(t, &reason).await;
    }
    let committed = t
        .lease()
        .complete_with(outputs, |record, revision| t.commit(record, revision))
        .await;
    match committed {
        Ok(()) => {
            t.settle(Settlement::Ack).await;
            MessageOutcome::Processed
        }
        Err(LeaseLost::Reclaimed) => {
            tracing::warn!("fenced commit refused: the claim moved to another owner; none of this attempt's outputs were stored");
            MessageOutcome::LostClaim
        }
        // Not stored (or landing later, which the next claim's compare-and-swap sees): hand
        // the key back without counting an attempt (rule 14).
        Err(LeaseLost::Unavailable(e)) => {
            release_or_give_up(t, &format!("fenced commit not confirmed: {e}")).await
        }
    }
}

/// Outputs not stored (`e`): dead-lettered when no retry can store them
/// ([`Settling::refused_for_good`]: a missing permission, which would otherwise retry
/// without end, uncounted), else the key is given back uncounted (rule 14).
async fn release_or_give_up<T: Settling>(t: &T, e: &str) -> MessageOutcome {
    match t.refused_for_good() {
        Some(reason) => give_up(t, &reason).await,
        None => release(t, e).await,
    }
}

/// A coalescing route's message with a newer one of its entity waiting: completed without
/// running, so the handler sees the latest state.
pub async fn coalesced<T: Settling>(t: &T) -> MessageOutcome {
    if let Err(e) = t.lease().coalesce().await {
        return write_failed(t, e, false).await;
    }
    tracing::debug!("coalesced: a newer message of the entity is waiting");
    t.settle(Settlement::Ack).await;
    MessageOutcome::Coalesced
}

/// How a failed attempt is retried.
#[derive(Debug, Clone, Copy)]
pub struct Retries {
    /// Attempts per key (`source.max_deliver`).
    pub max: u32,
    /// The backoff after this attempt.
    pub backoff: Duration,
    /// The largest backoff: a guest's own delay is clamped to it, so a re-run stays inside
    /// the duplicate window.
    pub max_backoff: Duration,
}

/// A failed attempt: retry after the backoff (or the guest's `delay`, clamped between the
/// backoff and the largest one), or give up after the last allowed attempt.
pub async fn retry_or_give_up<T: Settling>(
    t: &T,
    reason: &str,
    delay: Option<Duration>,
    retries: Retries,
) -> MessageOutcome {
    let attempt = t.lease().attempt();
    if attempt >= retries.max {
        let reason = format!("{reason} (attempt {attempt} of {}, none left)", retries.max);
        return give_up(t, &reason).await;
    }
    tracing::info!("attempt failed, will retry: {reason}");
    let backoff = retries.backoff;
    let delay = delay.map_or(backoff, |d| {
        d.clamp(backoff, retries.max_backoff.max(backoff))
    });
    if let Err(e) = t.lease().fail(reason, delay).await {
        return write_failed(t, e, false).await;
    }
    t.settle(Settlement::Nak(delay)).await;
    MessageOutcome::Retried
}

/// A permanent failure: dead-letter, record, terminate. A letter the dead-letter stream
/// refuses for good still ends the message: the claim records why, and it is terminated.
pub async fn give_up<T: Settling>(t: &T, reason: &str) -> MessageOutcome {
    tracing::warn!("dead-lettering: {reason}");
    if let Err(e) = t.lease().confirm().await {
        return write_failed(t, e, false).await;
    }
    let (recorded, outcome) = match t.dead_letter(reason).await {
        Ok(()) => (reason.to_string(), MessageOutcome::DeadLettered),
        Err(LetterRefused::Transient(e)) => return release(t, &e).await,
        Err(LetterRefused::ForGood(e)) => (
            format!("{reason}; not dead-lettered: {e}"),
            MessageOutcome::DeadLettered,
        ),
    };
    if let Err(e) = t.lease().give_up(&recorded).await {
        return write_failed(t, e, false).await;
    }
    t.settle(Settlement::Term).await;
    outcome
}

/// Gives the key back without counting the attempt (an infrastructure failure, rule 14) and
/// naks, so the message runs again soon. If even that write fails, the message comes back
/// once the lease lapses.
pub async fn release<T: Settling>(t: &T, reason: &str) -> MessageOutcome {
    release_after(t, reason, t.release_delay()).await
}

/// [`release`] with the nak delay given.
pub async fn release_after<T: Settling>(t: &T, reason: &str, delay: Duration) -> MessageOutcome {
    tracing::warn!("not the guest's fault, will retry without counting an attempt: {reason}");
    give_back(t, reason, delay).await
}

/// Records the claim released (this attempt uncounted) and naks the delivery after `delay`.
async fn give_back<T: Settling>(t: &T, reason: &str, delay: Duration) -> MessageOutcome {
    match t.lease().release(reason, delay).await {
        Ok(()) => {
            t.settle(Settlement::Nak(delay)).await;
            MessageOutcome::Error
        }
        Err(e) => write_failed(t, e, false).await,
    }
}

/// A write through the lease failed: if the key was reclaimed, touch nothing; if the store did
/// not answer, nak so the message comes back once the lease lapses.
pub async fn write_failed<T: Settling>(t: &T, e: LeaseLost, published: bool) -> MessageOutcome {
    match e {
        LeaseLost::Reclaimed => lost(published),
        LeaseLost::Unavailable(e) => {
            tracing::warn!("claim write failed, will retry: {e}");
            t.settle(Settlement::Nak(t.unanswered_delay())).await;
            MessageOutcome::Error
        }
    }
}

/// The claim was taken over: no more outputs, no record, no ack or nak (acks are keyed by
/// stream sequence and would settle the new owner's delivery).
pub fn lost(published: bool) -> MessageOutcome {
    if published {
        tracing::warn!("claim taken over after this attempt began publishing: outputs sent without an answer may still be stored, now or once the connection recovers; the new owner's outputs carry the same message ids, so within the window one copy of each is kept");
    } else {
        tracing::warn!("claim taken over by another owner before this attempt published anything; its effects are dropped");
    }
    MessageOutcome::LostClaim
}
