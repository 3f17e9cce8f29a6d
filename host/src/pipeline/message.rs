//! One message through the pipeline: route, key, claim, then run it with heartbeats; what
//! follows the guest's outcome is in [`super::settle`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::time::Duration;

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::{self, AckKind};
use dedup_delivery::marker;

use super::behind::Entered;
use super::marked::Marked;
use super::Shared;
use crate::bindings::{Event, Header};
use crate::claim::{ClaimError, ClaimOutcome, ClaimStore, Lease};
use crate::config::MissingKey;
use crate::routes::{Guest, Route};
use crate::runtime::{Invocation, Outcome};
use crate::stranded::{self, Marker, Origin};
use crate::telemetry::Trace;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use tracing::Instrument as _;

/// The W3C trace-context header: carried from an event to its outputs and dead letters.
pub(super) const TRACEPARENT: &str = "traceparent";

/// Nak delay of a message pulled just before its route stopped being served.
const NOT_SERVED_RETRY: Duration = Duration::from_secs(1);

/// A delivery this host holds the claim for, with everything settling it needs.
pub(super) struct Claimed<'a, S: ClaimStore> {
    pub(super) d: &'a Delivery,
    pub(super) route: &'a Route,
    /// The handler version this delivery runs on (its digest is in the claim record).
    pub(super) guest: Guest,
    pub(super) key: &'a str,
    pub(super) lease: Arc<Lease<S>>,
    /// The version the claim names, when it is not installed here: not run
    /// ([`dedup_delivery::before::run`] settles it unless it is superseded).
    pub(super) gone: Option<dedup_delivery::pinned::Gone>,
}

/// The most deliveries of a queued copy its retry delays count ([`Delivery::retry_count`]):
/// an outage naks it every few seconds at most.
const QUEUED_RETRY_COUNT: u64 = 4;

/// The parts of a delivery the pipeline works with.
pub(super) struct Delivery {
    pub(super) message: async_nats::Message,
    pub(super) acker: Acker,
    /// The delivery's ack subject, for an ack the server confirms.
    pub(super) reply: Option<async_nats::Subject>,
    /// The message's sequence in the source stream.
    pub(super) sequence: u64,
    /// For an exclusive route: where the message waited in the queue (subject, sequence).
    pub(super) queued: Option<(async_nats::Subject, u64)>,
    /// How many times the server delivered it (this delivery included).
    pub(super) delivered: u64,
    /// When its copy was stored, by this host's clock (when it arrived, if the copy looks
    /// younger): no earlier delivery of it can have been made.
    pub(super) stored: std::time::Instant,
    /// Whether this delivery ended the message's life (acked or termed here, not naked or
    /// left to another route's consumer): only those count in the end-to-end latency.
    pub(super) ended: std::sync::atomic::AtomicBool,
    /// The revision a proven replay reset its key at (`reset.rs`), else 0.
    reset_revision: std::sync::atomic::AtomicU64,
    /// How long its guest ran, in microseconds (0 when none ran): the rest of its handling
    /// is the time the host added.
    guest_us: std::sync::atomic::AtomicU64,
    /// Its spans (inert when traces are off).
    pub(super) trace: Trace,
}

