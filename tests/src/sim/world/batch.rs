//! Atomic batches on the model's fenced stream, as nats-server takes them (`allow_atomic`,
//! ADR-50). A host sends a batch's messages in order: each fenced commit's outputs, then its
//! completed claim record expecting its claim subject's last sequence (one commit alone, or
//! several laid end to end by the host's group commit, `dedup_delivery::group`). At commit,
//! under the stream lock, the server checks every record's expectation: one that fails (a
//! stale owner's) refuses the whole batch, and so does an expectation on a subject already
//! written earlier in the batch; otherwise every message is stored, each at the stream's next
//! sequence (outputs included), so a record's sequence follows from its place. Each message
//! counts against `max_payload` on its own, with the batch headers it carries at its place
//! (`Nats-Batch-Id`, `Nats-Batch-Sequence`, `Nats-Batch-Commit` on the last; a lone message is
//! sent without them); a batch holds at most [`MAX_BATCH`] messages. A batch meets the faults
//! of the model's other writes (its answer lost, after it landed or not, or landing later),
//! a publish's refusal, the output streams' outage, and a leader election of the stream.

use std::collections::{BTreeMap, BTreeSet};

use dedup_host::claim::{ClaimError, ClaimRecord};
use dedup_host::fenced::commit::headers;

use super::super::outputs::LINE_FRAMING;
use super::{Op, Output, World};

/// The most messages nats-server takes in one batch (its default).
pub const MAX_BATCH: usize = 1_000;

/// How long the fenced stream takes to answer a batch: at one replica on file storage,
/// nats-server stages each batch in a file store of its own, milliseconds whatever it holds,
/// which is why the host groups commits. One fenced run in two takes [`Staging::ms`] per
/// batch (drawn apart from the other draws), so commits arriving meanwhile wait for the next.
#[derive(Debug, Default)]
pub struct Staging {
    /// How long the server takes with each batch (0: answered like any other write).
    pub ms: u64,
    /// Batches in flight, by operation id: not answered before then.
    ready_at: BTreeMap<u64, u64>,
}

impl Staging {
    /// Batch `id` was sent at `now`.
    pub(super) fn sent(&mut self, id: u64, now: u64) {
        if self.ms > 0 {
            self.ready_at.insert(id, now + self.ms);
        }
    }

    /// Whether operation `id` is a batch the server is still staging at `now`.
    pub(super) fn staged(&mut self, id: u64, now: u64) -> bool {
        match self.ready_at.get(&id) {
            Some(at) if *at > now => true,
            Some(_) => {
                self.ready_at.remove(&id);
                false
            }
            None => false,
        }
    }
}

/// One message of a fenced batch as the host lays it out (`fenced::commit::prepare`), before
/// the batch headers it adds as it sends.
// A record carries a whole claim record; messages are short-lived values of the simulation,
// so their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Message {
    /// An output: the id its copies are counted under, its subject, and its size as the
    /// server counts it without the batch headers.
    Output(Output),
    /// A completed claim record on claim key `key` (with its space), expecting the key's last
    /// revision to be `revision`; `size` as the server counts it without the batch headers.
    Record {
        /// The claim key, with its space (`s:`).
        key: String,
        /// The record.
        record: ClaimRecord,
        /// The revision (subject sequence) it expects.
        revision: u64,
        /// Its size on the wire before the batch headers.
        size: usize,
    },
}

impl Message {
    fn size(&self) -> usize {
        match self {
            Message::Output(o) => o.size,
            Message::Record { size, .. } => *size,
        }
    }

    fn name(&self) -> String {
        match self {
            Message::Output(o) => o.id.clone(),
            Message::Record { key, revision, .. } => format!("{key}@{revision}"),
        }
    }
}

/// How the server answered a batch.
#[derive(Debug, Clone)]
pub enum Batched {
    /// Stored: the sequence of its last message.
    Stored(u64),
    /// Refused because a record's subject moved past the sequence it expected (10071, wrong
    /// last sequence): nothing stored.
    Conflict,
    /// Refused with another error: nothing stored.
    Refused(String),
    /// No answer: it may or may not have landed.
    Unanswered(String),
}

impl Batched {
    /// As a write's answer (for the model's log of writes landing late or abandoned).
    pub(super) fn written(self) -> Result<u64, ClaimError> {
        match self {
            Batched::Stored(last) => Ok(last),
            Batched::Conflict => Err(ClaimError::Conflict),
            Batched::Refused(e) | Batched::Unanswered(e) => Err(ClaimError::Unavailable(e)),
        }
    }
}

