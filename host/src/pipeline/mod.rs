//! Processing deliveries: one loop per route, each pulling from the route's own durable
//! consumer with its own budget of messages in flight and guest slots (so a slow or hostile
//! route cannot starve another), plus one that dead-letters what no route takes. Started and
//! stopped by [`crate::serve`].
//!
//! - `after`: a claim-after route's message (run, publish, then create the key completed): the
//!   run is the delivery crate's ([`dedup_delivery::after`]), `after` its adapters.
//! - `consume`: pulling a consumer's messages, re-creating it when it is deleted.
//! - `queue`: an exclusive route's messages queued per entity, in order (the order is the
//!   delivery crate's [`dedup_delivery::queue`]); `marked`: the stranded-message marker around
//!   a last delivery ([`dedup_delivery::marker`]), in the claim bucket.
//! - `ahead`: a queued message waits while an earlier one of its entity that the server gave
//!   up on may still run (the decision is [`dedup_delivery::ahead`]).
//! - `coalesce`: whether a coalescing route skips a message for a newer one that will run.
//! - `message`: one message, from its key and claim to the guest's outcome; the claim's
//!   answer and the run beside the heartbeat are the delivery crate's
//!   ([`dedup_delivery::before`]), `delivering` its adapters (JetStream, the guest, tokio's clock).
//! - `guest_call`: a guest call, on the calling thread or the guest threads.
//! - `undeliverable`: dead-letters what the server gave up delivering, now or once it can.
//! - `unreadable`: dead-letters at once a message whose header block the client could not parse.
//! - `settle`: what follows the outcome (publish and ack, retry, release, dead-letter), in
//!   the delivery crate's order; `settling`: the I/O it runs on.
//! - [`heartbeat`]: lease renewal plus progress acks while a guest runs.
//! - [`effects`]: outputs and dead letters, with deterministic message ids.

mod after;
mod ahead;
mod behind;
mod coalesce;
mod consume;
mod copier;
mod delays;
mod delivering;
pub mod effects;
mod guest_call;
pub mod heartbeat;
mod marked;
mod message;
mod pinned;
mod queue;
pub mod replayed;
mod reset;
mod settle;
mod settling;
mod stored;
mod undeliverable;
mod unreadable;

pub use delays::{busy_delay, infra_retry_ceiling};

use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim::{ClaimStore, Claimer};
use crate::config::Config;
use crate::metrics::RouteMetrics;
use crate::routes::{Route, Routes};

/// State shared by every in-flight message of one host.
pub(crate) struct Shared<S: ClaimStore> {
    js: async_nats::jetstream::Context,
    /// The client under `js`, for requests on its shared reply inbox.
    client: async_nats::Client,
    config: Arc<Config>,
    routes: Arc<Routes>,
    claimer: Claimer<S>,
    /// The claim bucket, where stranded messages are marked ([`crate::stranded`]).
    markers: async_nats::jetstream::kv::Store,
    guest_runtime: tokio::runtime::Handle,
    /// The series of messages no route takes, resolved once (the consumer of unrouted
    /// subjects sees every routed message too).
    unrouted: Arc<RouteMetrics>,
    /// Starts each delivery's spans, when traces are on ([`crate::telemetry`]).
    tracer: Option<Arc<crate::telemetry::Tracer>>,
    /// Runs candidates in shadow ([`crate::candidate::shadow`]).
    shadows: crate::candidate::shadow::Shadows,
    /// Sends fenced routes' commits, several to a batch ([`crate::fenced::group`]).
    fenced: crate::fenced::group::GroupCommits,
    /// This host's queued deliveries in progress ([`behind`]).
    in_progress: behind::InProgress,
}

impl<S: ClaimStore> Shared<S> {
    /// Everything the message loops of one host share; guests run on `guest_runtime`, and
    /// candidates' shadow runs through `shadows`.
    pub(crate) fn new(
        js: async_nats::jetstream::Context,
        config: Arc<Config>,
        routes: Arc<Routes>,
        claimer: Claimer<S>,
        markers: async_nats::jetstream::kv::Store,
        (guest_runtime, shadows): (tokio::runtime::Handle, crate::candidate::shadow::Shadows),
        tracer: Option<Arc<crate::telemetry::Tracer>>,
    ) -> Self {
        let unrouted = routes.metrics().route("");
        Self {
            client: js.client(),
            fenced: crate::fenced::group::GroupCommits::new(js.clone(), routes.metrics().batches()),
            js,
            config,
            routes,
            claimer,
            markers,
            guest_runtime,
            unrouted,
            tracer,
            shadows,
            in_progress: behind::InProgress::default(),
        }
    }

    /// The series of route `name` (of unrouted messages when empty).
    fn metrics(&self, name: &str) -> Arc<RouteMetrics> {
        if name.is_empty() {
            return self.unrouted.clone();
        }
        self.routes.metrics().route(name)
    }

    /// The series of `route`'s messages, or of unrouted ones.
    fn metrics_of(&self, route: Option<&Arc<Route>>) -> Arc<RouteMetrics> {
        route.map_or_else(|| self.unrouted.clone(), |r| r.metrics.clone())
    }
}

/// What a message loop does with what it pulls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Runs each message (a route's consumer, or the one for unrouted subjects).
    Process,
    /// Queues an exclusive route's messages per entity, in source order (one host, the
    /// route's copier, many at a time).
    Queue,
    /// Runs the messages of one partition of an exclusive route's queue.
    Partition(usize),
}

/// Starts the loop of one of a route's consumers; it ends when `stopped` turns true, after
/// draining (in-flight messages finish, pulled ones are handed back).
pub(crate) fn spawn_route<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    consumer: PullConsumer,
    route: Arc<Route>,
    role: Role,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(consume::consume(
        shared,
        consumer,
        Some(route),
        role,
        stopped,
    ))
}

/// Starts what serves no single route: the consumer of subjects no route takes (when there
/// is one), the handler of undeliverable messages and the sweep of stranded ones. They end when `stopped` turns true.
pub(crate) fn spawn_common<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    unrouted: Option<PullConsumer>,
    client: &async_nats::Client,
    stopped: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut loops = Vec::new();
    if let Some(consumer) = unrouted {
        loops.push(tokio::spawn(consume::consume(
            shared.clone(),
            consumer,
            None,
            Role::Process,
            stopped.clone(),
        )));
    }
    loops.push(tokio::spawn(undeliverable::run(
        shared.clone(),
        client.clone(),
        stopped.clone(),
    )));
    loops.push(tokio::spawn(undeliverable::sweep(
        shared,
        client.clone(),
        stopped.clone(),
    )));
    loops
}