impl<S: ClaimStore> Shared<S> {
    /// Processes one delivery of `route`'s consumer to its end, or, with no route, one of the
    /// consumer of subjects no route takes. Never panics on a message's content.
    pub(crate) async fn process(&self, message: jetstream::Message, route: Option<Arc<Route>>) {
        let Some(Position {
            sequence,
            published,
            delivered,
        }) = position(&message).await
        else {
            return;
        };
        let metrics = self.metrics_of(route.as_ref());
        let in_flight = metrics.in_flight();
        let started = std::time::Instant::now();
        let exclusive = route.as_ref().is_some_and(|r| r.exclusive.is_some());
        let mut d = Delivery::new(message, sequence, delivered);
        if exclusive {
            // By the stream's clock: a copy's earlier deliveries were made after it.
            let age = time::OffsetDateTime::now_utc() - published;
            if let Ok(age) = Duration::try_from(age) {
                d.stored = started.checked_sub(age).unwrap_or(started);
            }
        }
        let message = &mut d.message;
        if exclusive {
            // A queued copy: the guest, the key and the records see the original.
            let Some((subject, source_sequence, headers)) =
                crate::exclusive::original(message.headers.as_ref())
            else {
                tracing::error!("queued message without its origin headers, terminating it");
                let _ = d.acker.ack_with(AckKind::Term).await;
                return;
            };
            d.queued = Some((
                std::mem::replace(&mut message.subject, subject.into()),
                sequence,
            ));
            message.headers = Some(headers);
            d.sequence = source_sequence;
        }
        if let (Some(tracer), Some(route)) = (&self.tracer, &route) {
            let group = crate::setup::route_consumer_name(&self.config, &route.name);
            let m = &d.message;
            d.trace = tracer.process(&m.subject, &group, m.headers.as_ref(), || {
                let mut attributes = vec![
                    KeyValue::new("messaging.nats.stream.sequence", d.sequence as i64),
                    KeyValue::new("messaging.nats.message.delivered", d.delivered as i64),
                    KeyValue::new("dedup.route", route.name.clone()),
                ];
                let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
                if let Some(id) = id {
                    attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
                }
                attributes
            });
        }
        // Every line of this message's life carries its fields: route and sequence until it
        // is claimed, then all of them (see `route_and_run`). Spans are made only where a line
        // may follow: one with every field for a claimed message, the short one on the other
        // paths (a span per message was 5 % of the no-op guard's CPU, two of them twice that).
        // The server delivers it no more: until it is settled, a marker says so, in case the
        // host dies now and the advisory that would follow reaches no host ([`crate::stranded`]).
        // (The consumer of unrouted subjects acks a routed message at once: not its concern.)
        // A partition never gives a queued copy up: however often it was delivered (waiting
        // behind its entity's earlier message), it has no last delivery.
        let last = d.queued.is_none()
            && stranded::last_delivery(d.delivered, self.config.source.server_max_deliver)
            && (route.is_some() || self.routes.find(&d.message.subject).is_none());
        let marked = last.then(|| {
            let stream = self.config.source.stream.clone();
            // The route's consumer, or the one of unrouted subjects.
            let consumer = match &route {
                Some(route) => crate::setup::route_consumer_name(&self.config, &route.name),
                None => self.config.source.consumer.clone(),
            };
            let origin = Origin {
                stream: &stream,
                sequence: d.sequence,
                consumer: &consumer,
            };
            let reason = format!("its last delivery ({}) did not settle it", d.delivered);
            Marked {
                claims: &self.markers,
                marker: Marker::new(origin, d.delivered, reason)
                    .not_before(self.config.source.ack_wait * 2),
                // The short span, for the marker's lines: made only when there is a marker.
                span: d.span(
                    route
                        .as_ref()
                        .map_or(crate::metrics::UNROUTED, |r| r.name.as_str()),
                ),
                ended: &d.ended,
            }
        });
        // Boxed, here and below: the work's state machine is kilobytes, and the layers it is
        // wrapped in would otherwise copy it at every step (the copies were 5 % of the host's
        // CPU per message).
        let work = Box::pin(self.route_and_run(&d, route));
        let work = async {
            match d.trace.context() {
                // Outcomes are recorded on the delivery's span wherever they are counted.
                Some(cx) => opentelemetry::context::FutureExt::with_context(work, cx).await,
                None => work.await,
            }
            d.trace.end();
        };
        marker::around(marked.as_ref(), work).await;
        let ended = d.ended.load(Ordering::Relaxed);
        let published_ns = u64::try_from(published.unix_timestamp_nanos()).unwrap_or(0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let age = now
            .unwrap_or_default()
            .saturating_sub(Duration::from_nanos(published_ns));
        if ended {
            metrics.end_to_end(age);
        }
        let guest = Duration::from_micros(d.guest_us.load(Ordering::Relaxed));
        metrics.added_time(started.elapsed().saturating_sub(guest));
        drop(in_flight);
    }

    /// Routes, keys, claims and runs one delivery: a claimed one in a span with all its
    /// fields, anything else in one with its route and sequence.
    async fn route_and_run(&self, d: &Delivery, route: Option<Arc<Route>>) {
        // A queued delivery is in progress here until it ends: later ones of its subject wait
        // for it, woken as it ends (`behind.rs`).
        let entered = (d.queued.as_ref()).map(|(s, q)| self.in_progress.enter(s, *q, &d.ended));
        let claimed = match self.route_and_claim(d, route, entered.as_ref()).await {
            Some(claimed) => claimed,
            None => return,
        };
        let (route, chosen, key, lease) = claimed;
        let claimed_version = lease.digest().await;
        let (guest, gone) = super::pinned::version(&route, &key, chosen, &claimed_version);
        let span = tracing::warn_span!(
            "message",
            route = route.name,
            sequence = d.sequence,
            key,
            attempt = lease.attempt(),
            fencing_token = lease.fencing_token(),
            digest = guest.digest(),
            trace_id = d.trace_id(),
        );
        let claimed = Claimed {
            d,
            route: &route,
            guest,
            key: &key,
            lease: Arc::from(lease),
            gone: gone.map(|reason| dedup_delivery::pinned::Gone {
                digest: claimed_version,
                reason,
                delivered: d.retry_count(),
            }),
        };
        Box::pin(self.run(&claimed)).instrument(span).await
    }

    /// Routes, keys and claims one delivery, settling it unless this host now holds its
    /// claim: then the route, guest version, key and lease to run it with.
    async fn route_and_claim(
        &self,
        d: &Delivery,
        route: Option<Arc<Route>>,
        entered: Option<&Entered<'_>>,
    ) -> Option<(Arc<Route>, Guest, String, Box<Lease<S>>)> {
        let Some(route) = route else {
            let subject = &d.message.subject;
            let span = d.span(crate::metrics::UNROUTED);
            if self.routes.find(subject).is_some() || self.routes.is_parked(subject) {
                // The route's own consumer has it (a removed route's keeps it for its return).
                if let Err(e) = d.acker.ack_with(AckKind::Ack).instrument(span).await {
                    tracing::warn!(sequence = d.sequence, "ack failed: {e}");
                }
                return None;
            }
            let reason = format!("no route for subject `{}`", d.message.subject);
            self.dead_letter_unclaimed(d, "", "", &reason)
                .instrument(span)
                .await;
            return None;
        };
        // Made only where a line may follow: a span per message was 5 % of the no-op
        // guard's CPU.
        let log_span = || d.span(&route.name);
        if self
            .dead_letter_unreadable(d, &route.name, false)
            .instrument(log_span())
            .await
        {
            return None;
        }
        if d.message.payload.len() > route.max_payload_bytes {
            let reason = format!(
                "payload of {} bytes exceeds route `{}`'s max_payload_bytes of {}",
                d.message.payload.len(),
                route.name,
                route.max_payload_bytes
            );
            self.dead_letter_unclaimed(d, &route.name, "", &reason)
                .instrument(log_span())
                .await;
            return None;
        }
        let key = match self.derive_key(d, &route).await {
            Ok(Ok(key)) => key,
            Ok(Err(missing)) => match route.missing_key {
                MissingKey::DeadLetter => {
                    let reason = missing.to_string();
                    self.dead_letter_unclaimed(d, &route.name, "", &reason)
                        .instrument(log_span())
                        .await;
                    return None;
                }
                MissingKey::StreamSequence => format!("seq-{}", d.sequence),
            },
            Err(unavailable) => {
                self.nak_unavailable(d, &route, unavailable.to_string())
                    .await;
                return None;
            }
        };
        if let Err(unavailable) = self.prove_reset(d, &route, &key).await {
            self.nak_unavailable(d, &route, unavailable.to_string())
                .await;
            return None;
        }
        // The version now served runs this message to its end, whatever is swapped meanwhile.
        let Some(guest) = route.guest_for(&key) else {
            // The route stopped being served after this message was pulled (a swap, a reload):
            // not an outage, so no backoff; the loop pulls again only once it is served.
            self.settle(d, AckKind::Nak(Some(NOT_SERVED_RETRY)))
                .instrument(log_span())
                .await;
            return None;
        };
        let claim_key = route.claim_key(&key);
        if route.claim_after {
            let keys = (key.as_str(), claim_key.as_str());
            self.run_after(d, &route, guest, keys)
                .instrument(log_span())
                .await;
            return None;
        }
        // A partition hands out a window of messages: one of an entity waits while an earlier
        // one of its entity is still queued (`ahead.rs`), recorded here until it ends.
        if !self.clear_ahead(d, &route, &key, entered).await {
            return None;
        }
        let started = std::time::Instant::now();
        let span = d
            .trace
            .child(|| "claim".into(), SpanKind::Internal, Vec::new);
        let (digest, fresh_from, sequence) = (guest.digest(), d.fresh_from(), Some(d.sequence));
        // A window route's outputs go out one by one: its claim names the version that begins
        // them, so none waits for a write of its own (`Claimer::claim_window_message`). A
        // route that may publish nothing names none (a crash would hold its keys for nothing).
        let claimer = &self.claimer;
        let claimed = match route.fenced.is_none() && route.may_publish() {
            false => (claimer.claim_message(&claim_key, digest, fresh_from, sequence)).await,
            true => (claimer.claim_window_message(&claim_key, digest, fresh_from, sequence)).await,
        };
        route.metrics.claim_write(started.elapsed());
        span.set(|| vec![KeyValue::new("dedup.claim", claim_answer(&claimed))]);
        if let Err(e) = &claimed {
            span.error("claim_error", || e.to_string());
        }
        drop(span);
        d.trace.set(|| {
            vec![
                KeyValue::new("dedup.key", key.clone()),
                KeyValue::new("dedup.digest", guest.digest().to_string()),
            ]
        });
        let lease = self.settle_unclaimed(d, &route, &key, claimed).await?;
        if !self.still_first(d, &route, &key, entered, &lease).await {
            return None;
        }
        d.trace.set(|| {
            vec![
                KeyValue::new("dedup.attempt", i64::from(lease.attempt())),
                KeyValue::new("dedup.fencing_token", lease.fencing_token() as i64),
            ]
        });
        Some((route, guest, key, lease))
    }

    /// Runs a claimed message beside its heartbeat and settles it according to the outcome
    /// ([`dedup_delivery::before::run`]), counting how it ended.
    async fn run(&self, c: &Claimed<'_, S>) {
        let outcome = self.run_before(c).await;
        c.route.metrics.outcome(outcome);
    }
}

/// Where a delivery stands, from its JetStream metadata.
pub(super) struct Position {
    /// Its sequence in its stream.
    pub(super) sequence: u64,
    /// When the stream stored it.
    pub(super) published: time::OffsetDateTime,
    /// How many times the server delivered it (this delivery included).
    pub(super) delivered: u64,
}

/// A delivery's position. A delivery without JetStream metadata is terminated (`None`): it
/// cannot be told apart from another.
pub(super) async fn position(message: &jetstream::Message) -> Option<Position> {
    match message.info() {
        Ok(info) => Some(Position {
            sequence: info.stream_sequence,
            published: info.published,
            delivered: info.delivered.max(1) as u64,
        }),
        Err(e) => {
            tracing::error!("delivery without JetStream metadata, terminating it: {e}");
            let _ = message.ack_with(AckKind::Term).await;
            None
        }
    }
}

impl Delivery {
    /// The delivery `message` at stream `sequence`, delivered `delivered` times.
    pub(super) fn new(message: jetstream::Message, sequence: u64, delivered: u64) -> Self {
        let reply = message.reply.clone();
        let (message, acker) = message.split();
        Self {
            message,
            acker,
            reply,
            sequence,
            queued: None,
            delivered,
            stored: std::time::Instant::now(),
            ended: Default::default(),
            reset_revision: Default::default(),
            guest_us: Default::default(),
            trace: Trace::default(),
        }
    }

