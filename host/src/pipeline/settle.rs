//! What follows a guest's outcome: publish, record and ack; record a failure and nak; give
//! the key back uncounted after an infrastructure failure; or dead-letter and terminate.
//!
//! Only guest outcomes count attempts (rule 14). A stale owner, whose claim was taken over,
//! touches nothing: no outputs, no record, no ack or nak (rule 5).

use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::AckKind;

use super::delays::outage_retry_uncounted;
use super::effects::{self, DeadLetter, DeadLetterError};
use super::message::{Claimed, Delivery};
use super::Shared;
use crate::bindings::Output;
use crate::claim::{ClaimStore, LeaseLost};
use crate::config::AckMode;
use crate::metrics::{DedupLayer, MessageOutcome, RouteMetrics};
use crate::routes::Route;

impl<S: ClaimStore> Shared<S> {
    /// Success: publish outputs (raced against losing the lease), record completion, then
    /// ack ([`Self::ack_recorded`]).
    pub(super) async fn succeed(
        &self,
        c: &Claimed<'_, S>,
        outputs: &[Output],
        published: &AtomicBool,
    ) {
        if c.route.fenced.is_some() {
            return self.commit_fenced(c, outputs).await;
        }
        let trace = trace_context(c.d);
        let outgoing = effects::prepare_outputs(c.lease.key(), outputs, &c.d.trace, &trace);
        let sizes = outgoing.iter().map(|o| o.wire_size());
        let subjects = outputs.iter().map(|o| o.subject.as_str());
        if let Some(reason) = effects::oversized(&self.js, c.lease.key(), subjects.zip(sizes)) {
            return self.give_up_oversized(c, &reason).await;
        }
        if let Err(e) = c.lease.confirm().await {
            return self.write_failed(c, e, false).await;
        }
        // Raced against losing the lease by the heartbeat around this work (rule 16).
        published.store(!outputs.is_empty(), Ordering::Relaxed);
        let published = effects::publish_outputs(&self.js, outgoing).await;
        let published = match published {
            Ok(published) => published,
            Err(e) => {
                tracing::warn!("{e:#}");
                return self.release(c, &format!("{e:#}")).await;
            }
        };
        c.route.metrics.outputs(outputs.len() as u64);
        let duplicates = published.iter().filter(|o| o.duplicate).count();
        c.route.metrics.hit(DedupLayer::Output, duplicates as u64);
        let started = std::time::Instant::now();
        let span =
            c.d.trace
                .child(|| "record".into(), SpanKind::Internal, Vec::new);
        if let Err(e) = c.lease.complete(published).await {
            span.error("record_error", || e.to_string());
            drop(span);
            return self.write_failed(c, e, !outputs.is_empty()).await;
        }
        drop(span);
        c.route.metrics.claim_write(started.elapsed());
        c.route.metrics.outcome(MessageOutcome::Processed);
        // Completed is recorded: a redelivery finds it and acks.
        self.ack_recorded(c).await;
    }

