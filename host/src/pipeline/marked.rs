//! A stranded-message marker as the delivery crate's [`dedup_delivery::marker::around`] sees
//! it: written to and purged from the claim bucket ([`crate::stranded`]), in the delivery's
//! span; and the marker a last delivery gets as it reaches the host ([`Received`]). When to
//! mark and when to forget are not here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::Store;
use dedup_delivery::marker::Marking;
use tracing::Instrument as _;

use crate::stranded::{self, Marker, Origin};

/// The marker of one delivery that is the server's last.
pub(super) struct Marked<'a> {
    /// The claim bucket, where markers live.
    pub(super) claims: &'a Store,
    pub(super) marker: Marker,
    /// The delivery's span, for the marker's lines.
    pub(super) span: tracing::Span,
    /// Whether the delivery ended the message (`Delivery::ended`).
    pub(super) ended: &'a AtomicBool,
}

impl Marking for Marked<'_> {
    async fn mark(&self) {
        stranded::mark(self.claims, &self.marker)
            .instrument(self.span.clone())
            .await
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    async fn forget(&self) {
        stranded::forget(self.claims, &self.marker.key())
            .instrument(self.span.clone())
            .await
    }
}

/// The marker of a delivery that is the server's last, written as it reaches the host, before
/// it waits for its turn ([`dedup_delivery::marker::received`]): named from the delivery's
/// own metadata (its stream, sequence and delivery count).
pub(super) struct Received<'a> {
    /// The claim bucket, where markers live.
    pub(super) claims: &'a Store,
    pub(super) marker: Marker,
}

impl<'a> Received<'a> {
    /// The marker of `message` (in claim bucket `claims`) when it is the server's last
    /// delivery (`server_max_deliver`),
    /// due two ack waits on, as the one its work writes (`queues`: the work is an exclusive
    /// route's queue stage, whose marker says so); `None` otherwise, or when its metadata
    /// cannot be read (its work then decides).
    pub(super) fn of(
        claims: &'a Store,
        message: &jetstream::Message,
        (server_max_deliver, ack_wait): (i64, Duration),
        queues: bool,
    ) -> Option<Self> {
        let info = message.info().ok()?;
        let delivered = u64::try_from(info.delivered).ok()?;
        if !stranded::last_delivery(delivered, server_max_deliver)
            || (queues && !dedup_delivery::queue::marks_last_delivery())
        {
            return None;
        }
        let what = if queues { "queue" } else { "settle" };
        let reason = format!("its last delivery ({delivered}) did not {what} it");
        let origin = Origin {
            stream: info.stream,
            sequence: info.stream_sequence,
            consumer: info.consumer,
        };
        let marker = Marker::new(origin, delivered, reason).not_before(ack_wait * 2);
        Some(Self { claims, marker })
    }
}

impl Marking for Received<'_> {
    async fn mark(&self) {
        stranded::mark(self.claims, &self.marker).await
    }

    /// Nothing ended it yet: its work has not started.
    fn ended(&self) -> bool {
        false
    }

    async fn forget(&self) {
        stranded::forget(self.claims, &self.marker.key()).await
    }
}
