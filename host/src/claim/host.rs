//! The claim store a host runs on: the KV bucket, except for the keys of fenced routes,
//! which are subjects of their fenced output stream.

use async_nats::jetstream::Context;

use super::kv::KvClaimStore;
use super::record::ClaimRecord;
use super::store::{ClaimError, ClaimStore};
use super::stream::StreamClaimStore;
use crate::subject::FENCED_CLAIMS_PREFIX;

/// Sends each key to the store it lives in: a fenced claim subject
/// (`_dedup.claims.<stream>.<claim key>`, see [`crate::fenced`]) to its stream, any other key
/// to the claim bucket.
#[derive(Clone)]
pub struct HostClaimStore {
    kv: KvClaimStore,
    streams: StreamClaimStore,
}

impl HostClaimStore {
    /// Claims in the bucket `kv`, fenced claims in streams reached through `js`.
    pub fn new(kv: KvClaimStore, js: Context) -> Self {
        Self {
            kv,
            streams: StreamClaimStore::new(js),
        }
    }
}

fn fenced(key: &str) -> bool {
    key.starts_with(FENCED_CLAIMS_PREFIX)
}

impl ClaimStore for HostClaimStore {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        if fenced(key) {
            self.streams.get(key).await
        } else {
            self.kv.get(key).await
        }
    }

    async fn get_from_leader(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        if fenced(key) {
            self.streams.get_from_leader(key).await
        } else {
            self.kv.get_from_leader(key).await
        }
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        if fenced(key) {
            self.streams.create(key, record).await
        } else {
            self.kv.create(key, record).await
        }
    }

    async fn create_over_deleted(
        &self,
        key: &str,
        record: &ClaimRecord,
    ) -> Result<u64, ClaimError> {
        if fenced(key) {
            self.streams.create_over_deleted(key, record).await
        } else {
            self.kv.create_over_deleted(key, record).await
        }
    }

    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        if fenced(key) {
            self.streams.update(key, record, revision).await
        } else {
            self.kv.update(key, record, revision).await
        }
    }
}
