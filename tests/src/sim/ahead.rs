//! The first message on a queued delivery's queue subject in the model, for the host's own
//! decision whether it waits, goes on or is dropped ([`dedup_delivery::ahead`]): the earliest
//! message of its partition and entity still in the work queue (a settled one is deleted),
//! answered at once unless the work queue has no leader or the host is cut off from it.

use std::time::Duration;

use dedup_delivery::ahead::Ahead;
use dedup_delivery::claim::ClaimError;
use dedup_delivery::clock::Clock as _;
use dedup_delivery::outcome::MessageOutcome;

use super::consumer::{Delivery, Lane};
use super::network::Stream;
use super::running::SimUnclaimed;

impl Ahead for SimUnclaimed<'_> {
    fn sequence(&self) -> u64 {
        self.at.sequence
    }

    async fn first(&self) -> Result<Option<u64>, ClaimError> {
        if !self.ctx.reaches_server().await {
            return Err(ClaimError::Unavailable(
                "timed out: cut off from the server".into(),
            ));
        }
        let w = self.ctx.world();
        if w.network.electing(Stream::Queue, w.now) {
            return Err(ClaimError::Unavailable(
                "no responders: the work queue has no leader".into(),
            ));
        }
        let me = w.streams.message(Lane::Queue, self.at.sequence);
        let first = (w.streams.lane(Lane::Queue).iter())
            .filter(|m| m.delivery != Delivery::Done)
            .filter(|m| m.partition == me.partition && m.entity == me.entity)
            .map(|m| m.sequence)
            .min();
        Ok(first)
    }

    /// A read refused by a leader election or cut off by a partition
    /// ([`super::network`]): an infrastructure error, naked with the outage backoff.
    fn unread(&self, _error: &ClaimError) -> Duration {
        self.ctx.count(MessageOutcome::Error);
        self.ctx.outage_delay(self.at.number)
    }

    /// The model's hosts are woken by their reads only.
    async fn behind(&self, delay: Duration) -> bool {
        self.ctx.sleep(delay).await;
        false
    }

    /// As the host: a third of the ack wait, at most ten seconds.
    fn hold(&self) -> Duration {
        Duration::from_millis(self.ctx.settings.ack_wait_ms / 3).min(Duration::from_secs(10))
    }

    /// The model's queue deletes a copy as it is settled and gives none up: none is passed.
    async fn passed(&self, _earlier: u64) -> bool {
        false
    }
}
