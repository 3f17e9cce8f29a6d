//! The simulated server: a KV bucket with revisions and compare-and-swap (the claim stores:
//! the bucket, and a fenced stream's claim subjects, as key spaces of one map), atomic batches
//! of fenced commits (outputs and claim records, all or none: [`batch`]), an output stream
//! that drops a message id repeated inside its duplicate window, outages, and the dead letters. The streams and their
//! consumers are in [`super::consumer`]. Faults are decided here, from the run's seeded
//! randomness.

use std::collections::BTreeMap;

use dedup_delivery::undeliverable;
use dedup_host::claim::{ClaimError, ClaimRecord, ClaimState};

use super::consumer::Streams;
use super::network::{Network, Stream, REQUEST_TIMEOUT_MS};
pub use super::outputs::{Output, Version};
pub use super::rng::Rng;
pub use batch::{Batched, Message};
pub use components::Components;
pub use contract::ContractKey;

mod acks;
pub mod batch;
mod change;
mod components;
mod contract;
mod history;

/// A store operation sent by a host and not answered yet.
#[derive(Debug, Clone)]
pub enum Op {
    /// Read a key (a direct get: it may hit a lagging replica).
    Get(String),
    /// Read a key from the stream's leader: never older than a write it acknowledged.
    GetLeader(String),
    /// Create a key that must not exist.
    Create(String, ClaimRecord),
    /// Update a key at an expected revision.
    Update(String, ClaimRecord, u64),
    /// An atomic batch on the fenced stream: one or more commits' outputs and records
    /// ([`batch`]).
    Batch(Vec<Message>),
}

/// The answer a host gets for an [`Op`].
// A read carries a whole claim record; answers are short-lived values of the simulation,
// so their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Answer {
    /// A read's record and revision.
    Read(Result<Option<(ClaimRecord, u64)>, ClaimError>),
    /// A write's new revision.
    Wrote(Result<u64, ClaimError>),
    /// How a batch ended.
    Batch(Batched),
}

/// Fault rates, in thousandths, while faults are on.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// A write's answer is lost after it landed.
    pub lost_landed: u64,
    /// A write's answer is lost and it did not land.
    pub lost: u64,
    /// A write's answer is lost and it lands later (after the writer's read-back).
    pub late: u64,
    /// A read returns the key's previous value (a lagging replica).
    pub stale_read: u64,
    /// An ack, nak or term is lost.
    pub lost_ack: u64,
    /// An output publish is refused (a leader change).
    pub refused_publish: u64,
    /// A MAX_DELIVERIES advisory reaches no host.
    pub missed_advisory: u64,
}

/// The simulated server.
#[derive(Debug)]
pub struct World {
    /// Virtual time, Unix milliseconds.
    pub now: u64,
    /// The run's randomness.
    pub rng: Rng,
    /// Whether faults are injected now.
    pub faulty: bool,
    /// Fault rates.
    pub faults: Faults,
    kv: BTreeMap<String, Vec<(ClaimRecord, u64)>>,
    /// How long a replica lags each replay's reset in this run (`None`: it does not): direct
    /// gets of a replayed key answer its record from before the reset until then.
    pub replay_lag_ms: Option<u64>,
    /// Replayed keys a replica lags: until when, and the reset's revision.
    lagging: BTreeMap<String, (u64, u64)>,
    revision: u64,
    next_op: u64,
    /// Operations sent, by id: the sending host and the operation.
    pending: BTreeMap<u64, (usize, Op)>,
    answers: BTreeMap<u64, Answer>,
    /// Writes that land later: (when, operation).
    late: Vec<(u64, Op)>,
    /// The source stream and the exclusive route's work queue, with their consumers.
    pub streams: Streams,
    /// Output message id → the times a copy was stored.
    pub outputs: BTreeMap<String, Vec<u64>>,
    /// The output stream's duplicate window.
    pub window_ms: u64,
    /// Dead letters: keys, one entry per letter stored.
    pub dead_letters: Vec<String>,
    /// The route's contract key: recorded by the first host, maybe deleted by an operator.
    pub contract: ContractKey,
    /// When the output streams refuse every write (deleted, then recreated): from, until.
    pub outage: (u64, u64),
    /// When the dead-letter stream refuses every write: from, until.
    pub dead_letter_outage: (u64, u64),
    /// The server's `max_payload`.
    pub max_payload: usize,
    /// Handlers of exclusive routes running now: entity, key, owner.
    pub running: Vec<(String, String, String)>,
    /// Per entity, the highest source sequence whose run started (exclusive routes).
    pub started: BTreeMap<String, u64>,
    /// Keys whose dead letters were replayed (their handler was fixed first).
    pub replayed: std::collections::BTreeSet<String>,
    /// Claim keys (with their space) whose message the server gave up on and the
    /// undeliverable-message handler dead-lettered: a key whose handler succeeds may end so
    /// when the server's delivery bound is low (its busy copies spend their deliveries).
    pub gave_up: std::collections::BTreeSet<String>,
    /// What happened, one line per event, when tracing.
    pub trace: Option<Vec<String>>,
    /// Invariants the hosts saw broken as they ran.
    pub violations: Vec<String>,
    /// Per key, runs disrupted by a fault (see `Hosts::disrupted`).
    pub disrupted: BTreeMap<String, u32>,
    /// Each host's clock offset from the true time (ms), by host index.
    pub clock_offsets: Vec<i64>,
    /// Partitioned hosts and leader elections ([`super::network`]).
    pub network: Network,
    /// How long the fenced stream takes to answer a batch ([`batch::Staging`]).
    pub staging: batch::Staging,
    /// The route's versions: live, candidate, each host's view ([`components`]).
    pub components: Components,
    /// The route's name as its claim keys carry it (their prefix; empty until a rename,
    /// `history`).
    pub route: String,
    /// Every name the route had, first to last.
    pub names: Vec<String>,
    /// Keys completed under an earlier name, with that name, when the route was renamed:
    /// none may run again under a later one.
    pub settled_before: BTreeMap<String, String>,
}