    /// Success on a fenced route: the outputs and the completed record as one atomic batch,
    /// which the server stores only while the claim is still this owner's (no confirmation
    /// write first, no race against the heartbeat: the fence decides), then ack. Refused or not, nothing partial is ever stored.
    async fn commit_fenced(&self, c: &Claimed<'_, S>, outputs: &[Output]) {
        let (commits, subject) = (&self.fenced, c.lease.key());
        let stream = c.route.fenced.as_deref().unwrap_or_default();
        // One batch, one span: every output carries its context.
        let send = effects::send_span(&c.d.trace, stream, 0);
        send.set(|| vec![KeyValue::new("dedup.outputs", outputs.len() as i64)]);
        let own = send.headers();
        let trace: Vec<(&str, &str)> = match &own {
            Some(own) => own.iter().map(|(n, v)| (*n, v.as_str())).collect(),
            None => trace_context(c.d),
        };
        let claim_key = crate::fenced::claim_key_of(stream, subject).unwrap_or(subject);
        let sizes = effects::fenced_sizes(claim_key, outputs, &trace);
        if let Some(reason) = effects::oversized(&self.js, claim_key, sizes) {
            // Sent, it would fail the whole batch (and every commit grouped with it).
            return self.give_up_oversized(c, &reason).await;
        }
        let started = std::time::Instant::now();
        let committed = c
            .lease
            .complete_with(outputs.len() as u32, |record, revision| {
                let batch = crate::fenced::commit::prepare(
                    (subject, claim_key),
                    &record,
                    revision,
                    outputs,
                    &trace,
                );
                commits.commit(stream, batch)
            })
            .await;
        match committed {
            Ok(()) => {}
            Err(LeaseLost::Reclaimed) => {
                c.route.metrics.hit(DedupLayer::Fence, 1);
                tracing::warn!("fenced commit refused: the claim moved to another owner; none of this attempt's outputs were stored");
                c.route.metrics.outcome(MessageOutcome::LostClaim);
                return;
            }
            Err(LeaseLost::Unavailable(e)) => {
                // Not stored (or landing later, which the next claim's compare-and-swap sees):
                // hand the key back without counting an attempt (rule 14).
                return self
                    .release(c, &format!("fenced commit not confirmed: {e}"))
                    .await;
            }
        }
        c.route.metrics.claim_write(started.elapsed());
        c.route.metrics.outputs(outputs.len() as u64);
        c.route.metrics.outcome(MessageOutcome::Processed);
        self.ack_recorded(c).await;
    }

    /// Outputs that can never be stored: the handler's fault, dead-lettered at once.
    async fn give_up_oversized(&self, c: &Claimed<'_, S>, reason: &str) {
        let kind = crate::runtime::TrapKind::OutputLimit;
        c.route.metrics.trap(kind.as_str());
        self.give_up(c, reason).await
    }

    /// A coalescing route's message with a newer one of its entity waiting: completed
    /// without running, so the handler sees the latest state.
    pub(super) async fn coalesced(&self, c: &Claimed<'_, S>) {
        if let Err(e) = c.lease.coalesce().await {
            return self.write_failed(c, e, false).await;
        }
        tracing::debug!("coalesced: a newer message of the entity is waiting");
        c.route.metrics.outcome(MessageOutcome::Coalesced);
        self.ack_recorded(c).await;
    }

    /// A failed attempt: retry after the backoff (or the guest's delay, clamped to the
    /// largest backoff so a re-run stays inside the duplicate window), or give up after the
    /// last allowed attempt.
    pub(super) async fn retry_or_give_up(
        &self,
        c: &Claimed<'_, S>,
        reason: &str,
        delay: Option<Duration>,
    ) {
        let (attempt, max) = (c.lease.attempt(), self.config.source.max_deliver);
        if attempt >= max {
            let reason = format!("{reason} (attempt {attempt} of {max}, none left)");
            return self.give_up(c, &reason).await;
        }
        tracing::info!("attempt failed, will retry: {reason}");
        let backoff = self.config.backoff_for(attempt);
        let delay = delay.map_or(backoff, |d| d.clamp(backoff, self.config.max_backoff()));
        if let Err(e) = c.lease.fail(reason, delay).await {
            return self.write_failed(c, e, false).await;
        }
        c.route.metrics.outcome(MessageOutcome::Retried);
        self.settle(c.d, AckKind::Nak(Some(delay))).await;
    }

    /// A permanent failure: dead-letter, record, terminate. A letter the dead-letter stream
    /// refuses for good still ends the message: the claim records why, and it is termed.
    pub(super) async fn give_up(&self, c: &Claimed<'_, S>, reason: &str) {
        tracing::warn!("dead-lettering: {reason}");
        if let Err(e) = c.lease.confirm().await {
            return self.write_failed(c, e, false).await;
        }
        let letter = DeadLetter {
            reason,
            attempt: c.lease.attempt(),
            route: &c.route.name,
            key: c.key,
            // One letter per stored copy: a replay (a new sequence) that fails again gets its own.
            id: format!("dl:{}:{}", c.lease.key(), c.d.sequence),
            digest: c.guest.digest(),
        };
        let recorded = match self
            .publish_dead_letter(c.d, letter, &c.route.metrics)
            .await
        {
            Ok(()) => {
                c.route.metrics.outcome(MessageOutcome::DeadLettered);
                reason.to_string()
            }
            Err(e @ DeadLetterError::Transient { .. }) => {
                return self.release(c, &format!("{e}")).await;
            }
            Err(e @ DeadLetterError::Refused { .. }) => {
                format!("{reason}; not dead-lettered: {e}")
            }
        };
        if let Err(e) = c.lease.give_up(&recorded).await {
            return self.write_failed(c, e, false).await;
        }
        self.settle(c.d, AckKind::Term).await;
    }

