//! Sending a fenced route's success as one atomic batch: every output, then the completed
//! claim record with `Nats-Batch-Commit` and the owner's expected revision.

use std::error::Error as _;
use std::time::Duration;

use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::Context;

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

/// Commits `outputs` (each with [`OUTPUT_ID`] `<claim_key>#<index>`; headers checked at the sandbox boundary, plus the event's `trace`
/// context where an output sets none) and `record` on `claim_subject`, expecting the claim at
/// `revision`. Returns the record's new revision (its stream sequence; the outputs are the
/// sequences right before it).
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
    let mut last = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
        }
        match send(
            js,
            (claim_subject, claim_key),
            record,
            revision,
            outputs,
            trace,
        )
        .await
        {
            Ok(sequence) => return Ok(sequence),
            Err(e) if is_cas_conflict(&e) => return Err(ClaimError::Conflict),
            Err(e) if matches!(code(&e), Some(INCOMPLETE_BATCH | TOO_MANY_IN_FLIGHT)) => {
                tracing::debug!("fenced batch not taken, sending it again: {e}");
                last = Some(e);
            }
            Err(e) if code(&e) == Some(ATOMIC_DISABLED) => {
                return Err(ClaimError::Unavailable(format!(
                    "fenced commit refused, the stream of `{claim_subject}` does not accept atomic batches ({e}): mark its [[output_streams]] entry effects = \"fenced\" and restart the hosts, or run `dedup-host setup` to see what differs"
                )));
            }
            Err(e) => return Err(ClaimError::Unavailable(format!("fenced commit: {e}"))),
        }
    }
    let e = last.map_or_else(String::new, |e| e.to_string());
    Err(ClaimError::Unavailable(format!(
        "fenced commit not taken after {ATTEMPTS} tries: {e}"
    )))
}

/// Sends one batch: outputs without replies (the server answers only the commit), then the
/// record with the commit and the expectation.
async fn send(
    js: &Context,
    (claim_subject, claim_key): (&str, &str),
    record: &ClaimRecord,
    revision: u64,
    outputs: &[Output],
    trace: &[(&str, &str)],
) -> Result<u64, PublishError> {
    let id = format!("{:032x}", rand::random::<u128>());
    let client = js.client();
    for (i, o) in outputs.iter().enumerate() {
        let mut h = header_map(&o.headers);
        for (name, value) in trace {
            if h.get(*name).is_none() {
                h.insert(*name, *value);
            }
        }
        h.insert(OUTPUT_ID, output_id(claim_key, i).as_str());
        h.insert(headers::BATCH_ID, id.as_str());
        h.insert(headers::BATCH_SEQUENCE, (i + 1).to_string().as_str());
        client
            .publish_with_headers(o.subject.clone(), h, o.payload.clone().into())
            .await
            .map_err(|e| {
                PublishError::with_source(
                    async_nats::jetstream::context::PublishErrorKind::BrokenPipe,
                    e,
                )
            })?;
    }
    let mut h = StreamClaimStore::write_headers(revision);
    // Without outputs the record alone is the commit, atomic as one message is: no batch,
    // which at one replica on file storage would cost the server a file store of its own.
    if !outputs.is_empty() {
        h.insert(headers::BATCH_ID, id.as_str());
        h.insert(
            headers::BATCH_SEQUENCE,
            (outputs.len() + 1).to_string().as_str(),
        );
        h.insert(headers::BATCH_COMMIT, "1");
    }
    let ack = js
        .publish_with_headers(claim_subject.to_string(), h, record.to_bytes())
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
