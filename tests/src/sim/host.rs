//! The simulated hosts: each runs the real claim protocol through its own [`SimStore`] and
//! settles deliveries as `host/src/pipeline` does ([`super::settle`]). A host can be paused
//! (not polled: its lease lapses while its requests stay in flight) or killed (its work
//! dropped at an await point) and restarted under a new instance id. Each has its own config
//! of the route (hosts differ in size), checked against the route's contract at start and at
//! a reload, as the host decides: its record-or-read step and judgement
//! ([`route::compare`]), what it does with the comparison ([`agreement::decide`]) and its
//! reload plan ([`reload::plan`]); a host whose config differs from the contract does not
//! serve the route. Hosts
//! also handle MAX_DELIVERIES advisories and sweep stranded-message markers, deciding what
//! becomes of each message as the host does ([`undeliverable::decide`]). An operator may
//! delete the route's contract record, which the hosts' contract watches see, and a host
//! whose pulls failed re-binds the source consumer ([`edges`]).
//!
//! [`SimStore`]: super::store::SimStore

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use dedup_delivery::agreement::{self, Comparison};
use dedup_delivery::reload;
use dedup_delivery::undeliverable::{self, GivenUp};
use dedup_host::claim::record::virtual_clock;
use dedup_host::config::diff::ConfigDiff;
use dedup_host::config::EffectsMode;
use dedup_host::contract::RouteContract;
use dedup_host::stranded;

use super::consumer::{Delivery, Lane};
use super::ctx::Ctx;
use super::group::Runner;
use super::handler::{handler, Handler};
use super::route::{self, HostConfig, Mode, Served};
use super::store::Shared;
use super::world::Rng;
use super::Settings;

mod candidates;
mod change;
mod edges;
mod moved;
mod rename;
mod replay;

use edges::Edges;

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One simulated host.
struct Host {
    ctx: Arc<Ctx>,
    generation: u32,
    /// Not polled before this time (a pause) or, when down, not restarted before it.
    paused_until: u64,
    down: bool,
    /// Its clock's offset from the true time (ms).
    skew: i64,
    /// Deliveries in flight, with their keys.
    work: Vec<(String, Work)>,
    /// Its fenced streams' committers ([`super::group`]): polled beside its deliveries,
    /// killed and paused with it, never counted as work in flight.
    committers: Vec<Runner>,
    /// Its config of the route.
    config: HostConfig,
    /// What it serves: `None` while its config differs from the route's contract.
    served: Option<Served>,
    /// The config its process started with (`pipeline::Shared.config`, frozen until a
    /// restart): what its re-binds read.
    started: HostConfig,
    /// The contract it last agreed on (none after a restart): it keeps serving under it
    /// when the record is deleted.
    held: Option<RouteContract>,
    /// The contract record's revision its contract watch has seen.
    seen: u64,
    /// Its pulls failed (its source stream electing, or it was cut off): it re-binds the
    /// source consumer once they work again.
    rebind: bool,
}

impl Host {
    fn ready(&self, now: u64) -> bool {
        !self.down && self.paused_until <= now
    }

    /// Takes `config` (at start, restart or a reload that starts the route anew): serves the
    /// route if it agrees with the contract, else refuses it (work in flight drains), as the
    /// host decides ([`agreement::decide`]).
    fn configure(&mut self, world: &Shared, config: HostConfig, i: usize) {
        self.config = config;
        let served = Served::new(&config);
        let comparison = route::compare(world, &served, &format!("h{i}"), self.held.as_ref());
        let decided = agreement::decide(comparison, self.served.is_some());
        if comparison == Comparison::Agrees {
            self.held = Some(served.contract.clone());
        }
        self.seen = world.lock().expect("one thread").contract.revision;
        log(world, || {
            format!(
                "h{i} configured (changed: {}, partitions {}): {}",
                config.changed,
                served.partitions,
                match decided.serves() {
                    true => "serves the route".to_string(),
                    false => format!("refuses the route: {comparison:?} ({decided:?})"),
                }
            )
        });
        self.served = decided.serves().then_some(served);
    }