/// The bytes of the batch headers the message at `place` (from 1) of a batch of `total`
/// carries: none for a lone message, the id and sequence on each, the commit on the last.
fn batch_headers(place: usize, total: usize) -> usize {
    if total < 2 {
        return 0;
    }
    let line = |name: &str, value: usize| name.len() + value + LINE_FRAMING;
    let id = line(headers::BATCH_ID, 32);
    let sequence = line(headers::BATCH_SEQUENCE, place.to_string().len());
    let commit = match place == total {
        true => line(headers::BATCH_COMMIT, 1),
        false => 0,
    };
    id + sequence + commit
}

/// The claim records of a batch: (key, record, expected revision).
pub(super) fn records(messages: &[Message]) -> impl Iterator<Item = (&String, &ClaimRecord, u64)> {
    messages.iter().filter_map(|m| match m {
        Message::Record {
            key,
            record,
            revision,
            ..
        } => Some((key, record, *revision)),
        Message::Output(_) => None,
    })
}

/// A batch in the model's log.
pub(super) fn describe(messages: &[Message]) -> String {
    let names: Vec<String> = messages.iter().map(Message::name).collect();
    let owner = records(messages)
        .next()
        .map_or("", |(_, r, _)| r.owner.as_str());
    format!("batch [{}] by {owner}", names.join(", "))
}

impl World {
    /// Serves a batch as it arrives, with the run's faults.
    pub(super) fn serve_batch(&mut self, messages: &[Message]) -> Batched {
        if self.in_outage() {
            return Batched::Refused("simulated: the fenced stream is gone".into());
        }
        if messages.len() > MAX_BATCH {
            return Batched::Refused(format!(
                "simulated: a batch of {} messages, over the server's {MAX_BATCH}",
                messages.len()
            ));
        }
        // The server refuses a message above its max payload (and closes the connection):
        // the batch is never committed, and its sender hears nothing.
        let (max, total) = (self.max_payload, messages.len());
        let over: Vec<(String, usize)> = (messages.iter().enumerate())
            .map(|(i, m)| (m, m.size() + batch_headers(i + 1, total)))
            .filter(|(_, size)| *size > max)
            .map(|(m, size)| (m.name(), size))
            .collect();
        if !over.is_empty() {
            for (name, size) in over {
                self.violation(format!(
                    "a fenced batch carries {name}: {size} bytes on the wire, over the server's max_payload of {max}: nats-server refuses the whole batch (and closes the host's connection), every time; the host's size check must dead-letter the key"
                ));
            }
            return Batched::Unanswered("simulated: maximum payload exceeded".into());
        }
        let f = self.faults;
        let roll = if self.faulty {
            self.rng.bits() % 1000
        } else {
            1000
        };
        let lost = || Batched::Unanswered("simulated: no answer".into());
        if roll < f.lost {
            lost()
        } else if roll < f.lost + f.lost_landed {
            let _ = self.apply_batch(messages);
            lost()
        } else if roll < f.lost + f.lost_landed + f.late {
            let at = self.now + self.rng.range(1, 3_000);
            self.late.push((at, Op::Batch(messages.to_vec())));
            lost()
        } else if roll < f.lost + f.lost_landed + f.late + f.refused_publish {
            Batched::Refused("simulated: refused (a leader change)".into())
        } else {
            self.apply_batch(messages)
        }
    }

    /// Commits a batch: every record's expectation checked, then all of it stored, or none.
    pub(super) fn apply_batch(&mut self, messages: &[Message]) -> Batched {
        let mut written = BTreeSet::new();
        for (key, _, revision) in records(messages) {
            if !written.insert(key) {
                return Batched::Refused(format!(
                    "simulated: an expected last subject sequence on {key}, already written in the batch"
                ));
            }
            let current = self.kv.get(key).and_then(|h| h.last()).map(|(_, r)| *r);
            if current != Some(revision) {
                return Batched::Conflict;
            }
        }
        let now = self.now;
        for m in messages {
            self.revision += 1;
            match m {
                // A fenced output carries no message id: the fence, not a window, keeps it
                // single.
                Message::Output(o) => {
                    self.outputs.entry(o.id.clone()).or_default().push(now);
                    self.log(|| format!("fenced commit stores {}", o.id));
                }
                Message::Record { key, record, .. } => {
                    let revision = self.revision;
                    let history = self.kv.entry(key.clone()).or_default();
                    history.push((record.clone(), revision));
                }
            }
        }
        Batched::Stored(self.revision)
    }

    /// The record `key` held at `revision`, if it ever did.
    pub fn record_at(&self, key: &str, revision: u64) -> Option<&ClaimRecord> {
        let history = self.kv.get(key)?;
        history.iter().find(|(_, r)| *r == revision).map(|(r, _)| r)
    }
}
