//! An exclusive route's source messages, queued per entity (`crate::exclusive`): the route's
//! consumer hands out one message at a time; it is copied onto its entity's partition of the
//! work queue and only then acked, so the queue holds each route's messages in source order.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, AckKind};

use super::delays::{outage_retry, INFRA_RETRY_MAX};
use super::message::{position, Delivery, Position};
use super::Shared;
use crate::claim::ClaimStore;
use crate::exclusive;
use crate::idempotency;
use crate::metrics::MessageOutcome;
use crate::routes::{Exclusive, Route};
use crate::stranded::{self, Marker};

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
        let marker = stranded::last_delivery(d.delivered, self.config.source.server_max_deliver)
            .then(|| {
                let reason = format!("its last delivery ({}) did not queue it", d.delivered);
                Marker::new(&self.config.source.stream, sequence, d.delivered, reason)
                    .not_before(self.config.source.ack_wait * 2)
            });
        if let Some(marker) = &marker {
            stranded::mark(&self.markers, marker).await;
        }
        self.queue_delivery(&d, route, exclusive).await;
        if let (Some(marker), true) = (&marker, d.ended.load(Ordering::Relaxed)) {
            stranded::forget(&self.markers, &marker.key()).await;
        }
    }

    /// Copies one delivery of an exclusive route onto its entity's partition, then acks it.
    async fn queue_delivery(&self, d: &Delivery, route: &Arc<Route>, exclusive: &Exclusive) {
        let sequence = d.sequence;
        if self.dead_letter_unreadable(d, &route.name).await {
            return;
        }
        let entity = match idempotency::derive(
            &exclusive.by,
            &d.message.subject,
            d.message.headers.as_ref(),
            &d.message.payload,
        ) {
            Ok(entity) => entity,
            Err(missing) => {
                let reason = format!("no entity key (exclusive_by): {missing}");
                return self
                    .dead_letter_unclaimed(d, &route.name, "", &reason)
                    .await;
            }
        };
        let subject =
            exclusive::work_subject(&self.config, &route.name, exclusive.partitions, &entity);
        let headers = exclusive::queued_headers(
            d.message.headers.as_ref(),
            &route.name,
            &d.message.subject,
            sequence,
        );
        let stored = async {
            self.js
                .publish_with_headers(subject, headers, d.message.payload.clone())
                .await?
                .await
        }
        .await;
        match stored {
            Ok(_) => {
                tracing::debug!(route = route.name, sequence, "queued");
                // Not confirmed: the route's next message waits for this ack, and a lost one
                // only means a redelivery, queued again under the same id and dropped.
                d.end();
                if let Err(e) = d.acker.ack().await {
                    tracing::warn!(route = route.name, sequence, "queue ack not sent: {e}");
                }
            }
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                let reason = format!("too big to queue for exclusive route `{}`: {e}", route.name);
                self.dead_letter_unclaimed(d, &route.name, "", &reason)
                    .await;
            }
            Err(e) => {
                tracing::warn!(
                    route = route.name,
                    sequence,
                    "cannot queue, will retry: {e}"
                );
                route.metrics.outcome(MessageOutcome::Error);
                self.settle(
                    d,
                    AckKind::Nak(Some(outage_retry(&route.metrics, d.delivered))),
                )
                .await;
            }
        }
    }
}
