//! A key's journal of outbound HTTP calls as the operator commands see it (`inspect`,
//! `audit`, `dead-letters replay`): read and discarded beside the claim, never written
//! ([`crate::claim::journal`] writes it, fenced by the claim).

use async_nats::jetstream::Context;
use dedup_delivery::journal::{CallRecord, CallState, JournalError};

use crate::subject::FENCED_CLAIMS_PREFIX;

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
    ///
    /// In the claim bucket a record is purged (its subject's messages removed). In a fenced
    /// output stream it is cleared by a marker on its own subject instead (a message with
    /// the `KV-Operation` header, which every reader of a journal takes for no record): a
    /// publish on the claim subjects is all the console needs, where a purge would take a
    /// grant on the whole stream, outputs included (a purge grant cannot be limited to one
    /// subject).
    pub async fn discard(&self, all: bool) -> Result<usize, JournalError> {
        let mut removed = 0;
        for record in self.records().await? {
            if all || record.state == CallState::Pending {
                self.clear(&self.subject_of(record.index)).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes the record on `subject` (see [`KeyCalls::discard`]).
    async fn clear(&self, subject: &str) -> Result<(), JournalError> {
        let unavailable = |e: &dyn std::fmt::Display| JournalError::Unavailable(e.to_string());
        if self.claim_subject.starts_with(FENCED_CLAIMS_PREFIX) {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(CLEARED_HEADER, CLEARED_VALUE);
            let ack = (self.js)
                .publish_with_headers(subject.to_string(), headers, bytes::Bytes::new())
                .await
                .map_err(|e| unavailable(&e))?;
            ack.await.map_err(|e| unavailable(&e))?;
            return Ok(());
        }
        let stream = (self.js)
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| unavailable(&e))?;
        stream
            .purge()
            .filter(subject)
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(())
    }
}

/// The header of a cleared call record's marker: a KV deletion marker's, which the journal's
/// readers ([`crate::claim::journal`], [`KeyCalls::records`]) take for no record.
const CLEARED_HEADER: &str = "KV-Operation";

/// [`CLEARED_HEADER`]'s value: the key deleted.
const CLEARED_VALUE: &str = "DEL";
