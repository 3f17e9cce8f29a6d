//! The simulated hosts: each runs the real claim protocol through its own [`SimStore`] and
//! settles deliveries as `host/src/pipeline` does. A host can be paused (not polled: its lease
//! lapses while its requests stay in flight) or killed (its work dropped at an await point)
//! and restarted under a new instance id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dedup_host::claim::record::virtual_clock;
use dedup_host::claim::{ClaimOutcome, ClaimState, ClaimStore, Claimer, Lease, LeaseLost};

use super::store::{Shared, SimStore};
use super::world::{Delivery, Rng};
use super::Settings;

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What one host generation needs to settle a delivery.
struct Ctx {
    world: Shared,
    claimer: Claimer<SimStore>,
    settings: Settings,
    seed: u64,
    host: usize,
}

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
}

/// Every simulated host.
pub struct Hosts {
    world: Shared,
    settings: Settings,
    seed: u64,
    rng: Rng,
    hosts: Vec<Host>,
}

impl Hosts {
    /// `n` hosts sharing `world`.
    pub fn new(world: Shared, settings: Settings, n: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed.rotate_left(17) ^ 0x5151);
        let hosts = (0..n)
            .map(|i| {
                let skew = rng.range(0, settings.skew_ms) as i64 - settings.skew_ms as i64 / 2;
                Host {
                    ctx: ctx(&world, settings, seed, i, 0),
                    generation: 0,
                    paused_until: 0,
                    down: false,
                    skew,
                    work: Vec::new(),
                }
            })
            .collect();
        Self {
            world,
            settings,
            seed,
            rng,
            hosts,
        }
    }

    /// How many first attempts of `key` its handler fails (`u32::MAX`: all).
    pub fn failures(&self, key: &str) -> u32 {
        failures(self.seed, key)
    }

    /// Whether no host has work in flight.
    pub fn idle(&self) -> bool {
        self.hosts.iter().all(|h| h.work.is_empty())
    }

    /// Whether `key`'s handler fails every attempt.
    pub fn fails_forever(&self, key: &str) -> bool {
        failures(self.seed, key) == u32::MAX
    }

    /// Broken invariants the hosts saw as they ran.
    pub fn violations(&self) -> Vec<String> {
        self.hosts
            .first()
            .map(|h| {
                let w = h.ctx.world.lock().expect("one thread");
                w.violations.clone()
            })
            .unwrap_or_default()
    }

    /// One step at time `now`: faults (unless `healed`), deliveries, then every running
    /// host's work is polled once, on its own clock.
    pub fn step(&mut self, now: u64, healed: bool) {
        if !healed {
            self.faults(now);
        }
        for (i, h) in self.hosts.iter_mut().enumerate() {
            if h.down && h.paused_until <= now {
                h.down = false;
                h.generation += 1;
                h.ctx = ctx(&self.world, self.settings, self.seed, i, h.generation);
                log(&self.world, || {
                    format!("h{i} restarts as generation {}", h.generation)
                });
            }
        }
        self.deliver(now);
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        for h in &mut self.hosts {
            if h.down || h.paused_until > now {
                continue;
            }
            virtual_clock::set(Some(now.saturating_add_signed(h.skew)));
            h.work
                .retain_mut(|(_, w)| w.as_mut().poll(&mut cx).is_pending());
        }
        virtual_clock::set(None);
    }

    fn faults(&mut self, now: u64) {
        let lease = self.settings.lease_ms;
        let i = self.rng.range(0, self.hosts.len() as u64 - 1) as usize;
        let h = &mut self.hosts[i];
        if h.down || h.paused_until > now {
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
            log(&self.world, || {
                format!("h{i} killed with {} deliveries in flight", dropped.len())
            });
            drop(dropped);
        }
    }

    fn deliver(&mut self, now: u64) {
        let ready: Vec<usize> = (0..self.hosts.len())
            .filter(|i| !self.hosts[*i].down && self.hosts[*i].paused_until <= now)
            .collect();
        if ready.is_empty() {
            return;
        }
        let mut w = self.world.lock().expect("one thread");
        let ack_wait = w.ack_wait_ms;
        let mut out = Vec::new();
        for m in &mut w.messages {
            if matches!(m.delivery, Delivery::Available(at) if at <= now) {
                m.deliveries += 1;
                let number = m.deliveries;
                m.delivery = Delivery::Out {
                    number,
                    deadline: now + ack_wait,
                };
                out.push((m.sequence, number, m.key.clone()));
            }
        }
        for (sequence, number, key) in out {
            let i = ready[self.rng.range(0, ready.len() as u64 - 1) as usize];
            let host = &mut self.hosts[i];
            w.log(|| format!("deliver {sequence}#{number} ({key}) to h{i}"));
            let ctx = host.ctx.clone();
            let k = key.clone();
            host.work.push((
                k,
                Box::pin(async move {
                    match ctx.settings.claim_after {
                        false => ctx.deliver(sequence, number, &key).await,
                        true => ctx.deliver_after(sequence, number, &key).await,
                    }
                }),
            ));
        }
    }
}

