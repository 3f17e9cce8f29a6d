//! What follows a guest's outcome. The order (publish, record, ack; fail, nak; release;
//! dead-letter, record, terminate) is the delivery crate's ([`dedup_delivery::settle`], which
//! the simulation runs too); here the host counts how each delivery ended, and acks, naks or
//! terminates what was never claimed. The world it settles in is [`super::settling`].

use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

use async_nats::jetstream::AckKind;

use super::delays::outage_retry_uncounted;
use super::effects::{self, DeadLetter, DeadLetterError};
use super::message::{Claimed, Delivery};
use super::Shared;
use crate::claim::ClaimStore;
use crate::config::AckMode;
use crate::metrics::{DedupLayer, MessageOutcome, RouteMetrics};
use crate::routes::Route;

impl<S: ClaimStore> Shared<S> {
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
                    AckKind::Nak(Some(outage_retry_uncounted(&metrics, d.retry_count()))),
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

    /// The key, or the proof a replay carries, could not be read (the server did not
    /// answer): nak with the outage backoff; no attempt is counted.
    pub(super) async fn nak_unavailable(&self, d: &Delivery, route: &Route, why: String) {
        use tracing::Instrument as _;
        let span = d.span(&route.name);
        span.in_scope(|| tracing::warn!("{why}"));
        route.metrics.outcome(MessageOutcome::Error);
        let delay = super::delays::outage_retry(&route.metrics, d.retry_count());
        self.settle(d, AckKind::Nak(Some(delay)))
            .instrument(span)
            .await;
    }

    /// Acks a message whose outcome is recorded, as its route asks (rule 7): a plain ack by
    /// default (a lost one costs a redelivery the claim answers without running the guest),
    /// or a confirmed one.
    pub(super) async fn ack_recorded(&self, c: &Claimed<'_, S>) {
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
