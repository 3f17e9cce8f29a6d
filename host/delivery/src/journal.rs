//! The journal of a run's outbound calls (DESIGN.md rule 24): each call a guest makes gets an
//! index in its run and an idempotency key stable across re-runs (claim key + index); its
//! intent is recorded (PENDING) before it is sent and its answer (SENT) before the guest sees
//! it. A re-run of the key replays recorded answers call by call instead of sending again.
//!
//! Everything here decides; the records live wherever the host's [`CallStore`] keeps them
//! (beside the claim, fenced by it).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::redact::mask_url;

/// What becomes of a call left PENDING by an earlier run (the host died, or lost its lease,
/// between sending it and recording the answer): nobody knows whether it took effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnUnknown {
    /// Send it again under the same idempotency key: exactly once when the provider
    /// deduplicates by that key, at least once otherwise.
    #[default]
    Resend,
    /// Never send it again: the message is dead-lettered ("outcome unknown") for an operator.
    Fail,
}

/// A call as the journal compares it across runs: method, URL and a digest of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRequest {
    /// The method, upper case (`POST`).
    pub method: String,
    /// The full URL (`http://host:port/path?query`).
    pub url: String,
    /// `sha256:<hex>` of the body.
    pub body_digest: String,
}

impl CallRequest {
    /// The request `method url` with `body`.
    pub fn new(method: &str, url: &str, body: &[u8]) -> Self {
        Self {
            method: method.to_ascii_uppercase(),
            url: url.to_string(),
            body_digest: format!("sha256:{}", hex::encode(Sha256::digest(body))),
        }
    }
}

/// Whether a recorded call's answer is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Recorded before sending; the answer was never recorded.
    Pending,
    /// The answer is recorded.
    Sent,
}

/// An answer as recorded, replayed to a re-run byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedResponse {
    /// HTTP status code.
    pub status: u16,
    /// Response headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body, hex-encoded in the record.
    #[serde(with = "hex_bytes")]
    pub body: Vec<u8>,
}

/// One journal record: a call of a run, its state and (once SENT) its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The call's index in its run, from 0.
    pub index: u32,
    /// PENDING or SENT.
    pub state: CallState,
    /// The request's method.
    pub method: String,
    /// The request's URL.
    pub url: String,
    /// The request body's digest.
    pub body_digest: String,
    /// The idempotency key the call carried.
    pub idempotency_key: String,
    /// When the record was written, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The answer, once SENT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<RecordedResponse>,
    /// The fencing token of the run that wrote the record (stamped by the store that fences
    /// the write): a later run of the key, under another token, was answered from the
    /// journal. `None` in records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
}

impl CallRecord {
    /// The record as stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a call record serializes")
    }

    /// A stored record.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// What to do with call `index` of a run, given what the journal holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing recorded: record PENDING, then send.
    Send,
    /// Left PENDING by an earlier run, and the route resends: send again (same key).
    Resend,
    /// Answered in an earlier run: give the guest the recorded answer; send nothing.
    Replay(RecordedResponse),
    /// Left PENDING, and the route fails such calls: dead-letter with this reason.
    Unknown(String),
    /// The guest asks for something else than an earlier run did at this index: it is not
    /// deterministic; dead-letter with this reason.
    Mismatch(String),
}

/// Decides call `index` of a run making `request`, given the journal's record for that index.
pub fn decide(
    index: u32,
    recorded: Option<&CallRecord>,
    request: &CallRequest,
    on_unknown: OnUnknown,
) -> Decision {
    let Some(recorded) = recorded else {
        return Decision::Send;
    };
    let same = recorded.method == request.method
        && recorded.url == request.url
        && recorded.body_digest == request.body_digest;
    if !same {
        // The URLs as shown, secrets masked: say so when only a masked part differs.
        let (now, then) = (mask_url(&request.url), mask_url(&recorded.url));
        let masked = match now == then && request.url != recorded.url {
            true => " (the URLs differ in a masked secret)",
            false => "",
        };
        return Decision::Mismatch(format!(
            "the handler is not deterministic: outbound call {index} is {} {now} (body {}), but an earlier run of this key sent {} {then} (body {}) at that index{masked}; fix the handler so a re-run makes the same calls, then replay the dead letter",
            request.method, request.body_digest, recorded.method, recorded.body_digest
        ));
    }
    match (recorded.state, &recorded.response, on_unknown) {
        (CallState::Sent, Some(response), _) => Decision::Replay(response.clone()),
        (_, _, OnUnknown::Resend) => Decision::Resend,
        (_, _, OnUnknown::Fail) => Decision::Unknown(format!(
            "outcome unknown: outbound call {index} ({} {}, idempotency key `{}`) was sent by an earlier run whose answer was never recorded, and the route's http.on_unknown is \"fail\": check with the provider whether it took effect, then replay this dead letter (its call is sent again under the same idempotency key) or leave it",
            recorded.method, mask_url(&recorded.url), mask_url(&recorded.idempotency_key)
        )),
    }
}

/// The idempotency key of call `index` of claim key `claim_key`: the same in every run.
pub fn idempotency_key(claim_key: &str, index: u32) -> String {
    format!("{claim_key}.call.{index}")
}

