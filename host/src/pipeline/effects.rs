//! What leaves the host: handler outputs and dead letters, each with a deterministic
//! `Nats-Msg-Id` so a repeat is deduplicated by the receiving stream.

use crate::telemetry::{Child, Trace};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use base64::Engine as _;
use futures::future::try_join_all;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use thiserror::Error;

use crate::bindings::Output;
use crate::claim::OutputRef;
use crate::forever;
use crate::runtime::outputs::{header_map, CONTROL_HEADER_PREFIX};
use crate::text;
use dedup_delivery::revert::{self, Fix};

/// Header names the host sets on dead letters.
pub mod headers {
    /// Why the message was dead-lettered.
    pub const REASON: &str = "Dedup-Reason";
    /// The attempt that failed last (0 when the message never ran).
    pub const ATTEMPT: &str = "Dedup-Attempt";
    /// The route that matched (empty when none did).
    pub const ROUTE: &str = "Dedup-Route";
    /// The idempotency key (empty when there was none).
    pub const KEY: &str = "Dedup-Key";
    /// The key's claim key (`crate::claim::key::encode`), exact where `Dedup-Key` is escaped
    /// and cut for display: what a replay resets.
    pub const CLAIM_KEY: &str = "Dedup-Claim-Key";
    /// The subject the message was published on.
    pub const SUBJECT: &str = "Dedup-Original-Subject";
    /// The message's sequence in the source stream.
    pub const SEQUENCE: &str = "Dedup-Stream-Sequence";
    /// The digest of the handler version that failed it (a canary candidate's, or the live
    /// one's); absent when no version ran it.
    pub const DIGEST: &str = "Dedup-Digest";
    /// Set when the letter's payload was cut to fit the server's max payload: the original
    /// payload's size in bytes (read the whole message at `Dedup-Stream-Sequence`).
    pub const TRUNCATED: &str = "Dedup-Truncated";
    /// The original's header block, base64, when it could not be parsed (not UTF-8, a line
    /// without `:`): a letter's own headers must be valid, so it is kept encoded, byte for byte.
    pub const RAW_HEADERS: &str = "Dedup-Raw-Headers";
    /// The prefix the original's `Nats-*` headers are kept under (`Nats-TTL` becomes
    /// `Dedup-Original-Nats-TTL`), so they cannot act on the dead-letter stream.
    pub const ORIGINAL_PREFIX: &str = "Dedup-Original-";
}

/// The server's error for a message over its stream's `max_msg_size` (JSStreamMessageExceedsMaximumErr,
/// 10054): no retry can store it.
const MESSAGE_TOO_BIG_FOR_STREAM: &str = "error code 10054";

/// Room kept under the server's max payload for a dead letter's protocol line and rounding.
const SIZE_MARGIN: usize = 512;

/// The longest batch headers a fenced output carries on top of its own
/// ([`crate::fenced::commit::send_batch`]): `Nats-Batch-Id: <32 hex>` and
/// `Nats-Batch-Sequence: <at most 4 digits>` (a batch holds at most 1,000 messages).
pub const FENCED_BATCH_HEADER_BYTES: usize =
    (crate::fenced::commit::headers::BATCH_ID.len() + 32 + 4)
        + (crate::fenced::commit::headers::BATCH_SEQUENCE.len() + 4 + 4);

pub use crate::claim::key::output_id;

/// One output as it goes out: its subject, every header it is published with (the guest's,
/// the trace context, its message id), its payload, and the span of its publish.
pub struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: bytes::Bytes,
    send: Child,
}

impl Outgoing {
    /// What nats-server counts against its `max_payload` for this publish.
    pub fn wire_size(&self) -> usize {
        wire_size(&self.headers, self.payload.len())
    }

    /// The subject it is published on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Every header line it is published with, as (name, value), in order.
    pub fn header_lines(&self) -> impl Iterator<Item = (&str, &str)> {
        crate::runtime::outputs::header_lines(&self.headers)
    }
}

/// What nats-server counts against `max_payload` for one HPUB: the whole header block
/// (`NATS/1.0\r\n`, each `name: value\r\n`, the final `\r\n`) plus the payload.
pub fn wire_size(headers: &HeaderMap, payload: usize) -> usize {
    if revert::reverted(Fix::WireSize) {
        return counted_before_wire_size(headers) + payload;
    }
    header_bytes(headers) + payload
}

