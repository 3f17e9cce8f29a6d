//! Coalescing (`coalesce` on an exclusive route): a message is skipped, its key completed
//! without running, when a newer message of its entity waits in the queue, since that one
//! runs with the newest state. Only when it will run: a newer message whose key already
//! completed (a key from a JSON pointer, a resend after the dedup window) or was
//! dead-lettered is acked as a duplicate, and one without a key may be dead-lettered, so
//! skipping for it would leave the entity's update run by neither. And only for a newer
//! message of the same entity value: the queue subject carries the entity's hash, which two
//! values may share.

use async_nats::jetstream::message::StreamMessage;
use dedup_delivery::coalesce;

use super::message::{Claimed, Delivery};
use super::Shared;
use crate::claim::ClaimStore;
use crate::config::{KeySource, MissingKey};
use crate::idempotency;
use crate::routes::Route;

impl<S: ClaimStore> Shared<S> {
    /// Whether a coalescing route's message has a newer one of its entity waiting that
    /// will run. Any doubt (a read that fails, a key that cannot be told) runs this one:
    /// running both is only wasted work, running neither loses the update.
    pub(super) async fn superseded(&self, c: &Claimed<'_, S>) -> bool {
        let Some(exclusive) = c.route.exclusive.as_ref().filter(|e| e.coalesce) else {
            return false;
        };
        let Some((subject, sequence)) = c.d.queued.as_ref() else {
            return false;
        };
        let Ok(queue) = self
            .js
            .get_stream_no_info(crate::exclusive::stream_name(&self.config))
            .await
        else {
            return false;
        };
        let newest = match queue
            .get_last_raw_message_by_subject(subject.as_str())
            .await
        {
            Ok(newest) if newest.sequence > *sequence => newest,
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!("cannot tell whether a newer message waits, running this one: {e}");
                return false;
            }
        };
        if !same_entity(&exclusive.by, c.d, &newest) {
            tracing::debug!("the newer message on this queue subject is of another entity (their hashes collide), running this one");
            return false;
        }
        match self.will_run(c.route, &newest, c.d.sequence).await {
            Ok(will) => will,
            Err(why) => {
                tracing::debug!(
                    "cannot tell whether the newer message will run, running this one: {why}"
                );
                false
            }
        }
    }

    /// Whether the queued message `newest` of `route` will run: it has a key (or the route
    /// keys such messages by sequence), fits the route, and its key is neither completed
    /// (other than by coalescing, which a later message runs again, or by a message after
    /// ours, source sequence `ours`) nor dead-lettered ([`coalesce::will_run`]).
    async fn will_run(
        &self,
        route: &Route,
        newest: &StreamMessage,
        ours: u64,
    ) -> Result<bool, String> {
        let (subject, sequence, headers) = crate::exclusive::original(Some(&newest.headers))
            .ok_or("the queued copy lacks its source headers")?;
        if newest.payload.len() > route.max_payload_bytes {
            return Ok(false);
        }
        if idempotency::replay_claim(&route.key, Some(&headers)).is_some() {
            // A dead-letter replay is keyed only once its letter proves it: not told here.
            return Err("a dead-letter replay".into());
        }
        let key = match idempotency::derive(&route.key, &subject, Some(&headers), &newest.payload) {
            Ok(key) => key,
            Err(_) => match route.missing_key {
                MissingKey::DeadLetter => return Ok(false),
                MissingKey::StreamSequence => format!("seq-{sequence}"),
            },
        };
        // From the leader: a lagging replica can show a key that completed as still in
        // progress, and both messages would then go unrun (the simulation's seed 61
        // `--coalesce`).
        let record = self
            .claimer
            .store()
            .get_from_leader(&route.claim_key(&key))
            .await
            .map_err(|e| e.to_string())?;
        Ok(coalesce::will_run(
            record.as_ref().map(|(r, _)| r),
            (ours, sequence),
        ))
    }
}

/// Whether the queued message `newest` is of the same entity as delivery `d`, compared by the
/// full entity value: a queue subject carries only the entity's 64-bit FNV-1a hash, which
/// crafted values can share, and one entity's update must never be skipped for another's.
fn same_entity(by: &KeySource, d: &Delivery, newest: &StreamMessage) -> bool {
    let Some((subject, _, headers)) = crate::exclusive::original(Some(&newest.headers)) else {
        return false;
    };
    let theirs = idempotency::derive(by, &subject, Some(&headers), &newest.payload);
    let m = &d.message;
    let ours = idempotency::derive(by, &m.subject, m.headers.as_ref(), &m.payload);
    matches!((ours, theirs), (Ok(a), Ok(b)) if a == b)
}