/// Why the journal could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The claim is no longer this run's (reclaimed by another host): it must not record or
    /// send anything.
    #[error("the claim was taken over by another run: this run may not record or send calls")]
    Fenced,
    /// The store did not answer.
    #[error("the call journal is unavailable: {0}")]
    Unavailable(String),
    /// A replay-only journal (a shadow run) was asked to record a call.
    #[error("a shadow run records no call: its journal only replays the live run's answers")]
    ReplayOnly,
    /// A stored record does not parse.
    #[error("journal record of call {index} does not parse: {message}")]
    Corrupt {
        /// The call's index.
        index: u32,
        /// The parser's complaint.
        message: String,
    },
}

/// A boxed future of a [`CallStore`] operation.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, JournalError>> + Send + 'a>>;

/// Where one run's call records are kept (the seam the host and the tests implement). Writes
/// must be refused ([`JournalError::Fenced`]) once the run's claim is not its own.
pub trait CallStore: Send + Sync {
    /// The record of call `index`, if any.
    fn read(&self, index: u32) -> StoreFuture<'_, Option<CallRecord>>;
    /// Stores `record` (replacing an earlier one of its index).
    fn write(&self, record: CallRecord) -> StoreFuture<'_, ()>;
}

/// What the guest's call `index` gets, once the journal has been consulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Send it, after recording it PENDING.
    Send,
    /// Answer it with this recorded response, sending nothing.
    Replay(RecordedResponse),
    /// Send nothing, and dead-letter the message with this reason.
    Stop(String),
    /// Send nothing and refuse the call (a replay-only journal: a shadow run); the run goes
    /// on, its guest sees an error.
    Refuse(String),
}

/// One run's journal: its calls' records under claim key `claim_key`.
#[derive(Clone)]
pub struct Journal {
    store: Arc<dyn CallStore>,
    claim_key: String,
    on_unknown: OnUnknown,
    replay_only: bool,
}

impl Journal {
    /// The journal of the run holding `claim_key`, kept in `store`.
    pub fn new(store: Arc<dyn CallStore>, claim_key: &str, on_unknown: OnUnknown) -> Self {
        Self {
            store,
            claim_key: claim_key.to_string(),
            on_unknown,
            replay_only: false,
        }
    }

    /// The same journal for a run that must never send (a shadow candidate beside the live
    /// run): calls the journal answered are replayed, every other call is refused, and
    /// nothing is ever recorded.
    pub fn replay_only(mut self) -> Self {
        self.replay_only = true;
        self
    }

    /// Whether this run only replays ([`Journal::replay_only`]).
    pub fn is_replay_only(&self) -> bool {
        self.replay_only
    }

    /// The idempotency key of call `index`.
    pub fn key_of(&self, index: u32) -> String {
        idempotency_key(&self.claim_key, index)
    }

    /// Consults the journal before call `index`: send it, replay a recorded answer, or stop.
    /// Sending starts with [`Journal::pending`].
    pub async fn begin(&self, index: u32, request: &CallRequest) -> Result<Begin, JournalError> {
        let recorded = self.store.read(index).await?;
        let decision = decide(index, recorded.as_ref(), request, self.on_unknown);
        if self.replay_only {
            return Ok(match decision {
                Decision::Replay(response) => Begin::Replay(response),
                Decision::Mismatch(reason) => Begin::Refuse(reason),
                _ => Begin::Refuse(format!(
                    "a shadow run never sends: outbound call {index} ({} {}) has no recorded answer in the live run's journal",
                    request.method, mask_url(&request.url)
                )),
            });
        }
        Ok(match decision {
            Decision::Send | Decision::Resend => Begin::Send,
            Decision::Replay(response) => Begin::Replay(response),
            Decision::Unknown(reason) | Decision::Mismatch(reason) => Begin::Stop(reason),
        })
    }

    /// Records call `index` PENDING: the last step before its first byte leaves the host.
    /// `now_ms` stamps the record.
    pub async fn pending(
        &self,
        index: u32,
        request: &CallRequest,
        now_ms: u64,
    ) -> Result<(), JournalError> {
        if self.replay_only {
            return Err(JournalError::ReplayOnly);
        }
        let pending = self.record_of(index, request, CallState::Pending, None, now_ms);
        self.store.write(pending).await
    }

    /// Records call `index`'s answer (SENT): before the guest may see it.
    pub async fn sent(
        &self,
        index: u32,
        request: &CallRequest,
        response: RecordedResponse,
        now_ms: u64,
    ) -> Result<(), JournalError> {
        if self.replay_only {
            return Err(JournalError::ReplayOnly);
        }
        let sent = self.record_of(index, request, CallState::Sent, Some(response), now_ms);
        self.store.write(sent).await
    }

    fn record_of(
        &self,
        index: u32,
        request: &CallRequest,
        state: CallState,
        response: Option<RecordedResponse>,
        at_ms: u64,
    ) -> CallRecord {
        CallRecord {
            index,
            state,
            method: request.method.clone(),
            url: request.url.clone(),
            body_digest: request.body_digest.clone(),
            idempotency_key: self.key_of(index),
            at_ms,
            response,
            token: None,
        }
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("claim_key", &self.claim_key)
            .field("on_unknown", &self.on_unknown)
            .field("replay_only", &self.replay_only)
            .finish_non_exhaustive()
    }
}

/// Bytes as a hex string in a record.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        hex::decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
