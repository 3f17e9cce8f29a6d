//! A delivery as the delivery crate's claim-before loop sees it ([`dedup_delivery::before`]):
//! one whose claim was not won ([`NotClaimed`]: acks, naks and dead letters over JetStream,
//! counted and logged in the delivery's span), and one whose handler runs under the lease
//! ([`Run`]: the Wasm guest, progress acks, tokio's clock, the settle world of
//! [`super::settling`]). The decisions (busy, duplicate, the run beside the heartbeat, which
//! outcome settles how) are not here.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use dedup_delivery::before::{self, ClaimedDelivery, Handled, Unclaimed};
use dedup_delivery::claim::{ClaimError, ClaimOutcome, ClaimStore, Lease};
use dedup_delivery::clock::Tokio;
use dedup_delivery::heartbeat::Progress;
use dedup_delivery::pinned::Gone;
use dedup_delivery::settle::{Retries, Settlement};
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use tracing::Instrument as _;

use super::delays::{outage_retry, pool_full_retry};
use super::message::{event, invoked, Claimed, Delivery};
use super::settling::Settle;
use super::Shared;
use crate::bindings::Output;
use crate::metrics::{DedupLayer, MessageOutcome};
use crate::routes::Route;
use crate::runtime::{Invocation, Outcome, TrapKind};

impl<S: ClaimStore> Shared<S> {
    /// Settles delivery `d` of `route` (key `key`) whose claim was not won, through
    /// [`before::claimed`]; the lease when it was.
    pub(super) async fn settle_unclaimed(
        &self,
        d: &Delivery,
        route: &Route,
        key: &str,
        claimed: Result<ClaimOutcome<S>, ClaimError>,
    ) -> Option<Box<Lease<S>>> {
        let not_claimed = NotClaimed {
            shared: self,
            d,
            route,
            key,
        };
        before::claimed(&not_claimed, claimed).await
    }

    /// Runs claimed delivery `c` beside its heartbeat and settles it ([`before::run`]).
    pub(super) async fn run_before(&self, c: &Claimed<'_, S>) -> MessageOutcome {
        before::run(&Run { shared: self, c }).await
    }
}

/// A delivery of `route` with key `key` whose claim this host did not win.
pub(super) struct NotClaimed<'a, S: ClaimStore> {
    pub(super) shared: &'a Shared<S>,
    pub(super) d: &'a Delivery,
    pub(super) route: &'a Route,
    pub(super) key: &'a str,
}

impl<S: ClaimStore> Unclaimed for NotClaimed<'_, S> {
    /// A plain ack (nothing of this host's was recorded), in the delivery's span.
    async fn settle(&self, how: Settlement) {
        let kind = match how {
            Settlement::Ack => AckKind::Ack,
            Settlement::Nak(delay) => AckKind::Nak(Some(delay)),
            Settlement::Term => AckKind::Term,
        };
        let span = self.d.span(&self.route.name);
        self.shared.settle(self.d, kind).instrument(span).await
    }

    fn count(&self, outcome: MessageOutcome) {
        self.route.metrics.outcome(outcome);
    }

    fn busy_delay(&self, retry_in: Duration) -> Duration {
        let c = &self.shared.config;
        super::delays::busy_delay(
            retry_in,
            c.claims.lease + c.claims.clock_skew,
            c.max_backoff(),
        )
    }

    fn claim_failed(&self, error: &ClaimError) -> Duration {
        let span = self.d.span(&self.route.name);
        span.in_scope(|| tracing::warn!("claim failed, will retry: {error}"));
        self.route.metrics.outcome(MessageOutcome::Error);
        outage_retry(&self.route.metrics, self.d.retry_count())
    }

    async fn dead_letter(&self, reason: &str) {
        let span = self.d.span(&self.route.name);
        (self.shared)
            .dead_letter_unclaimed(self.d, &self.route.name, self.key, reason)
            .instrument(span)
            .await
    }
}

/// A claimed delivery of this host whose guest runs under the lease.
pub(super) struct Run<'a, 'c, S: ClaimStore> {
    pub(super) shared: &'a Shared<S>,
    pub(super) c: &'a Claimed<'c, S>,
}

impl<S: ClaimStore> Progress for Run<'_, '_, S> {
    /// A JetStream progress ack (`+WPI`).
    async fn progress(&self) -> Result<(), String> {
        (self.c.d.acker)
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| e.to_string())
    }
}

impl<'a, 'c, S: ClaimStore> ClaimedDelivery for Run<'a, 'c, S> {
    type Store = S;
    type Outputs = Vec<Output>;
    type Settle = Settle<'a, 'c, S>;
    type Clock = Tokio;

    fn lease(&self) -> &Lease<S> {
        &self.c.lease
    }

    fn fenced(&self) -> bool {
        self.c.route.fenced.is_some()
    }

    fn count_outputs(outputs: &Vec<Output>) -> u32 {
        outputs.len() as u32
    }

