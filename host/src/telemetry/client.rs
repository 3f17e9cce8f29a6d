//! The CLIENT span of each outbound HTTP call a guest makes (issue 45), a child of the
//! delivery's span, with the HTTP semantic conventions: `http.request.method`, `url.full`
//! (secrets masked as `inspect` masks them), `url.scheme`, `server.address`, `server.port`,
//! `http.response.status_code`, `error.type` when the call failed or was answered with a
//! 4xx/5xx. A call answered from the journal (nothing sent) has `dedup.call.replayed = true`.

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::Tracer;
use crate::runtime::http::trace::CallSpan;

/// Exports `call` as a span under `parent`, with the call's own start and end times.
pub(super) fn record(tracer: &Tracer, parent: &Context, call: &CallSpan) {
    let builder = tracer
        .inner
        .span_builder(call.method.clone())
        .with_kind(SpanKind::Client)
        .with_start_time(call.started)
        .with_attributes(attributes(call));
    let mut span = tracer.inner.build_with_context(builder, parent);
    match (&call.error, call.status) {
        (Some((_, message)), _) => span.set_status(Status::error(message.clone())),
        (None, Some(status)) if status >= 400 => span.set_status(Status::error("")),
        _ => {}
    }
    span.end_with_timestamp(call.ended);
}

/// The span's attributes.
pub fn attributes(call: &CallSpan) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("http.request.method", call.method.clone()),
        KeyValue::new("url.full", call.url.clone()),
        KeyValue::new("url.scheme", call.scheme.clone()),
        KeyValue::new("server.address", call.host.clone()),
        KeyValue::new("server.port", i64::from(call.port)),
        KeyValue::new("dedup.call.index", i64::from(call.index)),
        KeyValue::new("dedup.call.result", call.result.as_str()),
        KeyValue::new("dedup.call.replayed", call.replayed()),
    ];
    if let Some(status) = call.status {
        attributes.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 400 {
            attributes.push(KeyValue::new("error.type", status.to_string()));
        }
    }
    if let Some((kind, _)) = &call.error {
        attributes.push(KeyValue::new("error.type", kind.clone()));
    }
    attributes
}
