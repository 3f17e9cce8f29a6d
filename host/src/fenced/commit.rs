//! Sending a fenced route's success as one atomic batch: every output, then the completed
//! claim record with `Nats-Batch-Commit` and the owner's expected revision.
//!
//! [`prepare`] lays out one commit's messages, [`commit`] sends one commit as its own batch;
//! [`super::group`] sends the prepared commits of several messages as one batch.

use std::error::Error as _;
use std::time::Duration;

use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::Context;
use async_nats::HeaderMap;

use super::OUTPUT_ID;
use crate::bindings::Output;
use crate::claim::key::output_id;
use crate::claim::kv::is_cas_conflict;
use crate::claim::stream::StreamClaimStore;
use crate::claim::{ClaimError, ClaimRecord};
use crate::runtime::outputs::header_map;

/// The batch headers (checked in nats-server's `server/stream.go`).
pub mod headers {
    /// The batch's id (at most 64 characters), on every message.
    pub const BATCH_ID: &str = "Nats-Batch-Id";
    /// The message's place in the batch, from 1, on every message.
    pub const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
    /// `1` on the last message: commit.
    pub const BATCH_COMMIT: &str = "Nats-Batch-Commit";
}

/// The batch was incomplete (a message lost on the way, or the server dropped it): nothing
/// was stored, so the batch may be sent again.
const INCOMPLETE_BATCH: u64 = 10176;
/// The stream already has 50 batches in flight (or the server 1,000): nothing was stored.
const TOO_MANY_IN_FLIGHT: u64 = 10210;
/// The stream does not accept atomic batches (created without `allow_atomic`).
const ATOMIC_DISABLED: u64 = 10174;
/// How often a batch the server did not take is sent again before giving up for now.
const ATTEMPTS: u32 = 5;

/// One message of a batch, before the batch headers.
pub struct BatchMessage {
    subject: String,
    headers: HeaderMap,
    payload: bytes::Bytes,
}

impl BatchMessage {
    /// The subject it is published on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Every header line it carries before the batch headers, as (name, value), in order.
    pub fn header_lines(&self) -> impl Iterator<Item = (&str, &str)> {
        crate::runtime::outputs::header_lines(&self.headers)
    }

    /// Its payload's size in bytes.
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }
}

/// The messages of one fenced commit, in batch order: `outputs` (each with [`OUTPUT_ID`]
/// `<claim_key>#<index>`; headers checked at the sandbox boundary, plus the event's `trace`
/// context where an output sets none), then `record` on `claim_subject`, expecting the claim
/// at `revision`. The record is last, so its sequence is the commit's.
pub fn prepare(
    (claim_subject, claim_key): (&str, &str),
    record: &ClaimRecord,
    revision: u64,
    outputs: &[Output],
    trace: &[(&str, &str)],
) -> Vec<BatchMessage> {
    let mut messages = Vec::with_capacity(outputs.len() + 1);
    for (i, o) in outputs.iter().enumerate() {
        let mut headers = header_map(&o.headers);
        for (name, value) in trace {
            if headers.get(*name).is_none() {
                headers.insert(*name, *value);
            }
        }
        headers.insert(OUTPUT_ID, output_id(claim_key, i).as_str());
        messages.push(BatchMessage {
            subject: o.subject.clone(),
            headers,
            payload: o.payload.clone().into(),
        });
    }
    messages.push(BatchMessage {
        subject: claim_subject.to_string(),
        headers: StreamClaimStore::completion_headers(revision),
        payload: record.to_bytes(),
    });
    messages
}

/// Commits `outputs` and `record` on `claim_subject` as one batch of their own ([`prepare`]
/// lays them out), expecting the claim at `revision`. Returns the record's new revision (its
/// stream sequence; the outputs are the sequences right before it).
///
/// [`ClaimError::Conflict`]: the claim moved (a stale owner) and nothing was stored.
/// [`ClaimError::Unavailable`]: no answer, and the batch may or may not have landed; the
/// caller reads the record back to tell.
pub async fn commit(
    js: &Context,
    claim_subject: &str,
    claim_key: &str,
    record: &ClaimRecord,
    revision: u64,
    outputs: &[Output],
    trace: &[(&str, &str)],
) -> Result<u64, ClaimError> {
    let messages = prepare((claim_subject, claim_key), record, revision, outputs, trace);
    commit_prepared(js, &messages).await
}