    fn settling(&self) -> Settle<'a, 'c, S> {
        Settle::new(self.shared, self.c)
    }

    fn succeeded(&self, outputs: Vec<Output>) -> Settle<'a, 'c, S> {
        Settle::succeeded(self.shared, self.c, outputs)
    }

    async fn superseded(&self) -> bool {
        self.shared.superseded(self.c).await
    }

    fn pinned_gone(&self) -> Option<&Gone> {
        self.c.gone.as_ref()
    }

    /// Read from the components bucket, or this host's files ([`Shared::offered`]).
    async fn offered(&self, digest: &str) -> Result<bool, String> {
        let offered = self.shared.offered(self.c.route, digest).await;
        offered.map_err(|e| format!("{e:#}"))
    }

    fn jittered(&self, ceiling: Duration) -> Duration {
        dedup_delivery::backoff::jittered(ceiling, rand::random_range(0.0..=1.0))
    }

    /// The guest, in the delivery's `handle` span; what it took is counted.
    async fn invoke(&self, attempt: u32) -> Result<Handled<Vec<Output>>, String> {
        let c = self.c;
        let event = event(c.d, c.route, c.key, attempt, c.lease.fencing_token());
        let span =
            c.d.trace
                .child(|| "handle".into(), SpanKind::Internal, Vec::new);
        let journal = self.journal();
        let called = self
            .shared
            .call_guest(
                c.route,
                c.guest.clone(),
                event,
                journal,
                c.d.trace.call_tracer(),
            )
            .await;
        if let Ok(invocation) = &called {
            span.set(|| guest_attributes(invocation));
            if let Outcome::Trap(trap) = &invocation.outcome {
                span.error(trap.kind.as_str(), || trap.message.clone());
            }
        }
        drop(span);
        let invocation = match called {
            Ok(invocation) => invocation,
            Err(e) => {
                tracing::warn!("guest task ended without an outcome: {e}");
                return Err(format!("guest task ended without an outcome: {e}"));
            }
        };
        invoked(c.d, c.route, &invocation);
        Ok(match invocation.outcome {
            Outcome::Success(outputs) => Handled::Succeeded(outputs),
            Outcome::Retry { reason, delay } => Handled::Retry { reason, delay },
            Outcome::Trap(trap) if trap.kind == TrapKind::PoolFull => Handled::PoolFull {
                reason: trap.to_string(),
            },
            Outcome::Trap(trap) => Handled::Trapped {
                permanent: c.route.is_permanent(trap.kind),
                reason: trap.to_string(),
            },
            Outcome::Reject { reason } => Handled::Rejected { reason },
        })
    }

    fn retries(&self) -> Retries {
        let config = &self.shared.config;
        Retries {
            max: config.source.max_deliver,
            backoff: config.backoff_for(self.c.lease.attempt()),
            max_backoff: config.max_backoff(),
        }
    }

    fn pool_full_delay(&self) -> Duration {
        pool_full_retry(self.c.d.retry_count())
    }

    fn heartbeat(&self) -> Duration {
        self.shared.config.claims.heartbeat
    }

    fn clock(&self) -> &Tokio {
        &Tokio
    }

    fn fence_refused(&self) {
        self.c.route.metrics.hit(DedupLayer::Fence, 1);
    }
}

impl<S: ClaimStore> Run<'_, '_, S> {
    /// The journal of this run's outbound calls, beside its claim, when the route grants
    /// outbound HTTP (DESIGN.md rule 24).
    fn journal(&self) -> Option<dedup_delivery::journal::Journal> {
        let c = self.c;
        let grant = c.route.options.http.as_ref()?;
        let store = crate::claim::journal::NatsCallStore::for_claim(
            &self.shared.js,
            &self.shared.config.claims.bucket,
            c.lease.key(),
            c.lease.fencing_token(),
        )
        .held_at(c.lease.held_revision());
        // A renamed route's key keeps the idempotency keys of its old name (rule 24).
        let claim_key = match c.lease.calls_as() {
            Some(old) => old.to_string(),
            None => crate::claim::key::encode(&c.route.name, c.key),
        };
        let journal = dedup_delivery::journal::Journal::new(
            std::sync::Arc::new(store),
            &claim_key,
            grant.on_unknown(),
        );
        Some(journal)
    }
}

/// A guest call's span attributes: how it ended, its time, fuel and memory.
fn guest_attributes(invocation: &Invocation) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("dedup.guest.outcome", invocation.outcome.kind()),
        KeyValue::new(
            "dedup.guest.elapsed_us",
            invocation.elapsed.as_micros() as i64,
        ),
        KeyValue::new("dedup.guest.memory_bytes", invocation.memory_bytes as i64),
    ];
    if let Some(fuel) = invocation.fuel {
        attributes.push(KeyValue::new("dedup.guest.fuel", fuel as i64));
    }
    attributes
}