/// Test-only ([`Fix::WireSize`] reverted): what the size check counted of a header block
/// before it was sized as the wire counts it: the names and values of the guest's own headers,
/// without `: `, CRLF or `NATS/1.0` framing; the host's headers (its message id, the trace
/// context) were left to a fixed budget ([`budget_before_wire_size`]).
fn counted_before_wire_size(h: &HeaderMap) -> usize {
    crate::runtime::outputs::header_lines(h)
        .filter(|(name, _)| !crate::runtime::outputs::is_host_header(name))
        .map(|(name, value)| name.len() + value.len())
        .sum()
}

/// Test-only ([`Fix::WireSize`] reverted): what the size check added to that count for an
/// output of `claim_key` to `subject`: the subject's length and a fixed budget for the host's
/// headers, which an inherited `tracestate` outgrows.
fn budget_before_wire_size(claim_key: &str, subject: &str) -> usize {
    subject.len() + 2 * (claim_key.len() + 64) + SIZE_MARGIN
}

/// The headers output `o` is published with: its own, then each of `trace` it does not set
/// itself, then `id` (`Nats-Msg-Id`, or a fenced output's [`crate::fenced::OUTPUT_ID`]).
pub fn output_headers(o: &Output, trace: &[(&str, &str)], id: (&str, &str)) -> HeaderMap {
    // Outputs were checked at the sandbox boundary (`runtime::outputs`).
    let mut h = header_map(&o.headers);
    for (name, value) in trace {
        if h.get(*name).is_none() {
            h.insert(*name, *value);
        }
    }
    h.insert(id.0, id.1);
    h
}

/// Lays out `outputs` of the key `claim_key` as they will be published: each with its
/// `send <subject>` span (a child of `delivery`), that span's trace context, or with traces
/// off `inherited` (the event's `traceparent` and `tracestate`), and its message id.
pub fn prepare_outputs(
    claim_key: &str,
    outputs: &[Output],
    delivery: &Trace,
    inherited: &[(&str, &str)],
) -> Vec<Outgoing> {
    outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let send = send_span(delivery, &o.subject, i);
            let own = send.headers();
            let mut trace: Vec<(&str, &str)> = own
                .iter()
                .flatten()
                .map(|(n, v)| (*n, v.as_str()))
                .collect();
            trace.extend(inherited.iter().copied());
            let id = output_id(claim_key, i);
            let headers = output_headers(o, &trace, ("Nats-Msg-Id", &id));
            Outgoing {
                subject: o.subject.clone(),
                headers,
                payload: o.payload.clone().into(),
                send,
            }
        })
        .collect()
}

/// Why an output can never be stored, if one cannot: as published (`sizes`, each its
/// subject and [`wire_size`]) it is over the server's `max_payload` (`js`'s connection's).
/// Checked before the first publish or batch message: a permanent fault of the handler's,
/// never an outage to retry (the server answers an over-size publish by closing the
/// connection, which would drop every route's acks and heartbeats, every time).
pub fn oversized<'a>(
    js: &Context,
    claim_key: &str,
    sizes: impl IntoIterator<Item = (&'a str, usize)>,
) -> Option<String> {
    // The client's copy of the server's limit: `server_info()` would clone all of the
    // server's info (a dozen strings) for every message.
    over_max_payload(js.client().max_payload(), claim_key, sizes)
}

/// [`oversized`] for a server whose `max_payload` is `max`, given each output's subject and
/// wire size (its header block as published, with the host's headers, plus its payload).
pub fn over_max_payload<'a>(
    max: usize,
    claim_key: &str,
    outputs: impl IntoIterator<Item = (&'a str, usize)>,
) -> Option<String> {
    if revert::reverted(Fix::OutputSizeCheck) {
        return None;
    }
    outputs.into_iter().enumerate().find_map(|(i, (subject, size))| {
        let size = match revert::reverted(Fix::WireSize) {
            true => size + budget_before_wire_size(claim_key, subject),
            false => size,
        };
        (max > 0 && size > max).then(|| {
            format!(
                "output {i} (`{}`) to `{}` is {size} bytes as published (headers, the host's and the inherited trace context included, plus payload), over the server's max_payload of {max} bytes: it can never be stored; return smaller outputs (or raise max_payload on every server)",
                text::header_value(&output_id(claim_key, i)),
                text::header_value(subject)
            )
        })
    })
}

