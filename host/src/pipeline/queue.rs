//! An exclusive route's source messages, queued per entity (`crate::exclusive`): the route's
//! consumer hands them to one pinned host, the copier, which copies each onto its entity's
//! partition of the work queue (after the entity's previous copy, under its epoch:
//! [`dedup_delivery::copier`]) and only then acks it, so the queue holds each entity's
//! messages in source order. The order and what a refused copy does are the delivery crate's
//! ([`queue::queue`], under the stranded-message marker of [`marker::around`]); here its
//! adapters over JetStream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use dedup_delivery::marker;
use dedup_delivery::queue::{self, CopyRefused, Queueing};
use dedup_delivery::settle::Settlement;

use dedup_delivery::copier::{Copier, CopyError, Turn};

use super::copier::JsCopier;
use super::delays::{outage_retry, INFRA_RETRY_MAX};
use super::marked::Marked;
use super::message::{position, Delivery, Position};
use super::Shared;
use crate::claim::ClaimStore;
use crate::idempotency;
use crate::metrics::MessageOutcome;
use crate::routes::{Exclusive, Route};
use crate::stranded::{self, Marker, Origin};

impl<S: ClaimStore> Shared<S> {
    /// Queues one message of an exclusive route, then acks it. A message without an entity
    /// key, or too big to queue, is dead-lettered.
    pub(super) async fn queue(
        &self,
        message: jetstream::Message,
        route: &Arc<Route>,
        copier: &Copier,
        turn: Turn,
    ) {
        let Some(exclusive) = &route.exclusive else {
            tracing::error!(
                route = route.name,
                "queueing for a route that is not exclusive"
            );
            let _ = message.ack_with(AckKind::Nak(Some(INFRA_RETRY_MAX))).await;
            return;
        };
        let Some(Position {
            sequence,
            delivered,
            ..
        }) = position(&message).await
        else {
            return;
        };
        let d = Delivery::new(message, sequence, delivered);
        // The server delivers it no more: until it is queued or dead-lettered, a marker says
        // so, in case the host dies now and the advisory reaches no host (`crate::stranded`).
        let last = stranded::last_delivery(d.delivered, self.config.source.server_max_deliver);
        let marked = (last && queue::marks_last_delivery()).then(|| {
            let reason = format!("its last delivery ({}) did not queue it", d.delivered);
            let origin = Origin {
                stream: &self.config.source.stream,
                sequence,
                consumer: &crate::setup::route_consumer_name(&self.config, &route.name),
            };
            let marker = Marker::new(origin, d.delivered, reason)
                .not_before(self.config.source.ack_wait * 2);
            Marked {
                claims: &self.markers,
                marker,
                span: d.span(&route.name),
                ended: &d.ended,
            }
        });
        let queued = self.queue_delivery(&d, route, exclusive, copier, &turn);
        marker::around(marked.as_ref(), queued).await
    }

    /// Copies one delivery of an exclusive route onto its entity's partition, then acks it
    /// ([`queue::queue`]).
    async fn queue_delivery(
        &self,
        d: &Delivery,
        route: &Arc<Route>,
        exclusive: &Exclusive,
        copier: &Copier,
        turn: &Turn,
    ) {
        if self.dead_letter_unreadable(d, &route.name, true).await {
            return;
        }
        let q = Queued {
            shared: self,
            d,
            route,
            exclusive,
            copier,
            turn,
        };
        queue::queue(&q).await
    }
}

/// One delivery of an exclusive route's source consumer, queued over JetStream.
struct Queued<'a, S: ClaimStore> {
    shared: &'a Shared<S>,
    d: &'a Delivery,
    route: &'a Route,
    exclusive: &'a Exclusive,
    copier: &'a Copier,
    turn: &'a Turn,
}

impl<S: ClaimStore> Queueing for Queued<'_, S> {
    fn entity(&self) -> Result<String, String> {
        let m = &self.d.message;
        idempotency::derive(
            &self.exclusive.by,
            &m.subject,
            m.headers.as_ref(),
            &m.payload,
        )
        .map_err(|missing| missing.to_string())
    }

    /// Published by this host's copier, after its entity's previous copy, under its epoch
    /// ([`dedup_delivery::copier`]), with the origin headers the partition's consumer reads
    /// back.
    async fn copy(&self, _entity: &str) -> Result<(), CopyRefused> {
        let (d, route, shared) = (self.d, self.route, self.shared);
        let io = JsCopier {
            js: &shared.js,
            config: &shared.config,
            route,
            exclusive: self.exclusive,
        };
        let m = &d.message;
        let copy = |epoch| {
            let payload = m.payload.clone();
            io.copy(epoch, d.sequence, &m.subject, m.headers.as_ref(), payload)
        };
        // The server's pin id is the last `Nats-Pin-Id` (a producer's own comes first).
        let pin = (m.headers.as_ref()).and_then(|h| h.get_last(async_nats::header::NATS_PIN_ID));
        let handed = (d.sequence, pin.map(|p| p.as_str()));
        match self.copier.copy(&io, self.turn, handed, copy).await {
            Ok(()) => {
                tracing::debug!(route = route.name, sequence = d.sequence, "queued");
                Ok(())
            }
            Err(CopyError::ForGood(reason)) => Err(CopyRefused::ForGood(reason)),
            Err(CopyError::Transient(e)) => {
                let sequence = d.sequence;
                tracing::warn!(
                    route = route.name,
                    sequence,
                    "cannot queue, will retry: {e}"
                );
                Err(CopyRefused::Transient(e))
            }
            Err(CopyError::NotCopier(e)) => {
                tracing::debug!(
                    route = route.name,
                    sequence = d.sequence,
                    "handed back: {e}"
                );
                Err(CopyRefused::NotCopier(e))
            }
        }
    }

    /// A plain ack ends the message's life here.
    async fn settle(&self, how: Settlement) {
        let d = self.d;
        match how {
            Settlement::Ack => {
                d.end();
                if let Err(e) = d.acker.ack().await {
                    let (route, sequence) = (&self.route.name, d.sequence);
                    tracing::warn!(route, sequence, "queue ack not sent: {e}");
                }
            }
            Settlement::Nak(delay) => self.shared.settle(d, AckKind::Nak(Some(delay))).await,
            Settlement::Term => self.shared.settle(d, AckKind::Term).await,
        }
    }

    fn count(&self, outcome: MessageOutcome) {
        self.route.metrics.outcome(outcome);
    }

    /// The outage backoff, at most a quarter of the queue's duplicate window: a message naked
    /// longer holds the source consumer's ack floor back that long, and a takeover copies
    /// everything above the floor again, storing twice what was acked before the window.
    fn outage_delay(&self) -> Duration {
        let window = self.shared.config.source.duplicate_window;
        let cap = (window / 4).max(Duration::from_secs(1));
        outage_retry(&self.route.metrics, self.d.delivered).min(cap)
    }

    async fn dead_letter(&self, reason: &str) {
        (self.shared)
            .dead_letter_unclaimed(self.d, &self.route.name, "", reason)
            .await
    }
}
