//! A simulated host's claimed delivery as the host's own settle order sees it
//! ([`dedup_delivery::settle::Settling`]): the model's output stream, fenced commits, dead
//! letters and acks. The order (publish, record, ack; fail, nak; release; dead-letter, record,
//! terminate) is not restated here: [`super::settle`] calls the host's functions.

use std::time::Duration;

use dedup_delivery::claim::{ClaimError, ClaimRecord, Lease, OutputRef};
use dedup_delivery::settle::{LetterRefused, Settlement, Settling};

use super::ctx::{At, Ctx};
use super::group;
use super::outputs::Outputs;
use super::store::SimStore;

/// One delivery a simulated host holds the claim for, settling.
pub struct SimSettle<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
    pub(super) lease: &'a Lease<SimStore>,
    /// The claims' store (the bucket, or the fenced stream's claim subjects).
    pub(super) store: &'a SimStore,
    /// The handler's outputs, when it succeeded.
    pub(super) output: Option<Outputs>,
    /// Whether the route is fenced (its outputs committed with the record, sized as batch
    /// members), as the delivery's host serves it.
    pub(super) fenced: bool,
    /// Whether an ack is checked against the key's record: not for a coalesced key, which any
    /// later delivery of it (this message's own redelivery included) may reclaim at once.
    pub(super) checked: bool,
}

impl Settling for SimSettle<'_> {
    type Store = SimStore;

    fn lease(&self) -> &Lease<SimStore> {
        self.lease
    }

    fn oversized(&self) -> Option<String> {
        let output = self.output.as_ref()?;
        let max = self.ctx.world().max_payload;
        output.oversized(&self.at.claim, self.fenced, max)
    }

    async fn publish(&self) -> Result<Vec<OutputRef>, String> {
        let Some(output) = &self.output else {
            return Ok(Vec::new());
        };
        let by = (self.at.key.as_str(), &output.version);
        self.ctx.publish(output.published(&self.at.claim), by).await
    }

    async fn commit(&self, record: ClaimRecord, revision: u64) -> Result<u64, ClaimError> {
        let output = self
            .output
            .as_ref()
            .expect("a fenced commit has its outputs");
        let key = format!("{}{}", self.store.space, self.at.claim);
        let laid_out = output.committed(&self.at.claim, &record, revision);
        let messages = group::messages(laid_out, &key, &record, revision);
        // The host's own group commit, as its pipeline commits.
        let left = self.lease.left_locally();
        let committed = self.ctx.group.commit(messages, left).await;
        let wrong = group::checked(&self.ctx.world(), &key, &record, revision, &committed);
        if let Some(what) = wrong {
            self.ctx.violation(what);
        }
        committed
    }

    async fn dead_letter(&self, _reason: &str) -> Result<(), LetterRefused> {
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

    async fn settle(&self, how: Settlement) {
        let nak = match how {
            Settlement::Ack | Settlement::Term => None,
            Settlement::Nak(delay) => Some(delay.as_millis() as u64),
        };
        match self.checked {
            true => (self.ctx).claimed_settle(self.at, nak, self.lease.fencing_token()),
            false => self.ctx.settle_unchecked(self.at, nak),
        }
    }

    fn release_delay(&self) -> Duration {
        self.ctx.release_delay(self.at.number)
    }

    /// Also notes that the key's lease may lapse unseen (a write went unanswered), which
    /// excuses an attempt it costs.
    fn unanswered_delay(&self) -> Duration {
        self.ctx.unconfirmed(&self.at.key);
        Duration::from_millis(self.ctx.settings.lease_ms)
    }
}
