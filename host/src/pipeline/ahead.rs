//! An exclusive route's queued message behind an earlier one of its entity that the server
//! gave up on: whether it waits is the delivery crate's ([`dedup_delivery::ahead`]); here is
//! how the host reads what is ahead (the queue subject's earlier messages, their keys, their
//! records from the claim store's leader).

use std::time::Duration;

use dedup_delivery::ahead::Ahead;
use dedup_delivery::claim::{ClaimError, ClaimRecord, ClaimStore};

use super::delays::outage_retry;
use super::delivering::NotClaimed;
use super::message::Delivery;
use super::Shared;
use crate::config::MissingKey;
use crate::metrics::MessageOutcome;
use crate::routes::Route;

/// The most given-up messages ahead read per delivery: more are lettered by the undeliverable
/// handler meanwhile, and the next delivery reads on.
const AHEAD_READ: usize = 16;

impl<S: ClaimStore> Shared<S> {
    /// Whether queued delivery `d` of `route` (key `key`) may go on to its claim; when not, it
    /// was naked ([`dedup_delivery::ahead::clear`]). Deliveries that were not queued go on.
    pub(super) async fn clear_ahead(&self, d: &Delivery, route: &Route, key: &str) -> bool {
        if d.queued.is_none() {
            return true;
        }
        let not_claimed = NotClaimed {
            shared: self,
            d,
            route,
            key,
        };
        dedup_delivery::ahead::clear(&not_claimed).await
    }
}

impl<S: ClaimStore> Ahead for NotClaimed<'_, S> {
    /// Earlier messages on the delivery's queue subject (its partition and entity hash; a
    /// colliding entity's only delays it): the work queue keeps a message until it is acked,
    /// terminated or dead-lettered, and the partition handed this one out, so any earlier one
    /// still there is one the server gave up on.
    async fn given_up(&self) -> Result<Vec<Option<ClaimRecord>>, ClaimError> {
        let Some((subject, sequence)) = &self.d.queued else {
            return Ok(Vec::new());
        };
        let shared = self.shared;
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            ClaimError::Unavailable(format!(
                "cannot read {what} ahead of this message in `{}`: {e}",
                crate::exclusive::stream_name(&shared.config)
            ))
        };
        let queue = (shared.js)
            .get_stream_no_info(crate::exclusive::stream_name(&shared.config))
            .await
            .map_err(|e| unavailable("the messages", &e))?;
        let mut records = Vec::new();
        let mut from = 1;
        let mut read_all = false;
        for _ in 0..AHEAD_READ {
            let ahead = match queue
                .get_first_raw_message_by_subject(subject.as_str(), from)
                .await
            {
                Ok(m) if m.sequence < *sequence => m,
                Ok(_) => {
                    read_all = true;
                    break;
                }
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
                {
                    read_all = true;
                    break;
                }
                Err(e) => return Err(unavailable("the messages", &e)),
            };
            from = ahead.sequence + 1;
            let Some((subject, source_sequence, headers)) =
                crate::exclusive::original(Some(&ahead.headers))
            else {
                continue; // not a copy the host queued: never claimed
            };
            let key = super::replayed::key_of(
                &shared.js,
                &shared.config.dead_letter.stream,
                &self.route.key,
                &subject,
                Some(&headers),
                &ahead.payload,
            )
            .await
            .map_err(|e| unavailable("the key of a message", &e))?;
            let key = match (key, self.route.missing_key) {
                (Ok(key), _) => key,
                (Err(_), MissingKey::StreamSequence) => format!("seq-{source_sequence}"),
                (Err(_), MissingKey::DeadLetter) => continue, // dead-lettered unclaimed
            };
            let claim_key = self.route.claim_key(&key);
            let record = match shared.claimer.store().get_from_leader(&claim_key).await {
                Ok(record) => record.map(|(r, _)| r),
                // No host can hold a lease in a record none can read: not a run to wait for
                // (its own delivery dead-letters it), and waiting on it would stall the
                // partition behind it for good.
                Err(ClaimError::Corrupt { .. }) => None,
                Err(e) => return Err(e),
            };
            records.push(record);
        }
        // More given-up messages than one delivery reads: one further on may still run, so
        // this one waits (the undeliverable handler letters those ahead meanwhile).
        if !read_all {
            return Err(ClaimError::Unavailable(format!(
                "more than {AHEAD_READ} given-up messages wait ahead of this one on `{subject}`; it waits until they are dead-lettered"
            )));
        }
        Ok(records)
    }

    fn skew(&self) -> Duration {
        self.shared.config.claims.clock_skew
    }

    fn unread(&self, error: &ClaimError) -> Duration {
        let span = self.d.span(&self.route.name);
        span.in_scope(|| tracing::warn!("{error}; will retry"));
        self.route.metrics.outcome(MessageOutcome::Error);
        outage_retry(&self.route.metrics, self.d.delivered)
    }
}
