//! Messages the server gave up delivering. A message whose headers the client cannot parse
//! (bytes that are not UTF-8, stored through a raw `HPUB`) makes async-nats drop the whole
//! connection each time it is delivered, so the pipeline never sees it. The consumers' server
//! side bound on deliveries (`source.server_max_deliver`) ends that loop; the server then
//! publishes a `MAX_DELIVERIES` advisory, and this loop reads the message from the stream
//! through the JetStream API (where headers arrive base64-encoded), cleans its headers, and
//! dead-letters it, unless its key was completed meanwhile (then it was only a duplicate).

use std::str::FromStr;
use std::sync::Arc;

use async_nats::{HeaderMap, HeaderName, HeaderValue, Message, Subject};
use base64::Engine as _;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::watch;

use super::effects::{self, DeadLetter};
use super::Shared;
use crate::claim::{ClaimState, ClaimStore};
use crate::metrics::MessageOutcome;

/// The queue group hosts share, so one of them handles each advisory.
const QUEUE: &str = "dedup-host-undeliverable";

/// The fields of a `MAX_DELIVERIES` advisory the host uses.
#[derive(Debug, Deserialize)]
struct Advisory {
    stream_seq: u64,
    deliveries: u64,
}

/// A stored message as the `STREAM.MSG.GET` API returns it.
#[derive(Debug, Deserialize)]
struct Stored {
    message: StoredMessage,
}

#[derive(Debug, Deserialize)]
struct StoredMessage {
    subject: String,
    #[serde(default)]
    hdrs: Option<String>,
    #[serde(default)]
    data: Option<String>,
}

/// Handles advisories until `stopped`.
pub(super) async fn run<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    client: async_nats::Client,
    mut stopped: watch::Receiver<bool>,
) {
    let stream = &shared.config.source.stream;
    let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*");
    let mut advisories = match client.queue_subscribe(subject, QUEUE.into()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot follow max-deliveries advisories; undeliverable messages will stay in the stream: {e}");
            return;
        }
    };
    loop {
        let advisory = tokio::select! {
            a = advisories.next() => match a { Some(a) => a, None => return },
            _ = stopped.changed() => return,
        };
        let Ok(advisory) = serde_json::from_slice::<Advisory>(&advisory.payload) else {
            continue;
        };
        if let Err(e) = shared.undeliverable(&client, &advisory).await {
            tracing::error!(
                sequence = advisory.stream_seq,
                "undeliverable message not dead-lettered; it stays in stream `{stream}`: {e:#}"
            );
        }
    }
}

impl<S: ClaimStore> Shared<S> {
    async fn undeliverable(
        &self,
        client: &async_nats::Client,
        advisory: &Advisory,
    ) -> anyhow::Result<()> {
        let sequence = advisory.stream_seq;
        let api = format!("$JS.API.STREAM.MSG.GET.{}", self.config.source.stream);
        let body = serde_json::json!({ "seq": sequence }).to_string();
        let reply = client.request(api, body.into()).await?;
        let stored: Stored = serde_json::from_slice(&reply.payload)
            .map_err(|e| anyhow::anyhow!("message {sequence} not readable from the stream: {e}"))?;
        let message = decode(stored.message)?;
        let route = self.routes.find(&message.subject);
        if let Some(route) = &route {
            let id = crate::idempotency::derive(
                &route.key,
                &message.subject,
                message.headers.as_ref(),
                &message.payload,
            );
            if let Ok(id) = id {
                // A fenced route's claims are in its output stream, not the bucket.
                let claim = self.claimer.store().get(&route.claim_key(&id)).await;
                if let Ok(Some((record, _))) = claim {
                    if record.state == ClaimState::Completed {
                        return Ok(()); // a duplicate of work that was done
                    }
                }
            }
        }
        let reason = format!(
            "the server gave up after {} deliveries: the host could not take the message (headers it cannot parse, or a key that stayed busy)",
            advisory.deliveries
        );
        tracing::error!(sequence, subject = %message.subject, "dead-lettering: {reason}");
        let letter = DeadLetter {
            reason: &reason,
            attempt: 0,
            route: "",
            key: "",
            id: format!("dl:seq:{sequence}"),
        };
        let subject = &self.config.dead_letter.subject;
        effects::publish_dead_letter(&self.js, subject, &message, sequence, letter).await?;
        let metrics = self.metrics_of(route.as_ref());
        metrics.outcome(MessageOutcome::DeadLettered);
        Ok(())
    }
}

/// The stored message with its headers cleaned: each line that parses as `name: value` is
/// kept (invalid UTF-8 replaced, control characters dropped), everything else is dropped.
fn decode(stored: StoredMessage) -> anyhow::Result<Message> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = match stored.data {
        Some(data) => b64.decode(data)?,
        None => Vec::new(),
    };
    let headers = match stored.hdrs {
        Some(hdrs) => {
            let raw = b64.decode(hdrs)?;
            let text = String::from_utf8_lossy(&raw);
            let mut headers = HeaderMap::new();
            for line in text.lines().skip(1) {
                let Some((name, value)) = line.split_once(':') else {
                    continue;
                };
                let value: String = value.trim().chars().filter(|c| !c.is_control()).collect();
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_str(name.trim()),
                    HeaderValue::from_str(&value),
                ) {
                    headers.append(name, value);
                }
            }
            Some(headers)
        }
        None => None,
    };
    let length = payload.len();
    Ok(Message {
        subject: Subject::from(stored.subject),
        reply: None,
        payload: payload.into(),
        headers,
        status: None,
        description: None,
        length,
    })
}
