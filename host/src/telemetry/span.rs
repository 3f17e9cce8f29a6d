//! The spans of one delivery. A [`Trace`] is inert when traces are off: no span, no
//! attribute built (attributes are passed as closures).

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use super::{Tracer, MESSAGING_SYSTEM};
use crate::config::telemetry::ProducerRelation;

/// One delivery's `process` span, which its child spans hang on. Ended by [`Trace::end`] or
/// when dropped.
#[derive(Debug, Default)]
pub struct Trace {
    cx: Option<(Context, Arc<Tracer>)>,
}

/// A child span of a delivery (`claim`, `handle`, `send <subject>`, `settle`), ended when
/// dropped.
#[derive(Debug, Default)]
pub struct Child {
    cx: Option<Context>,
}

impl Tracer {
    /// Starts the CONSUMER span of a delivery of `subject` by consumer `group`, continuing
    /// (or linked to, per `[telemetry] producer`) the `traceparent` in `headers`.
    pub fn process(
        self: &Arc<Self>,
        subject: &str,
        group: &str,
        headers: Option<&async_nats::HeaderMap>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Trace {
        if !self.room.take() {
            return Trace::default();
        }
        let producer = headers
            .map(|h| TraceContextPropagator::new().extract(&Headers(h)))
            .unwrap_or_default();
        let remote = producer.span().span_context().clone();
        let mut attrs = vec![
            KeyValue::new("messaging.system", MESSAGING_SYSTEM),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", subject.to_string()),
            KeyValue::new("messaging.consumer.group.name", group.to_string()),
        ];
        attrs.extend(attributes());
        let mut builder = self
            .inner
            .span_builder(format!("process {subject}"))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attrs);
        let parent = match (self.producer, remote.is_valid()) {
            (ProducerRelation::Parent, true) => producer,
            (ProducerRelation::Link, true) => {
                builder = builder.with_links(vec![Link::with_context(remote)]);
                Context::new()
            }
            (_, false) => Context::new(),
        };
        let span = self.inner.build_with_context(builder, &parent);
        Trace {
            cx: Some((parent.with_span(span), self.clone())),
        }
    }
}

impl Trace {
    /// Whether spans are recorded (traces on).
    pub fn is_on(&self) -> bool {
        self.cx.is_some()
    }

    /// Adds attributes to the delivery's span.
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some((cx, _)) = &self.cx {
            cx.span().set_attributes(attributes());
        }
    }

    /// The delivery span's context, under which the delivery is processed (so that
    /// [`record_outcome`] finds it); `None` when traces are off.
    pub fn context(&self) -> Option<Context> {
        self.cx.as_ref().map(|(cx, _)| cx.clone())
    }

    /// Starts a child span of the delivery's span.
    pub fn child(
        &self,
        name: impl FnOnce() -> Cow<'static, str>,
        kind: SpanKind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Child {
        let Some((parent, tracer)) = &self.cx else {
            return Child::default();
        };
        let builder = tracer
            .inner
            .span_builder(name())
            .with_kind(kind)
            .with_attributes(attributes());
        let span = tracer.inner.build_with_context(builder, parent);
        Child {
            cx: Some(parent.with_span(span)),
        }
    }

    /// Where the guest's outbound calls are reported: each one becomes a CLIENT span, a
    /// child of the delivery's span ([`super::client`]); `None` when traces are off.
    pub fn call_tracer(&self) -> Option<crate::runtime::http::trace::CallTracer> {
        let (parent, tracer) = self.cx.clone()?;
        Some(crate::runtime::http::trace::CallTracer::new(move |call| {
            super::client::record(&tracer, &parent, &call)
        }))
    }

    /// Ends the delivery's span.
    pub fn end(&self) {
        if let Some((cx, _)) = &self.cx {
            cx.span().end();
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.end();
    }
}

impl Child {
    /// Adds attributes to this span.
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.cx {
            cx.span().set_attributes(attributes());
        }
    }

    /// Marks this span failed: `error.type` and an error status with `message`.
    pub fn error(&self, error_type: &'static str, message: impl FnOnce() -> String) {
        if let Some(cx) = &self.cx {
            let span = cx.span();
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error(message()));
        }
    }

    /// This span's W3C trace-context headers (`traceparent`, `tracestate`), which an output
    /// carries onward; `None` when traces are off.
    pub fn headers(&self) -> Option<Vec<(&'static str, String)>> {
        let cx = self.cx.as_ref()?;
        let mut out = Carrier(Vec::with_capacity(2));
        TraceContextPropagator::new().inject_context(cx, &mut out);
        Some(out.0)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}

/// Records how a delivery ended (`dedup.outcome`) on the delivery span processed now, if
/// any; an `error` outcome also sets the span's status and `error.type`. Called where the
/// outcome is counted, so every path reports it once.
pub fn record_outcome(outcome: &'static str, error: bool) {
    Context::map_current(|cx| {
        if !cx.has_active_span() {
            return;
        }
        let span = cx.span();
        span.set_attribute(KeyValue::new("dedup.outcome", outcome));
        if error {
            span.set_attribute(KeyValue::new("error.type", outcome));
            span.set_status(Status::error(outcome));
        }
    })
}

/// A message's headers, read by the propagator.
struct Headers<'a>(&'a async_nats::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        ["traceparent", "tracestate"]
            .into_iter()
            .filter(|k| self.0.get(*k).is_some())
            .collect()
    }
}

/// The headers the propagator writes.
struct Carrier(Vec<(&'static str, String)>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        let key = match key {
            "traceparent" => "traceparent",
            "tracestate" => "tracestate",
            _ => return,
        };
        self.0.push((key, value));
    }
}
