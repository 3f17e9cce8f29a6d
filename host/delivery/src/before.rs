//! A claim-before delivery, from the claim's answer to its settlement: a key completed or
//! dead-lettered is a duplicate (ack, or term); a key in progress under another owner's live
//! lease is busy (nak with a delay near the lease, never ack: if that owner dies this delivery
//! may be the only copy, rule 8); a claim the store did not answer is naked with the outage
//! backoff; a claimed one runs its handler beside the heartbeat that renews the lease (rule
//! 16), stops when the lease is found lost or lapses, and settles the handler's outcome in the
//! order of [`crate::settle`].
//!
//! The host runs these functions over JetStream and its Wasm guests (its pipeline's
//! adapters), the simulation over its model: the seams are [`Unclaimed`] (a delivery whose
//! claim was not won) and [`ClaimedDelivery`] (one whose handler runs under the lease).

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::claim::{ClaimError, ClaimOutcome, ClaimStore, Lease};
use crate::clock::Clock;
use crate::heartbeat::{Heartbeat, Progress};
use crate::outcome::MessageOutcome;
use crate::pinned::{self, Gone};
use crate::revert::{reverted, Fix};
use crate::settle::{self, Retries, Settlement, Settling};

/// A delivery whose claim this host did not win, or could not make.
pub trait Unclaimed: Sync {
    /// Hands the delivery back to the server.
    fn settle(&self, how: Settlement) -> impl Future<Output = ()> + Send;

    /// Counts how the delivery ended (a duplicate, a busy key), before it is settled.
    fn count(&self, outcome: MessageOutcome);

    /// The nak delay of a key busy elsewhere whose lease or backoff ends in `retry_in`.
    fn busy_delay(&self, retry_in: Duration) -> Duration;

    /// The claim store did not answer (`error`): counts and reports it, and returns the nak
    /// delay (the outage backoff, counting this error).
    fn claim_failed(&self, error: &ClaimError) -> Duration;

    /// Dead-letters the delivery, never claimed, for `reason`, and settles it.
    fn dead_letter(&self, reason: &str) -> impl Future<Output = ()> + Send;
}

/// Settles a delivery whose claim was not won; the lease when it was.
pub async fn claimed<U: Unclaimed, S: ClaimStore>(
    u: &U,
    claim: Result<ClaimOutcome<S>, ClaimError>,
) -> Option<Box<Lease<S>>> {
    match claim {
        Ok(ClaimOutcome::Acquired(lease)) => return Some(lease),
        Ok(ClaimOutcome::Completed) => {
            u.count(MessageOutcome::Duplicate);
            u.settle(Settlement::Ack).await;
        }
        Ok(ClaimOutcome::DeadLettered) => {
            u.count(MessageOutcome::Duplicate);
            u.settle(Settlement::Term).await;
        }
        Ok(ClaimOutcome::Busy { retry_in }) => {
            // Never ack: if the owner dies, this delivery may be the only copy left.
            u.count(MessageOutcome::Busy);
            let how = match crate::revert::reverted(crate::revert::Fix::BusyNaks) {
                true => Settlement::Ack,
                false => Settlement::Nak(u.busy_delay(retry_in)),
            };
            u.settle(how).await;
        }
        Err(e @ ClaimError::Corrupt { .. }) => {
            // Not a record this host wrote: retrying would loop for as long as it stays.
            let reason = format!("{e}; delete the key from the claim bucket to run it again");
            u.dead_letter(&reason).await;
        }
        Err(e) => {
            let delay = u.claim_failed(&e);
            u.settle(Settlement::Nak(delay)).await;
        }
    }
    None
}

