//! A seeded, deterministic simulation of the delivery protocol (issue 25, part 3; the model
//! and what it leaves out: `docs/src/how/simulation.md`). One thread, virtual time, one random
//! generator: a run is a function of its seed, and a failing seed replays step by step with
//! `target/release/simulate --seed S --trace` (after `cargo build --release --workspace --bins`).
//!
//! It runs the host's real claim protocol ([`dedup_host::claim::Claimer`] and its `Lease`)
//! for two to four hosts against [`world::World`], a model of the server, in every mode
//! combination ([`Mode`]: claim before or after, window or fenced effects, exclusive, coalesce),
//! with faults at every store call (answers lost after the write landed or not, writes landing
//! after the writer's read-back, reads from a lagging replica), lost acks, refused publishes,
//! outages of the output and dead-letter streams, missed advisories, hosts paused past their
//! lease, hosts killed and restarted, stream leader elections and hosts partitioned from the
//! server ([`network`]), clock skew, hosts of different sizes, a reload that
//! changes the route on one host, an operator's rename of the route under traffic over the
//! source stream's retained history, and a replay of every dead letter after a fix. A claim-before
//! delivery runs the host's own loop and settle order over the model ([`running`],
//! [`settling`]), a claim-after delivery the host's own run ([`after`]), an exclusive
//! route's source message the host's own queue stage ([`queue`]), each under the host's
//! stranded-message marker ([`marker`]); each adapter sits over one host generation's context
//! ([`ctx`]: its claimers, its outage backoff, the model's acks) and runs the one seeded
//! handler ([`handler`]). Checked as it runs and at the end ([`check`]): every
//! message settled, every key completed or dead-lettered as its handler deserves, one stored
//! copy of each output, per-entity runs never overlapping and in source order, the newest
//! message of a coalesced entity run, no host acking before the outcome is durable or giving
//! up a lease that is still its own.

mod after;
mod ahead;
pub mod canary;
mod check;
mod consumer;
mod ctx;
mod group;
mod handler;
mod host;
mod marker;
mod network;
mod outputs;
mod pinned;
mod queue;
mod rng;
pub mod route;
mod running;
mod settle;
mod settling;
pub mod store;
pub mod world;

use std::sync::{Arc, Mutex};

use route::HostConfig;
pub use route::Mode;
use world::{Faults, World};

/// The settings of a run that every host shares.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The route's delivery modes.
    pub mode: Mode,
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
    /// The server's delivery bound (`source.server_max_deliver`).
    pub server_max_deliver: u64,
    /// Delay before a failed attempt's retry.
    pub backoff_ms: u64,
    /// The output stream's duplicate window; `None`: the shortest the host accepts of a
    /// stream a route publishes to (`Config::longest_rerun_gap`, checked by `setup`), for
    /// these settings, from the host's own function ([`route::required_window_ms`]). Its
    /// largest term is the outage backoff's ceiling: a key whose output was stored but whose
    /// completion was lost, then refused by an outage, runs again up to `OUTAGE_BACKOFF_MAX`
    /// later (seed 7850 `--claim-after` re-ran after 184 s, when the model's window was
    /// 120 s). `Some`: a window of the test's choosing.
    pub window_ms: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mode: Mode::all()[1],
            lease_ms: 2_000,
            heartbeat_ms: 500,
            skew_ms: 200,
            ack_wait_ms: 2_000,
            max_deliver: 3,
            server_max_deliver: 100,
            backoff_ms: 300,
            window_ms: None,
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
/// The longest output outage of a window route: what its duplicate window covers
/// ([`run`] says why).
const WINDOW_OUTAGE_MS: u64 = 60_000;
/// The longest output outage of a fenced route, which needs no window.
const FENCED_OUTAGE_MS: u64 = 360_000;

