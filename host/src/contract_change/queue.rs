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
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::{Context, ErrorCode};
use async_nats::HeaderMap;

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
    /// Its sequence in the source stream, as its header and its message id both say.
    source_sequence: u64,
    /// Its sequence in the queue stream.
    sequence: u64,
    /// The partition token of its subject.
    partition: u64,
}

/// Why a queue move refused a message it found, or stopped after moving.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A queued message whose source sequence the host did not write: its
    /// `Dedup-Source-Sequence` header is missing, or its `Nats-Msg-Id` does not carry it.
    #[error("route `{route}`: message {sequence} in queue stream `{stream}` was not queued by a host ({reason}), so its place in its entity's order is unknown and the move stopped before moving any queued message; look at it (`nats stream get {stream} {sequence}`), remove it (`nats stream rmm {stream} {sequence}`) or publish it again on the source stream, then run the change again")]
    NotQueuedByHost {
        /// The route.
        route: String,
        /// The queue stream.
        stream: String,
        /// Its sequence in the queue stream.
        sequence: u64,
        /// What does not agree.
        reason: String,
    },
    /// After the move, messages still sit on partitions the target count does not consume.
    #[error("route `{route}`: after moving its queue to {partitions} partition(s), message(s) still wait on partition(s) {stranded:?} of queue stream `{stream}`, which no consumer reads under that count; the change was not recorded: run it again (each run re-queues the whole queue)")]
    Stranded {
        /// The route.
        route: String,
        /// The queue stream.
        stream: String,
        /// The target count.
        partitions: u64,
        /// The partitions at or past it that hold messages.
        stranded: Vec<u64>,
    },
}

impl RouteQueue {
    /// The queue of route `route`, or `None` when the deployment has no queue stream (the
    /// server answered "stream not found"); any other error is returned, since a queue that
    /// could not be read may hold messages.
    pub(super) async fn open(
        js: &Context,
        config: &Config,
        route: &str,
    ) -> anyhow::Result<Option<Self>> {
        let name = crate::exclusive::stream_name(config);
        let stream = match js.get_stream(&name).await {
            Ok(stream) => stream,
            Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND) => {
                return Ok(None)
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "cannot read queue stream `{name}` of route `{route}` ({e}): its messages must move with the change; check that the server answers and that this config's NATS user may read `$JS.API.STREAM.INFO.{name}`, then run the change again"
                ))
            }
        };
        Ok(Some(Self {
            stream,
            base: crate::exclusive::route_subjects(config, route),
            route: route.to_string(),
        }))
    }

    /// The queue stream's name.
    fn stream_name(&self) -> String {
        self.stream.cached_info().config.name.clone()
    }

    /// The source sequence a queued message's headers give, checked against its message id:
    /// the host writes `<route>.<source sequence>` when it queues a message and
    /// `<route>.<source sequence>.q<queue sequence>.p<count>` when a move re-queues it.
    fn source_sequence(&self, headers: &HeaderMap, sequence: u64) -> Result<u64, QueueError> {
        let refused = |reason: String| QueueError::NotQueuedByHost {
            route: self.route.clone(),
            stream: self.stream_name(),
            sequence,
            reason,
        };
        let header = crate::exclusive::headers::SEQUENCE;
        let source: u64 = headers
            .get(header)
            .ok_or_else(|| refused(format!("it has no `{header}` header")))?
            .as_str()
            .parse()
            .map_err(|_| refused(format!("its `{header}` header is not a number")))?;
        let id = headers
            .get(crate::idempotency::MSG_ID)
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let carried = id
            .strip_prefix(&format!("{}.", self.route))
            .and_then(|rest| rest.split('.').next())
            .and_then(|s| s.parse::<u64>().ok());
        if carried != Some(source) {
            return Err(refused(format!(
                "its `{header}` header says {source}, its `{}` `{id}` does not",
                crate::idempotency::MSG_ID
            )));
        }
        Ok(source)
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
            let source_sequence = self.source_sequence(&m.headers, m.sequence)?;
            let partition = m
                .subject
                .strip_prefix(&format!("{}.", self.base))
                .and_then(|rest| rest.split('.').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(u64::MAX);
            found.push(Waiting {
                source_sequence,
                sequence: m.sequence,
                partition,
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
    /// it (one source sequence) a stopped move left, the run's `lease` kept before each. The
    /// number of messages moved.
    pub(super) async fn requeue(
        &self,
        js: &Context,
        waiting: &[Waiting],
        partitions: u64,
        lease: &mut super::Lease,
    ) -> anyhow::Result<usize> {
        let partitions = partitions.max(1);
        let mut moved = 0;
        for group in waiting.chunk_by(|a, b| a.source_sequence == b.source_sequence) {
            lease.keep().await?;
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
            // Stored `Nats-*` headers (expectations, a TTL) would be checked again against
            // the queue: only the message id the host sets goes with the copy.
            let mut headers = crate::exclusive::without_nats_headers(&m.headers);
            let id = format!(
                "{}.{}.q{}.p{partitions}",
                self.route, newest.source_sequence, m.sequence
            );
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
            lease.moved();
        }
        Ok(moved)
    }

    /// Fails, naming them, when messages of the route wait on partitions at or past
    /// `partitions` (read again after a move).
    pub(super) async fn check_none_past(&self, partitions: u64) -> anyhow::Result<()> {
        let partitions = partitions.max(1);
        let mut stranded: Vec<u64> = self
            .waiting()
            .await?
            .iter()
            .map(|w| w.partition)
            .filter(|p| *p >= partitions)
            .collect();
        stranded.sort();
        stranded.dedup();
        if stranded.is_empty() {
            return Ok(());
        }
        Err(QueueError::Stranded {
            route: self.route.clone(),
            stream: self.stream_name(),
            partitions,
            stranded,
        }
        .into())
    }
}
