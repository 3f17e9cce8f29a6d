//! A seeded, deterministic simulation of the delivery protocol (issue 25, part 3; the model
//! and what it leaves out: `docs/simulation.md`). One thread, virtual time, one random
//! generator: a run is a function of its seed, and a failing seed replays step by step with
//! `cargo run --release -p dedup-host-tests --bin simulate -- --seed S --trace`.
//!
//! It runs the host's real claim protocol ([`dedup_host::claim::Claimer`] and its `Lease`)
//! for two to four hosts against [`world::World`], a model of the server, with faults at every
//! store call (answers lost after the write landed or not, writes landing after the writer's
//! read-back, reads from a lagging replica), lost acks, refused publishes, hosts paused past
//! their lease, hosts killed and restarted, and clock skew between hosts. The settle logic
//! around the protocol (heartbeat, publish, record, ack; retry; give up; release) follows
//! `host/src/pipeline` step for step. After the faults stop and everything settles, it checks:
//! every message settled, every key completed or (when its handler fails every attempt)
//! dead-lettered, at most one stored copy of each output, no output for a key that never
//! succeeded, and no host acking for a key another host owns.

mod host;
pub mod store;
pub mod world;

use std::sync::{Arc, Mutex};

use world::{Delivery, Faults, World};

/// The settings of a run that every host shares.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Claim after the handler ran (no lease) instead of before.
    pub claim_after: bool,
    /// Lease, heartbeat, clock skew, ack wait (ms).
    pub lease_ms: u64,
    /// How often a running handler's lease is renewed.
    pub heartbeat_ms: u64,
    /// The largest clock difference between two hosts the claims tolerate.
    pub skew_ms: u64,
    /// The consumer's ack wait.
    pub ack_wait_ms: u64,
    /// Attempts per key.
    pub max_deliver: u32,
    /// Delay before a failed attempt's retry.
    pub backoff_ms: u64,
    /// Delay before retrying after an infrastructure error.
    pub infra_retry_ms: u64,
    /// The longest a Busy answer delays a message (another host's clock decides it).
    pub busy_max_ms: u64,
    /// The output stream's duplicate window: the README's bound for these settings (it
    /// outlasts every gap between two runs of a key that publish) is far below 120 s.
    pub window_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            claim_after: false,
            lease_ms: 2_000,
            heartbeat_ms: 500,
            skew_ms: 200,
            ack_wait_ms: 2_000,
            max_deliver: 3,
            backoff_ms: 300,
            infra_retry_ms: 1_000,
            busy_max_ms: 5_000,
            window_ms: 120_000,
        }
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Scheduler steps taken.
    pub steps: u64,
    /// Every broken invariant, one sentence each; empty when the run passed.
    pub violations: Vec<String>,
    /// The step-by-step trace, when asked for.
    pub trace: Vec<String>,
}

/// The longest a run may take (virtual ms) before unsettled messages count as stuck.
const HORIZON_MS: u64 = 30 * 60 * 1000;
/// How long faults are injected (virtual ms).
const FAULTS_MS: u64 = 40_000;
/// Virtual time at the start (any fixed Unix time).
const EPOCH_MS: u64 = 1_800_000_000_000;