    /// Reloads `config` as the host's `Live::reload` plans it ([`reload::plan`], from the
    /// host's own `ConfigDiff`): refused whole if a fenced route would run unfenced, else the
    /// route is kept as it runs, started anew (its contract checked again), or retired.
    fn reload(&mut self, world: &Shared, config: HostConfig, i: usize) {
        let (old, new) = (self.config.config(), config.config());
        let refused = reload::unfenced(new.routes.iter().map(|r| reload::Fencing {
            route: &r.name,
            fenced: r.effects == EffectsMode::Fenced,
            captured: new.fenced_stream(r).is_some(),
            allowed_outputs: &r.allowed_outputs,
        }));
        if !refused.is_empty() {
            log(world, || {
                format!("h{i} refuses the reload: {}", refused.join("; "))
            });
            return;
        }
        let diff = ConfigDiff::between(&old, &new);
        let running = |name: &str| old.routes.iter().any(|r| r.name == name);
        let names = new
            .routes
            .iter()
            .map(|r| (r.name.as_str(), running(&r.name)));
        let plan = reload::plan(
            names,
            reload::Diff {
                added: &diff.added,
                removed: &diff.removed,
                changed: &diff.changed,
            },
        );
        for (name, step) in &plan.steps {
            log(world, || format!("h{i} reloads route {name}: {step:?}"));
            match step {
                reload::Step::Keep => self.config = config,
                reload::Step::Start { .. } => self.configure(world, config, i),
            }
        }
        if !plan.retired.is_empty() {
            self.served = None;
        }
    }
}

/// Every simulated host.
pub struct Hosts {
    world: Shared,
    settings: Settings,
    seed: u64,
    rng: Rng,
    hosts: Vec<Host>,
    /// When host 0 reloads a changed config of the route, if it does.
    reload_at: Option<u64>,
    /// How often (thousandths) a queued delivery waits in the host's buffer, behind the
    /// partition's permit, before the host takes it up; drawn apart from the other draws, so
    /// that seeds without it run as they did before it was modelled.
    buffered: u64,
    buffer: Rng,
    /// When an operator deletes the route's contract record, and when an operator's `setup`
    /// records it again, if they do ([`Edges`]).
    delete_at: Option<u64>,
    setup_at: Option<u64>,
    /// The draws of the contract deletion, the stale start and the contract watches' latency,
    /// apart from the other draws (runs without them run as before).
    edges: Rng,
    /// An operator's `setup --rename-route` under traffic, if the run has one.
    rename: rename::Rename,
    /// An operator's `setup --change-route` under traffic, if the run has one.
    change: change::Change,
}

/// How long the copier stays pinned without pulling (`exclusive::COPIER_PIN_TTL`), in ms.
const PIN_TTL_MS: u64 = dedup_host::exclusive::COPIER_PIN_TTL.as_millis() as u64;

