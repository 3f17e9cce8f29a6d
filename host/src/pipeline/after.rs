//! A claim-after delivery (`claim = "after"`) as the delivery crate's run sees it
//! ([`dedup_delivery::after`]): its key read and written through this host's claimer, its
//! guest, its outputs published over JetStream, its dead letter, acks and counters. The
//! decisions (duplicate, which outcome settles how, publish, record, ack) are not here.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use dedup_delivery::after::{self, AfterDelivery};
use dedup_delivery::before::Handled;
use dedup_delivery::claim::OutputRef;
use dedup_delivery::settle::{LetterRefused, Retries, Settlement};

use super::delays::{outage_retry, outage_retry_uncounted, pool_full_retry};
use super::effects::{self, DeadLetter, Outgoing};
use super::message::{event, invoked, Delivery};
use super::settling::trace_context;
use super::Shared;
use crate::claim::{ClaimStore, Claimer};
use crate::config::AckMode;
use crate::metrics::{DedupLayer, MessageOutcome};
use crate::refusals::OutputRefused;
use crate::routes::{Guest, Route};
use crate::runtime::{Outcome, TrapKind};

impl<S: ClaimStore> Shared<S> {
    /// Runs a claim-after delivery of `route` with idempotency key `key` (claim key
    /// `claim_key`) on `guest` to its end ([`after::run`]).
    pub(super) async fn run_after(
        &self,
        d: &Delivery,
        route: &Route,
        guest: Guest,
        (key, claim_key): (&str, &str),
    ) {
        let a = After {
            shared: self,
            d,
            route,
            guest,
            key,
            claim_key,
            refused: std::sync::Mutex::new(None),
        };
        after::run(&a).await
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
        (self.claimer).dead_lettered(digest, attempt, reason, effects && route.may_publish())
    }
}

/// One claim-after delivery of this host: what it is, and the key it settles.
struct After<'a, S: ClaimStore> {
    shared: &'a Shared<S>,
    d: &'a Delivery,
    route: &'a Route,
    guest: Guest,
    key: &'a str,
    claim_key: &'a str,
    /// Why the last publish can never pass until an operator acts, if so.
    refused: std::sync::Mutex<Option<String>>,
}

