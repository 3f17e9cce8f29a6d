//! A key's journal of outbound HTTP calls as the operator commands see it (`inspect`,
//! `audit`, `dead-letters replay`): read and discarded beside the claim, never written
//! ([`crate::claim::journal`] writes it, fenced by the claim).

use async_nats::jetstream::Context;
use dedup_delivery::journal::{CallRecord, CallState, JournalError};

use crate::claim::kv::is_cas_conflict;
use crate::claim::stream::EXPECTED_LAST_SUBJECT_SEQUENCE;

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
        let (stream, claim_subject) = crate::claim::journal::place(bucket, store_key);
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
        let latest = self.latest().await?;
        Ok(latest.into_iter().map(|(record, _)| record).collect())
    }

    /// Every call record of the key (the latest of each index) with its stream sequence, by
    /// index.
    async fn latest(&self) -> Result<Vec<(CallRecord, u64)>, JournalError> {
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
                latest.insert(m.subject, (record, m.sequence));
            }
        }
        let mut records: Vec<(CallRecord, u64)> = latest.into_values().collect();
        records.sort_by_key(|(r, _)| r.index);
        Ok(records)
    }

    /// Removes the key's call records: every one (`all`), or only those left PENDING.
    /// Returns how many were removed. Only while no run holds the key (a replay resets it
    /// first): a run's records are its own.
    ///
    /// A record is cleared by a marker on its own subject (a message with the
    /// `KV-Operation: DEL` header, a KV deletion marker, which every reader of a journal takes
    /// for no record), in the claim bucket and in a fenced output stream alike: a publish on
    /// the claim subjects is all the console needs, where a purge would take a grant on the
    /// whole stream (a purge grant cannot be limited to one subject; in a fenced stream it
    /// would reach the outputs). The marker expects the sequence of the record read
    /// (`Nats-Expected-Last-Subject-Sequence` on its subject): a record a run wrote since
    /// (a host claimed the key meanwhile) is not cleared, and the discard stops saying so.
    pub async fn discard(&self, all: bool) -> Result<usize, JournalError> {
        let mut removed = 0;
        for (record, sequence) in self.latest().await? {
            if all || record.state == CallState::Pending {
                self.clear_at(record.index, sequence).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes the record of call `index`, read at stream sequence `sequence` (see
    /// [`KeyCalls::discard`]): the marker is refused, and nothing changes, when the record
    /// was written since.
    pub async fn clear_at(&self, index: u32, sequence: u64) -> Result<(), JournalError> {
        self.clear(&self.subject_of(index), sequence).await
    }

    /// Removes the record on `subject`, read at stream sequence `sequence` (see
    /// [`KeyCalls::discard`]).
    async fn clear(&self, subject: &str, sequence: u64) -> Result<(), JournalError> {
        let unavailable = |e: &dyn std::fmt::Display| JournalError::Unavailable(e.to_string());
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(CLEARED_HEADER, CLEARED_VALUE);
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            sequence.to_string().as_str(),
        );
        let ack = (self.js)
            .publish_with_headers(subject.to_string(), headers, bytes::Bytes::new())
            .await
            .map_err(|e| unavailable(&e))?;
        match ack.await {
            Ok(_) => Ok(()),
            Err(e) if is_cas_conflict(&e) => Err(JournalError::Unavailable(format!(
                "call record `{subject}` changed since it was read (a run of the key wrote it meanwhile), so it was not cleared: see the key with `dedup-host inspect`, and replay again once no run holds it"
            ))),
            Err(e) => Err(unavailable(&e)),
        }
    }
}

/// The header of a cleared call record's marker: a KV deletion marker's, which the journal's
/// readers ([`crate::claim::journal`], [`KeyCalls::records`]) take for no record.
const CLEARED_HEADER: &str = "KV-Operation";

/// [`CLEARED_HEADER`]'s value: the key deleted.
const CLEARED_VALUE: &str = "DEL";
