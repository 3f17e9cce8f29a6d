//! Claim-after routes (`claim = "after"`): run first, publish the outputs with their message
//! ids, then create the key as completed. One write, no lease and no heartbeat. A host that
//! loses the create finished second: another host completed the key, and the output stream
//! dropped this run's outputs as duplicates of that host's (their ids are the same).
//!
//! Attempts are the server's delivery count (there is no record before the first outcome).
//! The final ack is not confirmed: the stored record makes a lost ack a redelivery that is
//! acked, not a re-run. A delivery whose publish fails part-way records that the key's window
//! outputs may be stored ([`ClaimRecord::unknown_effects`](crate::claim::ClaimRecord::unknown_effects));
//! a key dead-lettered on a route with outputs keeps that mark, so a change to fenced effects
//! refuses while it is dead (see `dedup-host setup --change-route`). A guest's reject of a key
//! no publish was attempted for leaves no mark.

use async_nats::jetstream::AckKind;

use super::delays::{outage_retry, outage_retry_uncounted, pool_full_retry};
use super::effects::{self, DeadLetter, DeadLetterError};
use super::message::{event, invoked, Delivery};
use super::settling::trace_context;
use super::Shared;
use crate::claim::after::{found, Found};
use crate::claim::{ClaimError, ClaimStore};
use crate::config::AckMode;
use crate::metrics::{DedupLayer, MessageOutcome};
use crate::routes::{Guest, Route};
use crate::runtime::{Outcome, TrapKind};

/// The nak delay of a replayed message whose key read lags its reset.
const STALE_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// One claim-after delivery: what it is, and the key it settles.
struct After<'a> {
    d: &'a Delivery,
    route: &'a Route,
    guest: Guest,
    key: &'a str,
    claim_key: &'a str,
    /// The revision of a record found before running (a key a replay reset to run again):
    /// the settled record replaces it, where a fresh key's is created.
    reset: Option<u64>,
    /// The key's record read before running says its window outputs may be stored (a
    /// delivery's publish failed part-way, or a dead key was replayed).
    effects: bool,
}

impl<S: ClaimStore> Shared<S> {
    /// Runs a claim-after delivery of `route` with idempotency key `key` (claim key
    /// `claim_key`) on `guest` to its end.
    pub(super) async fn run_after(
        &self,
        d: &Delivery,
        route: &Route,
        guest: Guest,
        (key, claim_key): (&str, &str),
    ) {
        let mut a = After {
            d,
            route,
            guest,
            key,
            claim_key,
            reset: None,
            effects: false,
        };
        // A read, not a claim: skip a key settled already (a resend, a redelivery).
        match self.claimer.store().get(a.claim_key).await {
            Ok(read) => match found(read.as_ref(), d.fresh_from()) {
                Found::Completed => {
                    route.metrics.outcome(MessageOutcome::Duplicate);
                    return self.settle(d, AckKind::Ack).await;
                }
                Found::FailedForGood => {
                    route.metrics.outcome(MessageOutcome::Duplicate);
                    return self.settle(d, AckKind::Term).await;
                }
                Found::Stale => {
                    tracing::debug!("the key's read lags its replay's reset, will read again");
                    return self.settle(d, AckKind::Nak(Some(STALE_RETRY))).await;
                }
                Found::Run { reset } => {
                    a.reset = reset;
                    a.effects = read.is_some_and(|(r, _)| r.may_have_effects());
                }
            },
            Err(e @ ClaimError::Corrupt { .. }) => {
                let reason = format!("{e}; delete the key from the claim bucket to run it again");
                return self
                    .dead_letter_unclaimed(d, &route.name, a.key, &reason)
                    .await;
            }
            Err(e) => {
                tracing::warn!("claim store unavailable, will retry: {e}");
                route.metrics.outcome(MessageOutcome::Error);
                return self
                    .settle(
                        d,
                        AckKind::Nak(Some(outage_retry(&route.metrics, d.delivered))),
                    )
                    .await;
            }
        }
        // Not started beside the read: measured, that cost a fifth more host CPU per message
        // (two threads woken for one message) for a few hundred microseconds of latency.
        let attempt = u32::try_from(d.delivered).unwrap_or(u32::MAX);
        let event = event(d, route, key, attempt, 0);
        let invocation = match self.call_guest(route, a.guest.clone(), event).await {
            Ok(invocation) => invocation,
            Err(e) => {
                tracing::warn!("guest task ended without an outcome: {e}");
                route.metrics.outcome(MessageOutcome::Error);
                return self
                    .settle(
                        d,
                        AckKind::Nak(Some(outage_retry(&route.metrics, d.delivered))),
                    )
                    .await;
            }
        };
        invoked(route, &invocation);
        let max = self.config.source.max_deliver;
        let failed = match invocation.outcome {
            Outcome::Success(outputs) => return self.complete_after(&a, attempt, &outputs).await,
            Outcome::Trap(trap) if trap.kind == TrapKind::PoolFull => {
                route.metrics.outcome(MessageOutcome::Error);
                return self
                    .settle(d, AckKind::Nak(Some(pool_full_retry(d.delivered))))
                    .await;
            }
            Outcome::Trap(trap) if route.is_permanent(trap.kind) => {
                return self.give_up_after(&a, attempt, &trap.to_string()).await
            }
            Outcome::Reject { reason } => return self.give_up_after(&a, attempt, &reason).await,
            Outcome::Retry { reason, .. } => reason,
            Outcome::Trap(trap) => trap.to_string(),
        };
        if attempt >= max {
            let reason = format!("{failed} (attempt {attempt} of {max}, none left)");
            return self.give_up_after(&a, attempt, &reason).await;
        }
        self.retry_after(&a, attempt, &failed).await
    }