impl Hosts {
    /// `configs.len()` hosts sharing `world`; host 0 reloads a changed config at `reload_at`.
    pub fn new(
        world: Shared,
        settings: Settings,
        configs: &[HostConfig],
        seed: u64,
        reload_at: Option<u64>,
    ) -> Self {
        let mut rng = Rng::new(seed.rotate_left(17) ^ 0x5151);
        let mut edges = Rng::new(seed.rotate_left(53) ^ 0xC047);
        let drawn = Edges::draw(
            &mut edges,
            configs.len(),
            settings.mode.exclusive,
            reload_at,
        );
        // `setup` wrote the route's source consumer.
        let consumer = route::set_up_consumer(
            &configs[0],
            settings.ack_wait_ms,
            settings.server_max_deliver,
        );
        world.lock().expect("one thread").streams.source_consumer = consumer;
        let mut hosts = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            let started = match drawn.stale == Some(i) {
                true => HostConfig {
                    mode: Mode {
                        exclusive: false,
                        coalesce: false,
                        ..config.mode
                    },
                    ..*config
                },
                false => *config,
            };
            let skew = rng.range(0, settings.skew_ms) as i64 - settings.skew_ms as i64 / 2;
            let mut host = Host {
                ctx: Ctx::new(&world, settings, seed, i, 0),
                generation: 0,
                paused_until: 0,
                down: false,
                skew,
                work: Vec::new(),
                committers: Vec::new(),
                config: *config,
                served: None,
                started,
                held: None,
                seen: 0,
                rebind: false,
            };
            world.lock().expect("one thread").clock_offsets.push(skew);
            host.configure(&world, *config, i);
            hosts.push(host);
        }
        // One run in four: a queued delivery now and then waits in its host's buffer for half
        // to two ack waits, and the server may give up on it meanwhile.
        let mut buffer = Rng::new(seed.rotate_left(29) ^ 0xB0FF);
        let buffered = match buffer.chance(250) {
            true => buffer.range(50, 300),
            false => 0,
        };
        Self {
            world,
            settings,
            seed,
            rng,
            hosts,
            reload_at,
            buffered,
            buffer,
            delete_at: drawn.delete_at,
            setup_at: drawn.setup_at,
            edges,
            rename: rename::Rename::draw(seed, settings.mode.exclusive),
            change: change::Change::draw(
                seed,
                settings.mode.exclusive,
                drawn.delete_at.is_some()
                    || (rename::Rename::draw(seed, settings.mode.exclusive).next_event()).is_some(),
            ),
        }
    }

    /// What `key`'s handler does (before any replay).
    pub fn handler(&self, key: &str) -> Handler {
        handler(self.seed, key)
    }

    /// Whether the route's effects are fenced.
    pub fn fenced(&self) -> bool {
        self.settings.mode.fenced
    }

    /// Whether the route coalesces.
    pub fn coalesces(&self) -> bool {
        self.settings.mode.coalesce
    }

    /// Whether an operator changes the route's contract in this run (`setup --change-route`:
    /// a fenced route turns window, a window route fenced), as drawn: asked before the first
    /// step.
    pub fn changes_route(&self) -> bool {
        self.change.next_event().is_some()
    }

    /// Whether no host has work in flight.
    pub fn idle(&self) -> bool {
        self.hosts.iter().all(|h| h.work.is_empty()) && !self.change.busy()
    }

    /// The next time a host comes back from a pause or a kill, if any.
    pub fn next_event(&self, now: u64) -> Option<u64> {
        self.hosts
            .iter()
            .map(|h| h.paused_until)
            .chain(self.reload_at)
            .chain(self.delete_at)
            .chain(self.setup_at)
            .chain(self.rename.next_event())
            .chain(self.change.next_event())
            .filter(|t| *t > now)
            .min()
    }

    /// One step at time `now`: faults (unless `healed`), restarts, a reload, advisories and
    /// markers, deliveries, then every running host's work is polled once, on its own clock.
    pub fn step(&mut self, now: u64, healed: bool) {
        if !healed {
            self.faults(now);
        }
        for (i, h) in self.hosts.iter_mut().enumerate() {
            if h.down && h.paused_until <= now {
                h.down = false;
                h.generation += 1;
                h.ctx = Ctx::new(&self.world, self.settings, self.seed, i, h.generation);
                log(&self.world, || {
                    format!("h{i} restarts as generation {}", h.generation)
                });
                // A restarted host serves nothing until it agrees anew, holds no contract, and
                // its process starts with its config as it is now.
                h.served = None;
                h.held = None;
                h.started = h.config;
                h.rebind = false;
                let config = h.config;
                h.configure(&self.world, config, i);
                self.world
                    .lock()
                    .expect("one thread")
                    .components
                    .restarted(i);
            }
        }
        if self.reload_at.is_some_and(|at| at <= now) {
            self.reload_at = None;
            let config = HostConfig {
                changed: true,
                ..self.hosts[0].config
            };
            self.hosts[0].reload(&self.world, config, 0);
        }
        self.operator(now);
        self.renames(now);
        self.changes(now);
        self.watch(now);
        self.candidates(now);
        self.rebinds(now);
        self.undeliverable(now);
        self.deliver(now);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for h in &mut self.hosts {
            if !h.ready(now) {
                continue;
            }
            virtual_clock::set(Some(now.saturating_add_signed(h.skew)));
            h.work
                .retain_mut(|(_, w)| w.as_mut().poll(&mut cx).is_pending());
            h.committers.append(&mut h.ctx.group.started());
            h.committers
                .retain_mut(|c| c.as_mut().poll(&mut cx).is_pending());
        }
        virtual_clock::set(None);
    }

    fn faults(&mut self, now: u64) {
        // A partition ([`super::network`]) costs the work in flight what a pause does.
        for (i, h) in self.hosts.iter().enumerate() {
            if self
                .world
                .lock()
                .expect("one thread")
                .network
                .newly_cut(i, now)
            {
                disrupt(&self.world, &h.work);
                log(&self.world, || format!("h{i} is cut off from the server"));
            }
        }
        let lease = self.settings.lease_ms;
        let i = self.rng.range(0, self.hosts.len() as u64 - 1) as usize;
        let h = &mut self.hosts[i];
        if !h.ready(now) {
            return;
        }
        let roll = self.rng.bits() % 10_000;
        if roll < 5 {
            h.paused_until = now + self.rng.range(lease / 2, lease * 3);
            disrupt(&self.world, &h.work);
            log(&self.world, || {
                format!("h{i} paused until {}", h.paused_until)
            });
        } else if roll < 8 {
            disrupt(&self.world, &h.work);
            h.down = true;
            h.paused_until = now + self.rng.range(0, 3_000);
            let dropped = std::mem::take(&mut h.work); // dropped at their await points
            h.committers.clear(); // its batches in flight stay with the server
            log(&self.world, || {
                format!("h{i} killed with {} deliveries in flight", dropped.len())
            });
            drop(dropped);
        }
    }

    /// MAX_DELIVERIES advisories (one reaches a running host unless missed) and markers that
    /// are due (any running host sweeps them): `pipeline::undeliverable`.
    fn undeliverable(&mut self, now: u64) {
        let skew = Duration::from_millis(self.settings.skew_ms);
        let mut w = self.world.lock().expect("one thread");
        let up = (self.hosts.iter().enumerate())
            .any(|(i, h)| h.ready(now) && !w.network.cut_off(i, now));
        let advisories = std::mem::take(&mut w.streams.advisories);
        for (lane, sequence) in advisories {
            let rate = w.faults.missed_advisory;
            let missed = !up || w.rng.chance(rate);
            w.log(|| {
                format!(
                    "advisory: {lane:?} {sequence} undeliverable{}",
                    if missed { ", missed" } else { "" }
                )
            });
            if !missed {
                rescue(&mut w, lane, sequence, skew);
            }
        }
        let due: Vec<(Lane, u64)> = w
            .streams
            .markers
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(m, _)| *m)
            .collect();
        if up {
            for (lane, sequence) in due {
                rescue(&mut w, lane, sequence, skew);
            }
        }
    }

    fn deliver(&mut self, now: u64) {
        if self.rename.stopping() {
            return;
        }
        let serving: Vec<(usize, usize)> = (0..self.hosts.len())
            .filter(|i| self.hosts[*i].ready(now))
            // A partitioned host's pulls do not reach the server ([`super::network`]).
            .filter(|i| {
                !self
                    .world
                    .lock()
                    .expect("one thread")
                    .network
                    .cut_off(*i, now)
            })
            .filter_map(|i| self.hosts[i].served.as_ref().map(|s| (i, s.partitions)))
            .collect();
        if serving.is_empty() {
            return;
        }
        // A source consumer pinned to one host (an exclusive route's copier) hands its messages
        // to that host only; the pin moves once the pinned host has not pulled for the pin's
        // time to live (`exclusive::COPIER_PIN_TTL`).
        let pinned_consumer = self
            .world
            .lock()
            .expect("one thread")
            .streams
            .source_consumer
            .pinned;
        let pin = self.world.lock().expect("one thread").streams.pin;
        let pinned = match (pinned_consumer, pin) {
            (false, _) => None,
            (true, Some((p, _))) if serving.iter().any(|(i, _)| *i == p) => Some(p),
            (true, Some((_, seen))) if now < seen + PIN_TTL_MS => None,
            (true, _) => Some(serving[self.rng.range(0, serving.len() as u64 - 1) as usize].0),
        };
        if let Some(p) = pinned {
            if pin.is_none_or(|(was, _)| was != p) {
                log(&self.world, || format!("the source consumer pins h{p}"));
            }
            self.world.lock().expect("one thread").streams.pin = Some((p, now));
        }
        let offers = {
            let mut w = self.world.lock().expect("one thread");
            let source = !pinned_consumer || pinned.is_some();
            w.streams
                .due(now, source, |p| serving.iter().any(|(_, n)| p < *n))
        };
        for offer in offers {
            let pulling: Vec<usize> = serving
                .iter()
                .filter(|(_, n)| offer.message.partition.is_none_or(|p| p < *n))
                .map(|(i, _)| *i)
                .collect();
            let i = match (offer.lane, pinned) {
                (Lane::Source, Some(p)) => p,
                _ => pulling[self.rng.range(0, pulling.len() as u64 - 1) as usize],
            };
            let host = &mut self.hosts[i];
            // Its place among its entity's copies, taken in the order handed out.
            // Its place among its entity's copies, taken in the order handed out, and the pin
            // it was handed out under.
            let turn = (offer.lane == Lane::Source && self.settings.mode.exclusive).then(|| {
                let pin = pinned.map(super::consumer::pin_id);
                (host.ctx.copier.turn(Some(&offer.message.entity)), pin)
            });
            log(&self.world, || {
                format!(
                    "deliver {:?} {}#{} ({}, {}) to h{i}",
                    offer.lane,
                    offer.message.sequence,
                    offer.number,
                    offer.message.key,
                    offer.message.entity
                )
            });
            let ctx = host.ctx.clone();
            let served = host.served.clone().expect("serving");
            let key = offer.message.key.clone();
            let faulty = self.world.lock().expect("one thread").faulty;
            let ack_wait = self.settings.ack_wait_ms;
            let wait = (offer.lane == Lane::Queue && faulty && self.buffer.chance(self.buffered))
                .then(|| self.buffer.range(ack_wait / 2, ack_wait * 2));
            if let Some(ms) = wait {
                log(&self.world, || format!("  waits {ms} ms in h{i}'s buffer"));
            }
            host.work.push((
                key,
                Box::pin(async move {
                    let buffered = wait.map(Duration::from_millis);
                    ctx.handle(offer, served, buffered, turn).await
                }),
            ));
        }
    }
}

