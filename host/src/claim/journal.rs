//! Where a run's outbound calls are journaled ([`dedup_delivery::journal`]): beside its claim,
//! in the store that holds the claim (the claim bucket, or a fenced route's stream), on
//! subjects `<claim subject>.call.<index>`. Every write is fenced by the claim: it is sent only
//! while the claim record is this run's (in progress, with this run's fencing token) and
//! carries `Nats-Expected-Last-Subject-Sequence` on the claim's subject, so the server
//! refuses it if the claim moved in between: a stale owner can neither record nor send.

use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use dedup_delivery::journal::{CallRecord, CallState, CallStore, JournalError, StoreFuture};

use super::kv::is_cas_conflict;
use super::record::{ClaimRecord, ClaimState};
use super::stream::{stream_of, EXPECTED_LAST_SUBJECT_SEQUENCE};
use crate::subject::FENCED_CLAIMS_PREFIX;

/// The header naming the subject whose last sequence `Nats-Expected-Last-Subject-Sequence`
/// checks (nats-server 2.11+).
const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";

/// How many times a write is tried again when the claim moved under it (a heartbeat of this
/// very run renewed it).
const CLAIM_MOVES: usize = 5;

/// A key's call records, as the operator commands read and discard them (`inspect`,
/// `audit`, `dead-letters replay`): unfenced, never written through.
#[derive(Clone)]
pub struct KeyCalls {
    js: Context,
    stream: String,
    claim_subject: String,
}

impl KeyCalls {
    /// The call records of claim `store_key` (a key of bucket `bucket`, or a fenced claim
    /// subject).
    pub fn of(js: &Context, bucket: &str, store_key: &str) -> Self {
        let (stream, claim_subject) = match store_key.starts_with(FENCED_CLAIMS_PREFIX) {
            true => (
                stream_of(store_key).unwrap_or_default().to_string(),
                store_key.to_string(),
            ),
            false => (format!("KV_{bucket}"), format!("$KV.{bucket}.{store_key}")),
        };
        Self {
            js: js.clone(),
            stream,
            claim_subject,
        }
    }

    fn subject_of(&self, index: u32) -> String {
        format!("{}.call.{index}", self.claim_subject)
    }

    /// Every call record of the key (the latest of each index), by index.
    pub async fn records(&self) -> Result<Vec<CallRecord>, JournalError> {
        let filter = format!("{}.call.*", self.claim_subject);
        let stored = crate::scan::stream_from(&self.js, &self.stream, &filter, 1)
            .await
            .map_err(|e| JournalError::Unavailable(format!("{e:#}")))?;
        let mut latest = std::collections::BTreeMap::new();
        for m in stored {
            if m.header("KV-Operation").is_some() {
                latest.remove(&m.subject);
                continue;
            }
            if let Ok(record) = CallRecord::from_bytes(&m.payload) {
                latest.insert(m.subject, record);
            }
        }
        let mut records: Vec<CallRecord> = latest.into_values().collect();
        records.sort_by_key(|r| r.index);
        Ok(records)
    }

    /// Removes the key's call records: every one (`all`), or only those left PENDING.
    /// Returns how many were removed. Only while no run holds the key (a replay resets it
    /// first): a run's records are its own.
    pub async fn discard(&self, all: bool) -> Result<usize, JournalError> {
        let unavailable = |e: &dyn std::fmt::Display| JournalError::Unavailable(e.to_string());
        let stream = (self.js)
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| unavailable(&e))?;
        let mut removed = 0;
        for record in self.records().await? {
            if all || record.state == CallState::Pending {
                let subject = self.subject_of(record.index);
                stream
                    .purge()
                    .filter(subject)
                    .await
                    .map_err(|e| unavailable(&e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// One run's journal in NATS, fenced by its claim.
pub struct NatsCallStore {
    js: Context,
    stream: String,
    claim_subject: String,
    fencing_token: u64,
}

impl NatsCallStore {
    /// The journal of the run holding claim `store_key` (a key of bucket `bucket`, or a
    /// fenced claim subject) with `fencing_token`.
    pub fn for_claim(js: &Context, bucket: &str, store_key: &str, fencing_token: u64) -> Self {
        let KeyCalls {
            js,
            stream,
            claim_subject,
        } = KeyCalls::of(js, bucket, store_key);
        Self {
            js,
            stream,
            claim_subject,
            fencing_token,
        }
    }

    fn subject_of(&self, index: u32) -> String {
        format!("{}.call.{index}", self.claim_subject)
    }

    async fn stream(&self) -> Result<Stream<()>, JournalError> {
        (self.js)
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| JournalError::Unavailable(e.to_string()))
    }

    /// The last message of `subject` (payload, sequence), read from the stream's leader.
    async fn last(&self, subject: &str) -> Result<Option<(bytes::Bytes, u64)>, JournalError> {
        let stream = self.stream().await?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) if m.headers.get("KV-Operation").is_some() => Ok(None),
            Ok(m) => Ok(Some((m.payload, m.sequence))),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(JournalError::Unavailable(e.to_string())),
        }
    }

    /// The claim's revision while it is still this run's; [`JournalError::Fenced`] otherwise.
    async fn own_revision(&self) -> Result<u64, JournalError> {
        let (payload, revision) = self
            .last(&self.claim_subject)
            .await?
            .ok_or(JournalError::Fenced)?;
        let record = ClaimRecord::from_bytes(&payload).map_err(|_| JournalError::Fenced)?;
        // The record of the winning write carries no token yet: its revision is the token.
        let ours = record.state == ClaimState::InProgress
            && (record.fencing_token == Some(self.fencing_token) || revision == self.fencing_token);
        match ours {
            true => Ok(revision),
            false => Err(JournalError::Fenced),
        }
    }

    async fn put(&self, record: CallRecord) -> Result<(), JournalError> {
        let subject = self.subject_of(record.index);
        let record = CallRecord {
            token: Some(self.fencing_token),
            ..record
        };
        let payload = record.to_bytes();
        for _ in 0..CLAIM_MOVES {
            let revision = self.own_revision().await?;
            let mut headers = HeaderMap::new();
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE,
                revision.to_string().as_str(),
            );
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
                self.claim_subject.as_str(),
            );
            let sent = (self.js)
                .publish_with_headers(subject.clone(), headers, payload.clone().into())
                .await
                .map_err(|e| JournalError::Unavailable(e.to_string()))?;
            match sent.await {
                Ok(_) => return Ok(()),
                Err(e) if is_cas_conflict(&e) => continue,
                Err(e) => return Err(JournalError::Unavailable(e.to_string())),
            }
        }
        Err(JournalError::Unavailable(format!(
            "the claim moved under every one of {CLAIM_MOVES} tries to record the call"
        )))
    }
}

impl CallStore for NatsCallStore {
    fn read(&self, index: u32) -> StoreFuture<'_, Option<CallRecord>> {
        Box::pin(async move {
            let Some((payload, _)) = self.last(&self.subject_of(index)).await? else {
                return Ok(None);
            };
            let record = CallRecord::from_bytes(&payload).map_err(|e| JournalError::Corrupt {
                index,
                message: e.to_string(),
            })?;
            Ok(Some(record))
        })
    }

    fn write(&self, record: CallRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.put(record))
    }
}
