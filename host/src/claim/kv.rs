//! The claim store on a NATS KV bucket.

use async_nats::jetstream::kv::{CreateErrorKind, Store, UpdateErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;

use super::record::ClaimRecord;
use super::store::{ClaimError, ClaimStore};

/// JetStream error code for a compare-and-swap on the wrong last sequence.
const WRONG_LAST_SEQUENCE: u64 = 10071;
/// The header NATS KV marks a deletion or purge with (a put carries none, or `PUT`).
const KV_OPERATION: &str = "KV-Operation";
/// The header a server-written marker (max age, purge, removal) carries.
const NATS_MARKER_REASON: &str = "Nats-Marker-Reason";
/// JetStream error code for concurrent expected-sequence writes on replicated streams.
const CONCURRENT_EXPECTED_SEQUENCE: u64 = 10164;

/// A [`ClaimStore`] on a NATS KV bucket (history `setup::CLAIM_HISTORY` or 1, max age set at
/// creation).
#[derive(Clone)]
pub struct KvClaimStore {
    kv: Store,
}

impl KvClaimStore {
    /// Wraps an opened bucket.
    pub fn new(kv: Store) -> Self {
        Self { kv }
    }
}

/// Whether an error's source chain carries one of the compare-and-swap conflict codes.
pub(crate) fn is_cas_conflict(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>() {
            let code = js.error_code().0;
            if code == WRONG_LAST_SEQUENCE || code == CONCURRENT_EXPECTED_SEQUENCE {
                return true;
            }
        }
        current = e.source();
    }
    let text = err.to_string();
    text.contains("10071") || text.contains("10164")
}

/// A failed KV write as a claim error: a conflict when the key was refused (`refused`, the
/// error's own kind) or the server reported a compare-and-swap code, else unavailable.
fn write_error(refused: bool, e: &(dyn std::error::Error + 'static)) -> ClaimError {
    if refused || is_cas_conflict(e) {
        ClaimError::Conflict
    } else {
        ClaimError::Unavailable(format!("{e}: {:?}", e.source()))
    }
}

impl ClaimStore for KvClaimStore {
    async fn get_from_leader(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        // `STREAM.MSG.GET` on the bucket's stream is answered by its leader, never by a
        // replica (unlike `Store::entry`, a direct get when the bucket allows them).
        let subject = format!("{}{key}", self.kv.prefix);
        let message = match self
            .kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
        {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(ClaimError::Unavailable(e.to_string())),
        };
        // A deletion or purge marker (`KV-Operation`, or a server marker's reason) is absence.
        let operation = message.headers.get(KV_OPERATION).map(|v| v.as_str());
        let marked = matches!(operation, Some(op) if op != "PUT")
            || message.headers.get(NATS_MARKER_REASON).is_some();
        if marked {
            return Ok(None);
        }
        let record =
            ClaimRecord::from_bytes(&message.payload).map_err(|e| ClaimError::Corrupt {
                key: key.to_string(),
                message: e.to_string(),
            })?;
        Ok(Some((record, message.sequence)))
    }

    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        let entry = self
            .kv
            .entry(key)
            .await
            .map_err(|e| ClaimError::Unavailable(e.to_string()))?;
        let Some(entry) = entry else { return Ok(None) };
        if entry.operation != async_nats::jetstream::kv::Operation::Put {
            return Ok(None);
        }
        let record = ClaimRecord::from_bytes(&entry.value).map_err(|e| ClaimError::Corrupt {
            key: key.to_string(),
            message: e.to_string(),
        })?;
        Ok(Some((record, entry.revision)))
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        // An update expecting revision 0 is a create in one round trip; `Store::create` also
        // reads the key after a refusal, which the claim protocol does anyway. A deleted key
        // is refused here and created by `create_over_deleted`.
        let written = self.kv.update(key, record.to_bytes(), 0).await;
        written.map_err(|e| write_error(e.kind() == UpdateErrorKind::WrongLastRevision, &e))
    }

    async fn create_over_deleted(
        &self,
        key: &str,
        record: &ClaimRecord,
    ) -> Result<u64, ClaimError> {
        let written = self.kv.create(key, record.to_bytes()).await;
        written.map_err(|e| write_error(e.kind() == CreateErrorKind::AlreadyExists, &e))
    }

    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let written = self.kv.update(key, record.to_bytes(), revision).await;
        written.map_err(|e| write_error(e.kind() == UpdateErrorKind::WrongLastRevision, &e))
    }
}