/// Runs seed `seed` with `settings`; `trace` keeps every event.
pub fn run(seed: u64, settings: Settings, trace: bool) -> Report {
    let mut rng = world::Rng::new(seed.wrapping_mul(31).wrapping_add(7));
    let hosts = rng.range(2, 4) as usize;
    let distinct = rng.range(2, 8);
    let entities = rng.range(1, 3);
    // Published over the fault period, in sequence order; keys repeat (a producer's retries).
    let count = rng.range(distinct, distinct * 3);
    let mut at = EPOCH_MS;
    let published: Vec<(String, String, u64)> = (0..count)
        .map(|_| {
            at += rng.range(0, FAULTS_MS / count);
            let k = rng.range(0, distinct - 1);
            (format!("k{k}"), format!("e{}", k % entities), at)
        })
        .collect();
    // One fenced run in two, the fenced stream takes 10 ms to a second to answer each batch
    // (a server under load), so the hosts' committers group the commits that wait
    // (`world::batch::Staging`); 4 to 12 more keys are published, and its messages come in
    // bursts of two to six, so that commits wait together. Drawn from a generator of its own:
    // other runs are as before.
    let mut staging = world::Rng::new(seed.wrapping_mul(137).wrapping_add(43));
    let (staging_ms, published) = match settings.mode.fenced && staging.chance(500) {
        true => {
            let ms = staging.range(10, 1_000);
            (ms, bursts(published, (distinct, entities), &mut staging))
        }
        false => (0, published),
    };
    let faults = Faults {
        lost_landed: rng.range(0, 40),
        lost: rng.range(0, 40),
        late: rng.range(0, 30),
        stale_read: rng.range(0, 30),
        lost_ack: rng.range(0, 30),
        refused_publish: rng.range(0, 50),
        missed_advisory: rng.range(0, 500),
    };
    // Hosts differ in size; the route's own settings are the same on each.
    let partitions = rng.range(1, 6) as usize;
    let configs: Vec<HostConfig> = (0..hosts)
        .map(|_| HostConfig {
            mode: settings.mode,
            partitions,
            host_concurrency: rng.range(1, 8) as usize,
            route_concurrency: rng.chance(500).then(|| rng.range(1, 8) as usize),
            changed: false,
        })
        .collect();
    // One run in four loses its output streams (deleted and created again); one in four its
    // dead-letter stream, for up to six minutes. A window route's outputs can be re-run
    // after the outage plus the backoff then in force (about twice the outage): the
    // duplicate window the host requires (its outage backoff's ceiling plus
    // `claims.pause_margin`) covers outages of the margin's length, so its output outages
    // last up to 60 s (the default margin; a window without the outage backoff covers only
    // about half of that). Fenced routes need no window: theirs last up to six minutes.
    let longest = match settings.mode.fenced {
        true => FENCED_OUTAGE_MS,
        false => WINDOW_OUTAGE_MS,
    };
    let mut outage = |longest: u64| match rng.chance(250) {
        true => {
            let from = EPOCH_MS + rng.range(0, FAULTS_MS);
            (from, from + rng.range(longest / 6, longest))
        }
        false => (0, 0),
    };
    // On an exclusive window route a dead-letter outage holds a partition (a given-up message
    // waits for its letter, the entity's next messages behind it), so it delays a re-run as
    // an output outage does, and lasts as long (seed 6709 `--coalesce`: a 269 s one held a
    // key's newest message past the window).
    let letters_longest = match settings.mode.exclusive && !settings.mode.fenced {
        true => longest,
        false => 360_000,
    };
    let (outputs_out, letters_out) = (outage(longest), outage(letters_longest));
    // One run in two reloads a changed route on one host; one in two replays its dead
    // letters once everything settled.
    let reload_at = rng.chance(500).then(|| EPOCH_MS + rng.range(0, FAULTS_MS));
    let mut replay = rng.chance(500);
    // One run in four has a server that gives up on a message after a few deliveries (a
    // consumer's `max_deliver` set low): last deliveries, their markers and the sweep happen
    // here, not only after an outage long enough to spend 100 deliveries. On an exclusive
    // route a partition then hands out the entity's next message while a paused owner's lease
    // on the given-up one may still live: the next waits for it (`dedup_delivery::ahead`).
    let mut settings = settings;
    let low_bound = rng.chance(250).then(|| rng.range(4, 10));
    if let Some(bound) = low_bound {
        settings.server_max_deliver = settings.server_max_deliver.min(bound);
    }
    let streams = consumer::Streams::new(
        &published,
        settings.ack_wait_ms,
        settings.server_max_deliver,
        settings.mode.exclusive,
    );
    let window_ms = (settings.window_ms).unwrap_or_else(|| route::required_window_ms(&settings));
    let mut w = World::new(seed, EPOCH_MS, streams, faults, window_ms);
    w.outage = outputs_out;
    w.dead_letter_outage = letters_out;
    // One run in four whose server bound is the default, a replica lags each replay's reset
    // for 2 to 10 s: the replay's deliveries (more than five) read its key from before the
    // reset and are read again, then naked, until it catches up. Drawn from a generator of
    // its own, so that runs without it are as before.
    let mut lag = world::Rng::new(seed.wrapping_mul(131).wrapping_add(11));
    w.replay_lag_ms = (low_bound.is_none() && lag.chance(250)).then(|| lag.range(2_000, 10_000));
    w.staging.ms = staging_ms;
    let fenced = settings.mode.fenced;
    w.network = network::Network::draw(seed, hosts, fenced, settings.lease_ms, EPOCH_MS, FAULTS_MS);
    // One run in two deploys a candidate (canary or shadow) under traffic, then promotes or
    // rolls it back ([`world::Components`]).
    let claim_after = settings.mode.claim_after;
    w.components = world::Components::draw(seed, hosts, claim_after, EPOCH_MS, FAULTS_MS);
    if trace {
        w.trace = Some(vec![format!(
            "seed {seed}: {hosts} hosts {configs:?}, messages {published:?}, {settings:?}, {faults:?}, outages {outputs_out:?} {letters_out:?}, reload at {reload_at:?}, replay {replay}, batches staged {staging_ms} ms, {}",
            w.network.describe()
        )]);
    }
    let world = Arc::new(Mutex::new(w));
    let mut sim = host::Hosts::new(world.clone(), settings, &configs, seed, reload_at);
    // A fenced route that `setup --change-route` turns window runs under window effects from
    // the change on: its output outage is bounded as a window route's (`WINDOW_OUTAGE_MS`),
    // the drawn length scaled to that range so that the run draws what it drew before. (Seeds
    // 12627 and 17265 `--fenced`: a 351 s outage, drawn for the starting mode, re-ran a key
    // under the window contract past its window: the limit of window effects, by design.)
    if settings.mode.fenced && sim.changes_route() {
        let mut w = world.lock().expect("one thread");
        let (from, to) = w.outage;
        w.outage = (from, from + (to - from) * WINDOW_OUTAGE_MS / longest);
        let outage = w.outage;
        w.log(|| format!("the route changes to window: its output outage is {outage:?}"));
    }
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
            let now = w.now;
            w.streams.expire(now);
            w.streams.leaderless = [consumer::Lane::Source, consumer::Lane::Queue]
                .into_iter()
                .filter(|lane| w.network.electing((*lane).into(), now))
                .collect();
            w.serve();
            now
        };
        sim.step(now, now > EPOCH_MS + FAULTS_MS);
        let mut w = world.lock().expect("one thread");
        let quiet = w.quiet() && sim.idle();
        if quiet && w.streams.settled() {
            if !replay {
                break;
            }
            replay = false;
            drop(w);
            sim.replay();
            continue;
        }
        if now > EPOCH_MS + HORIZON_MS {
            for (lane, m) in w.streams.unsettled() {
                violations.push(format!(
                    "stuck: {lane:?} message {} (key {}) is {:?} after {} deliveries",
                    m.sequence, m.key, m.delivery, m.deliveries
                ));
            }
            break;
        }
        // Nothing in flight and no faults: skip to the next thing that happens.
        if quiet && !w.faulty {
            let next = [
                w.streams.next_event(),
                sim.next_event(now),
                w.components.next_event(),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(next) = next.filter(|t| *t > now + 40) {
                w.now = next.min(EPOCH_MS + HORIZON_MS + 1) - 1;
            }
        }
    }
    let mut w = world.lock().expect("one thread");
    violations.extend(check::end(&w, &sim, settings.max_deliver));
    Report {
        seed,
        steps,
        violations,
        trace: w.trace.take().unwrap_or_default(),
    }
}