/// The claim key space the route's contract names.
pub fn space(w: &super::world::World) -> &'static str {
    match &w.contract.record {
        Some(c) if c.contract.claims.starts_with("stream ") => "s:",
        _ => "b:",
    }
}

/// Dead-letters a message the server gave up on, unless it is gone or its key settled or
/// running ([`undeliverable::decide`], the host's decision); if the letter cannot be stored,
/// the marker stays and is retried with backoff ([`stranded::retry_ceiling`]).
fn rescue(w: &mut super::world::World, lane: Lane, sequence: u64, skew: Duration) {
    let m = w.streams.message(lane, sequence).clone();
    let key = w.claim_key(space(w), &m.key);
    let record = w.record(&key).cloned();
    let now = w.now;
    let given_up =
        undeliverable::decide(record.as_ref().map(|(r, _)| r), Some(m.source), now, skew);
    let later = |w: &mut super::world::World, tries: u32| {
        let ceiling = stranded::retry_ceiling(tries + 1).as_millis() as u64;
        let at = now + w.rng.range(ceiling / 2, ceiling);
        w.streams.markers.insert((lane, sequence), (at, tries + 1));
    };
    let tries = w
        .streams
        .markers
        .get(&(lane, sequence))
        .map_or(0, |(_, t)| *t);
    match (m.delivery, given_up) {
        (Delivery::Done, _) => {}
        // The model's marker of a last delivery still out, or naked: the server is not done.
        (Delivery::Out { .. } | Delivery::Available(_), g) if g != GivenUp::Settled => {
            return later(w, tries)
        }
        (_, GivenUp::Settled) => w.streams.delete(lane, sequence),
        (_, GivenUp::Running { .. }) => return later(w, tries),
        (_, GivenUp::Letter { last_reason, .. }) => {
            if !w.dead_letter(&m.key) {
                return later(w, tries);
            }
            let reason = undeliverable::reason(m.deliveries, last_reason.as_deref());
            w.given_up(&key, record, reason);
            w.streams.delete(lane, sequence);
        }
    }
    w.streams.markers.remove(&(lane, sequence));
}

fn disrupt(world: &Shared, work: &[(String, Work)]) {
    let mut w = world.lock().expect("one thread");
    for (key, _) in work {
        *w.disrupted.entry(key.clone()).or_default() += 1;
    }
}

fn log(world: &Shared, line: impl FnOnce() -> String) {
    world.lock().expect("one thread").log(line);
}
