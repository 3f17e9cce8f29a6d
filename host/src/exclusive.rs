//! Exclusive routes (`exclusive_by`): at most one message per entity runs at a time, across
//! every host, in the order the messages were published. Built from JetStream primitives
//! only (the design and its failure analysis: `docs/src/how/exclusive.md`):
//!
//! - the route's consumer on the source stream hands its messages to one pinned host, the
//!   route's copier ([`COPIER_GROUP`], a window of [`COPY_WINDOW`]), which copies them, each
//!   entity's in source order, onto
//!   `dedup.exclusive.<source stream>.<route>.<partition>.<entity>` in the work-queue stream
//!   `<source stream>_EXCLUSIVE`, and acks each once its copy is stored
//!   ([`dedup_delivery::copier`]). The copy's `Nats-Msg-Id` is the source sequence, so a copy
//!   made twice (a takeover copying what the last copier left) is stored once;
//! - each partition has a durable consumer handing out a window of [`PARTITION_WINDOW`]
//!   messages and never giving one up; an entity's copies lie in source order on one
//!   subject, and a delivery goes on to its claim only once it is the first on its subject
//!   ([`dedup_delivery::ahead`]). A nak (retry, busy claim) keeps the message in the queue,
//!   so its entity's next waits for it: order holds through retries, redeliveries and host
//!   deaths;
//! - an entity always hashes to the same partition; the route's `partitions` (recorded in its
//!   contract on the server, [`crate::contract`], so every host agrees) let other entities run
//!   in parallel.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::stream;
use async_nats::HeaderMap;

use crate::config::Config;
use crate::subject::EXCLUSIVE_PREFIX;

/// Headers the host sets on a message it queues for an exclusive route.
pub mod headers {
    /// The subject the message was published on.
    pub const SUBJECT: &str = "Dedup-Source-Subject";
    /// Its sequence in the source stream.
    pub const SEQUENCE: &str = "Dedup-Source-Sequence";
    /// Its own `Nats-Msg-Id` (the queued copy carries another).
    pub const MSG_ID: &str = "Dedup-Source-Msg-Id";
}

/// The work-queue stream of a deployment's exclusive routes.
pub fn stream_name(config: &Config) -> String {
    format!("{}_EXCLUSIVE", config.source.stream)
}

/// The subjects of that stream.
pub fn stream_subjects(config: &Config) -> String {
    format!("{EXCLUSIVE_PREFIX}{}.>", config.source.stream)
}

/// The number of partitions of a route: its `partitions` setting, never a host's size (hosts
/// of different sizes must put an entity on the same partition; `config` is the host's own,
/// read only by the test-only revert of that fix).
pub fn partitions(config: &Config, route: &crate::config::RouteConfig) -> usize {
    use dedup_delivery::revert::{reverted, Fix};
    if reverted(Fix::PartitionsFromContract) {
        return route.concurrency(&config.host).max(1);
    }
    route.partitions()
}

/// A stable hash of an entity key (FNV-1a, 64 bits): the same on every host and version.
pub fn entity_hash(entity: &str) -> u64 {
    entity.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The subjects of `route`'s queue, below which each partition has its own token.
pub fn route_subjects(config: &Config, route: &str) -> String {
    format!("{EXCLUSIVE_PREFIX}{}.{route}", config.source.stream)
}

/// Where a message of `entity` waits: its partition's subject, with the entity's hash as the
/// last token (the newest message per entity is found by that subject).
pub fn work_subject(config: &Config, route: &str, partitions: usize, entity: &str) -> String {
    let hash = entity_hash(entity);
    let partition = hash % partitions as u64;
    format!("{}.{partition}.{hash:016x}", route_subjects(config, route))
}

/// The durable consumer of one partition: `<source.consumer>-<route>-p<partition>`.
pub fn partition_consumer_name(config: &Config, route: &str, partition: usize) -> String {
    format!("{}-{route}-p{partition}", config.source.consumer)
}

/// Creates or updates the consumer of one partition of `route`.
pub async fn partition_consumer(
    work: &stream::Stream,
    config: &Config,
    route: &str,
    partition: usize,
) -> anyhow::Result<PullConsumer> {
    let name = partition_consumer_name(config, route, partition);
    let filter = format!("{}.{partition}.*", route_subjects(config, route));
    work.create_consumer(pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: filter,
        ack_policy: AckPolicy::Explicit,
        ack_wait: config.source.ack_wait,
        // Given up only far past any wait: the host counts attempts in the claim record and
        // dead-letters itself, and a message of an entity holds the next until its copy is
        // deleted (`dedup_delivery::ahead`).
        max_deliver: PARTITION_MAX_DELIVER,
        max_ack_pending: PARTITION_WINDOW,
        ..Default::default()
    })
    .await
    .with_context(|| {
        format!(
            "cannot create or bind consumer `{name}` of `{}`",
            stream_name(config)
        )
    })
}

/// How many of a partition's messages are out at once (its consumer's `max_ack_pending`):
/// messages of different entities run side by side, one entity's wait for each other
/// (`dedup_delivery::ahead`).
pub const PARTITION_WINDOW: i64 = 32;

/// How often a partition hands a message out before it gives it up: a backstop only, for a
/// message no host can take (a subject the client cannot parse drops its connection at each
/// delivery), far past any wait behind an entity's earlier message (10,000 naked waits of 11 s
/// are a day and more). A given-up copy is dead-lettered by its advisory, or by the sweep once
/// the next message of its entity finds it below the partition's ack floor.
pub const PARTITION_MAX_DELIVER: i64 = 10_000;

