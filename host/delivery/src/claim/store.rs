//! The storage a claim protocol runs on.

use std::future::Future;

use thiserror::Error;

use super::record::ClaimRecord;

/// Why a store operation failed.
#[derive(Debug, Error)]
pub enum ClaimError {
    /// The key exists (create) or changed since the expected revision (update).
    #[error("claim conflict: the key exists or changed since it was read")]
    Conflict,
    /// The stored value is not a claim record.
    #[error("claim record under `{key}` is corrupt: {message}")]
    Corrupt {
        /// The KV key.
        key: String,
        /// The parse error.
        message: String,
    },
    /// The store could not be reached or answered with an error; the outcome of a write is
    /// unknown.
    #[error("claim store unavailable: {0}")]
    Unavailable(String),
}

/// A key-value store with create-if-absent and compare-and-swap updates, which is all the
/// claim protocol needs. Revisions grow with every write to the store.
pub trait ClaimStore: Send + Sync + 'static {
    /// Reads a key: its record and revision, or `None`.
    fn get(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<(ClaimRecord, u64)>, ClaimError>> + Send;

    /// Reads a key from the store's leader: never older than a write the store acknowledged.
    /// [`ClaimStore::get`] may be answered by a replica that lags (KV direct gets); this one
    /// decides where a read disagrees with a revision known to have been written (a replay's
    /// reset). A store without replicas answers it like `get`.
    fn get_from_leader(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<(ClaimRecord, u64)>, ClaimError>> + Send {
        self.get(key)
    }

    /// Writes a key that must not exist; returns the new revision.
    fn create(
        &self,
        key: &str,
        record: &ClaimRecord,
    ) -> impl Future<Output = Result<u64, ClaimError>> + Send;

    /// Writes a key that [`ClaimStore::create`] refused but [`ClaimStore::get`] did not find:
    /// its last write was a deletion (an operator deleted or purged it). Slower than `create`,
    /// which skips this case to answer in one round trip.
    fn create_over_deleted(
        &self,
        key: &str,
        record: &ClaimRecord,
    ) -> impl Future<Output = Result<u64, ClaimError>> + Send {
        self.create(key, record)
    }

    /// Writes a key whose current revision must be `revision`; returns the new revision.
    fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> impl Future<Output = Result<u64, ClaimError>> + Send;
}