/// How a handler's run ended, as the settle order needs it.
#[derive(Debug)]
pub enum Handled<O> {
    /// It succeeded with these outputs.
    Succeeded(O),
    /// It asked to be retried (after `delay`, if it gave one).
    Retry {
        /// Why, as the handler said.
        reason: String,
        /// The delay it asked for (clamped between the backoff and the largest one).
        delay: Option<Duration>,
    },
    /// It trapped (a timeout, out of memory, ...): retried unless the route makes the trap
    /// `permanent`.
    Trapped {
        /// The trap, as recorded.
        reason: String,
        /// Whether the route dead-letters this kind of trap at once.
        permanent: bool,
    },
    /// No instance was free to run it: not the handler's fault, so released uncounted.
    PoolFull {
        /// Why, as recorded.
        reason: String,
    },
    /// It rejected the message: dead-lettered.
    Rejected {
        /// Why, as the handler said.
        reason: String,
    },
}

/// A delivery this host holds the claim for, whose handler runs under its lease.
pub trait ClaimedDelivery: Progress {
    /// The store the claim lives in.
    type Store: ClaimStore;
    /// What a successful handler returns.
    type Outputs: Send;
    /// The world the delivery settles in. (Not borrowed from `self`: a lifetime-generic
    /// associated type held across an await point makes the compiler unable to prove the
    /// host's task `Send`.)
    type Settle: Settling<Store = Self::Store>;
    /// The clock the heartbeat beats by.
    type Clock: Clock;

    /// The delivery's lease.
    fn lease(&self) -> &Lease<Self::Store>;

    /// Whether the route stores outputs with the completed record as one atomic batch.
    fn fenced(&self) -> bool;

    /// How many outputs `outputs` holds.
    fn count_outputs(outputs: &Self::Outputs) -> u32;

    /// Settling on a path that stores no outputs (retry, release, give up, coalesce, ...).
    fn settling(&self) -> Self::Settle;

    /// Settling after the handler succeeded with `outputs`.
    fn succeeded(&self, outputs: Self::Outputs) -> Self::Settle;

    /// Whether a newer message of the entity waits, on a coalescing route.
    fn superseded(&self) -> impl Future<Output = bool> + Send;

    /// The version the claim names when it is not installed on this host
    /// ([`pinned::Pinned::Gone`]): the delivery does not run; [`run`] settles it
    /// ([`pinned::settle_missing`]) unless it is superseded. `None` when it runs.
    fn pinned_gone(&self) -> Option<&Gone>;

    /// Whether version `digest` is still offered to the route's hosts (its live version or a
    /// running candidate); an error says why that could not be read
    /// ([`pinned::missing`]).
    fn offered(&self, digest: &str) -> impl Future<Output = Result<bool, String>> + Send;

    /// A nak delay jittered below `ceiling`.
    fn jittered(&self, ceiling: Duration) -> Duration;

    /// Runs the handler on attempt `attempt`; an error says why it ended without an outcome
    /// (a shutdown cancelled it: not the handler's fault).
    fn invoke(
        &self,
        attempt: u32,
    ) -> impl Future<Output = Result<Handled<Self::Outputs>, String>> + Send;

    /// How this attempt's failure is retried.
    fn retries(&self) -> Retries;

    /// The nak delay of a message whose handler found no free instance.
    fn pool_full_delay(&self) -> Duration;

    /// How often the lease is renewed while the handler runs.
    fn heartbeat(&self) -> Duration;

    /// The clock of the heartbeat.
    fn clock(&self) -> &Self::Clock;

    /// A fenced commit was refused because the claim moved: counted where the host counts
    /// what each dedup layer caught. Nothing by default.
    fn fence_refused(&self) {}
}