fn ctx(world: &Shared, settings: Settings, seed: u64, host: usize, generation: u32) -> Arc<Ctx> {
    let store = SimStore {
        world: world.clone(),
        host,
    };
    let claimer = Claimer::new(
        Arc::new(store),
        format!("h{host}.{generation}"),
        Duration::from_millis(settings.lease_ms),
        Duration::from_millis(settings.skew_ms),
    );
    Arc::new(Ctx {
        world: world.clone(),
        claimer,
        settings,
        seed,
        host,
    })
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

/// How many first attempts of `key` fail (`u32::MAX`: all of them).
fn failures(seed: u64, key: &str) -> u32 {
    let h = key.bytes().fold(seed ^ 0xfeed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    match Rng::new(h).bits() % 10 {
        0..=4 => 0,
        5..=7 => 1,
        _ => u32::MAX,
    }
}

impl Ctx {
    fn world(&self) -> std::sync::MutexGuard<'_, super::world::World> {
        self.world.lock().expect("one thread")
    }

    fn settle(&self, sequence: u64, number: u64, nak: Option<u64>) {
        self.world().settle(sequence, number, nak);
    }

    /// How long the handler runs on `attempt` of `key`.
    fn work_ms(&self, key: &str, attempt: u32) -> u64 {
        let h = key.bytes().fold(self.seed ^ u64::from(attempt), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let most = match self.settings.claim_after {
            false => self.settings.lease_ms * 2,
            true => self.settings.ack_wait_ms / 2,
        };
        Rng::new(h).bits() % most
    }

    /// A lease write of `key` went unanswered: its lease may lapse, costing an attempt.
    fn unconfirmed(&self, key: &str) {
        *self.world().disrupted.entry(key.to_string()).or_default() += 1;
    }

    fn violation(&self, what: String) {
        let mut w = self.world();
        w.log(|| format!("VIOLATION {what}"));
        w.violations.push(what);
    }

    /// Claim before: `pipeline::message` and `pipeline::settle`.
    async fn deliver(&self, sequence: u64, number: u64, key: &str) {
        let s = self.settings;
        match self.claimer.claim(key, "d").await {
            Err(_) => {
                // The claim may land later, unseen: a lease nobody renews, which costs an attempt.
                self.unconfirmed(key);
                self.settle(sequence, number, Some(s.infra_retry_ms))
            }
            Ok(ClaimOutcome::Completed | ClaimOutcome::DeadLettered) => {
                self.settle(sequence, number, None)
            }
            Ok(ClaimOutcome::Busy { retry_in }) => {
                let delay = (retry_in.as_millis() as u64).min(s.busy_max_ms);
                self.settle(sequence, number, Some(delay));
            }
            Ok(ClaimOutcome::Acquired(lease)) => self.run(sequence, number, key, &lease).await,
        }
    }

    async fn run(&self, sequence: u64, number: u64, key: &str, lease: &Lease<SimStore>) {
        let s = self.settings;
        let attempt = lease.attempt();
        if attempt > s.max_deliver {
            return self.give_up(sequence, number, key, lease).await;
        }
        // The handler runs; the heartbeat renews the lease and sends progress acks.
        let mut left = self.work_ms(key, attempt);
        while left > 0 {
            let slice = left.min(s.heartbeat_ms);
            sleep(&self.world, slice).await;
            left -= slice;
            if slice == s.heartbeat_ms {
                match lease.renew().await {
                    Ok(()) => self.world().progress(sequence, number),
                    Err(LeaseLost::Reclaimed) => return self.lost(key, lease),
                    Err(LeaseLost::Unavailable(_)) => self.unconfirmed(key),
                }
            }
        }
        if attempt <= failures(self.seed, key) {
            if attempt >= s.max_deliver {
                return self.give_up(sequence, number, key, lease).await;
            }
            return match lease
                .fail("failed", Duration::from_millis(s.backoff_ms))
                .await
            {
                Ok(()) => self.recorded_settle(sequence, number, key, Some(s.backoff_ms)),
                Err(e) => self.write_failed(sequence, number, key, lease, e),
            };
        }
        if let Err(e) = lease.confirm().await {
            return self.write_failed(sequence, number, key, lease, e);
        }
        if !self.world().publish(&format!("{key}#0")) {
            let delay = Duration::from_millis(s.infra_retry_ms);
            return match lease.release("publish refused", delay).await {
                Ok(()) => self.recorded_settle(sequence, number, key, Some(s.infra_retry_ms)),
                Err(e) => self.write_failed(sequence, number, key, lease, e),
            };
        }
        match lease.complete(Vec::new()).await {
            Ok(()) => self.recorded_settle(sequence, number, key, None),
            Err(e) => self.write_failed(sequence, number, key, lease, e),
        }
    }

    async fn give_up(&self, sequence: u64, number: u64, key: &str, lease: &Lease<SimStore>) {
        if let Err(e) = lease.confirm().await {
            return self.write_failed(sequence, number, key, lease, e);
        }
        {
            let mut w = self.world();
            w.dead_letters.push(key.to_string());
            w.log(|| format!("dead letter for {key}"));
        }
        match lease.give_up("out of attempts").await {
            Ok(()) => self.recorded_settle(sequence, number, key, None),
            Err(e) => self.write_failed(sequence, number, key, lease, e),
        }
    }

    fn write_failed(
        &self,
        sequence: u64,
        number: u64,
        key: &str,
        lease: &Lease<SimStore>,
        e: LeaseLost,
    ) {
        match e {
            LeaseLost::Reclaimed => self.lost(key, lease),
            LeaseLost::Unavailable(_) => {
                self.unconfirmed(key);
                self.settle(sequence, number, Some(self.settings.lease_ms))
            }
        }
    }

    /// The lease was found taken over: touch nothing. It must really be another's.
    fn lost(&self, key: &str, lease: &Lease<SimStore>) {
        let mine = self.claimer.owner().to_string();
        let record = self.world().record(key).cloned();
        if let Some((r, revision)) = record {
            // A lease's first write is the claim itself (its revision is the token); every
            // later one carries the token.
            let token = r.fencing_token.unwrap_or(revision);
            let ours = r.owner == mine
                && r.state == ClaimState::InProgress
                && token == lease.fencing_token();
            if ours {
                self.violation(format!(
                    "h{} gave up its lease on {key} (token {}) while the key is still its own: healthy work abandoned",
                    self.host,
                    lease.fencing_token()
                ));
            }
        }
    }

    /// Settles a delivery after recording its outcome through the lease. An ack must find the
    /// outcome durable (the key completed or failed for good): an ack before that loses the
    /// message. (Who owns the key by now does not matter: the write that recorded it went
    /// through the lease, and a pause may fall between that write and this settle.)
    fn recorded_settle(&self, sequence: u64, number: u64, key: &str, nak: Option<u64>) {
        if nak.is_none() {
            let state = self
                .world()
                .record(key)
                .map(|(r, _)| (r.state, r.permanent));
            if !matches!(
                state,
                Some((ClaimState::Completed, _) | (ClaimState::Failed, true))
            ) {
                self.violation(format!(
                    "h{} acked {sequence}#{number} while {key} is {state:?}: nothing says it is done",
                    self.host
                ));
            }
        }
        self.settle(sequence, number, nak);
    }

    /// Claim after: `pipeline::after`. Run first, then create the key settled.
    async fn deliver_after(&self, sequence: u64, number: u64, key: &str) {
        let s = self.settings;
        let store = self.claimer.store();
        match store.get(key).await {
            Err(_) => return self.settle(sequence, number, Some(s.infra_retry_ms)),
            Ok(Some((r, _))) if r.state == ClaimState::Completed || r.permanent => {
                return self.settle(sequence, number, None)
            }
            Ok(_) => {}
        }
        let attempt = u32::try_from(number).unwrap_or(u32::MAX);
        let mut left = self.work_ms(key, attempt);
        while left > 0 {
            let slice = left.min(s.heartbeat_ms);
            sleep(&self.world, slice).await;
            left -= slice;
            self.world().progress(sequence, number);
        }
        let outcome = if attempt <= failures(self.seed, key) {
            if attempt < s.max_deliver {
                return self.settle(sequence, number, Some(s.backoff_ms));
            }
            let mut w = self.world();
            w.dead_letters.push(key.to_string());
            w.log(|| format!("dead letter for {key}"));
            Err("out of attempts".to_string())
        } else {
            if !self.world().publish(&format!("{key}#0")) {
                return self.settle(sequence, number, Some(s.infra_retry_ms));
            }
            Ok(Vec::new())
        };
        let record = self.claimer.settled("d", attempt, outcome);
        match self.claimer.create_settled(key, &record).await {
            Ok(_) => self.settle(sequence, number, None),
            Err(_) => self.settle(sequence, number, Some(s.infra_retry_ms)),
        }
    }
}

/// Waits `ms` of virtual time.
async fn sleep(world: &Shared, ms: u64) {
    let until = world.lock().expect("one thread").now + ms;
    std::future::poll_fn(|_| {
        let now = world.lock().expect("one thread").now;
        if now >= until {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

fn noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}