/// Runs seed `seed` with `settings`; `trace` keeps every event.
pub fn run(seed: u64, settings: Settings, trace: bool) -> Report {
    let mut rng = world::Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let hosts = rng.range(2, 4) as usize;
    let distinct = rng.range(2, 8);
    // Published over the fault period, in sequence order; keys repeat (a producer's retries).
    let count = rng.range(distinct, distinct * 3);
    let mut at = EPOCH_MS;
    let keys: Vec<(String, u64)> = (0..count)
        .map(|_| {
            at += rng.range(0, FAULTS_MS / count);
            (format!("k{}", rng.range(0, distinct - 1)), at)
        })
        .collect();
    let faults = Faults {
        lost_landed: rng.range(0, 40),
        lost: rng.range(0, 40),
        late: rng.range(0, 30),
        stale_read: rng.range(0, 30),
        lost_ack: rng.range(0, 30),
        refused_publish: rng.range(0, 50),
    };
    let mut w = World::new(
        seed,
        EPOCH_MS,
        &keys,
        faults,
        settings.window_ms,
        settings.ack_wait_ms,
    );
    if trace {
        w.trace = Some(vec![format!(
            "seed {seed}: {hosts} hosts, keys {keys:?}, {settings:?}, {faults:?}"
        )]);
    }
    let world = Arc::new(Mutex::new(w));
    let mut sim = host::Hosts::new(world.clone(), settings, hosts, seed);
    let mut steps = 0;
    let mut violations = Vec::new();
    loop {
        steps += 1;
        let now = {
            let mut w = world.lock().expect("one thread");
            let tick = w.rng.range(1, 40);
            w.now += tick;
            if w.faulty && w.now > EPOCH_MS + FAULTS_MS {
                w.faulty = false;
                w.log(|| "faults stop".into());
            }
            w.expire();
            w.serve();
            w.now
        };
        sim.step(now, now > EPOCH_MS + FAULTS_MS);
        let settled = {
            let w = world.lock().expect("one thread");
            w.messages.iter().all(|m| m.delivery == Delivery::Done)
        };
        if settled && sim.idle() {
            break;
        }
        if now > EPOCH_MS + HORIZON_MS {
            let w = world.lock().expect("one thread");
            for m in w.messages.iter().filter(|m| m.delivery != Delivery::Done) {
                violations.push(format!(
                    "stuck: message {} (key {}) is {:?} after {} deliveries",
                    m.sequence, m.key, m.delivery, m.deliveries
                ));
            }
            break;
        }
    }
    violations.extend(sim.violations());
    let mut w = world.lock().expect("one thread");
    violations.extend(check(&w, &sim, settings.max_deliver));
    Report {
        seed,
        steps,
        violations,
        trace: w.trace.take().unwrap_or_default(),
    }
}

/// The end-state invariants.
fn check(w: &World, sim: &host::Hosts, max_deliver: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut keys: Vec<&str> = w.messages.iter().map(|m| m.key.as_str()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let fails = sim.fails_forever(key);
        // Attempts a pause or a kill may legitimately have cost (each can lose a lease).
        let disrupted = w.disrupted.get(key).copied().unwrap_or(0);
        let excused = sim.failures(key).saturating_add(disrupted) >= max_deliver;
        let record = w.record(key).map(|(r, _)| r);
        let state = record.map(|r| (r.state, r.permanent));
        use dedup_host::claim::ClaimState::{Completed, Failed};
        match (fails, state) {
            (false, Some((Completed, _))) => {}
            (true, Some((Failed, true))) => {}
            (false, Some((Failed, true))) if excused => {}
            (_, state) => out.push(format!(
                "key {key} ended {state:?} (its handler {} every attempt)",
                if fails { "fails" } else { "does not fail" }
            )),
        }
        let id = format!("{key}#0");
        let copies = w.outputs.get(&id).map_or(0, Vec::len);
        match (fails, copies) {
            (false, 1) | (true, 0) => {}
            (false, 0) if excused => {}
            (_, n) => out.push(format!("key {key}: its output is stored {n} times")),
        }
        let letters = w.dead_letters.iter().filter(|k| *k == key).count();
        if fails && letters == 0 {
            out.push(format!("key {key} failed for good without a dead letter"));
        }
        if !fails && letters > 0 && !excused {
            out.push(format!("key {key} succeeded yet was dead-lettered"));
        }
    }
    out
}

/// Runs seeds `from..from + seeds` in both claim modes, with `base` otherwise; reports each failure through `say`
/// (its violations and the command that replays it) and returns how many failed.
pub fn explore(from: u64, seeds: u64, base: Settings, mut say: impl FnMut(String)) -> u64 {
    let mut failed = 0;
    for seed in from..from + seeds {
        for claim_after in [false, true] {
            let settings = Settings {
                claim_after,
                ..base
            };
            let report = run(seed, settings, false);
            if !report.violations.is_empty() {
                failed += 1;
                let mode = if claim_after { " --claim-after" } else { "" };
                say(format!(
                    "seed {seed}{mode} failed after {} steps:\n  {}\n  replay: cargo run --release -p dedup-host-tests --bin simulate -- --seed {seed}{mode} --trace",
                    report.steps,
                    report.violations.join("\n  ")
                ));
            }
        }
    }
    failed
}