impl<S: ClaimStore> AfterDelivery for After<'_, S> {
    type Store = S;
    /// Laid out once, as published: for the size check, then the publish.
    type Outputs = Vec<Outgoing>;

    fn claimer(&self) -> &Claimer<S> {
        &self.shared.claimer
    }

    fn claim_key(&self) -> &str {
        self.claim_key
    }

    fn fresh_from(&self) -> u64 {
        self.d.fresh_from()
    }

    fn delivered(&self) -> u64 {
        self.d.delivered
    }

    fn source_sequence(&self) -> Option<u64> {
        Some(self.d.sequence)
    }

    fn digest(&self) -> &str {
        self.guest.digest()
    }

    async fn offered(&self, digest: &str) -> Result<bool, String> {
        let offered = self.shared.offered(self.route, digest).await;
        offered.map_err(|e| format!("{e:#}"))
    }

    fn jittered(&self, ceiling: Duration) -> Duration {
        dedup_delivery::backoff::jittered(ceiling, rand::random_range(0.0..=1.0))
    }

    fn pinned_gone(&self, digest: &str) -> String {
        dedup_delivery::pinned::gone(&self.route.name, self.key, digest)
    }

    fn may_publish(&self) -> bool {
        self.route.may_publish()
    }

    fn count(&self, outcome: MessageOutcome) {
        self.route.metrics.outcome(outcome);
    }

    fn hit(&self, layer: DedupLayer) {
        self.route.metrics.hit(layer, 1);
    }

    async fn settle(&self, how: Settlement) {
        self.shared.settle(self.d, kind(how)).await
    }

    /// An ack as the route asks (rule 7): plain, or confirmed by the server.
    async fn settle_recorded(&self, how: Settlement) {
        match (how, self.route.ack) {
            (Settlement::Ack, AckMode::Confirmed) => self.shared.ack_confirmed(self.d).await,
            _ => self.shared.settle(self.d, kind(how)).await,
        }
    }

    fn outage_delay(&self) -> Duration {
        outage_retry(&self.route.metrics, self.d.retry_count())
    }

    fn release_delay(&self) -> Duration {
        outage_retry_uncounted(&self.route.metrics, self.d.retry_count())
    }

    fn pool_full_delay(&self) -> Duration {
        pool_full_retry(self.d.retry_count())
    }

    fn retries(&self, attempt: u32) -> Retries {
        let config = &self.shared.config;
        Retries {
            max: config.source.max_deliver,
            backoff: config.backoff_for(attempt),
            max_backoff: config.max_backoff(),
        }
    }

    async fn unreadable(&self, reason: &str) {
        (self.shared)
            .dead_letter_unclaimed(self.d, &self.route.name, self.key, reason)
            .await
    }

    /// The guest, counted; a success's outputs laid out as they will be published.
    async fn invoke(&self, attempt: u32) -> Result<Handled<Vec<Outgoing>>, String> {
        // Not started beside the read: measured, that cost a fifth more host CPU per message
        // (two threads woken for one message) for a few hundred microseconds of latency.
        let event = event(self.d, self.route, self.key, attempt, 0);
        let invocation = (self.shared)
            .call_guest(self.route, self.guest.clone(), event, None, None)
            .await
            .map_err(|e| e.to_string())?;
        invoked(self.d, self.route, &invocation);
        Ok(match invocation.outcome {
            Outcome::Success(outputs) => {
                let trace = trace_context(self.d);
                let outgoing =
                    effects::prepare_outputs(self.claim_key, &outputs, &self.d.trace, &trace);
                Handled::Succeeded(outgoing)
            }
            Outcome::Retry { reason, delay } => Handled::Retry { reason, delay },
            Outcome::Trap(trap) if trap.kind == TrapKind::PoolFull => Handled::PoolFull {
                reason: trap.to_string(),
            },
            Outcome::Trap(trap) => Handled::Trapped {
                permanent: self.route.is_permanent(trap.kind),
                reason: trap.to_string(),
            },
            Outcome::Reject { reason } => Handled::Rejected { reason },
        })
    }

    /// Also counts the handler's output-limit trap when they are.
    fn oversized(&self, outgoing: &Vec<Outgoing>) -> Option<String> {
        let sizes = outgoing.iter().map(|o| (o.subject(), o.wire_size()));
        let reason = effects::oversized(&self.shared.js, self.claim_key, sizes);
        if reason.is_some() {
            self.route.metrics.trap(TrapKind::OutputLimit.as_str());
        }
        reason
    }

    async fn publish(&self, outgoing: Vec<Outgoing>) -> Result<Vec<OutputRef>, String> {
        let count = outgoing.len() as u64;
        let subjects: Vec<String> = outgoing.iter().map(|o| o.subject().to_string()).collect();
        let started = std::time::Instant::now();
        let published = match effects::publish_outputs(&self.shared.js, outgoing).await {
            Ok(published) => published,
            Err(e) => {
                let filters = self.route.options.allowed_outputs.as_deref();
                let refused = OutputRefused::find(
                    &self.route.name,
                    filters.unwrap_or_default(),
                    subjects.iter().map(String::as_str),
                    started,
                );
                *self.refused.lock().unwrap_or_else(|p| p.into_inner()) =
                    refused.map(|r| r.to_string());
                return Err(format!("{e:#}"));
            }
        };
        let metrics = &self.route.metrics;
        metrics.outputs(count);
        let duplicates = published.iter().filter(|o| o.duplicate).count();
        metrics.hit(DedupLayer::Output, duplicates as u64);
        Ok(published)
    }

    fn refused_for_good(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    async fn dead_letter(&self, reason: &str, attempt: u32) -> Result<(), LetterRefused> {
        let letter = DeadLetter {
            reason,
            attempt,
            route: &self.route.name,
            key: self.key,
            // One letter per stored copy: a replay (a new sequence) that fails again gets its own.
            id: format!("dl:{}:{}", self.claim_key, self.d.sequence),
            digest: self.guest.digest(),
        };
        let stored = (self.shared)
            .publish_dead_letter(self.d, letter, &self.route.metrics)
            .await;
        stored.map_err(LetterRefused::from)
    }
}

/// The JetStream ack of `how`.
fn kind(how: Settlement) -> AckKind {
    match how {
        Settlement::Ack => AckKind::Ack,
        Settlement::Nak(delay) => AckKind::Nak(Some(delay)),
        Settlement::Term => AckKind::Term,
    }
}
