//! What leaves the host: handler outputs and dead letters, each with a deterministic
//! `Nats-Msg-Id` so a repeat is deduplicated by the receiving stream.

use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use futures::future::try_join_all;

use crate::bindings::Output;

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
    /// The subject the message was published on.
    pub const SUBJECT: &str = "Dedup-Original-Subject";
    /// The message's sequence in the source stream.
    pub const SEQUENCE: &str = "Dedup-Stream-Sequence";
}

/// The `Nats-Msg-Id` of output `index` of a claim key.
pub fn output_id(claim_key: &str, index: usize) -> String {
    format!("{claim_key}#{index}")
}

/// Publishes outputs in order, pipelined, and waits for every stream ack. Returns how many
/// the streams reported as duplicates.
pub async fn publish_outputs(
    js: &Context,
    claim_key: &str,
    outputs: &[Output],
) -> anyhow::Result<usize> {
    let mut acks = Vec::with_capacity(outputs.len());
    for (i, o) in outputs.iter().enumerate() {
        let mut h = HeaderMap::new();
        for header in &o.headers {
            h.append(header.name.as_str(), header.value.as_str());
        }
        h.insert("Nats-Msg-Id", output_id(claim_key, i).as_str());
        let ack = js
            .publish_with_headers(o.subject.clone(), h, o.payload.clone().into())
            .await
            .map_err(|e| anyhow::anyhow!("publishing output {i} on `{}`: {e}", o.subject))?;
        acks.push(async move {
            ack.await.map_err(|e| {
                anyhow::anyhow!("output {i}: {e} (is a stream capturing this subject?)")
            })
        });
    }
    let acks = try_join_all(acks).await?;
    Ok(acks.iter().filter(|a| a.duplicate).count())
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
}

/// Publishes the original payload and headers plus the reason to the dead-letter subject.
pub async fn publish_dead_letter(
    js: &Context,
    subject: &str,
    original: &async_nats::Message,
    sequence: u64,
    letter: DeadLetter<'_>,
) -> anyhow::Result<()> {
    let mut h = original.headers.clone().unwrap_or_default();
    h.insert(headers::REASON, single_line(letter.reason).as_str());
    h.insert(headers::ATTEMPT, letter.attempt.to_string().as_str());
    h.insert(headers::ROUTE, letter.route);
    h.insert(headers::KEY, single_line(letter.key).as_str());
    h.insert(headers::SUBJECT, original.subject.as_str());
    h.insert(headers::SEQUENCE, sequence.to_string().as_str());
    h.insert("Nats-Msg-Id", letter.id.as_str());
    js.publish_with_headers(subject.to_string(), h, original.payload.clone())
        .await
        .map_err(|e| anyhow::anyhow!("publishing dead letter on `{subject}`: {e}"))?
        .await
        .map_err(|e| anyhow::anyhow!("dead letter on `{subject}` not stored: {e}"))?;
    Ok(())
}

/// Header values cannot hold line breaks.
fn single_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    flat.chars().take(1024).collect()
}
