//! An exclusive route's queued message and the messages of its entity ahead of it: whether it
//! waits, goes on or is dropped is the delivery crate's ([`dedup_delivery::ahead`]); here is
//! how the host reads the first message on its queue subject.

use std::time::Duration;

use async_nats::jetstream::stream::RawMessageErrorKind;
use dedup_delivery::ahead::Ahead;
use dedup_delivery::before::Unclaimed;
use dedup_delivery::claim::{ClaimError, ClaimStore};
use dedup_delivery::settle::Settlement;

use super::behind::Entered;
use super::delays::outage_retry;
use super::delivering::NotClaimed;
use super::message::Delivery;
use super::Shared;
use crate::metrics::MessageOutcome;
use crate::routes::Route;
use crate::stranded::{self, Marker, Origin};

/// The longest a queued delivery is held behind an earlier message of its entity before it is
/// naked.
const HOLD_MAX: Duration = Duration::from_secs(10);

impl<S: ClaimStore> Shared<S> {
    /// Whether queued delivery `d` of `route` (key `key`), in progress here as `entered`, may
    /// go on to its claim ([`dedup_delivery::ahead::clear`]); when not, it was settled.
    /// Deliveries that were not queued go on.
    pub(super) async fn clear_ahead(
        &self,
        d: &Delivery,
        route: &Route,
        key: &str,
        entered: Option<&Entered<'_>>,
    ) -> bool {
        let Some(entered) = entered else {
            return true;
        };
        let queued = self.queued(d, route, key, entered);
        dedup_delivery::ahead::clear(&queued).await
    }

    /// Queued delivery `d` of `route` (key `key`), in progress here as `entered`.
    fn queued<'a, 'e>(
        &'a self,
        d: &'a Delivery,
        route: &'a Route,
        key: &'a str,
        entered: &'a Entered<'e>,
    ) -> Queued<'a, 'e, S> {
        let not_claimed = NotClaimed {
            shared: self,
            d,
            route,
            key,
        };
        Queued {
            not_claimed,
            entered,
        }
    }

    /// Whether queued delivery `d`, whose claim `lease` was just won, still runs
    /// ([`dedup_delivery::ahead::still_first`]); when not, the claim was given back and the
    /// delivery settled. Deliveries that were not queued run.
    pub(super) async fn still_first<C: ClaimStore>(
        &self,
        d: &Delivery,
        route: &Route,
        key: &str,
        entered: Option<&Entered<'_>>,
        lease: &dedup_delivery::claim::Lease<C>,
    ) -> bool {
        let Some(entered) = entered else {
            return true;
        };
        let queued = self.queued(d, route, key, entered);
        // A redelivery always reads again: another delivery of its copy was made. A first one
        // by the age of its copy, by the stream's clock, allowing for the skew between clocks.
        let age = match d.delivered {
            1 => d.stored.elapsed() + self.config.claims.clock_skew,
            _ => Duration::MAX,
        };
        dedup_delivery::ahead::still_first(&queued, lease, age).await
    }
}

/// A queued delivery not claimed yet, recorded in progress on this host.
struct Queued<'a, 'e, S: ClaimStore> {
    not_claimed: NotClaimed<'a, S>,
    entered: &'a Entered<'e>,
}

impl<S: ClaimStore> Unclaimed for Queued<'_, '_, S> {
    async fn settle(&self, how: Settlement) {
        self.not_claimed.settle(how).await
    }

    fn count(&self, outcome: MessageOutcome) {
        self.not_claimed.count(outcome)
    }

    fn busy_delay(&self, retry_in: Duration) -> Duration {
        self.not_claimed.busy_delay(retry_in)
    }

    fn claim_failed(&self, error: &ClaimError) -> Duration {
        self.not_claimed.claim_failed(error)
    }

    async fn dead_letter(&self, reason: &str) {
        self.not_claimed.dead_letter(reason).await
    }
}

impl<S: ClaimStore> Ahead for Queued<'_, '_, S> {
    fn sequence(&self) -> u64 {
        let d = self.not_claimed.d;
        d.queued.as_ref().map_or(0, |(_, sequence)| *sequence)
    }

