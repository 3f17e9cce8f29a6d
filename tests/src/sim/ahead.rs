//! What is ahead of a queued message in the model, for the host's own decision whether it
//! waits ([`dedup_delivery::ahead`]): the earlier messages of its entity still in its
//! partition (the server gave up on them; settled ones are done), and their keys' records,
//! each read from the store's leader through the scheduler like any store call.

use std::time::Duration;

use dedup_delivery::ahead::Ahead;
use dedup_delivery::claim::{ClaimError, ClaimRecord};
use dedup_delivery::outcome::MessageOutcome;

use super::consumer::{Delivery, Lane};
use super::running::SimUnclaimed;

impl Ahead for SimUnclaimed<'_> {
    async fn given_up(&self) -> Result<Vec<Option<ClaimRecord>>, ClaimError> {
        let keys: Vec<String> = {
            let w = self.ctx.world();
            let me = w.streams.message(Lane::Queue, self.at.sequence);
            w.streams
                .lane(Lane::Queue)
                .iter()
                .filter(|m| m.sequence < me.sequence && m.delivery != Delivery::Done)
                .filter(|m| m.partition == me.partition && m.entity == me.entity)
                .map(|m| m.key.clone())
                .collect()
        };
        let mut records = Vec::new();
        for key in keys {
            records.push(self.store.get_fresh(&key).await?.map(|(r, _)| r));
        }
        Ok(records)
    }

    fn skew(&self) -> Duration {
        Duration::from_millis(self.ctx.settings.skew_ms)
    }

    /// A read refused by a leader election or cut off by a partition
    /// ([`super::network`]): an infrastructure error, naked with the outage backoff.
    fn unread(&self, _error: &ClaimError) -> Duration {
        self.ctx.count(MessageOutcome::Error);
        self.ctx.outage_delay(self.at.number)
    }
}
