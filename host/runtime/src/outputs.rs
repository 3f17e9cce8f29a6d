//! The sandbox boundary on the way out: every output a guest returns is checked, all of them
//! before the first is published, so a message either publishes all its outputs or none.
//!
//! An output is refused (a permanent [`TrapKind::ForbiddenOutput`]) when its subject is not a
//! literal subject, lies in a server namespace (`$JS.`, `$KV.`, ...) or outside the route's
//! `allowed_outputs`, or when a header is malformed or is one the host gives meaning to
//! (DESIGN rule 22): a `Nats-*` control header (the host alone sets `Nats-Msg-Id`;
//! `Nats-Rollup`, `Nats-TTL` or `Nats-Expected-*` from a guest could purge or break a shared
//! stream), a `Dedup-*` header (`Dedup-Replayed-Msg-Id` would choose a downstream route's
//! idempotency key) or the trace context the host carries itself (`traceparent`, `tracestate`).

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};

use super::outcome::{Outcome, Trap, TrapKind};
use super::state::InvokeOptions;
use crate::bindings::{Header, Output};
use dedup_delivery::subject;

/// The prefix of JetStream's control headers, compared case-insensitively.
pub const CONTROL_HEADER_PREFIX: &str = "nats-";

/// The prefix of the host's own headers (dead letters, replays, fenced outputs), compared
/// case-insensitively.
pub const HOST_HEADER_PREFIX: &str = "dedup-";

/// The trace-context headers the host copies from an event to its outputs, compared
/// case-insensitively.
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Enforces the output count and size limits, then checks every output's subject and headers.
pub fn check_outputs(outputs: Vec<Output>, options: &InvokeOptions) -> Outcome {
    let limits = &options.limits;
    if outputs.len() > limits.max_outputs {
        return trap(
            TrapKind::OutputLimit,
            format!(
                "returned {} outputs, over the limit of {}",
                outputs.len(),
                limits.max_outputs
            ),
        );
    }
    let bytes: u64 = outputs.iter().map(output_size).sum();
    if bytes > limits.max_output_bytes {
        return trap(
            TrapKind::OutputLimit,
            format!(
                "returned {bytes} output bytes, over the limit of {}",
                limits.max_output_bytes
            ),
        );
    }
    for (i, o) in outputs.iter().enumerate() {
        if let Err(problem) = check_output(o, options.allowed_outputs.as_deref()) {
            return trap(TrapKind::ForbiddenOutput, format!("output {i}: {problem}"));
        }
    }
    Outcome::Success(outputs)
}

fn trap(kind: TrapKind, message: String) -> Outcome {
    Outcome::Trap(Trap { kind, message })
}

/// Why one output may not leave the host, if it may not.
fn check_output(o: &Output, allowed: Option<&[String]>) -> Result<(), String> {
    let shown = shorten(&o.subject);
    if let Some(problem) = subject::literal_problem(&o.subject) {
        return Err(format!("subject `{shown}` {problem}"));
    }
    if let Some(prefix) = subject::reserved_prefix(&o.subject) {
        return Err(format!(
            "subject `{shown}` is in the server's reserved `{prefix}` namespace"
        ));
    }
    if let Some(allowed) = allowed {
        if !allowed.iter().any(|f| subject::matches(f, &o.subject)) {
            return Err(format!(
                "subject `{shown}` is outside the route's allowed_outputs {allowed:?}"
            ));
        }
    }
    for h in &o.headers {
        check_header(h)?;
    }
    Ok(())
}

/// Why a guest's header is refused, if it is.
pub fn check_header(h: &Header) -> Result<(), String> {
    let name = shorten(&h.name);
    if h.name.is_empty() || HeaderName::from_str(&h.name).is_err() {
        return Err(format!(
            "header name `{}` is not a header name (printable ASCII, no spaces or `:`)",
            name.escape_debug()
        ));
    }
    if has_prefix(&h.name, CONTROL_HEADER_PREFIX) {
        return Err(format!(
            "header `{name}` is a JetStream control header; only the host sets `Nats-*` headers"
        ));
    }
    if has_prefix(&h.name, HOST_HEADER_PREFIX) {
        return Err(format!(
            "header `{name}` is the host's; only the host sets `Dedup-*` headers (name it `X-...`)"
        ));
    }
    if TRACE_HEADERS.iter().any(|t| h.name.eq_ignore_ascii_case(t)) {
        return Err(format!(
            "header `{name}` is trace context, which the host carries from the event itself"
        ));
    }
    if HeaderValue::from_str(&h.value).is_err()
        || h.value.chars().any(|c| c.is_control() && c != '\t')
    {
        return Err(format!(
            "header `{name}` has a value with line breaks or control characters"
        ));
    }
    Ok(())
}