    /// Gives the key back without counting the attempt (an infrastructure failure, rule 14)
    /// and naks, so the message runs again soon. If even that write fails, the message comes
    /// back once the lease lapses.
    pub(super) async fn release(&self, c: &Claimed<'_, S>, reason: &str) {
        // `release_after` counts this error in the route's run.
        let delay = outage_retry_uncounted(&c.route.metrics, c.d.delivered);
        self.release_after(c, reason, delay).await
    }

    /// [`Self::release`] with the nak delay given.
    pub(super) async fn release_after(&self, c: &Claimed<'_, S>, reason: &str, delay: Duration) {
        tracing::warn!("not the guest's fault, will retry without counting an attempt: {reason}");
        c.route.metrics.outcome(MessageOutcome::Error);
        match c.lease.release(reason, delay).await {
            Ok(()) => self.settle(c.d, AckKind::Nak(Some(delay))).await,
            Err(e) => self.write_failed(c, e, false).await,
        }
    }

    /// Dead-letters a message that was never claimed (no route, no key, too big).
    pub(super) async fn dead_letter_unclaimed(
        &self,
        d: &Delivery,
        route: &str,
        key: &str,
        reason: &str,
    ) {
        tracing::warn!(subject = %d.message.subject, "dead-lettering: {reason}");
        let letter = DeadLetter {
            reason,
            attempt: 0,
            route,
            key,
            id: format!("dl:seq:{}", d.sequence),
            digest: "",
        };
        let metrics = self.metrics(route);
        match self.publish_dead_letter(d, letter, &metrics).await {
            Ok(()) => {
                metrics.outcome(MessageOutcome::DeadLettered);
                self.settle(d, AckKind::Term).await;
            }
            Err(DeadLetterError::Transient { .. }) => {
                self.settle(
                    d,
                    AckKind::Nak(Some(outage_retry_uncounted(&metrics, d.delivered))),
                )
                .await
            }
            Err(e @ DeadLetterError::Refused { .. }) => {
                tracing::error!(sequence = d.sequence, "terminating message: {reason}; {e}");
                self.settle(d, AckKind::Term).await;
            }
        }
    }

    /// Publishes a dead letter for the delivery; a failure is logged and counted.
    pub(super) async fn publish_dead_letter(
        &self,
        d: &Delivery,
        letter: DeadLetter<'_>,
        metrics: &RouteMetrics,
    ) -> Result<(), DeadLetterError> {
        let subject = &self.config.dead_letter.subject;
        let result =
            effects::publish_dead_letter(&self.js, subject, &d.message, d.sequence, letter).await;
        match &result {
            Ok(duplicate) => metrics.hit(DedupLayer::Stream, *duplicate as u64),
            Err(e) => {
                tracing::error!(sequence = d.sequence, "{e}");
                metrics.outcome(MessageOutcome::Error);
            }
        }
        result.map(|_| ())
    }

    /// A write through the lease failed: if the key was reclaimed, touch nothing; if the
    /// store did not answer, nak so the message comes back once the lease lapses.
    pub(super) async fn write_failed(&self, c: &Claimed<'_, S>, e: LeaseLost, published: bool) {
        match e {
            LeaseLost::Reclaimed => self.lost(c, published),
            LeaseLost::Unavailable(e) => {
                tracing::warn!("claim write failed, will retry: {e}");
                c.route.metrics.outcome(MessageOutcome::Error);
                self.settle(c.d, AckKind::Nak(Some(self.config.claims.lease)))
                    .await;
            }
        }
    }

