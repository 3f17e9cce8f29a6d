//! A simulated host's group commit: the host's own committers ([`group::Committers`], each
//! running [`group::run`] and [`group::commit_group`]) over the model's fenced stream
//! ([`SimBatches`], the [`Batches`] seam; the server's side is `world::batch`). A fenced
//! delivery commits through [`SimGroup::commit`] as the host's pipeline does through
//! `GroupCommits::commit`: a lone record at once, anything else queued for its stream's
//! committer, which lays what waits end to end in one batch, one batch in flight at a time.
//! Each committer is a future its host polls beside its deliveries ([`SimGroup::started`]),
//! paused and killed with it, and ignored when the run asks whether the host is idle (it
//! waits for commits forever). Each answer is checked ([`checked`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use dedup_delivery::group::{self, BatchResult, Batches, Committers, Sent};
use dedup_host::claim::{ClaimError, ClaimRecord, ClaimState};

use super::store::{Shared, SimStore};
use super::world::{Batched, Message, Output, World};

/// A committer of a simulated host, polled beside its deliveries.
pub type Runner = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The model's one fenced stream (the route's outputs and its claims).
const STREAM: &str = "OUT";

/// One host's batches on the model's fenced stream.
pub struct SimBatches(SimStore);

impl SimBatches {
    fn new(world: &Shared, host: usize) -> Self {
        Self(SimStore {
            world: world.clone(),
            host,
            space: "s:",
        })
    }
}

impl Batches for SimBatches {
    type Message = Message;

    async fn send(&self, messages: &[Message]) -> Sent {
        match self.0.batch(messages.to_vec()).await {
            Batched::Stored(last) => Sent::Stored(last),
            Batched::Conflict => Sent::Refused("wrong last sequence".into()),
            Batched::Refused(e) => Sent::Refused(e),
            Batched::Unanswered(e) => Sent::Unanswered(e),
        }
    }

    async fn commit_alone(&self, messages: &[Message]) -> Result<u64, ClaimError> {
        match self.0.batch(messages.to_vec()).await {
            Batched::Stored(last) => Ok(last),
            Batched::Conflict => Err(ClaimError::Conflict),
            Batched::Refused(e) | Batched::Unanswered(e) => Err(ClaimError::Unavailable(e)),
        }
    }
}

/// One host generation's group commit.
pub struct SimGroup {
    world: Shared,
    host: usize,
    committers: Committers<Message>,
    /// Committers started and not yet taken by the host.
    started: Mutex<Vec<Runner>>,
}

impl SimGroup {
    /// Host `host`'s, on `world`.
    pub fn new(world: &Shared, host: usize) -> Self {
        Self {
            world: world.clone(),
            host,
            committers: Committers::default(),
            started: Mutex::new(Vec::new()),
        }
    }

    /// Commits one commit's `messages` (its record last), whose lease has `left` by the
    /// host's clock, as the host's pipeline does ([`Committers::commit`]); answers like a
    /// lone commit.
    pub async fn commit(&self, messages: Vec<Message>, left: Duration) -> Result<u64, ClaimError> {
        let start = |members| {
            let (world, host) = (self.world.clone(), self.host);
            let ended = move |commits: usize, result: BatchResult| {
                let mut w = world.lock().expect("one thread");
                w.log(|| format!("h{host}: a batch of {commits} commits {}", result.label()));
            };
            let runner = group::run(SimBatches::new(&self.world, self.host), members, ended);
            self.started
                .lock()
                .expect("one thread")
                .push(Box::pin(runner));
        };
        let batches = SimBatches::new(&self.world, self.host);
        (self.committers)
            .commit(&batches, STREAM, messages, left, start)
            .await
    }

    /// The committers started since the host last took them.
    pub fn started(&self) -> Vec<Runner> {
        std::mem::take(&mut *self.started.lock().expect("one thread"))
    }
}

/// One commit's messages as the model server takes them: its `outputs`, then `record` on
/// claim key `key` (with its space) expecting `revision`, `size` bytes on the wire before the
/// batch headers (`Outputs::committed` sizes them).
pub fn messages(
    (outputs, size): (Vec<Output>, usize),
    key: &str,
    record: &ClaimRecord,
    revision: u64,
) -> Vec<Message> {
    let record = Message::Record {
        key: key.to_string(),
        record: record.clone(),
        revision,
        size,
    };
    (outputs.into_iter().map(Message::Output))
        .chain([record])
        .collect()
}

/// What is wrong with the answer to a fenced commit of `record` on claim key `key` (with its
/// space) expecting `revision`, as the server holds it now: a commit answered stored at a
/// sequence must find its record there (each member's sequence follows from its place in its
/// batch); one answered refused for a stale owner must have lost its fence (the key moved
/// past `revision`; a key's revisions only grow, so one still there was there when the server
/// refused it): else a refusal another member of its batch earned took it down.
pub fn checked(
    w: &World,
    key: &str,
    record: &ClaimRecord,
    revision: u64,
    answer: &Result<u64, ClaimError>,
) -> Option<String> {
    match answer {
        Ok(sequence) => {
            let stored = w.record_at(key, *sequence).is_some_and(|r| {
                r.owner == record.owner
                    && r.nonce == record.nonce
                    && r.state == ClaimState::Completed
                    && r.updated_ms == record.updated_ms
            });
            (!stored).then(|| {
                format!(
                    "{}'s commit of {key} was answered stored at {sequence}, but the server holds no such record there",
                    record.owner
                )
            })
        }
        Err(ClaimError::Conflict) => {
            let held = w.record(key).is_some_and(|(_, at)| *at == revision);
            held.then(|| {
                format!(
                    "{}'s commit of {key} was refused for a stale owner while its fence held (the key is still at {revision}): another member's refusal took it down",
                    record.owner
                )
            })
        }
        Err(_) => None,
    }
}