/// Sends prepared messages (one commit's, or several commits' laid end to end) as one batch,
/// answering like [`commit`].
pub async fn commit_prepared(js: &Context, messages: &[BatchMessage]) -> Result<u64, ClaimError> {
    match send_batch(js, messages).await {
        Ok(sequence) => Ok(sequence),
        Err(Failure::Refused(e)) if is_cas_conflict(&e) => Err(ClaimError::Conflict),
        Err(Failure::Refused(e)) if code(&e) == Some(ATOMIC_DISABLED) => {
            let subject = messages.last().map_or("", |m| m.subject.as_str());
            Err(ClaimError::Unavailable(format!(
                "fenced commit refused, the stream of `{subject}` does not accept atomic batches ({e}): mark its [[output_streams]] entry effects = \"fenced\" and restart the hosts, or run `dedup-host setup` to see what differs"
            )))
        }
        Err(e) => Err(ClaimError::Unavailable(e.to_string())),
    }
}

/// Why a batch was not stored (or may not have been).
pub enum Failure {
    /// The server answered with an error: nothing of the batch was stored.
    Refused(PublishError),
    /// The server did not take the batch (incomplete, too many in flight) in [`ATTEMPTS`]
    /// tries: nothing was stored.
    NotTaken(String),
    /// No answer: the batch may or may not have landed.
    NoAnswer(PublishError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(e) | Failure::NoAnswer(e) => write!(f, "fenced commit: {e}"),
            Failure::NotTaken(e) => {
                write!(f, "fenced commit not taken after {ATTEMPTS} tries: {e}")
            }
        }
    }
}

/// Sends `messages` as one batch, again (with a new id, after a growing pause) while the
/// server does not take it, up to [`ATTEMPTS`] times. Returns the last message's sequence.
pub async fn send_batch(js: &Context, messages: &[BatchMessage]) -> Result<u64, Failure> {
    let mut last = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
        }
        match send(js, messages).await {
            Ok(sequence) => return Ok(sequence),
            Err(e) if matches!(code(&e), Some(INCOMPLETE_BATCH | TOO_MANY_IN_FLIGHT)) => {
                tracing::debug!("fenced batch not taken, sending it again: {e}");
                last = Some(e);
            }
            Err(e) if code(&e).is_some() || is_cas_conflict(&e) => {
                return Err(Failure::Refused(e));
            }
            Err(e) => return Err(Failure::NoAnswer(e)),
        }
    }
    Err(Failure::NotTaken(
        last.map_or_else(String::new, |e| e.to_string()),
    ))
}

/// Sends one batch: every message but the last without a reply (the server answers only the
/// commit), then the last with the commit. The batch headers go on copies, so `messages` can
/// be sent again, alone or with others.
async fn send(js: &Context, messages: &[BatchMessage]) -> Result<u64, PublishError> {
    let Some((last, rest)) = messages.split_last() else {
        return Ok(0);
    };
    let id = format!("{:032x}", rand::random::<u128>());
    let client = js.client();
    for (i, m) in rest.iter().enumerate() {
        let mut h = m.headers.clone();
        h.insert(headers::BATCH_ID, id.as_str());
        h.insert(headers::BATCH_SEQUENCE, (i + 1).to_string().as_str());
        client
            .publish_with_headers(m.subject.clone(), h, m.payload.clone())
            .await
            .map_err(|e| {
                PublishError::with_source(
                    async_nats::jetstream::context::PublishErrorKind::BrokenPipe,
                    e,
                )
            })?;
    }
    let mut h = last.headers.clone();
    // A lone record is atomic as one message is: no batch, which at one replica on file
    // storage would cost the server a file store of its own.
    if !rest.is_empty() {
        h.insert(headers::BATCH_ID, id.as_str());
        h.insert(
            headers::BATCH_SEQUENCE,
            (rest.len() + 1).to_string().as_str(),
        );
        h.insert(headers::BATCH_COMMIT, "1");
    }
    let ack = js
        .publish_with_headers(last.subject.clone(), h, last.payload.clone())
        .await?
        .await?;
    Ok(ack.sequence)
}

/// The JetStream error code of a refused publish, if the server sent one.
fn code(e: &PublishError) -> Option<u64> {
    e.source()?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|js| js.error_code().0)
}
