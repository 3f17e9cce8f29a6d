//! The simulated server: a KV bucket with revisions and compare-and-swap (the claim store),
//! a consumer that delivers, redelivers after its ack wait and takes acks, naks and terms, an
//! output stream that drops a message id repeated inside its duplicate window, and the dead
//! letters. Faults are decided here, from the run's seeded randomness.

use std::collections::BTreeMap;

use dedup_host::claim::{ClaimError, ClaimRecord};

/// Deterministic randomness (SplitMix64): the whole run follows from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.bits() % (hi - lo + 1)
    }

    /// True with probability `p` (in thousandths).
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.bits() % 1000 < per_mille
    }
}

/// A store operation sent by a host and not answered yet.
#[derive(Debug, Clone)]
pub enum Op {
    /// Read a key (a direct get: it may hit a lagging replica).
    Get(String),
    /// Create a key that must not exist.
    Create(String, ClaimRecord),
    /// Update a key at an expected revision.
    Update(String, ClaimRecord, u64),
}

/// The answer a host gets for an [`Op`].
#[derive(Debug)]
pub enum Answer {
    /// A read's record and revision.
    Read(Result<Option<(ClaimRecord, u64)>, ClaimError>),
    /// A write's new revision.
    Wrote(Result<u64, ClaimError>),
}

/// Where one message of the source stream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Waiting to be delivered, not before this time.
    Available(u64),
    /// Delivered (the `number`-th time) and not settled; redelivered after `deadline`.
    Out {
        /// Which delivery this is.
        number: u64,
        /// When the ack wait runs out.
        deadline: u64,
    },
    /// Acked or termed.
    Done,
}

/// One source message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its idempotency key (repeats model a producer's retries).
    pub key: String,
    /// Where it is.
    pub delivery: Delivery,
    /// How many times it was delivered.
    pub deliveries: u64,
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
    revision: u64,
    next_op: u64,
    /// Operations sent, by id: the sending host and the operation.
    pending: BTreeMap<u64, (usize, Op)>,
    answers: BTreeMap<u64, Answer>,
    /// Writes that land later: (when, operation).
    late: Vec<(u64, Op)>,
    /// The source stream and its consumer.
    pub messages: Vec<Message>,
    /// Output message id → the times a copy was stored.
    pub outputs: BTreeMap<String, Vec<u64>>,
    /// The output stream's duplicate window.
    pub window_ms: u64,
    /// Dead letters: keys, one entry per letter stored.
    pub dead_letters: Vec<String>,
    /// The consumer's ack wait.
    pub ack_wait_ms: u64,
    /// What happened, one line per event, when tracing.
    pub trace: Option<Vec<String>>,
    /// Invariants the hosts saw broken as they ran.
    pub violations: Vec<String>,
    /// Per key, runs disrupted by a fault (see `Hosts::disrupted`).
    pub disrupted: BTreeMap<String, u32>,
}

impl World {
    /// A server at virtual time `now` with `published` messages (key, publish time).
    pub fn new(
        seed: u64,
        now: u64,
        published: &[(String, u64)],
        faults: Faults,
        window_ms: u64,
        ack_wait_ms: u64,
    ) -> Self {
        let messages = published
            .iter()
            .enumerate()
            .map(|(i, (key, at))| Message {
                sequence: i as u64 + 1,
                key: key.clone(),
                delivery: Delivery::Available(*at),
                deliveries: 0,
            })
            .collect();
        Self {
            now,
            rng: Rng::new(seed),
            faulty: true,
            faults,
            kv: BTreeMap::new(),
            revision: 0,
            next_op: 0,
            pending: BTreeMap::new(),
            answers: BTreeMap::new(),
            late: Vec::new(),
            messages,
            outputs: BTreeMap::new(),
            window_ms,
            dead_letters: Vec::new(),
            ack_wait_ms,
            trace: None,
            violations: Vec::new(),
            disrupted: BTreeMap::new(),
        }
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

    /// Sends `op` for `host`; its answer is taken with [`World::answer`].
    pub fn send(&mut self, host: usize, op: Op) -> u64 {
        self.next_op += 1;
        self.pending.insert(self.next_op, (host, op));
        self.next_op
    }

    /// Takes the answer of operation `id`, once the server gave it.
    pub fn answer(&mut self, id: u64) -> Option<Answer> {
        self.answers.remove(&id)
    }

    /// Operation `id`'s sender is gone: the server still applies it, nobody reads the answer.
    pub fn abandon(&mut self, id: u64) {
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
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            if !self.rng.chance(500) {
                continue;
            }
            let (host, op) = self.pending.remove(&id).expect("listed");
            let answer = self.serve_one(&op);
            self.log(|| format!("h{host} {} -> {answer:?}", describe(&op)));
            self.answers.insert(id, answer);
        }
    }

    fn serve_one(&mut self, op: &Op) -> Answer {
        let f = self.faults;
        let faulty = self.faulty;
        let lost = || ClaimError::Unavailable("simulated: no answer".into());
        match op {
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
            Op::Get(_) => return Ok(self.revision),
            Op::Create(key, record) => (key, record, None),
            Op::Update(key, record, revision) => (key, record, Some(*revision)),
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

    /// Stores an output under `id` unless a copy is inside the window; `false` when the
    /// publish is refused (a fault).
    pub fn publish(&mut self, id: &str) -> bool {
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
            self.log(|| format!("publish {id}: stored"));
        }
        true
    }

    /// Settles delivery `number` of message `sequence`; `None` acks or terms, `Some(delay)`
    /// naks. An answer to an older delivery still settles the message, as on the server.
    pub fn settle(&mut self, sequence: u64, number: u64, nak: Option<u64>) {
        if self.faulty && self.rng.chance(self.faults.lost_ack) {
            self.log(|| format!("settle of {sequence}#{number} lost"));
            return;
        }
        let now = self.now;
        let m = &mut self.messages[sequence as usize - 1];
        if matches!(m.delivery, Delivery::Out { .. }) {
            m.delivery = match nak {
                None => Delivery::Done,
                Some(delay) => Delivery::Available(now + delay),
            };
        }
        self.log(|| {
            format!(
                "settle {sequence}#{number}: {}",
                nak.map_or("ack".into(), |d| format!("nak {d} ms"))
            )
        });
    }

    /// A progress ack: the ack wait starts again.
    pub fn progress(&mut self, sequence: u64, number: u64) {
        let deadline = self.now + self.ack_wait_ms;
        let m = &mut self.messages[sequence as usize - 1];
        if let Delivery::Out { number: n, .. } = m.delivery {
            if n == number {
                m.delivery = Delivery::Out { number, deadline };
            }
        }
    }

    /// Messages whose ack wait ran out become available again.
    pub fn expire(&mut self) {
        let now = self.now;
        for m in &mut self.messages {
            if let Delivery::Out { deadline, .. } = m.delivery {
                if deadline < now {
                    m.delivery = Delivery::Available(now);
                }
            }
        }
    }
}

fn describe(op: &Op) -> String {
    match op {
        Op::Get(key) => format!("get {key}"),
        Op::Create(key, r) => format!("create {key} {:?} by {}", r.state, r.owner),
        Op::Update(key, r, rev) => format!("update {key}@{rev} {:?} by {}", r.state, r.owner),
    }
}
