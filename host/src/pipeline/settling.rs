//! A claimed delivery as the delivery crate's settle order sees it
//! ([`dedup_delivery::settle::Settling`]): its outputs published over JetStream (or committed
//! with the completed record as one atomic batch on a fenced route), its dead letter, its acks,
//! and the host's spans and counters around them. The order itself is not here.

use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use dedup_delivery::claim::{ClaimError, ClaimRecord, ClaimStore, Lease, LeaseLost, OutputRef};
use dedup_delivery::settle::{LetterRefused, Settlement, Settling};
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

use super::delays::outage_retry_uncounted;
use super::effects::{self, DeadLetter, Outgoing};
use super::message::{Claimed, Delivery};
use super::Shared;
use crate::bindings::Output;
use crate::metrics::DedupLayer;
use crate::refusals::OutputRefused;

/// One claimed delivery of this host, settling.
pub(super) struct Settle<'a, 'c, S: ClaimStore> {
    pub(super) shared: &'a Shared<S>,
    pub(super) c: &'a Claimed<'c, S>,
    /// The guest's outputs (none unless it succeeded).
    pub(super) outputs: Vec<Output>,
    /// A window route's outputs with their headers and ids, made once for the size check and
    /// the publish.
    outgoing: Mutex<Option<Vec<Outgoing>>>,
    /// A fenced route's send span (one batch, one span) and the trace context its outputs
    /// carry.
    fenced: Option<(crate::telemetry::Child, Vec<(&'static str, String)>)>,
    /// When settling began: a refusal of an output subject since then is this delivery's.
    started: std::time::Instant,
}

impl<'a, 'c, S: ClaimStore> Settle<'a, 'c, S> {
    /// The settling of `c` on a path that stores no outputs (retry, release, give up, ...).
    pub(super) fn new(shared: &'a Shared<S>, c: &'a Claimed<'c, S>) -> Self {
        Self {
            shared,
            c,
            outputs: Vec::new(),
            outgoing: Mutex::new(None),
            fenced: None,
            started: std::time::Instant::now(),
        }
    }

    /// The settling of `c` after the guest succeeded with `outputs`: on a fenced route, with
    /// the send span of its commit.
    pub(super) fn succeeded(
        shared: &'a Shared<S>,
        c: &'a Claimed<'c, S>,
        outputs: Vec<Output>,
    ) -> Self {
        let fenced = c.route.fenced.as_deref().map(|stream| {
            let send = effects::send_span(&c.d.trace, stream, 0);
            send.set(|| vec![KeyValue::new("dedup.outputs", outputs.len() as i64)]);
            let trace = match send.headers() {
                Some(own) => own.iter().map(|(n, v)| (*n, v.clone())).collect(),
                None => trace_context(c.d)
                    .into_iter()
                    .map(|(n, v)| (n, v.to_string()))
                    .collect(),
            };
            (send, trace)
        });
        Self {
            shared,
            c,
            outputs,
            outgoing: Mutex::new(None),
            fenced,
            started: std::time::Instant::now(),
        }
    }

    /// The trace context a fenced route's outputs carry.
    fn fenced_trace(&self) -> Vec<(&str, &str)> {
        self.fenced
            .iter()
            .flat_map(|(_, t)| t.iter().map(|(n, v)| (*n, v.as_str())))
            .collect()
    }

    /// The fenced stream and the claim key its record is stored under.
    fn fenced_keys(&self) -> (&str, &str) {
        let stream = self.c.route.fenced.as_deref().unwrap_or_default();
        let subject = self.c.lease.key();
        let claim_key = crate::fenced::claim_key_of(stream, subject).unwrap_or(subject);
        (stream, claim_key)
    }

    /// A window route's outputs as published, made on first use.
    fn take_outgoing(&self) -> Vec<Outgoing> {
        let made = self.outgoing.lock().expect("outgoing lock").take();
        made.unwrap_or_else(|| self.make_outgoing())
    }

    fn make_outgoing(&self) -> Vec<Outgoing> {
        let trace = trace_context(self.c.d);
        effects::prepare_outputs(self.c.lease.key(), &self.outputs, &self.c.d.trace, &trace)
    }
}

impl<S: ClaimStore> Settling for Settle<'_, '_, S> {
    type Store = S;

    fn lease(&self) -> &Lease<S> {
        &self.c.lease
    }

    /// Also counts the handler's output-limit trap when they are.
    fn oversized(&self) -> Option<String> {
        let js = &self.shared.js;
        let reason = if self.c.route.fenced.is_some() {
            let trace = self.fenced_trace();
            let (_, claim_key) = self.fenced_keys();
            effects::oversized(
                js,
                claim_key,
                effects::fenced_sizes(claim_key, &self.outputs, &trace),
            )
        } else {
            let outgoing = self.make_outgoing();
            let sizes = outgoing.iter().map(|o| o.wire_size());
            let subjects = self.outputs.iter().map(|o| o.subject.as_str());
            let reason = effects::oversized(js, self.c.lease.key(), subjects.zip(sizes));
            *self.outgoing.lock().expect("outgoing lock") = Some(outgoing);
            reason
        };
        if reason.is_some() {
            let kind = crate::runtime::TrapKind::OutputLimit;
            self.c.route.metrics.trap(kind.as_str());
        }
        reason
    }

    async fn publish(&self) -> Result<Vec<OutputRef>, String> {
        match effects::publish_outputs(&self.shared.js, self.take_outgoing()).await {
            Ok(published) => {
                let metrics = &self.c.route.metrics;
                metrics.outputs(self.outputs.len() as u64);
                let duplicates = published.iter().filter(|o| o.duplicate).count();
                metrics.hit(DedupLayer::Output, duplicates as u64);
                Ok(published)
            }
            Err(e) => {
                tracing::warn!("{e:#}");
                Err(format!("{e:#}"))
            }
        }
    }

    /// A publish (or a fenced batch message) of one of the outputs that the server refused
    /// for lack of permission since settling began.
    fn refused_for_good(&self) -> Option<String> {
        let route = self.c.route;
        let filters = route.options.allowed_outputs.as_deref().unwrap_or_default();
        let subjects = self.outputs.iter().map(|o| o.subject.as_str());
        let refused = OutputRefused::find(&route.name, filters, subjects, self.started)?;
        Some(refused.to_string())
    }

    async fn commit(&self, record: ClaimRecord, revision: u64) -> Result<u64, ClaimError> {
        let (stream, claim_key) = self.fenced_keys();
        let trace = self.fenced_trace();
        let subject = self.c.lease.key();
        let batch = crate::fenced::commit::prepare(
            (subject, claim_key),
            &record,
            revision,
            &self.outputs,
            &trace,
        );
        // A commit queued for its batch is not sent once the lease lapsed by our clock.
        let left = self.c.lease.left_locally();
        let committed = self.shared.fenced.commit(stream, batch, left).await;
        if committed.is_ok() {
            self.c.route.metrics.outputs(self.outputs.len() as u64);
        }
        committed
    }

    async fn recording<F>(&self, write: F) -> Result<(), LeaseLost>
    where
        F: std::future::Future<Output = Result<(), LeaseLost>> + Send,
    {
        let started = std::time::Instant::now();
        // A fenced commit has its send span; a window route's record gets its own.
        let span = self.c.route.fenced.is_none().then(|| {
            self.c
                .d
                .trace
                .child(|| "record".into(), SpanKind::Internal, Vec::new)
        });
        let written = write.await;
        match (&written, span) {
            (Err(e), Some(span)) => span.error("record_error", || e.to_string()),
            (Ok(()), _) => self.c.route.metrics.claim_write(started.elapsed()),
            _ => {}
        }
        written
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), LetterRefused> {
        let c = self.c;
        let letter = DeadLetter {
            reason,
            attempt: c.lease.attempt(),
            route: &c.route.name,
            key: c.key,
            // One letter per stored copy: a replay (a new sequence) that fails again gets its own.
            id: format!("dl:{}:{}", c.lease.key(), c.d.sequence),
            digest: c.guest.digest(),
        };
        let stored = self
            .shared
            .publish_dead_letter(c.d, letter, &c.route.metrics)
            .await;
        stored.map_err(LetterRefused::from)
    }

    async fn settle(&self, how: Settlement) {
        let d = self.c.d;
        match how {
            Settlement::Ack => self.shared.ack_recorded(self.c).await,
            Settlement::Nak(delay) => self.shared.settle(d, AckKind::Nak(Some(delay))).await,
            Settlement::Term => self.shared.settle(d, AckKind::Term).await,
        }
    }

    fn release_delay(&self) -> Duration {
        outage_retry_uncounted(&self.c.route.metrics, self.c.d.retry_count())
    }

    fn unanswered_delay(&self) -> Duration {
        self.shared.config.claims.lease
    }
}

/// The event's W3C trace-context headers, carried to its outputs.
pub(super) fn trace_context(d: &Delivery) -> Vec<(&'static str, &str)> {
    let Some(headers) = &d.message.headers else {
        return Vec::new();
    };
    [super::message::TRACEPARENT, "tracestate"]
        .into_iter()
        .filter_map(|name| headers.get(name).map(|v| (name, v.as_str())))
        .collect()
}
