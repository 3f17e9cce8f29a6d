//! Pulling one consumer's messages: pull requests that expire and carry idle heartbeats so a
//! dead pull is noticed, a consumer that is re-created when it was deleted (by an operator, a
//! re-created stream, another host's set-up), backoff on errors, a last delivery of a
//! one-at-a-time consumer marked as it arrives ([`crate::stranded`]), and at shutdown a nak
//! for every message pulled but not started, so another host takes it at once.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{MessagesErrorKind, Stream as Messages};
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::AckKind;
use futures::StreamExt;
use tokio::sync::{watch, Semaphore};

use super::{Role, Shared};
use crate::claim::ClaimStore;
use crate::routes::{Guest, Route};

/// How long one pull request waits for messages before the server ends it.
const PULL_EXPIRES: Duration = Duration::from_secs(2);
/// Idle heartbeat the server sends during a pull; two missed ones end the stream.
const PULL_HEARTBEAT: Duration = Duration::from_secs(1);
/// First and largest wait before pulling again after a failure.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Returns once the route is served (`served`) or not served (`!served`); never for the
/// consumer of unrouted subjects, which has no route to follow, when waiting for `!served`.
async fn until_served(route: &mut Option<watch::Receiver<Option<Guest>>>, served: bool) {
    match route {
        Some(rx) => {
            if rx.wait_for(|g| g.is_some() == served).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None if served => {}
        None => std::future::pending().await,
    }
}

impl<S: ClaimStore> Shared<S> {
    /// Creates or re-binds the consumer of `route` in `role` (or of unrouted subjects).
    async fn bind(
        &self,
        route: Option<&Route>,
        role: Role,
    ) -> anyhow::Result<Option<PullConsumer>> {
        if let (Some(r), Role::Partition(p)) = (route, role) {
            let queue = self
                .js
                .get_stream(crate::exclusive::stream_name(&self.config))
                .await?;
            return crate::exclusive::partition_consumer(&queue, &self.config, &r.name, p)
                .await
                .map(Some);
        }
        let source = self.js.get_stream(&self.config.source.stream).await?;
        match route {
            // The route as served decides, not `self.config` (frozen at start): a reload
            // may have added the route or made it exclusive.
            Some(r) => crate::setup::route_consumer(
                &source,
                &self.config,
                &r.name,
                &r.subject,
                crate::source_consumer::binds_exclusive(
                    &self.config,
                    &r.name,
                    r.exclusive.is_some(),
                ),
            )
            .await
            .map(Some),
            None => crate::setup::unrouted_consumer(&source, &self.config).await,
        }
    }
}

/// Pulls one consumer's messages until told to stop: a route's (`route` set) or the one for
/// subjects no route takes. A route's consumer pulls only while the route has a handler:
/// when its component is removed, pulling stops and its messages wait in the stream.
pub(super) async fn consume<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    mut consumer: PullConsumer,
    route: Option<Arc<Route>>,
    role: Role,
    mut stopped: watch::Receiver<bool>,
) {
    let in_flight = match (&route, role) {
        // The partition's window (`exclusive::PARTITION_WINDOW`).
        (_, Role::Partition(_)) => crate::exclusive::PARTITION_WINDOW as usize,
        // The copier's window (`exclusive::COPY_WINDOW`).
        (_, Role::Queue) => crate::exclusive::COPY_WINDOW as usize,
        (Some(r), Role::Process) => r.max_in_flight,
        (None, Role::Process) => shared.config.host.max_in_flight,
    };
    let batch = in_flight;
    // An exclusive route's source consumer hands its messages to one pinned host, its copier.
    let group = (role == Role::Queue).then_some(crate::exclusive::COPIER_GROUP);
    let copier = Arc::new(dedup_delivery::copier::Copier::default());
    let name = route.as_ref().map_or("(unrouted)", |r| r.name.as_str());
    // The copier's pull must not wait for a permit: the server renews its pin only while it
    // pulls (`exclusive::COPIER_PIN_TTL`), and copies stalled behind a takeover would lose it.
    // The consumer's window bounds its deliveries, so its permits are never the bound (twice
    // the window: a delivery handed out again while its first copy still runs).
    let permits_total = match role {
        Role::Queue => in_flight * 2,
        _ => in_flight,
    };
    let permits = Arc::new(Semaphore::new(permits_total));
    let mut serving = route.as_ref().map(|r| r.subscribe());
    let metrics = route.as_ref().map(|r| r.metrics.clone());
    let bound = |b: bool| {
        if let Some(m) = &metrics {
            m.set_bound(b);
        }
    };
    bound(true);
    let mut retry = RETRY_FIRST;
    let mut rebind = false;
    'pull: while !*stopped.borrow() {
        tokio::select! {
            _ = until_served(&mut serving, true) => {}
            _ = stopped.changed() => break,
        }
        if std::mem::take(&mut rebind) {
            match shared.bind(route.as_deref(), role).await {
                Ok(Some(c)) => {
                    tracing::info!(route = name, "consumer re-created");
                    consumer = c;
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(
                        route = name,
                        "cannot re-create the consumer, retrying in {retry:?}: {e:#}"
                    );
                    rebind = true;
                }
            }
        }
        let mut messages = match pull(&consumer, batch, group).await {
            Ok(m) => {
                bound(true);
                m
            }
            Err(e) => {
                bound(false);
                tracing::warn!(
                    route = name,
                    "cannot pull messages, retrying in {retry:?}: {e}"
                );
                rebind = true;
                tokio::select! { _ = tokio::time::sleep(retry) => {}, _ = stopped.changed() => break }
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        loop {
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => p.expect("semaphore open"),
                _ = stopped.changed() => {
                    nak_pulled(&mut messages).await;
                    break 'pull;
                }
                _ = until_served(&mut serving, false) => continue 'pull,
            };
            let next = tokio::select! {
                m = messages.next() => m,
                _ = stopped.changed() => {
                    nak_pulled(&mut messages).await;
                    break 'pull;
                }
                _ = until_served(&mut serving, false) => continue 'pull,
            };
            match next {
                Some(Ok(message)) => {
                    retry = RETRY_FIRST;
                    // Its place among its entity's copies, taken in the order handed out.
                    let turn = match (role, &route) {
                        (Role::Queue, Some(r)) => {
                            let entity = r.exclusive.as_ref().and_then(|e| {
                                let (s, h, p) =
                                    (&message.subject, message.headers.as_ref(), &message.payload);
                                super::copier::entity_of(e, s, h, p).ok()
                            });
                            Some(copier.turn(entity.as_deref()))
                        }
                        _ => None,
                    };
                    let shared = shared.clone();
                    let route = route.clone();
                    let copier = copier.clone();
                    // A message's work is a future of about 12 KiB: boxed once here, the task
                    // `spawn` moves through its layers stays small (the copies were 7 % of
                    // the I/O threads' samples in a profile of the pipeline benchmark).
                    tokio::spawn(async move {
                        match (role, route) {
                            (Role::Queue, Some(route)) => {
                                let turn = turn.expect("a queued message's turn");
                                Box::pin(shared.queue(message, &route, &copier, turn)).await
                            }
                            (_, route) => Box::pin(shared.process(message, route)).await,
                        }
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    let kind = e.kind();
                    tracing::warn!(
                        route = name,
                        "message stream error, pulling again in {retry:?}: {e}"
                    );
                    // A deleted consumer never comes back by itself; a missed heartbeat or
                    // no responders may mean the same after a stream was re-created.
                    rebind = matches!(
                        kind,
                        MessagesErrorKind::ConsumerDeleted
                            | MessagesErrorKind::NoResponders
                            | MessagesErrorKind::MissingHeartbeat
                    );
                    if rebind {
                        bound(false);
                    }
                    tokio::select! { _ = tokio::time::sleep(retry) => {}, _ = stopped.changed() => break 'pull }
                    retry = (retry * 2).min(RETRY_MAX);
                    continue 'pull;
                }
                None => {
                    tracing::warn!(
                        route = name,
                        "message stream ended, pulling again in {retry:?}"
                    );
                    rebind = true;
                    tokio::select! { _ = tokio::time::sleep(retry) => {}, _ = stopped.changed() => break 'pull }
                    retry = (retry * 2).min(RETRY_MAX);
                    continue 'pull;
                }
            }
        }
    }
    // Graceful shutdown: no new messages; wait for the in-flight ones within the bound.
    let grace = shared.config.host.shutdown_grace;
    let all = u32::try_from(permits_total).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(route = name, "shutdown: in-flight messages did not finish within {grace:?}; their claims will lapse and be retried");
    }
}

/// Starts a pull stream with an expiry and idle heartbeats.
async fn pull(
    consumer: &PullConsumer,
    batch: usize,
    group: Option<&str>,
) -> Result<Messages, async_nats::jetstream::consumer::StreamError> {
    let mut stream = consumer
        .stream()
        .max_messages_per_batch(batch)
        .expires(PULL_EXPIRES)
        .heartbeat(PULL_HEARTBEAT);
    if let Some(group) = group {
        stream = stream.group(group);
    }
    stream.messages().await
}

/// How long the pull must stay quiet at shutdown before it is dropped: a pull request the
/// server is answering may still bring messages, and each must be handed back.
const DRAIN_QUIET: Duration = Duration::from_millis(250);

/// Naks every message already pulled but not started, so another host gets it soon rather
/// than after the ack wait. The nak's delay outlasts this host's open pull request: redelivered
/// earlier, a message would go to that request, which nobody reads any more. Under steady
/// traffic the stream never goes quiet, so handing back ends after one pull's expiry; what
/// arrives later is redelivered after the ack wait.
async fn nak_pulled(messages: &mut Messages) {
    let mut naked = 0;
    let delay = PULL_EXPIRES + DRAIN_QUIET * 2;
    let until = tokio::time::Instant::now() + PULL_EXPIRES + DRAIN_QUIET;
    while let Ok(Ok(Some(Ok(message)))) =
        tokio::time::timeout_at(until, tokio::time::timeout(DRAIN_QUIET, messages.next())).await
    {
        if message.ack_with(AckKind::Nak(Some(delay))).await.is_ok() {
            naked += 1;
        }
    }
    if naked > 0 {
        tracing::info!(
            naked,
            "shutdown: handed back messages pulled but not started"
        );
    }
}