    /// The delivery count its retry delays grow with: a queued copy's deliveries mostly waited
    /// behind its entity (each wait past the hold is one more), so only the first few count:
    /// a partition has no delivery bound to spare, and one transient error after a long wait
    /// must not wait minutes.
    pub(super) fn retry_count(&self) -> u64 {
        match self.queued {
            Some(_) => self.delivered.min(QUEUED_RETRY_COUNT),
            None => self.delivered,
        }
    }

    /// Marks the delivery as the message's last.
    pub(super) fn end(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The revision a dead-letter replay reset this message's key at (its
    /// [`RESET_REVISION`](crate::claim::record::RESET_REVISION) header, honoured only on a
    /// proven replay whose reset the claim store's leader holds: `reset.rs`); 0 otherwise.
    pub(super) fn fresh_from(&self) -> u64 {
        let reset = (self.reset_revision).load(std::sync::atomic::Ordering::Relaxed);
        crate::claim::record::fresh_from(reset, self.delivered)
    }

    /// Records the revision a proven replay reset this message's key at.
    pub(super) fn reset_at(&self, revision: u64) {
        (self.reset_revision).store(revision, std::sync::atomic::Ordering::Relaxed);
    }

    /// The span of this delivery's lines until it is claimed: its route and sequence.
    pub(super) fn span(&self, route: &str) -> tracing::Span {
        tracing::warn_span!(
            "message",
            route,
            sequence = self.sequence,
            trace_id = self.trace_id(),
        )
    }

    /// The trace id of the event's W3C `traceparent` header, if it has a valid one.
    fn trace_id(&self) -> Option<&str> {
        let value = self.message.headers.as_ref()?.get(TRACEPARENT)?;
        crate::logging::trace_id(value.as_str())
    }
}

/// The event a guest sees for delivery `d` of `route`.
pub(super) fn event(d: &Delivery, route: &Route, key: &str, attempt: u32, token: u64) -> Event {
    Event {
        subject: d.message.subject.to_string(),
        payload: d.message.payload.to_vec(),
        headers: headers_of(&d.message),
        key: key.to_string(),
        attempt,
        fencing_token: token,
        stream_sequence: d.sequence,
        route: route.name.clone(),
    }
}

/// What the answer to a claim was, for its span.
fn claim_answer<S: ClaimStore>(claimed: &Result<ClaimOutcome<S>, ClaimError>) -> &'static str {
    match claimed {
        Ok(ClaimOutcome::Acquired(_)) => "acquired",
        Ok(ClaimOutcome::Completed) => "completed",
        Ok(ClaimOutcome::DeadLettered) => "dead_lettered",
        Ok(ClaimOutcome::Busy { .. }) => "busy",
        Err(_) => "error",
    }
}

/// Logs and counts what an invocation of delivery `d`'s guest took and how it ended.
pub(super) fn invoked(d: &Delivery, route: &Route, invocation: &Invocation) {
    let us = u64::try_from(invocation.elapsed.as_micros()).unwrap_or(u64::MAX);
    d.guest_us.fetch_add(us, Ordering::Relaxed);
    tracing::debug!(
        outcome = invocation.outcome.kind(),
        elapsed_us = invocation.elapsed.as_micros() as u64,
        "invoked"
    );
    route.metrics.guest_time(invocation.elapsed);
    if let Outcome::Trap(trap) = &invocation.outcome {
        route.metrics.trap(trap.kind.as_str());
    }
}

/// The message's headers as the guest sees them.
fn headers_of(message: &async_nats::Message) -> Vec<Header> {
    let Some(headers) = &message.headers else {
        return Vec::new();
    };
    let mut out: Vec<Header> = headers
        .iter()
        .flat_map(|(name, values)| {
            values.iter().map(move |v| Header {
                name: name.to_string(),
                value: v.to_string(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