/// How long the route's source consumer waits for the ack of a message being queued (a copy
/// is one publish, though it may wait for its entity's previous copy or a takeover): then it
/// is handed out again, to the pinned host.
pub const ORDER_ACK_WAIT: Duration = Duration::from_secs(5);

/// How many of the route's source messages its copier holds at once (the source consumer's
/// `max_ack_pending`): their copies are sent without waiting for each other
/// (`pipeline/copier.rs`).
pub const COPY_WINDOW: i64 = 256;

/// The priority group of the route's source consumer: the server hands its messages to one
/// pinned host, the copier.
pub const COPIER_GROUP: &str = "copier";

/// How long the copier stays pinned without pulling: then another host's pull takes over.
pub const COPIER_PIN_TTL: Duration = ORDER_ACK_WAIT;

/// The subject of `route`'s copier epochs in the work queue: a host becomes the copier by
/// writing there, and every copy it stores is fenced on its write. It is the route's subjects'
/// stem itself, so nothing that reads the route's queued messages (`<stem>.>`: the partition
/// consumers, a partition change, `audit`'s floor) ever sees an epoch.
pub fn order_subject(config: &Config, route: &str) -> String {
    route_subjects(config, route)
}

/// The headers of the queued copy: the original's, plus where it came from; its
/// `Nats-Msg-Id` (the copy's dedup id) is `<route>.<sequence>`, the original's is kept aside.
/// The original's other `Nats-*` headers are dropped: the server would check an expectation
/// (`Nats-Expected-Last-Subject-Sequence`, `Nats-Expected-Stream`) or a `Nats-TTL` again
/// against the queue, where it does not hold, and the copy would never be stored.
pub fn queued_headers(
    original: Option<&HeaderMap>,
    route: &str,
    subject: &str,
    sequence: u64,
) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(original) = original {
        for (name, values) in original.iter() {
            for value in values {
                let name_str: &str = name.as_ref();
                if name_str.eq_ignore_ascii_case(crate::idempotency::MSG_ID) {
                    h.append(headers::MSG_ID, value.as_str());
                } else if !is_nats_header(name_str) {
                    h.append(name.clone(), value.clone());
                }
            }
        }
    }
    h.insert(headers::SUBJECT, subject);
    h.insert(headers::SEQUENCE, sequence.to_string().as_str());
    h.insert(
        crate::idempotency::MSG_ID,
        format!("{route}.{sequence}").as_str(),
    );
    h
}

/// Whether `name` is a header the server gives meaning to (`Nats-*`).
fn is_nats_header(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("Nats-"))
}

/// `headers` without any `Nats-*` header: what a queued message keeps when it is queued
/// again (the caller sets the copy's own `Nats-Msg-Id`).
pub fn without_nats_headers(headers: &HeaderMap) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, values) in headers.iter() {
        if is_nats_header(name.as_ref()) {
            continue;
        }
        for value in values {
            h.append(name.clone(), value.clone());
        }
    }
    h
}

/// The original of a queued copy: its subject, source sequence and headers as published
/// (with its own `Nats-Msg-Id` back). `None` when the copy lacks what the host set.
pub fn original(queued: Option<&HeaderMap>) -> Option<(String, u64, HeaderMap)> {
    let queued = queued?;
    let subject = queued.get(headers::SUBJECT)?.as_str().to_string();
    let sequence = queued.get(headers::SEQUENCE)?.as_str().parse().ok()?;
    let mut h = HeaderMap::new();
    for (name, values) in queued.iter() {
        let name_str: &str = name.as_ref();
        if [
            headers::SUBJECT,
            headers::SEQUENCE,
            crate::idempotency::MSG_ID,
        ]
        .iter()
        .any(|n| name_str.eq_ignore_ascii_case(n))
        {
            continue;
        }
        for value in values {
            if name_str.eq_ignore_ascii_case(headers::MSG_ID) {
                h.append(crate::idempotency::MSG_ID, value.as_str());
            } else {
                h.append(name.clone(), value.clone());
            }
        }
    }
    Some((subject, sequence, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_copy_gives_back_its_original() {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", "evt-1");
        h.insert("Account", "a-1");
        h.insert("Nats-Expected-Last-Subject-Sequence", "7");
        let queued = queued_headers(Some(&h), "ledger", "ledger.adjust.a-1", 42);
        assert_eq!(queued.get("Nats-Msg-Id").unwrap().as_str(), "ledger.42");
        assert!(queued.get("Nats-Expected-Last-Subject-Sequence").is_none());
        let (subject, sequence, back) = original(Some(&queued)).unwrap();
        assert_eq!((subject.as_str(), sequence), ("ledger.adjust.a-1", 42));
        assert_eq!(back.get("Nats-Msg-Id").unwrap().as_str(), "evt-1");
        assert_eq!(back.get("Account").unwrap().as_str(), "a-1");
        assert!(back.get(headers::SUBJECT).is_none() && back.get(headers::MSG_ID).is_none());
    }

    #[test]
    fn an_entity_always_lands_in_the_same_partition() {
        let config = Config::default();
        let a = work_subject(&config, "r", 16, "account-1");
        assert_eq!(a, work_subject(&config, "r", 16, "account-1"));
        assert!(a.starts_with("dedup.exclusive.DEDUP_EVENTS.r."), "{a}");
        let spread: std::collections::HashSet<u64> = (0..200)
            .map(|i| entity_hash(&format!("e{i}")) % 16)
            .collect();
        assert_eq!(spread.len(), 16, "200 entities reach every partition");
    }
}
