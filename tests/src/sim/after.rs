//! A simulated host's claim-after delivery as the host's own run sees it
//! ([`dedup_delivery::after`]): the key read and written through the host's claimer on the
//! model's store, the seeded handler in virtual time, the model's output stream, dead letters
//! and acks. Which read settles how, and the order publish, record, ack (or dead-letter,
//! record, terminate) are the host's, not restated here; what is here are the model's I/O and
//! the check that an ack finds the key's outcome durable.

use std::time::Duration;

use dedup_delivery::after::AfterDelivery;
use dedup_delivery::before::Handled;
use dedup_delivery::claim::{Claimer, OutputRef};
use dedup_delivery::outcome::{DedupLayer, MessageOutcome};
use dedup_delivery::settle::{LetterRefused, Retries, Settlement};

use super::ctx::{At, Ctx, NakMs};
use super::outputs::Outputs;
use super::store::SimStore;

/// One claim-after delivery of a simulated host.
pub(super) struct SimAfter<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
    /// The host's claimer of the claim bucket (claim-after routes are never fenced).
    pub(super) claimer: &'a Claimer<SimStore>,
    /// The handler version the host's split chose (a claim-after route takes no canary).
    pub(super) version: String,
}

impl AfterDelivery for SimAfter<'_> {
    type Store = SimStore;
    type Outputs = Outputs;

    fn claimer(&self) -> &Claimer<SimStore> {
        self.claimer
    }

    fn claim_key(&self) -> &str {
        &self.at.claim
    }

    fn fresh_from(&self) -> u64 {
        self.at.fresh_from
    }

    fn delivered(&self) -> u64 {
        self.at.number
    }

    fn digest(&self) -> &str {
        &self.version
    }

    fn may_publish(&self) -> bool {
        true
    }

    fn count(&self, outcome: MessageOutcome) {
        self.ctx.count(outcome);
    }

    fn hit(&self, _layer: DedupLayer) {}

    /// An ack is checked (the key it was acked for must be done); a term answers a
    /// failed-for-good key, which a replay may reset meanwhile.
    async fn settle(&self, how: Settlement) {
        match how {
            Settlement::Ack => self.ctx.recorded_settle(self.at, None),
            _ => self.ctx.settle_unchecked(self.at, how.nak_ms()),
        }
    }

    /// Checked: the key's outcome must be durable (completed or failed for good).
    async fn settle_recorded(&self, how: Settlement) {
        self.ctx.recorded_settle(self.at, how.nak_ms())
    }

    fn outage_delay(&self) -> Duration {
        self.ctx.outage_delay(self.at.number)
    }

    fn release_delay(&self) -> Duration {
        self.ctx.release_delay(self.at.number)
    }

    /// Never asked: the model's handlers always find an instance.
    fn pool_full_delay(&self) -> Duration {
        self.ctx.outage_delay(self.at.number)
    }

    fn retries(&self, _attempt: u32) -> Retries {
        let s = self.ctx.settings;
        let backoff = Duration::from_millis(s.backoff_ms);
        Retries {
            max: s.max_deliver,
            backoff,
            max_backoff: backoff,
        }
    }

    /// The model's hosts write every record they read: a record the protocol cannot read is
    /// a defect of the model or the protocol.
    async fn unreadable(&self, reason: &str) {
        self.ctx.violation(format!(
            "h{} cannot read the record of {}: {reason}",
            self.ctx.host, self.at.key
        ));
    }

    /// The seeded handler ([`Ctx::invoke`]); no heartbeat and no progress acks, as on the
    /// host: a claim-after handler is short.
    async fn invoke(&self, attempt: u32) -> Result<Handled<Outputs>, String> {
        self.ctx.invoke(&self.at.key, attempt, &self.version).await
    }

    /// The host's size check of a claim-after route (never fenced).
    fn oversized(&self, output: &Outputs) -> Option<String> {
        let max = self.ctx.world().max_payload;
        output.oversized(&self.at.claim, false, max)
    }

    async fn publish(&self, output: Outputs) -> Result<Vec<OutputRef>, String> {
        let by = (self.at.key.as_str(), &output.version);
        self.ctx.publish(output.published(&self.at.claim), by).await
    }

    /// Read from the model's components ([`Ctx::offered`]).
    async fn offered(&self, digest: &str) -> Result<bool, String> {
        self.ctx.offered(digest).await
    }

    /// Jittered with the run's seeded generator.
    fn jittered(&self, ceiling: Duration) -> Duration {
        dedup_delivery::backoff::jittered(ceiling, self.ctx.unit())
    }

    fn pinned_gone(&self, digest: &str) -> String {
        dedup_delivery::pinned::gone("r", &self.at.key, digest)
    }

    async fn dead_letter(&self, _reason: &str, _attempt: u32) -> Result<(), LetterRefused> {
        if !self.ctx.reaches_server().await {
            return Err(LetterRefused::Transient(
                "dead letter timed out: cut off from the server".into(),
            ));
        }
        match self.ctx.world().dead_letter(&self.at.key) {
            true => Ok(()),
            false => Err(LetterRefused::Transient("dead letter refused".into())),
        }
    }
}