    async fn retry_after(&self, a: &After<'_>, attempt: u32, reason: &str) {
        tracing::info!("attempt failed, will retry: {reason}");
        a.route.metrics.outcome(MessageOutcome::Retried);
        let delay = self.config.backoff_for(attempt);
        self.settle(a.d, AckKind::Nak(Some(delay))).await
    }

    /// Publishes the outputs, then creates the key as completed (or finds that another host
    /// did first), then acks.
    async fn complete_after(
        &self,
        a: &After<'_>,
        attempt: u32,
        outputs: &[crate::bindings::Output],
    ) {
        let metrics = &a.route.metrics;
        let trace = trace_context(a.d);
        let outgoing = effects::prepare_outputs(a.claim_key, outputs, &a.d.trace, &trace);
        let sizes = outgoing.iter().map(|o| o.wire_size());
        let subjects = outputs.iter().map(|o| o.subject.as_str());
        if let Some(reason) = effects::oversized(&self.js, a.claim_key, subjects.zip(sizes)) {
            metrics.trap(TrapKind::OutputLimit.as_str());
            return self.give_up_after(a, attempt, &reason).await;
        }
        let published = match effects::publish_outputs(&self.js, outgoing).await {
            Ok(published) => published,
            Err(e) => {
                tracing::warn!("{e:#}, will retry");
                metrics.outcome(MessageOutcome::Error);
                self.publish_failed(a, attempt, &e).await;
                return self
                    .settle(
                        a.d,
                        AckKind::Nak(Some(outage_retry(&a.route.metrics, a.d.delivered))),
                    )
                    .await;
            }
        };
        let duplicates = published.iter().filter(|o| o.duplicate).count() as u64;
        metrics.outputs(outputs.len() as u64);
        metrics.hit(DedupLayer::Output, duplicates);
        let record = self
            .claimer
            .settled(a.guest.digest(), attempt, Ok(published));
        self.record_after(a, record, MessageOutcome::Processed, AckKind::Ack)
            .await
    }