/// `published` with 4 to 12 keys more (after the `distinct` keys of `entities` entities), in
/// bursts of two to six messages: each published when its burst's first is.
fn bursts(
    mut published: Vec<(String, String, u64)>,
    (distinct, entities): (u64, u64),
    rng: &mut world::Rng,
) -> Vec<(String, String, u64)> {
    for k in distinct..distinct + rng.range(4, 12) {
        let at = EPOCH_MS + rng.range(0, FAULTS_MS);
        published.push((format!("k{k}"), format!("e{}", k % entities), at));
    }
    published.sort_by_key(|m| m.2);
    let mut i = 0;
    while i < published.len() {
        let size = rng.range(2, 6) as usize;
        let at = published[i].2;
        for m in published.iter_mut().skip(i).take(size) {
            m.2 = at;
        }
        i += size;
    }
    published
}

/// Runs seeds `from..from + seeds` in every mode combination, with `base` otherwise; reports
/// each failure through `say` (its violations and the command that replays it) and returns how
/// many runs failed.
pub fn explore(from: u64, seeds: u64, base: Settings, mut say: impl FnMut(String)) -> u64 {
    let mut failed = 0;
    for seed in from..from + seeds {
        for mode in Mode::all() {
            let settings = Settings { mode, ..base };
            let report = run(seed, settings, false);
            if !report.violations.is_empty() {
                failed += 1;
                let flags = mode.flags();
                say(format!(
                    "seed {seed}{flags} failed after {} steps:\n  {}\n  replay: target/release/simulate --seed {seed}{flags}{} --trace   (after cargo build --release --workspace --bins)",
                    report.steps,
                    report.violations.join("\n  "),
                    reverted_flag()
                ));
            }
        }
    }
    failed
}

/// The fixes reverted on this thread, as the `simulate` flag that reverts them again (empty:
/// none): a replay command must reproduce the run it came from.
pub fn reverted_flag() -> String {
    let names: Vec<&str> = dedup_delivery::revert::active()
        .iter()
        .map(|f| f.name())
        .collect();
    match names.is_empty() {
        true => String::new(),
        false => format!(" --revert {}", names.join(",")),
    }
}
