//! The claim store of one simulated host: each call is sent to the [`World`] and waits for
//! the answer the scheduler gives it, so every store call is a point where faults and other
//! hosts' steps interleave. Beside it, the route's contract store ([`SimContracts`]), which
//! the model answers at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use dedup_delivery::contract::{ContractStore, Found, Written};
use dedup_host::claim::{ClaimError, ClaimRecord, ClaimStore};
use dedup_host::contract::ContractRecord;

use super::world::{Answer, Batched, ContractKey, Message, Op, World};

/// The shared simulated server.
pub type Shared = Arc<Mutex<World>>;

/// The store as host `host` sees it.
pub struct SimStore {
    /// The server.
    pub world: Shared,
    /// The host's index.
    pub host: usize,
    /// The key space: `b:` for the bucket, `s:` for the fenced stream's claim subjects.
    pub space: &'static str,
}

/// An operation in flight: pending until the server answers it.
struct Pending {
    world: Shared,
    id: u64,
}

impl Future for Pending {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Answer> {
        match self.world.lock().expect("one thread").answer(self.id) {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending, // the scheduler polls every host again each step
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // A host that died leaves its request to the server, which may still apply it.
        if let Ok(mut w) = self.world.lock() {
            if w.answer(self.id).is_none() {
                w.abandon(self.id);
            }
        }
    }
}

impl SimStore {
    /// Sends an atomic batch to the fenced stream ([`Op::Batch`]); its records' keys carry
    /// their space already. A request that timed out (the host cut off) is unanswered.
    pub async fn batch(&self, messages: Vec<Message>) -> Batched {
        match self.send(Op::Batch(messages)).await {
            Answer::Batch(answer) => answer,
            Answer::Wrote(Err(e)) => Batched::Unanswered(e.to_string()),
            Answer::Wrote(Ok(_)) | Answer::Read(_) => unreachable!("a batch gets a batch's answer"),
        }
    }

    /// Reads a key from the leader ([`Op::GetLeader`]): the model's reads that must not lag
    /// (what is ahead of a queued message), and the host's own leader reads
    /// ([`ClaimStore::get_from_leader`]).
    pub async fn get_fresh(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        match self.send(Op::GetLeader(self.key(key))).await {
            Answer::Read(r) => r,
            _ => unreachable!("a read gets a read's answer"),
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.space)
    }

    fn send(&self, op: Op) -> Pending {
        let id = self.world.lock().expect("one thread").send(self.host, op);
        Pending {
            world: self.world.clone(),
            id,
        }
    }
}

impl ClaimStore for SimStore {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        match self.send(Op::Get(self.key(key))).await {
            Answer::Read(r) => r,
            _ => unreachable!("a read gets a read's answer"),
        }
    }

    /// From the leader, as the host's stores answer it (a lagging replica does not show):
    /// answered like a direct get, the leader re-read of `after::elsewhere` found a key
    /// completed elsewhere not there yet and dead-lettered its message (seed 9023
    /// `--claim-after`).
    async fn get_from_leader(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        self.get_fresh(key).await
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        match self.send(Op::Create(self.key(key), record.clone())).await {
            Answer::Wrote(r) => r,
            _ => unreachable!("a write gets a write's answer"),
        }
    }

    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let op = Op::Update(self.key(key), record.clone(), revision);
        match self.send(op).await {
            Answer::Wrote(r) => r,
            _ => unreachable!("a write gets a write's answer"),
        }
    }
}

/// The route's contract store on the model server ([`World::contract`]): one key, read and
/// written by revision, which an operator may delete ([`ContractKey::delete`]) or mark as
/// changing (`setup --change-route`, `host/change.rs`). It answers at once, never through the scheduler: a host
/// checks its contract as it is configured and as its contract watch sees a change, between
/// steps, as the model always did.
pub struct SimContracts {
    /// The server.
    pub world: Shared,
}

impl ContractStore for SimContracts {
    type Record = ContractRecord;
    type Error = std::convert::Infallible;

    async fn get(&self, _: &str) -> Result<Found<ContractRecord>, Self::Error> {
        let w = self.world.lock().expect("one thread");
        let key = &w.contract;
        Ok(match (&key.record, key.deleted) {
            (_, true) => Found::Deleted(key.revision),
            (None, false) => Found::Never,
            (Some(record), false) => Found::Recorded {
                record: record.clone(),
                revision: key.revision,
                changing: key.changing.as_ref().map(|c| c.since_ms),
            },
        })
    }

    async fn update(
        &self,
        _: &str,
        record: &ContractRecord,
        revision: u64,
    ) -> Result<Written, Self::Error> {
        let mut w = self.world.lock().expect("one thread");
        if revision != w.contract.revision {
            return Ok(Written::Raced);
        }
        w.contract = ContractKey {
            record: Some(record.clone()),
            revision: revision + 1,
            deleted: false,
            changing: None,
        };
        Ok(Written::Written)
    }
}
