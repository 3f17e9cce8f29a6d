//! A stranded-message marker as the delivery crate's [`dedup_delivery::marker::around`] sees
//! it: written to and purged from the claim bucket ([`crate::stranded`]), in the delivery's
//! span. When to mark and when to forget are not here.

use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::jetstream::kv::Store;
use dedup_delivery::marker::Marking;
use tracing::Instrument as _;

use crate::stranded::{self, Marker};

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