/// The sizes of a fenced commit's `outputs` as the server counts them: each with its
/// `trace` context, its [`crate::fenced::OUTPUT_ID`] under `claim_key` and the batch
/// headers ([`FENCED_BATCH_HEADER_BYTES`], at their longest).
pub fn fenced_sizes<'a>(
    claim_key: &'a str,
    outputs: &'a [Output],
    trace: &'a [(&str, &str)],
) -> impl Iterator<Item = (&'a str, usize)> + 'a {
    outputs.iter().enumerate().map(move |(i, o)| {
        let id = output_id(claim_key, i);
        let headers = output_headers(o, trace, (crate::fenced::OUTPUT_ID, &id));
        let batch = match revert::reverted(Fix::WireSize) {
            true => 0,
            false => FENCED_BATCH_HEADER_BYTES,
        };
        let size = wire_size(&headers, o.payload.len()) + batch;
        (o.subject.as_str(), size)
    })
}

/// Publishes outputs laid out by [`prepare_outputs`] in order, pipelined, and waits for
/// every stream ack. Returns where each was stored (a duplicate's sequence is the copy
/// stored first).
pub async fn publish_outputs(
    js: &Context,
    outgoing: Vec<Outgoing>,
) -> anyhow::Result<Vec<OutputRef>> {
    let mut acks = Vec::with_capacity(outgoing.len());
    for (i, o) in outgoing.into_iter().enumerate() {
        let Outgoing {
            subject,
            headers,
            payload,
            send,
        } = o;
        let id = headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let ack = js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
            .map_err(|e| anyhow::anyhow!("publishing output {i} on `{subject}`: {e}"))?;
        acks.push(async move {
            let _send = send; // ends with the stream's ack
            match ack.await {
                Ok(a) => Ok(OutputRef {
                    stream: a.stream,
                    sequence: a.sequence,
                    duplicate: a.duplicate,
                }),
                // A forever stream already holds this subject's message: a duplicate.
                Err(e) if forever::refused_as_duplicate(&e) => held(js, &subject).await,
                // Sent, but no answer: it may be stored all the same (it may sit in a socket
                // buffer until a cut connection heals), so say so rather than that it was
                // dropped. A re-run sends it again under the same message id.
                Err(e) if e.kind() == PublishErrorKind::TimedOut => Err(anyhow::anyhow!(
                    "output {i} on `{subject}` got no answer ({e}): it may still be stored, now or once the connection recovers; a re-run publishes it again as message id `{id}`, which the stream drops as a duplicate within its window"
                )),
                Err(e) => Err(anyhow::anyhow!(
                    "output {i}: {e} (is a stream capturing this subject?)"
                )),
            }
        });
    }
    try_join_all(acks).await
}

/// The PRODUCER span of output `index`'s publish on `subject`.
pub fn send_span(delivery: &Trace, subject: &str, index: usize) -> Child {
    delivery.child(
        || format!("send {subject}").into(),
        SpanKind::Producer,
        || {
            vec![
                KeyValue::new("messaging.system", crate::telemetry::MESSAGING_SYSTEM),
                KeyValue::new("messaging.operation.name", "send"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", subject.to_string()),
                KeyValue::new("dedup.output.index", index as i64),
            ]
        },
    )
}

/// Where a forever stream holds the message of `subject`, as a duplicate output.
async fn held(js: &Context, subject: &str) -> anyhow::Result<OutputRef> {
    let name = js
        .stream_by_subject(subject)
        .await
        .map_err(|e| anyhow::anyhow!("finding the stream that holds `{subject}`: {e}"))?;
    let stream = js.get_stream_no_info(&name).await?;
    let message = stream
        .get_last_raw_message_by_subject(subject)
        .await
        .map_err(|e| anyhow::anyhow!("reading what `{name}` holds on `{subject}`: {e}"))?;
    Ok(OutputRef {
        stream: name,
        sequence: message.sequence,
        duplicate: true,
    })
}

/// What a dead letter says about the original message.
pub struct DeadLetter<'a> {
    /// The reason.
    pub reason: &'a str,
    /// The last attempt (0 when it never ran).
    pub attempt: u32,
    /// The route, if one matched.
    pub route: &'a str,
    /// The idempotency key, if there was one.
    pub key: &'a str,
    /// Deduplicates repeats of this dead letter.
    pub id: String,
    /// The digest of the version that ran it (empty when none did).
    pub digest: &'a str,
}

/// Why a dead letter was not stored.
#[derive(Debug, Error)]
pub enum DeadLetterError {
    /// The server did not answer or the connection broke: try again later.
    #[error("dead letter on `{subject}` not stored (will retry): {source}")]
    Transient {
        /// The dead-letter subject.
        subject: String,
        /// The publish error.
        source: PublishError,
    },
    /// The dead-letter stream refused the letter and would refuse it again.
    #[error("dead letter on `{subject}` refused by the server: {source}")]
    Refused {
        /// The dead-letter subject.
        subject: String,
        /// The publish error.
        source: PublishError,
    },
}

impl From<DeadLetterError> for dedup_delivery::settle::LetterRefused {
    /// The delivery logic's view: try again later, or never stored.
    fn from(e: DeadLetterError) -> Self {
        match e {
            DeadLetterError::Transient { .. } => Self::Transient(e.to_string()),
            DeadLetterError::Refused { .. } => Self::ForGood(e.to_string()),
        }
    }
}

/// Publishes the original payload and headers plus the reason to the dead-letter subject.
/// The letter is made storable first: the original's `Nats-*` headers are kept under
/// [`headers::ORIGINAL_PREFIX`], and a letter over the server's max payload is cut, with
/// [`headers::TRUNCATED`] set and [`headers::SEQUENCE`] pointing at the whole message.
/// Returns whether the stream already held it (a repeat inside its duplicate window).
pub async fn publish_dead_letter(
    js: &Context,
    subject: &str,
    original: &async_nats::Message,
    sequence: u64,
    letter: DeadLetter<'_>,
) -> Result<bool, DeadLetterError> {
    let mut h = HeaderMap::new();
    for (name, values) in original.headers.iter().flat_map(|h| h.iter()) {
        let name: &str = name.as_ref();
        let controls = name
            .get(..CONTROL_HEADER_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(CONTROL_HEADER_PREFIX));
        let kept = if controls {
            format!("{}{name}", headers::ORIGINAL_PREFIX)
        } else {
            name.to_string()
        };
        for v in values {
            h.append(kept.as_str(), v.clone());
        }
    }
    if let Some(raw) = &original.raw_headers {
        let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
        h.insert(headers::RAW_HEADERS, encoded.as_str());
    }
    h.insert(headers::REASON, text::header_value(letter.reason).as_str());
    h.insert(headers::ATTEMPT, letter.attempt.to_string().as_str());
    h.insert(headers::ROUTE, letter.route);
    h.insert(headers::KEY, text::header_value(letter.key).as_str());
    if !letter.route.is_empty() && !letter.key.is_empty() {
        let claim_key = crate::claim::key::encode(letter.route, letter.key);
        h.insert(headers::CLAIM_KEY, claim_key.as_str());
    }
    h.insert(
        headers::SUBJECT,
        text::header_value(&original.subject).as_str(),
    );
    h.insert(headers::SEQUENCE, sequence.to_string().as_str());
    if !letter.digest.is_empty() {
        h.insert(headers::DIGEST, letter.digest);
    }
    h.insert("Nats-Msg-Id", letter.id.as_str());

    let max = js.client().max_payload().max(4096);
    let mut payload = original.payload.clone();
    if header_bytes(&h) + payload.len() + SIZE_MARGIN > max {
        h.insert(headers::TRUNCATED, payload.len().to_string().as_str());
        let room = max.saturating_sub(header_bytes(&h) + SIZE_MARGIN);
        if room == 0 {
            // The original's headers alone are too big: keep only the host's.
            h = keep_dedup_headers(&h);
        }
        let room = max.saturating_sub(header_bytes(&h) + SIZE_MARGIN);
        payload.truncate(room);
    }
    let refused = |source: PublishError| {
        let subject = subject.to_string();
        // Only what no retry can change is a refusal; anything else the server says (a full
        // discard-new stream, insufficient resources, a leader change) may pass, and the
        // message stays in its stream until the letter is stored.
        let too_big_for_the_stream = || {
            std::error::Error::source(&source)
                .is_some_and(|e| e.to_string().contains(MESSAGE_TOO_BIG_FOR_STREAM))
        };
        match source.kind() {
            PublishErrorKind::MaxPayloadExceeded
            | PublishErrorKind::WrongLastMessageId
            | PublishErrorKind::WrongLastSequence => DeadLetterError::Refused { subject, source },
            PublishErrorKind::Other if too_big_for_the_stream() => {
                DeadLetterError::Refused { subject, source }
            }
            _ => DeadLetterError::Transient { subject, source },
        }
    };
    let ack = js
        .publish_with_headers(subject.to_string(), h, payload)
        .await
        .map_err(refused)?
        .await
        .map_err(refused)?;
    Ok(ack.duplicate)
}

/// Bytes a header block takes on the wire: `NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`.
fn header_bytes(h: &HeaderMap) -> usize {
    let lines: usize = h
        .iter()
        .map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(|v| name.len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum();
    10 + lines + 2
}

/// Only the headers the host set (`Dedup-*` and the message id).
fn keep_dedup_headers(h: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for (name, values) in h.iter() {
        let n: &str = name.as_ref();
        let original = n.starts_with(headers::ORIGINAL_PREFIX) || n == headers::RAW_HEADERS;
        if n.starts_with("Dedup-") && !original || n == "Nats-Msg-Id" {
            for v in values {
                kept.append(name.clone(), v.clone());
            }
        }
    }
    kept
}