/// Runs a claimed delivery's handler beside its heartbeat and settles its outcome; returns how
/// the delivery ended. The heartbeat runs until the outcome is recorded (rule 16), not just
/// until the handler returns.
pub async fn run<C: ClaimedDelivery>(c: &C) -> MessageOutcome {
    // Reverted (test-only): a claim pinned to a version not installed here is settled first,
    // even a stale copy of a message already settled (the simulation's seed 9185
    // `--coalesce`: it reclaimed a coalesced key after a promote and was dead-lettered).
    let pinned_first = reverted(Fix::PinnedAfterLate);
    if pinned_first {
        if let Some(outcome) = not_installed(c).await {
            return outcome;
        }
    }
    if c.superseded().await {
        return settle::coalesced(&c.settling()).await;
    }
    // Superseded deliveries run no version: only one that would run is pinned.
    if !pinned_first {
        if let Some(outcome) = not_installed(c).await {
            return outcome;
        }
    }
    let attempt = c.lease().attempt();
    let max = c.retries().max;
    if attempt > max {
        let last = c.lease().previous_reason().await;
        let last = last.unwrap_or_else(|| "the host running it stopped".into());
        let reason = format!("out of attempts ({max}); last failure: {last}");
        return settle::give_up(&c.settling(), &reason).await;
    }
    let heartbeat = Heartbeat::new(c.lease(), c, c.heartbeat(), c.clock());
    let published = AtomicBool::new(false);
    // Boxed: the work's state machine is large, and the heartbeat's select would otherwise
    // copy it at every step.
    match heartbeat
        .beside(Box::pin(work(c, attempt, &published)))
        .await
    {
        Some(outcome) => outcome,
        // The handler is aborted with the dropped work; outputs may be out already.
        None => settle::lost(published.load(Ordering::Relaxed)),
    }
}

/// Settles claimed delivery `c` if its claim names a version not installed here
/// ([`ClaimedDelivery::pinned_gone`]): given back while the route's hosts are still offered
/// that version, dead-lettered once it is gone ([`pinned::settle_missing`]). `None` when it
/// runs.
async fn not_installed<C: ClaimedDelivery>(c: &C) -> Option<MessageOutcome> {
    let gone = c.pinned_gone()?;
    let offered = c.offered(&gone.digest).await;
    let jittered = |ceiling| c.jittered(ceiling);
    Some(pinned::settle_missing(&c.settling(), gone, offered, jittered).await)
}

/// Runs the handler and settles what it returned; `published` turns true once outputs may
/// have left the host.
async fn work<C: ClaimedDelivery>(c: &C, attempt: u32, published: &AtomicBool) -> MessageOutcome {
    let handled = match c.invoke(attempt).await {
        Ok(handled) => handled,
        // Cancelled by shutdown, most likely: not the handler's outcome (rule 14).
        Err(reason) => return settle::release(&c.settling(), &reason).await,
    };
    match handled {
        Handled::Succeeded(outputs) => succeed(c, outputs, published).await,
        Handled::Retry { reason, delay } => {
            settle::retry_or_give_up(&c.settling(), &reason, delay, c.retries()).await
        }
        Handled::PoolFull { reason } => {
            settle::release_after(&c.settling(), &reason, c.pool_full_delay()).await
        }
        Handled::Trapped {
            reason,
            permanent: true,
        }
        | Handled::Rejected { reason } => settle::give_up(&c.settling(), &reason).await,
        Handled::Trapped {
            reason,
            permanent: false,
        } => settle::retry_or_give_up(&c.settling(), &reason, None, c.retries()).await,
    }
}

/// Success: a window route's outputs go out one by one (so a re-run must be this version's:
/// the record says effects began), then publish, record, ack; a fenced route commits them
/// with the record as one batch.
async fn succeed<C: ClaimedDelivery>(
    c: &C,
    outputs: C::Outputs,
    published: &AtomicBool,
) -> MessageOutcome {
    let count = C::count_outputs(&outputs);
    if c.fenced() {
        let outcome = settle::commit_fenced(&c.succeeded(outputs), count).await;
        if outcome == MessageOutcome::LostClaim {
            c.fence_refused();
        }
        return outcome;
    }
    if count > 0 {
        if let Err(e) = c.lease().begin_effects().await {
            return settle::write_failed(&c.settling(), e, false).await;
        }
    }
    settle::succeed(&c.succeeded(outputs), count > 0, published).await
}
