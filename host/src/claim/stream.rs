//! Claim records kept as subjects of an ordinary stream, the way NATS KV keeps keys: one
//! subject per key, compare-and-swap through `Nats-Expected-Last-Subject-Sequence`, and at
//! most two records per subject, as a bucket with history 2 keeps (DESIGN.md rule 11): an
//! update rolls the subject up to itself, while a create (the subject is empty) and a
//! completion (one earlier record stays beside it) purge nothing, which on the message path
//! saves the server a purge per write. A fenced output stream holds its routes' claims like
//! this, so that outputs and the completed record can be one atomic batch (docs/src/how/fenced.md).

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::Context;
use async_nats::HeaderMap;

use super::kv::is_cas_conflict;
use super::record::ClaimRecord;
use super::store::{ClaimError, ClaimStore};

/// The header that makes a write conditional on the subject's last sequence (0: none yet).
pub const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
/// The header that makes a write replace every earlier message of its subject.
pub const ROLLUP: &str = "Nats-Rollup";

/// A [`ClaimStore`] whose keys are subjects `<prefix>.<stream>.<claim key>` of a stream
/// (created with rollups allowed); the key passed in is the whole subject and names the
/// stream in its third token. Revisions are stream sequences.
#[derive(Clone)]
pub struct StreamClaimStore {
    js: Context,
}

impl StreamClaimStore {
    /// A store writing through `js`.
    pub fn new(js: Context) -> Self {
        Self { js }
    }

    /// The headers of a record written over `revision` (0: the key must not exist). An
    /// update replaces every earlier record of its subject; a create has none to replace.
    pub fn write_headers(revision: u64) -> HeaderMap {
        let mut h = Self::completion_headers(revision);
        if revision != 0 {
            h.insert(ROLLUP, "sub");
        }
        h
    }

    /// The headers of a completed record committed over `revision`: it leaves the record
    /// it replaces in place, so a subject holds at most two records (the last update, or the
    /// create, and the completion), and the commit purges nothing.
    pub fn completion_headers(revision: u64) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE,
            revision.to_string().as_str(),
        );
        h
    }

    async fn put(
        &self,
        subject: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let sent = self
            .js
            .publish_with_headers(
                subject.to_string(),
                Self::write_headers(revision),
                record.to_bytes(),
            )
            .await
            .map_err(|e| ClaimError::Unavailable(e.to_string()))?;
        match sent.await {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if is_cas_conflict(&e) => Err(ClaimError::Conflict),
            Err(e) => Err(ClaimError::Unavailable(e.to_string())),
        }
    }
}

/// The stream a claim subject lives in: its third token (`_dedup.claims.<stream>.…`).
pub fn stream_of(subject: &str) -> Option<&str> {
    subject.split('.').nth(2)
}

impl ClaimStore for StreamClaimStore {
    // `get` reads with `STREAM.MSG.GET`, which the stream's leader answers: it is already
    // the leader read `ClaimStore::get_from_leader` asks for.
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        let name = stream_of(key)
            .ok_or_else(|| ClaimError::Unavailable(format!("`{key}` names no stream")))?;
        let stream = self
            .js
            .get_stream_no_info(name)
            .await
            .map_err(|e| ClaimError::Unavailable(e.to_string()))?;
        let message = match stream.get_last_raw_message_by_subject(key).await {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(ClaimError::Unavailable(e.to_string())),
        };
        let record =
            ClaimRecord::from_bytes(&message.payload).map_err(|e| ClaimError::Corrupt {
                key: key.to_string(),
                message: e.to_string(),
            })?;
        Ok(Some((record, message.sequence)))
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        self.put(key, record, 0).await
    }

    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        self.put(key, record, revision).await
    }
}
