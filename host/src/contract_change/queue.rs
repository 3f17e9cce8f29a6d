//! Moving the messages queued for an exclusive route ([`crate::exclusive`]) to their
//! partitions under another count, in a way a stopped move can always be finished or undone.
//!
//! Each message is read from the queue stream's leader (`STREAM.MSG.GET`), published again
//! on its partition's subject under the target count, then deleted by sequence. A move that
//! stopped part-way leaves the moved copies behind the messages not yet moved, so queue
//! order no longer is each entity's order; the order the host queued them in is: every
//! queued copy carries its source sequence ([`crate::exclusive::headers::SEQUENCE`]). So each
//! move re-queues the whole route's queue sorted by source sequence, to the partitions of
//! the count it moves to: run again it finishes the move, run with the recorded count it
//! moves everything back, and no message stays on a partition nobody consumes.

use anyhow::Context as _;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::Context;

use crate::config::Config;

/// The queue of one exclusive route.
pub(super) struct RouteQueue {
    stream: Stream,
    /// `dedup.exclusive.<source stream>.<route>`: a partition token and the entity's hash
    /// follow.
    base: String,
    route: String,
}

/// A message waiting in the queue: where it is, and where it was in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Waiting {
    /// Its sequence in the source stream (the queue's sequence for a message without one).
    source_sequence: u64,
    /// Its sequence in the queue stream.
    sequence: u64,
}

impl RouteQueue {
    /// The queue of route `route`, or `None` when the deployment has no queue stream.
    pub(super) async fn open(js: &Context, config: &Config, route: &str) -> Option<Self> {
        let stream = js
            .get_stream(crate::exclusive::stream_name(config))
            .await
            .ok()?;
        Some(Self {
            stream,
            base: crate::exclusive::route_subjects(config, route),
            route: route.to_string(),
        })
    }

    /// Every message waiting in the route's queue, in the order the host queued them (by
    /// source sequence), copies a stopped move made twice of one message counted once each.
    pub(super) async fn waiting(&self) -> anyhow::Result<Vec<Waiting>> {
        let filter = format!("{}.>", self.base);
        let mut found = Vec::new();
        let mut next = 1;
        loop {
            let m = match self
                .stream
                .get_first_raw_message_by_subject(&filter, next)
                .await
            {
                Ok(m) => m,
                Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => break,
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "reading route `{}`'s queue at sequence {next}: {e}",
                        self.route
                    ))
                }
            };
            let source_sequence = m
                .headers
                .get(crate::exclusive::headers::SEQUENCE)
                .and_then(|v| v.as_str().parse().ok())
                .unwrap_or(m.sequence);
            found.push(Waiting {
                source_sequence,
                sequence: m.sequence,
            });
            next = m.sequence + 1;
        }
        found.sort();
        Ok(found)
    }

    /// Deletes the durable consumers of partitions `0..count` (hosts create those of the
    /// recorded count when they start the route).
    pub(super) async fn delete_partition_consumers(&self, config: &Config, count: u64) {
        for p in 0..count as usize {
            let name = crate::exclusive::partition_consumer_name(config, &self.route, p);
            let _ = self.stream.delete_consumer(&name).await;
        }
    }

    /// Re-queues `waiting` (from [`Self::waiting`]) on the partitions of `partitions`, in
    /// its order: each message is published again, then deleted, with every other copy of
    /// it (one source sequence) a stopped move left. The number of messages moved.
    pub(super) async fn requeue(
        &self,
        js: &Context,
        waiting: &[Waiting],
        partitions: u64,
    ) -> anyhow::Result<usize> {
        let partitions = partitions.max(1);
        let mut moved = 0;
        for group in waiting.chunk_by(|a, b| a.source_sequence == b.source_sequence) {
            // The newest copy is moved, so a copy made by an earlier move is never lost.
            let newest = group.last().expect("a group is never empty");
            let m = self
                .stream
                .get_raw_message(newest.sequence)
                .await
                .with_context(|| {
                    format!(
                        "reading queued message {} of route `{}`",
                        newest.sequence, self.route
                    )
                })?;
            let hash = m.subject.rsplit('.').next().unwrap_or_default().to_string();
            let entity = u64::from_str_radix(&hash, 16).unwrap_or(0);
            let subject = format!("{}.{}.{hash}", self.base, entity % partitions);
            let mut headers = m.headers.clone();
            let id = format!("{}.{}.p{partitions}", self.route, m.sequence);
            headers.insert(crate::idempotency::MSG_ID, id.as_str());
            js.publish_with_headers(subject, headers, m.payload.clone())
                .await?
                .await
                .with_context(|| {
                    format!(
                        "re-queueing message {} of route `{}` on its partition",
                        m.sequence, self.route
                    )
                })?;
            for copy in group {
                self.stream
                    .delete_message(copy.sequence)
                    .await
                    .with_context(|| {
                        format!(
                            "removing re-queued message {} of route `{}`",
                            copy.sequence, self.route
                        )
                    })?;
            }
            moved += 1;
        }
        Ok(moved)
    }
}