    /// An earlier delivery of its subject in progress on this host; else the first message on
    /// the delivery's queue subject (its partition and entity hash: a colliding entity's only
    /// delay it), one `STREAM.MSG.GET` from the stream's leader.
    async fn first(&self) -> Result<Option<u64>, ClaimError> {
        if let Some(earlier) = self.entered.earlier() {
            return Ok(Some(earlier));
        }
        let Some((subject, _)) = &self.not_claimed.d.queued else {
            return Ok(None);
        };
        let shared = self.not_claimed.shared;
        let stream = crate::exclusive::stream_name(&shared.config);
        let unavailable = |e: &dyn std::fmt::Display| {
            ClaimError::Unavailable(format!(
                "cannot read what is ahead of this message on `{subject}` in `{stream}`: {e}"
            ))
        };
        let queue = (shared.js.get_stream_no_info(&stream).await).map_err(|e| unavailable(&e))?;
        let mut from = 1;
        loop {
            let first = match queue
                .get_first_raw_message_by_subject(subject.as_str(), from)
                .await
            {
                Ok(m) => m.sequence,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
                Err(e) => return Err(unavailable(&e)),
            };
            // Acked or terminated here, its deletion not processed yet: its run ended. Or
            // found no longer handed out by its partition.
            let past = self.entered.gone_here(first) || self.entered.passed(first);
            match first < self.sequence() && past {
                true => from = first + 1,
                false => return Ok(Some(first)),
            }
        }
    }

    fn unread(&self, error: &ClaimError) -> Duration {
        let NotClaimed { d, route, .. } = &self.not_claimed;
        let span = d.span(&route.name);
        span.in_scope(|| tracing::warn!("{error}; will retry"));
        route.metrics.outcome(MessageOutcome::Error);
        outage_retry(&route.metrics, d.retry_count())
    }

    async fn behind(&self, delay: Duration) -> bool {
        self.entered.wait(delay).await
    }

    /// Read from the partition consumer's ack floor: at or below it, nothing is pending, so
    /// the server never hands that copy out again. Found so once, the delivery is naked; found
    /// so again seconds later, the copy is looked past.
    async fn passed(&self, earlier: u64) -> bool {
        let NotClaimed {
            shared, d, route, ..
        } = &self.not_claimed;
        let Some((subject, _)) = &d.queued else {
            return false;
        };
        // `<prefix>.<route>.<partition>.<entity hash>`
        let mut tokens = subject.rsplit('.');
        let partition = tokens.nth(1).and_then(|p| p.parse::<usize>().ok());
        let Some(partition) = partition else {
            return false;
        };
        let stream = crate::exclusive::stream_name(&shared.config);
        let name =
            crate::exclusive::partition_consumer_name(&shared.config, &route.name, partition);
        let floor = match shared.js.get_stream_no_info(&stream).await {
            Ok(queue) => match queue.consumer_info(&name).await {
                Ok(info) => info.ack_floor.stream_sequence,
                Err(e) => {
                    tracing::warn!("cannot read partition consumer `{name}`: {e}");
                    return false;
                }
            },
            Err(e) => {
                tracing::warn!("cannot read queue `{stream}`: {e}");
                return false;
            }
        };
        // Found so twice, seconds apart: not an acked copy the server is about to delete.
        if earlier > floor || !self.entered.pass(earlier, std::time::Instant::now()) {
            return false;
        }
        shared.routes.metrics().copies_passed().inc();
        let span = d.span(&route.name);
        span.in_scope(|| {
            tracing::warn!(
                "copy {earlier} on `{subject}` in `{stream}` is stored but never handed out again \
                 (at or below partition consumer `{name}`'s ack floor {floor}): the messages of \
                 its entity behind it go on, and the sweep of undeliverable messages deletes it \
                 (its key settled) or dead-letters it"
            )
        });
        // The sweep's own path: a settled key's copy is deleted, a running one waits, any
        // other is dead-lettered, then deleted (`undeliverable.rs`).
        let origin = Origin {
            stream: &stream,
            sequence: earlier,
            consumer: &name,
        };
        let reason = format!("partition consumer `{name}` no longer hands it out");
        stranded::mark(&shared.markers, &Marker::new(origin, 0, reason)).await;
        true
    }

    /// A third of the ack wait, at most [`HOLD_MAX`]: held longer, the server would hand the
    /// message out again meanwhile.
    fn hold(&self) -> Duration {
        (self.not_claimed.shared.config.source.ack_wait / 3).min(HOLD_MAX)
    }
}
