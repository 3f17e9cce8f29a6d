//! An exclusive route's source messages, queued per entity (`crate::exclusive`): the route's
//! consumer hands out one message at a time; it is copied onto its entity's partition of the
//! work queue and only then acked, so the queue holds each route's messages in source order.
//! The order and what a refused copy does are the delivery crate's ([`queue::queue`], under
//! the stranded-message marker of [`marker::around`]); here its adapters over JetStream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, AckKind};
use dedup_delivery::marker;
use dedup_delivery::queue::{self, CopyRefused, Queueing};
use dedup_delivery::settle::Settlement;

use super::delays::{outage_retry, INFRA_RETRY_MAX};
use super::marked::Marked;
use super::message::{position, Delivery, Position};
use super::Shared;
use crate::claim::ClaimStore;
use crate::exclusive;
use crate::idempotency;
use crate::metrics::MessageOutcome;
use crate::routes::{Exclusive, Route};
use crate::stranded::{self, Marker, Origin};

impl<S: ClaimStore> Shared<S> {
    /// Queues one message of an exclusive route, then acks it. A message without an entity
    /// key, or too big to queue, is dead-lettered.
    pub(super) async fn queue(&self, message: jetstream::Message, route: &Arc<Route>) {
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
        marker::around(marked.as_ref(), self.queue_delivery(&d, route, exclusive)).await
    }

    /// Copies one delivery of an exclusive route onto its entity's partition, then acks it
    /// ([`queue::queue`]).
    async fn queue_delivery(&self, d: &Delivery, route: &Arc<Route>, exclusive: &Exclusive) {
        if self.dead_letter_unreadable(d, &route.name).await {
            return;
        }
        let q = Queued {
            shared: self,
            d,
            route,
            exclusive,
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

    /// Published with the origin headers the partition's consumer reads back.
    async fn copy(&self, entity: &str) -> Result<(), CopyRefused> {
        let (d, route) = (self.d, self.route);
        let config = &self.shared.config;
        let subject =
            exclusive::work_subject(config, &route.name, self.exclusive.partitions, entity);
        let headers = exclusive::queued_headers(
            d.message.headers.as_ref(),
            &route.name,
            &d.message.subject,
            d.sequence,
        );
        let stored = async {
            (self.shared.js)
                .publish_with_headers(subject, headers, d.message.payload.clone())
                .await?
                .await
        }
        .await;
        match stored {
            Ok(_) => {
                tracing::debug!(route = route.name, sequence = d.sequence, "queued");
                Ok(())
            }
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                Err(CopyRefused::ForGood(format!(
                    "too big to queue for exclusive route `{}`: {e}",
                    route.name
                )))
            }
            Err(e) => {
                let sequence = d.sequence;
                tracing::warn!(
                    route = route.name,
                    sequence,
                    "cannot queue, will retry: {e}"
                );
                Err(CopyRefused::Transient(e.to_string()))
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

    fn outage_delay(&self) -> Duration {
        outage_retry(&self.route.metrics, self.d.delivered)
    }

    async fn dead_letter(&self, reason: &str) {
        (self.shared)
            .dead_letter_unclaimed(self.d, &self.route.name, "", reason)
            .await
    }
}
