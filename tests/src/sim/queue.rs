//! A simulated host's queueing of an exclusive route's source message as the host's own
//! queue stage sees it ([`dedup_delivery::queue`]): the copy onto the entity's partition of the
//! model's work queue (the partition from the host's real `exclusive::work_subject`,
//! deduplicated by source sequence) and the model's acks. Copy first, then ack, and what a
//! refused copy does are the host's, not restated here.

use std::time::Duration;

use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::queue::{CopyRefused, Queueing};
use dedup_delivery::settle::Settlement;

use super::ctx::{At, Ctx, NakMs};
use super::network::Stream;
use super::route::Served;

/// One delivery of an exclusive route's source consumer on a simulated host.
pub(super) struct SimQueue<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
    /// The message's source sequence (the work queue's deduplication id).
    pub(super) source: u64,
    pub(super) served: &'a Served,
}

impl Queueing for SimQueue<'_> {
    /// The model's messages always carry their entity.
    fn entity(&self) -> Result<String, String> {
        Ok(self.at.entity.clone())
    }

    /// Refused at the rate of refused publishes while faults last.
    async fn copy(&self, entity: &str) -> Result<(), CopyRefused> {
        let partition = self.served.partition_of(entity);
        if !self.ctx.reaches_server().await {
            return Err(CopyRefused::Transient(
                "queue copy timed out: cut off from the server".into(),
            ));
        }
        let mut w = self.ctx.world();
        if w.network.electing(Stream::Queue, w.now) {
            return Err(CopyRefused::Transient(
                "queue copy refused: no responders (leader election)".into(),
            ));
        }
        let rate = w.faults.refused_publish;
        if w.faulty && w.rng.chance(rate) {
            return Err(CopyRefused::Transient("queue copy refused".into()));
        }
        let now = w.now;
        w.streams.enqueue(self.source, partition, now);
        w.log(|| {
            format!(
                "h{} queues {} ({entity}) on partition {partition}",
                self.ctx.host, self.at.sequence
            )
        });
        Ok(())
    }

    async fn settle(&self, how: Settlement) {
        self.ctx.settle_unchecked(self.at, how.nak_ms())
    }

    fn count(&self, outcome: MessageOutcome) {
        self.ctx.count(outcome);
    }

    fn outage_delay(&self) -> Duration {
        self.ctx.outage_delay(self.at.number)
    }

    /// The model's messages always have an entity and fit: a dead letter here is a defect of
    /// the model or the host.
    async fn dead_letter(&self, reason: &str) {
        self.ctx.violation(format!(
            "h{} dead-letters {:?} {} instead of queueing it: {reason}",
            self.ctx.host, self.at.lane, self.at.sequence
        ));
    }
}
