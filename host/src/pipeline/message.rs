//! One message through the pipeline: route, key, claim, run with heartbeats, then publish,
//! record and ack; or record, nak and retry; or dead-letter and terminate.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::{self, AckKind};

use super::effects::{self, DeadLetter};
use super::heartbeat::Heartbeat;
use super::routes::{Guest, Route};
use super::Shared;
use crate::bindings::{Event, Header, Output};
use crate::claim::{key, ClaimOutcome, ClaimStore, Lease, LeaseLost};
use crate::config::MissingKey;
use crate::idempotency;
use crate::runtime::Outcome;
use crate::stats::Counter;

/// Nak delay after an infrastructure error (NATS unavailable).
const ERROR_RETRY: Duration = Duration::from_secs(1);

/// A delivery this host holds the claim for, with everything settling it needs.
struct Claimed<'a, S: ClaimStore> {
    d: &'a Delivery,
    route: &'a Route,
    /// The handler version this delivery runs on (its digest is in the claim record).
    guest: Guest,
    key: &'a str,
    lease: Arc<Lease<S>>,
}

/// The parts of a delivery the pipeline works with.
struct Delivery {
    message: async_nats::Message,
    acker: Arc<Acker>,
    sequence: u64,
}

impl<S: ClaimStore> Shared<S> {
    /// Processes one delivery of `route`'s consumer to its end, or, with no route, one of the
    /// consumer of subjects no route takes. Never panics on a message's content.
    pub(crate) async fn process(&self, message: jetstream::Message, route: Option<Arc<Route>>) {
        let sequence = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(e) => {
                tracing::error!("delivery without JetStream metadata, terminating it: {e}");
                let _ = message.ack_with(AckKind::Term).await;
                return;
            }
        };
        let (message, acker) = message.split();
        let d = Delivery {
            message,
            acker: Arc::new(acker),
            sequence,
        };