/// Whether header `name` is one only the host sets: a JetStream control header (`Nats-*`),
/// the host's own (`Dedup-*`) or trace context.
pub fn is_host_header(name: &str) -> bool {
    has_prefix(name, CONTROL_HEADER_PREFIX)
        || has_prefix(name, HOST_HEADER_PREFIX)
        || TRACE_HEADERS.iter().any(|t| name.eq_ignore_ascii_case(t))
}

/// Whether `name` starts with `prefix`, in any case.
fn has_prefix(name: &str, prefix: &str) -> bool {
    name.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

/// Every line of header block `h`, as (name, value), in order (what goes on the wire).
pub fn header_lines(h: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    h.iter().flat_map(|(name, values)| {
        let name: &str = name.as_ref();
        values.iter().map(move |v| (name, v.as_str()))
    })
}

/// Builds the header map of an already checked output.
pub fn header_map(headers: &[Header]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for h in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_str(&h.name),
            HeaderValue::from_str(&h.value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// The first 128 characters of a guest string, for error messages.
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(128).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Bytes an output occupies on the wire as the guest returned it: its subject, its payload
/// and its header block as sent (`NATS/1.0\r\n`, each `name: value\r\n`, the final
/// `\r\n`). The host's own headers come on top; what is checked against the server's
/// `max_payload` is the message as published (`pipeline::effects::wire_size`).
pub fn output_size(output: &Output) -> u64 {
    let lines: usize = output
        .headers
        .iter()
        .map(|h| h.name.len() + ": ".len() + h.value.len() + "\r\n".len())
        .sum();
    let block = match output.headers.is_empty() {
        true => 0,
        false => "NATS/1.0\r\n".len() + lines + "\r\n".len(),
    };
    (output.subject.len() + output.payload.len() + block) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(subject: &str, headers: &[(&str, &str)]) -> Output {
        Output {
            subject: subject.into(),
            payload: Vec::new(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
        }
    }

    fn refused(o: Output, allowed: &[&str]) -> String {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        check_output(&o, Some(&allowed)).expect_err("refused")
    }

    #[test]
    fn subjects_outside_the_sandbox_are_refused() {
        assert!(refused(out("$JS.API.STREAM.DELETE.X", &[]), &[">"]).contains("reserved"));
        assert!(refused(out("_INBOX.x", &[]), &[">"]).contains("reserved"));
        assert!(refused(out("a.*", &[]), &[">"]).contains("wildcard"));
        assert!(refused(out("a.>", &[]), &[">"]).contains("wildcard"));
        assert!(refused(out("", &[]), &[">"]).contains("empty"));
        assert!(refused(out("a b", &[]), &[">"]).contains("whitespace"));
        assert!(refused(out("b.c", &[]), &["a.>"]).contains("allowed_outputs"));
        assert!(check_output(&out("a.b", &[]), Some(&["a.>".to_string()])).is_ok());
    }

    #[test]
    fn control_and_malformed_headers_are_refused() {
        for (name, value) in [
            ("Nats-Rollup", "all"),
            ("nats-ttl", "1s"),
            ("NATS-Expected-Stream", "X"),
            ("Nats-Msg-Id", "forged"),
            ("Dedup-Replayed-Msg-Id", "victim"),
            ("dedup-reset-revision", "1"),
            (
                "Traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("tracestate", "a=b"),
            ("Bad Name", "v"),
            ("Bad:Name", "v"),
            ("Bäd", "v"),
            ("", "v"),
            ("Ok", "line\r\nPUB x 1"),
            ("Ok", "nul\0"),
        ] {
            assert!(
                check_output(&out("a.b", &[(name, value)]), None).is_err(),
                "{name:?}: {value:?} must be refused"
            );
        }
        assert!(check_output(&out("a.b", &[("X-Trace", "ok value\twith tab")]), None).is_ok());
    }
}