impl World {
    /// A server at virtual time `now` with `streams`.
    pub fn new(seed: u64, now: u64, streams: Streams, faults: Faults, window_ms: u64) -> Self {
        Self {
            now,
            rng: Rng::new(seed),
            faulty: true,
            faults,
            kv: BTreeMap::new(),
            replay_lag_ms: None,
            lagging: BTreeMap::new(),
            revision: 0,
            next_op: 0,
            pending: BTreeMap::new(),
            answers: BTreeMap::new(),
            late: Vec::new(),
            streams,
            outputs: BTreeMap::new(),
            window_ms,
            dead_letters: Vec::new(),
            contract: Default::default(),
            outage: (0, 0),
            dead_letter_outage: (0, 0),
            max_payload: 1 << 20,
            started: BTreeMap::new(),
            running: Vec::new(),
            replayed: Default::default(),
            gave_up: Default::default(),
            trace: None,
            violations: Vec::new(),
            disrupted: BTreeMap::new(),
            clock_offsets: Vec::new(),
            network: Network::default(),
            staging: Default::default(),
            components: Components::default(),
            route: String::new(),
            names: vec![String::new()],
            settled_before: BTreeMap::new(),
        }
    }

    /// Whether no store operation is in flight, unanswered or landing late.
    pub fn quiet(&self) -> bool {
        self.pending.is_empty()
            && self.answers.is_empty()
            && self.late.is_empty()
            && self.network.quiet()
    }