        let Some(route) = route else {
            if self.routes.find(&d.message.subject).is_some() {
                // The route's own consumer has it.
                return self.settle(&d, AckKind::Ack).await;
            }
            let reason = format!("no route for subject `{}`", d.message.subject);
            return self.dead_letter_unclaimed(&d, "", "", &reason).await;
        };
        if d.message.payload.len() > route.max_payload_bytes {
            let reason = format!(
                "payload of {} bytes exceeds route `{}`'s max_payload_bytes of {}",
                d.message.payload.len(),
                route.name,
                route.max_payload_bytes
            );
            return self
                .dead_letter_unclaimed(&d, &route.name, "", &reason)
                .await;
        }
        let key = match idempotency::derive(
            &route.key,
            &d.message.subject,
            d.message.headers.as_ref(),
            &d.message.payload,
        ) {
            Ok(key) => key,
            Err(missing) => match route.missing_key {
                MissingKey::DeadLetter => {
                    return self
                        .dead_letter_unclaimed(&d, &route.name, "", &missing.to_string())
                        .await;
                }
                MissingKey::StreamSequence => format!("seq-{}", d.sequence),
            },
        };
        // The version now served runs this message to its end, whatever is swapped meanwhile.
        let Some(guest) = route.guest() else {
            // The route stopped being served after this message was pulled: leave it for later.
            return self.settle(&d, AckKind::Nak(Some(ERROR_RETRY))).await;
        };
        let claim_key = key::encode(&route.name, &key);
        match self.claimer.claim(&claim_key, guest.digest()).await {
            Ok(ClaimOutcome::Acquired(lease)) => {
                let claimed = Claimed {
                    d: &d,
                    route: &route,
                    guest,
                    key: &key,
                    lease: Arc::from(lease),
                };
                self.run(&claimed).await
            }
            Ok(ClaimOutcome::Completed) => {
                self.stats.bump(Counter::Duplicate);
                self.settle(&d, AckKind::Ack).await;
            }
            Ok(ClaimOutcome::DeadLettered) => {
                self.stats.bump(Counter::Duplicate);
                self.settle(&d, AckKind::Term).await;
            }
            Ok(ClaimOutcome::Busy { retry_in }) => {
                // Never ack: if the owner dies, this delivery may be the only copy left.
                self.stats.bump(Counter::Busy);
                self.settle(&d, AckKind::Nak(Some(retry_in))).await;
            }
            Err(e) => {
                tracing::warn!(route = %route.name, key, "claim failed, will retry: {e}");
                self.stats.bump(Counter::Error);
                self.settle(&d, AckKind::Nak(Some(ERROR_RETRY))).await;
            }
        }
    }

    /// Runs a claimed message and settles it according to the outcome.
    async fn run(&self, c: &Claimed<'_, S>) {
        let (attempt, max) = (c.lease.attempt(), self.config.source.max_deliver);
        if attempt > max {
            let last = c
                .lease
                .previous_reason()
                .await
                .unwrap_or_else(|| "the host running it stopped".into());
            let reason = format!("out of attempts ({max}); last failure: {last}");
            return self.give_up(c, &reason).await;
        }
        let event = Event {
            subject: c.d.message.subject.to_string(),
            payload: c.d.message.payload.to_vec(),
            headers: headers_of(&c.d.message),
            key: c.key.to_string(),
            attempt,
            fencing_token: c.lease.fencing_token(),
            stream_sequence: c.d.sequence,
            route: c.route.name.clone(),
        };
        let mut heartbeat = Heartbeat::start(
            c.lease.clone(),
            c.d.acker.clone(),
            self.config.claims.heartbeat,
        );
        let guest = c.guest.clone();
        let options = c.route.options.clone();
        let slots = c.route.slots.clone();
        let mut call = self.guest_runtime.spawn(async move {
            let _slot = slots.acquire_owned().await.expect("guest slots open");
            guest.invoke(event, &options).await
        });
        let invocation = tokio::select! {
            result = &mut call => result,
            _ = heartbeat.lost() => {
                call.abort();
                heartbeat.stop().await;
                return self.lost(c);
            }
        };
        heartbeat.stop().await;
        let invocation = match invocation {
            Ok(invocation) => invocation,
            Err(e) => {
                tracing::error!(route = %c.route.name, key = c.key, "guest task failed: {e}");
                let reason = format!("guest task failed: {e}");
                return self.retry_or_give_up(c, &reason, None).await;
            }
        };
        tracing::debug!(route = %c.route.name, key = c.key, digest = c.guest.digest(), outcome = invocation.outcome.kind(), elapsed_us = invocation.elapsed.as_micros() as u64, "invoked");
        match invocation.outcome {
            Outcome::Success(outputs) => self.succeed(c, &outputs).await,
            Outcome::Retry { reason, delay } => self.retry_or_give_up(c, &reason, delay).await,
            Outcome::Trap(trap) if c.route.is_permanent(trap.kind) => {
                self.give_up(c, &trap.to_string()).await
            }
            Outcome::Trap(trap) => self.retry_or_give_up(c, &trap.to_string(), None).await,
            Outcome::Reject { reason } => self.give_up(c, &reason).await,
        }
    }

    /// Success: publish outputs, record completion, then ack with confirmation.
    async fn succeed(&self, c: &Claimed<'_, S>, outputs: &[Output]) {
        if let Err(e) = c.lease.confirm().await {
            return self.write_failed(c, e).await;
        }
        if let Err(e) = effects::publish_outputs(&self.js, c.lease.key(), outputs).await {
            tracing::warn!(route = %c.route.name, key = c.key, "{e:#}");
            self.stats.bump(Counter::Error);
            return self.retry_or_give_up(c, &format!("{e:#}"), None).await;
        }
        self.stats.add_outputs(outputs.len() as u64);
        if let Err(e) = c.lease.complete().await {
            return self.write_failed(c, e).await;
        }
        self.stats.bump(Counter::Processed);
        if let Err(e) = c.d.acker.double_ack().await {
            // Completed is recorded: a redelivery finds it and acks.
            tracing::warn!(route = %c.route.name, key = c.key, "ack not confirmed: {e}");
        }
    }

    /// A failed attempt: retry with backoff, or give up after the last allowed attempt.
    async fn retry_or_give_up(&self, c: &Claimed<'_, S>, reason: &str, delay: Option<Duration>) {
        let (attempt, max) = (c.lease.attempt(), self.config.source.max_deliver);
        if attempt >= max {
            let reason = format!("{reason} (attempt {attempt} of {max}, none left)");
            return self.give_up(c, &reason).await;
        }
        tracing::info!(route = %c.route.name, key = c.key, digest = c.guest.digest(), attempt, "attempt failed, will retry: {reason}");
        if let Err(e) = c.lease.fail(reason, false).await {
            return self.write_failed(c, e).await;
        }
        let backoff = self.config.backoff_for(attempt);
        self.stats.bump(Counter::Retried);
        let delay = delay.map_or(backoff, |d| d.max(backoff));
        self.settle(c.d, AckKind::Nak(Some(delay))).await;
    }

    /// A permanent failure: dead-letter, record, terminate.
    async fn give_up(&self, c: &Claimed<'_, S>, reason: &str) {
        tracing::warn!(route = %c.route.name, key = c.key, digest = c.guest.digest(), "dead-lettering: {reason}");
        if let Err(e) = c.lease.confirm().await {
            return self.write_failed(c, e).await;
        }
        let letter = DeadLetter {
            reason,
            attempt: c.lease.attempt(),
            route: &c.route.name,
            key: c.key,
            id: format!("dl:{}", c.lease.key()),
        };
        if let Err(e) = self.publish_dead_letter(c.d, letter).await {
            let reason = format!("dead letter not stored: {e:#}");
            let _ = c.lease.fail(&reason, false).await;
            return self.settle(c.d, AckKind::Nak(Some(ERROR_RETRY))).await;
        }
        if let Err(e) = c.lease.fail(reason, true).await {
            return self.write_failed(c, e).await;
        }
        self.stats.bump(Counter::DeadLettered);
        self.settle(c.d, AckKind::Term).await;
    }

    /// Dead-letters a message that was never claimed (no route, no key, too big).
    async fn dead_letter_unclaimed(&self, d: &Delivery, route: &str, key: &str, reason: &str) {
        tracing::warn!(subject = %d.message.subject, route, "dead-lettering: {reason}");
        let letter = DeadLetter {
            reason,
            attempt: 0,
            route,
            key,
            id: format!("dl:seq:{}", d.sequence),
        };
        match self.publish_dead_letter(d, letter).await {
            Ok(()) => {
                self.stats.bump(Counter::DeadLettered);
                self.settle(d, AckKind::Term).await;
            }
            Err(_) => self.settle(d, AckKind::Nak(Some(ERROR_RETRY))).await,
        }
    }

    /// Publishes a dead letter for the delivery; a failure is logged and counted.
    async fn publish_dead_letter(
        &self,
        d: &Delivery,
        letter: DeadLetter<'_>,
    ) -> anyhow::Result<()> {
        let subject = &self.config.dead_letter.subject;
        let result =
            effects::publish_dead_letter(&self.js, subject, &d.message, d.sequence, letter).await;
        if let Err(e) = &result {
            tracing::error!(sequence = d.sequence, "{e:#}");
            self.stats.bump(Counter::Error);
        }
        result
    }

    /// A write through the lease failed: if the key was reclaimed, touch nothing; if the
    /// store did not answer, nak so the message comes back once the lease lapses.
    async fn write_failed(&self, c: &Claimed<'_, S>, e: LeaseLost) {
        match e {
            LeaseLost::Reclaimed => self.lost(c),
            LeaseLost::Unavailable(e) => {
                tracing::warn!(route = %c.route.name, key = c.key, "claim write failed, will retry: {e}");
                self.stats.bump(Counter::Error);
                self.settle(c.d, AckKind::Nak(Some(self.config.claims.lease)))
                    .await;
            }
        }
    }

    /// The claim was taken over: no outputs, no record, no ack (acks are keyed by stream
    /// sequence and would settle the new owner's delivery).
    fn lost(&self, c: &Claimed<'_, S>) {
        tracing::warn!(route = %c.route.name, key = c.key, "claim taken over by another owner; dropping this attempt's effects");
        self.stats.bump(Counter::LostClaim);
    }

    async fn settle(&self, d: &Delivery, kind: AckKind) {
        if let Err(e) = d.acker.ack_with(kind).await {
            tracing::warn!(sequence = d.sequence, "ack ({kind:?}) failed: {e}");
        }
    }
}

/// The message's headers as the guest sees them.
fn headers_of(message: &async_nats::Message) -> Vec<Header> {
    let Some(headers) = &message.headers else {
        return Vec::new();
    };
    let mut out: Vec<Header> = headers
        .iter()
        .flat_map(|(name, values)| {
            values.iter().map(move |v| Header {
                name: name.to_string(),
                value: v.to_string(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
