//! A simulated host's queueing of an exclusive route's source message as the host's own
//! queue stage sees it ([`dedup_delivery::queue`]): the copy onto the entity's partition of the
//! model's work queue (the partition from the host's real `exclusive::work_subject`,
//! deduplicated by source sequence) and the model's acks. Copy first, then ack, and what a
//! refused copy does are the host's, not restated here.

use std::time::Duration;

use dedup_delivery::copier::{CopierIo, CopyError, Refused, Turn, Window};
use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::queue::{CopyRefused, Queueing};
use dedup_delivery::settle::Settlement;

use super::consumer::Lane;
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
    /// Its place among its entity's copies, taken as it was handed out.
    pub(super) turn: &'a Turn,
    /// The pin it was handed out under (`Nats-Pin-Id`).
    pub(super) pin: Option<&'a str>,
}

impl Queueing for SimQueue<'_> {
    /// The model's messages always carry their entity.
    fn entity(&self) -> Result<String, String> {
        Ok(self.at.entity.clone())
    }

    /// By the host's copier ([`dedup_delivery::copier`]) over the model.
    async fn copy(&self, _entity: &str) -> Result<(), CopyRefused> {
        let io = SimCopier {
            ctx: self.ctx,
            served: self.served,
        };
        let source = self.source;
        let copy = |epoch| io.store(source, epoch);
        match self
            .ctx
            .copier
            .copy(&io, self.turn, (source, self.pin), copy)
            .await
        {
            Ok(()) => Ok(()),
            Err(CopyError::ForGood(e)) => Err(CopyRefused::ForGood(e)),
            Err(CopyError::Transient(e)) => Err(CopyRefused::Transient(e)),
            Err(CopyError::NotCopier(e)) => Err(CopyRefused::NotCopier(e)),
        }
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

/// A simulated host's copier I/O over the model: the route's epochs, its source consumer's
/// window, and copies fenced on the epoch.
struct SimCopier<'a> {
    ctx: &'a Ctx,
    served: &'a Served,
}

impl SimCopier<'_> {
    /// Whether a request to the work queue is answered now; refused at the rate of refused
    /// publishes while faults last.
    async fn answered(&self, what: &str) -> Result<(), String> {
        if !self.ctx.reaches_server().await {
            return Err(format!("{what} timed out: cut off from the server"));
        }
        let mut w = self.ctx.world();
        if w.network.electing(Stream::Queue, w.now) {
            return Err(format!("{what} refused: no responders (leader election)"));
        }
        let rate = w.faults.refused_publish;
        if w.faulty && w.rng.chance(rate) {
            return Err(format!("{what} refused"));
        }
        Ok(())
    }

    /// Copies source message `source` onto its entity's partition, fenced on `epoch`.
    async fn store(&self, source: u64, epoch: u64) -> Result<(), Refused> {
        self.answered("queue copy").await.map_err(Refused::Other)?;
        let mut w = self.ctx.world();
        if w.streams.epoch != epoch {
            return Err(Refused::Epoch);
        }
        let entity = w.streams.message(Lane::Source, source).entity.clone();
        let partition = self.served.partition_of(&entity);
        let now = w.now;
        w.streams.enqueue(source, partition, now);
        w.log(|| {
            format!(
                "h{} queues {source} ({entity}) on partition {partition} under epoch {epoch}",
                self.ctx.host
            )
        });
        Ok(())
    }
}

impl CopierIo for SimCopier<'_> {
    async fn last_epoch(&self) -> Result<u64, String> {
        self.answered("epoch read").await?;
        Ok(self.ctx.world().streams.epoch)
    }

    async fn write_epoch(&self, last: u64) -> Result<u64, Refused> {
        self.answered("epoch write").await.map_err(Refused::Other)?;
        let mut w = self.ctx.world();
        if w.streams.epoch != last {
            return Err(Refused::Epoch);
        }
        w.streams.epoch += 1;
        let epoch = w.streams.epoch;
        w.log(|| format!("h{} takes over copying: epoch {epoch}", self.ctx.host));
        Ok(epoch)
    }

    async fn window(&self) -> Result<Window, String> {
        self.answered("consumer info").await?;
        Ok(self.ctx.world().streams.source_window())
    }

    async fn copy_next(
        &self,
        after: u64,
        through: u64,
        epoch: u64,
    ) -> Result<Option<u64>, Refused> {
        let next = {
            let w = self.ctx.world();
            let last = through.min(w.streams.lane(Lane::Source).len() as u64);
            (after < last).then_some(after + 1)
        };
        let Some(source) = next else {
            return Ok(None);
        };
        self.store(source, epoch).await?;
        Ok(Some(source))
    }
}