    /// Notes an event in the trace.
    pub fn log(&mut self, line: impl FnOnce() -> String) {
        let now = self.now;
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{now:>8} {}", line()));
        }
    }

    /// The current record of `key`.
    pub fn record(&self, key: &str) -> Option<&(ClaimRecord, u64)> {
        self.kv.get(key).and_then(|h| h.last())
    }

    /// The claim spaces' latest revision (0: nothing written yet).
    pub fn last_revision(&self) -> u64 {
        self.revision
    }

    /// Whether `key` was done for the message at source sequence `message` (completed, or
    /// failed for good) as it stood at revision `revision` of the claim spaces or at any later
    /// one, whatever it holds now. A coalesced record counts only if it names that message or a
    /// later one of the key ([`ClaimRecord::source_sequence`]): it settles those, as a claim
    /// does (`Claimer::claim_message`), while a later message of the key reclaims it (the
    /// entity's newest may carry the key, and must run).
    pub fn done_since(&self, key: &str, revision: u64, message: u64) -> bool {
        let done = |r: &ClaimRecord| match r.state {
            ClaimState::Completed if r.is_coalesced() => {
                r.source_sequence.is_some_and(|named| message <= named)
            }
            ClaimState::Completed => true,
            ClaimState::Failed => r.permanent,
            ClaimState::InProgress => false,
        };
        let history = self.kv.get(key).map_or(&[][..], Vec::as_slice);
        // The record it held at `revision` (its last write up to then), and every later one.
        let from = history.iter().rposition(|(_, at)| *at <= revision);
        history[from.unwrap_or(0)..].iter().any(|(r, _)| done(r))
    }

    /// What host `owner` (`h<index>.<generation>`) reads on its own clock now.
    pub fn clock_of(&self, owner: &str) -> u64 {
        let index = owner.trim_start_matches('h').split('.').next();
        let offset = index
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| self.clock_offsets.get(i))
            .copied()
            .unwrap_or(0);
        self.now.saturating_add_signed(offset)
    }

    /// Whether `r` is a lease its owner still holds by its own clock: the owner stops all
    /// work, and sends no write, once its clock passes the lease's end.
    pub fn held(&self, r: &ClaimRecord) -> bool {
        r.state == ClaimState::InProgress && self.clock_of(&r.owner) < r.lease_expires_ms
    }

    /// Sends `op` for `host`; its answer is taken with [`World::answer`]. A write to a key
    /// under a lease its sender no longer holds by its own clock breaks the local expiry rule:
    /// another host, seeing the lapse, may have gone ahead (an exclusive entity's next
    /// message), and the write could revive or complete the key after it.
    pub fn send(&mut self, host: usize, op: Op) -> u64 {
        let writes: Vec<(&String, &ClaimRecord, u64)> = match &op {
            Op::Update(key, record, revision) => vec![(key, record, *revision)],
            Op::Batch(messages) => batch::records(messages).collect(),
            _ => Vec::new(),
        };
        for (key, record, revision) in writes {
            let lapsed = self.record(key).is_some_and(|(current, at)| {
                *at == revision
                    && current.state == ClaimState::InProgress
                    && current.owner == record.owner
                    && current.nonce == record.nonce
                    && !self.held(current)
                    // Sent by its owner: the operator's tools rewrite (fence) or copy a
                    // record as it is, keeping its owner.
                    && current.owner.starts_with(&format!("h{host}."))
            });
            if lapsed {
                let what = format!(
                    "{} writes {key} ({:?}) after its lease lapsed by its own clock",
                    record.owner, record.state
                );
                self.log(|| format!("VIOLATION {what}"));
                self.violations.push(what);
            }
        }
        self.next_op += 1;
        if self.network.cut_off(host, self.now) {
            // Sent over a cut connection: it never reaches the server.
            let at = self.now + REQUEST_TIMEOUT_MS;
            let read = matches!(op, Op::Get(_) | Op::GetLeader(_));
            self.log(|| format!("h{host} (cut off) {} is lost", describe(&op)));
            self.network.timing_out.insert(self.next_op, (at, read));
            return self.next_op;
        }
        if matches!(op, Op::Batch(_)) {
            self.staging.sent(self.next_op, self.now);
        }
        self.pending.insert(self.next_op, (host, op));
        self.next_op
    }

    /// Takes the answer of operation `id`, once the server gave it.
    pub fn answer(&mut self, id: u64) -> Option<Answer> {
        self.answers.remove(&id)
    }

    /// Operation `id`'s sender is gone: the server still applies it, nobody reads the answer.
    pub fn abandon(&mut self, id: u64) {
        self.network.timing_out.remove(&id);
        if let Some((host, op)) = self.pending.remove(&id) {
            let answer = self.serve_one(&op);
            self.log(|| format!("h{host} (gone) {} -> {answer:?}", describe(&op)));
        }
    }

    /// Answers some of the pending operations (each with even odds, so they interleave), with
    /// faults when they are on; lands late writes that are due.
    pub fn serve(&mut self) {
        let due: Vec<Op> = {
            let now = self.now;
            let (due, later) = self.late.drain(..).partition(|(at, _)| *at <= now);
            self.late = later;
            due.into_iter().map(|(_, op)| op).collect()
        };
        for op in due {
            let result = self.apply(&op);
            self.log(|| format!("late write lands: {} -> {result:?}", describe(&op)));
        }
        for (id, read) in self.network.timed_out(self.now) {
            let timeout = ClaimError::Unavailable("simulated: timed out".into());
            let answer = match read {
                true => Answer::Read(Err(timeout)),
                false => Answer::Wrote(Err(timeout)),
            };
            self.answers.insert(id, answer);
        }
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            if self.staging.staged(id, self.now) || !self.rng.chance(500) {
                continue;
            }
            let (host, op) = self.pending.remove(&id).expect("listed");
            if self.network.cut_off(host, self.now) {
                // In flight as the cut came: it may have landed; its answer is lost.
                let landed = self.rng.chance(500).then(|| self.apply(&op));
                self.log(|| {
                    format!(
                        "h{host} (cut off) {} -> {landed:?}, unanswered",
                        describe(&op)
                    )
                });
                let read = matches!(op, Op::Get(_) | Op::GetLeader(_));
                let at = self.now + REQUEST_TIMEOUT_MS;
                self.network.timing_out.insert(id, (at, read));
                continue;
            }
            let answer = self.serve_one(&op);
            self.log(|| format!("h{host} {} -> {answer:?}", describe(&op)));
            self.answers.insert(id, answer);
        }
    }

    fn serve_one(&mut self, op: &Op) -> Answer {
        let f = self.faults;
        let faulty = self.faulty;
        let lost = || ClaimError::Unavailable("simulated: no answer".into());
        if self.network.electing(Stream::Claims, self.now) {
            let none = ClaimError::Unavailable("simulated: no responders (leader election)".into());
            return match op {
                Op::Get(_) | Op::GetLeader(_) => Answer::Read(Err(none)),
                Op::Batch(_) => Answer::Batch(Batched::Unanswered(none.to_string())),
                _ => Answer::Wrote(Err(none)),
            };
        }
        match op {
            Op::Get(key)
                if self
                    .lagging
                    .get(key)
                    .is_some_and(|(until, _)| self.now < *until) =>
            {
                let reset = self.lagging[key].1;
                let history = self.kv.get(key).into_iter().flatten();
                Answer::Read(Ok(history.rev().find(|(_, r)| *r < reset).cloned()))
            }
            Op::Get(key) => {
                let history = self.kv.get(key);
                let stale = faulty && self.rng.chance(f.stale_read);
                let value = match (history, stale) {
                    (Some(h), true) if h.len() >= 2 => Some(h[h.len() - 2].clone()),
                    (Some(h), _) => h.last().cloned(),
                    (None, _) => None,
                };
                Answer::Read(Ok(value))
            }
            Op::GetLeader(key) => {
                Answer::Read(Ok(self.kv.get(key).and_then(|h| h.last().cloned())))
            }
            Op::Batch(messages) => Answer::Batch(self.serve_batch(messages)),
            Op::Create(..) | Op::Update(..) => {
                let roll = if faulty { self.rng.bits() % 1000 } else { 1000 };
                if roll < f.lost {
                    Answer::Wrote(Err(lost()))
                } else if roll < f.lost + f.lost_landed {
                    let _ = self.apply(op);
                    Answer::Wrote(Err(lost()))
                } else if roll < f.lost + f.lost_landed + f.late {
                    let at = self.now + self.rng.range(1, 3_000);
                    self.late.push((at, op.clone()));
                    Answer::Wrote(Err(lost()))
                } else {
                    Answer::Wrote(self.apply(op))
                }
            }
        }
    }

    /// Applies a write with the server's compare-and-swap.
    fn apply(&mut self, op: &Op) -> Result<u64, ClaimError> {
        let (key, record, expected) = match op {
            Op::Get(_) | Op::GetLeader(_) => return Ok(self.revision),
            Op::Create(key, record) => (key, record, None),
            Op::Update(key, record, revision) => (key, record, Some(*revision)),
            Op::Batch(messages) => return self.apply_batch(messages).written(),
        };
        let current = self.kv.get(key).and_then(|h| h.last()).map(|(_, r)| *r);
        let allowed = match expected {
            None => current.is_none(),
            Some(revision) => current == Some(revision),
        };
        if !allowed {
            return Err(ClaimError::Conflict);
        }
        self.revision += 1;
        let revision = self.revision;
        self.kv
            .entry(key.clone())
            .or_default()
            .push((record.clone(), revision));
        Ok(revision)
    }

    /// A replay reset `key` at revision `reset`: a replica lags it for the run's
    /// [`World::replay_lag_ms`], if any.
    pub fn lag_replay(&mut self, key: &str, reset: u64) {
        if let Some(ms) = self.replay_lag_ms {
            self.lagging.insert(key.to_string(), (self.now + ms, reset));
        }
    }

    /// Writes `record` over `key` at `revision` for an operator's tool (no faults): its new
    /// revision, or `None` when the key moved.
    pub fn operator_update(
        &mut self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Option<u64> {
        let op = Op::Update(key.to_string(), record.clone(), revision);
        self.apply(&op).ok()
    }

    /// Stores a dead letter for `key`; `false` when the dead-letter stream refuses it.
    pub fn dead_letter(&mut self, key: &str) -> bool {
        if (self.dead_letter_outage.0..self.dead_letter_outage.1).contains(&self.now) {
            self.log(|| format!("dead letter for {key} refused: the stream is gone"));
            return false;
        }
        self.dead_letters.push(key.to_string());
        self.log(|| format!("dead letter for {key}"));
        true
    }

    /// Records `key` (whose record was `record`) as failed for good with `reason`, as the
    /// host's undeliverable-message handler does once a letter is stored
    /// ([`undeliverable::failed_for_good`]; no faults). A key never claimed gets a record too
    /// (the host writes none; the end checks read one).
    pub fn given_up(&mut self, key: &str, record: Option<(ClaimRecord, u64)>, reason: String) {
        self.gave_up.insert(key.to_string());
        let (mut r, revision) = match record {
            Some((r, revision)) => (r, Some(revision)),
            None => (
                ClaimRecord {
                    state: ClaimState::Failed,
                    owner: "sweep".into(),
                    nonce: 0,
                    attempt: 0,
                    lease_expires_ms: 0,
                    digest: String::new(),
                    effects_by: None,
                    unknown_effects: false,
                    outputs_as: None,
                    calls_as: None,
                    reason: None,
                    permanent: true,
                    retry_at_ms: None,
                    fencing_token: None,
                    source_sequence: None,
                    outputs: Vec::new(),
                    batch_outputs: None,
                    created_ms: self.now,
                    updated_ms: self.now,
                },
                None,
            ),
        };
        undeliverable::failed_for_good(&mut r, reason, self.now);
        let op = match revision {
            Some(revision) => Op::Update(key.to_string(), r, revision),
            None => Op::Create(key.to_string(), r),
        };
        let _ = self.apply(&op);
    }

    /// Whether the output streams refuse writes now.
    pub fn in_outage(&self) -> bool {
        (self.outage.0..self.outage.1).contains(&self.now)
    }

    /// Notes a broken invariant once (a refusal repeated on every retry says nothing more).
    fn violation(&mut self, what: String) {
        self.log(|| format!("VIOLATION {what}"));
        if !self.violations.contains(&what) {
            self.violations.push(what);
        }
    }

    /// Stores `out`, published by host `host`, unless a copy is inside the window; `false`
    /// when the publish is refused (a fault, an outage, or an output above the server's max
    /// payload, which the host's size check must never let out). `by`: the key whose output
    /// it is and the version that made it.
    pub fn publish(&mut self, host: usize, out: &Output, by: (&str, &Version)) -> bool {
        let id = &out.id;
        if out.size > self.max_payload {
            self.log(|| format!("h{host} publishes {id}: maximum payload exceeded"));
            let what = format!(
                "a host publishes {id} to `{}`: {} bytes on the wire, over the server's max_payload of {}: nats-server refuses it (and closes the host's connection), every time; the host's size check must dead-letter the key",
                out.subject, out.size, self.max_payload
            );
            self.violation(what);
            return false;
        }
        if self.in_outage() {
            self.log(|| format!("publish {id} refused: the output stream is gone"));
            return false;
        }
        if self.network.electing(Stream::Outputs, self.now) {
            self.log(|| format!("publish {id} refused: no responders (leader election)"));
            return false;
        }
        if self.faulty && self.rng.chance(self.faults.refused_publish) {
            self.log(|| format!("publish {id} refused"));
            return false;
        }
        let now = self.now;
        let window = self.window_ms;
        let copies = self.outputs.entry(id.to_string()).or_default();
        if copies
            .last()
            .is_some_and(|t| now.saturating_sub(*t) < window)
        {
            self.log(|| format!("publish {id}: duplicate inside the window"));
        } else {
            copies.push(now);
            self.log(|| format!("publish {id} by {}: stored", by.1.digest));
            if let Some(what) = self.components.stored(by.0, id, by.1) {
                self.violation(what);
            }
        }
        true
    }
}

fn describe(op: &Op) -> String {
    match op {
        Op::Get(key) => format!("get {key}"),
        Op::GetLeader(key) => format!("get {key} from the leader"),
        Op::Create(key, r) => format!("create {key} {:?} by {}", r.state, r.owner),
        Op::Update(key, r, rev) => format!("update {key}@{rev} {:?} by {}", r.state, r.owner),
        Op::Batch(messages) => batch::describe(messages),
    }
}