    /// Records that `a`'s publish failed part-way (`e`): its key's window outputs may be
    /// stored, which a later dead letter of the key must say (a claim-after key has no other
    /// record before its outcome). Once per key: a record saying so already is left as it is.
    /// A write that fails is only logged: the delivery is retried anyway.
    async fn publish_failed(&self, a: &After<'_>, attempt: u32, e: &anyhow::Error) {
        if a.effects {
            return;
        }
        let reason = format!("publishing the outputs failed part-way: {e:#}");
        let record = self
            .claimer
            .publish_failed(a.guest.digest(), attempt, reason);
        let written = self
            .claimer
            .record_settled(a.claim_key, &record, a.reset)
            .await;
        if let Err(e) = written {
            tracing::warn!("cannot record that the key's outputs may be stored: {e}");
        }
    }

    /// Dead-letters the original, records the key as failed for good, terminates.
    async fn give_up_after(&self, a: &After<'_>, attempt: u32, reason: &str) {
        tracing::warn!("dead-lettering: {reason}");
        let letter = DeadLetter {
            reason,
            attempt,
            route: &a.route.name,
            key: a.key,
            // One letter per stored copy: a replay (a new sequence) that fails again gets its own.
            id: format!("dl:{}:{}", a.claim_key, a.d.sequence),
            digest: a.guest.digest(),
        };
        let recorded = match self
            .publish_dead_letter(a.d, letter, &a.route.metrics)
            .await
        {
            Ok(()) => reason.to_string(),
            Err(DeadLetterError::Transient { .. }) => {
                return self
                    .settle(
                        a.d,
                        AckKind::Nak(Some(outage_retry_uncounted(
                            &a.route.metrics,
                            a.d.delivered,
                        ))),
                    )
                    .await;
            }
            Err(e @ DeadLetterError::Refused { .. }) => format!("{reason}; not dead-lettered: {e}"),
        };
        let digest = a.guest.digest();
        let record = self.dead_after(a.route, digest, attempt, recorded, a.effects);
        self.record_after(a, record, MessageOutcome::DeadLettered, AckKind::Term)
            .await
    }

    /// The record of claim-after route `route`'s key dead-lettered with `reason` after
    /// `digest` ran it (empty when not known). When `effects` says window outputs of the key
    /// may be stored (a publish under it was attempted, or cannot be ruled out) and the route
    /// may publish outputs, the record says so without naming a version
    /// (`setup --change-route` to fenced effects then refuses while the key is dead).
    pub(super) fn dead_after(
        &self,
        route: &Route,
        digest: &str,
        attempt: u32,
        reason: String,
        effects: bool,
    ) -> crate::claim::ClaimRecord {
        let outputs = (route.options.allowed_outputs.as_ref()).is_some_and(|o| !o.is_empty());
        (self.claimer).dead_lettered(digest, attempt, reason, effects && outputs)
    }

    /// Creates the key's settled record (or replaces the reset one a replay left). Losing the
    /// write means another host settled the key first: this delivery is a duplicate of its run.
    async fn record_after(
        &self,
        a: &After<'_>,
        record: crate::claim::ClaimRecord,
        outcome: MessageOutcome,
        kind: AckKind,
    ) {
        let written = self
            .claimer
            .record_settled(a.claim_key, &record, a.reset)
            .await;
        match written {
            Ok(true) => a.route.metrics.outcome(outcome),
            Ok(false) => {
                a.route.metrics.outcome(MessageOutcome::Duplicate);
                a.route.metrics.hit(DedupLayer::Claim, 1);
            }
            Err(e) => {
                tracing::warn!("recording the outcome failed, will retry: {e}");
                a.route.metrics.outcome(MessageOutcome::Error);
                return self
                    .settle(
                        a.d,
                        AckKind::Nak(Some(outage_retry(&a.route.metrics, a.d.delivered))),
                    )
                    .await;
            }
        }
        // The settled record is stored: an ack as the route asks (rule 7).
        match (kind, a.route.ack) {
            (AckKind::Ack, AckMode::Confirmed) => self.ack_confirmed(a.d).await,
            _ => self.settle(a.d, kind).await,
        }
    }
}