    /// The key, or the proof a replay carries, could not be read (the server did not
    /// answer): nak with the outage backoff; no attempt is counted.
    pub(super) async fn nak_unavailable(&self, d: &Delivery, route: &Route, why: String) {
        use tracing::Instrument as _;
        let span = d.span(&route.name);
        span.in_scope(|| tracing::warn!("{why}"));
        route.metrics.outcome(MessageOutcome::Error);
        let delay = super::delays::outage_retry(&route.metrics, d.delivered);
        self.settle(d, AckKind::Nak(Some(delay)))
            .instrument(span)
            .await;
    }

    /// The claim was taken over: no more outputs, no record, no ack or nak (acks are keyed
    /// by stream sequence and would settle the new owner's delivery).
    pub(super) fn lost(&self, c: &Claimed<'_, S>, published: bool) {
        if published {
            tracing::warn!("claim taken over after this attempt began publishing: outputs sent without an answer may still be stored, now or once the connection recovers; the new owner's outputs carry the same message ids, so within the window one copy of each is kept");
        } else {
            tracing::warn!("claim taken over by another owner before this attempt published anything; its effects are dropped");
        }
        c.route.metrics.outcome(MessageOutcome::LostClaim);
    }

    /// Acks a message whose outcome is recorded, as its route asks (rule 7): a plain ack by
    /// default (a lost one costs a redelivery the claim answers without running the guest),
    /// or a confirmed one.
    async fn ack_recorded(&self, c: &Claimed<'_, S>) {
        match c.route.ack {
            AckMode::Plain => self.settle(c.d, AckKind::Ack).await,
            AckMode::Confirmed => self.ack_confirmed(c.d).await,
        }
    }

    /// Acks with the server's confirmation: one request on the client's shared reply inbox,
    /// where `double_ack` subscribes, publishes and unsubscribes a fresh inbox per message.
    /// A failure is logged: the record is written, so a redelivery finds it and acks.
    pub(super) async fn ack_confirmed(&self, d: &Delivery) {
        d.end();
        let _span = settle_span(d, "ack");
        let Some(reply) = d.reply.clone() else {
            return tracing::warn!("ack not confirmed: the delivery has no ack subject");
        };
        let ack = bytes::Bytes::from_static(b"+ACK");
        if let Err(e) = self.client.request(reply, ack).await {
            tracing::warn!("ack not confirmed: {e}");
        }
    }

    /// Acks, naks or terms a delivery; a failure is logged (the server redelivers).
    pub(super) async fn settle(&self, d: &Delivery, kind: AckKind) {
        if matches!(kind, AckKind::Ack | AckKind::Term) {
            d.end();
        }
        let _span = settle_span(d, ack_name(&kind));
        if let Err(e) = d.acker.ack_with(kind).await {
            tracing::warn!(sequence = d.sequence, "ack ({kind:?}) failed: {e}");
        }
    }
}

/// The CLIENT span of a delivery's ack, nak or term.
fn settle_span(d: &Delivery, ack: &'static str) -> crate::telemetry::Child {
    let attributes = || vec![KeyValue::new("dedup.ack", ack)];
    d.trace
        .child(|| "settle".into(), SpanKind::Client, attributes)
}

/// The name of an ack kind, for spans.
fn ack_name(kind: &AckKind) -> &'static str {
    match kind {
        AckKind::Ack => "ack",
        AckKind::Nak(_) => "nak",
        AckKind::Progress => "progress",
        AckKind::Next => "next",
        AckKind::Term => "term",
    }
}

/// The event's W3C trace-context headers, carried to its outputs.
pub(super) fn trace_context(d: &Delivery) -> Vec<(&'static str, &str)> {
    let Some(headers) = &d.message.headers else {
        return Vec::new();
    };
    [super::message::TRACEPARENT, "tracestate"]
        .into_iter()
        .filter_map(|name| headers.get(name).map(|v| (name, v.as_str())))
        .collect()
}
