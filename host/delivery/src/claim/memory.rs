//! An in-memory claim store for unit tests and local runs. Not shared between processes.

use std::collections::HashMap;
use std::sync::Mutex;

use super::record::ClaimRecord;
use super::store::{ClaimError, ClaimStore};

/// A process-local [`ClaimStore`] with the same create/compare-and-swap semantics as KV.
#[derive(Debug, Default)]
pub struct MemoryClaimStore {
    /// The last revision handed out, and each key's record with its revision.
    inner: Mutex<(u64, Entries)>,
}

type Entries = HashMap<String, (ClaimRecord, u64)>;

impl MemoryClaimStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes `key` if its revision is `revision`, as a KV deletion expecting it does;
    /// [`ClaimError::Conflict`] if it moved or is gone.
    pub fn remove(&self, key: &str, revision: u64) -> Result<(), ClaimError> {
        let mut guard = self.inner.lock().expect("poisoned");
        match guard.1.get(key) {
            Some((_, current)) if *current == revision => {
                guard.1.remove(key);
                Ok(())
            }
            _ => Err(ClaimError::Conflict),
        }
    }
}

impl ClaimStore for MemoryClaimStore {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        Ok(self.inner.lock().expect("poisoned").1.get(key).cloned())
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        let mut guard = self.inner.lock().expect("poisoned");
        let (seq, map) = &mut *guard;
        if map.contains_key(key) {
            return Err(ClaimError::Conflict);
        }
        *seq += 1;
        map.insert(key.to_string(), (record.clone(), *seq));
        Ok(*seq)
    }

    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let mut guard = self.inner.lock().expect("poisoned");
        let (seq, map) = &mut *guard;
        match map.get(key) {
            Some((_, current)) if *current == revision => {
                *seq += 1;
                map.insert(key.to_string(), (record.clone(), *seq));
                Ok(*seq)
            }
            _ => Err(ClaimError::Conflict),
        }
    }
}
