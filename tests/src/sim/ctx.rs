//! What one simulated host generation has to settle its deliveries with: its claimers on the
//! model's store, its route's outage backoff (the host's own [`OutageStreak`]), its clock in
//! virtual time, and the model's acks and naks, each checked as the host's code calls it (an
//! ack before the outcome is durable, an exclusive route's overlapping runs). The adapters of
//! the host's seams ([`super::running`], [`super::after`], [`super::queue`], [`super::marker`],
//! [`super::settling`]) are built over it; which delivery takes which seam is
//! [`super::settle`].

use std::sync::Arc;
use std::time::Duration;

use dedup_delivery::claim::OutputRef;
use dedup_delivery::clock::Clock;
use dedup_delivery::outage::OutageStreak;
use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::settle::Settlement;
use dedup_host::claim::Claimer;

use super::consumer::Lane;
use super::group::SimGroup;
use super::network::REQUEST_TIMEOUT_MS;
use super::route::Served;
use super::store::{Shared, SimStore};
use super::world::{Output, Version, World};
use super::Settings;

/// What one host generation needs to settle a delivery.
pub struct Ctx {
    pub(super) world: Shared,
    /// Claims in the bucket, and in the fenced stream.
    pub(super) claimers: [Claimer<SimStore>; 2],
    pub(super) settings: Settings,
    pub(super) seed: u64,
    pub(super) host: usize,
    /// The route's name as this host generation's config names it, as the model's claim
    /// keys carry it (their prefix: empty before any rename, `World::route`).
    pub(super) route: String,
    /// The route's run of infrastructure errors on this host generation, as the host's
    /// metrics keep it per route and process.
    outages: OutageStreak,
    /// Its fenced commits' committers ([`SimGroup`]).
    pub(super) group: SimGroup,
    /// The exclusive route's copier of this host generation ([`dedup_delivery::copier`]):
    /// its epoch and its chains of copies per entity, lost with the process.
    pub(super) copier: dedup_delivery::copier::Copier,
}

/// One delivery being settled.
pub(super) struct At {
    pub(super) lane: Lane,
    pub(super) sequence: u64,
    pub(super) number: u64,
    pub(super) key: String,
    pub(super) entity: String,
    /// The revision a replay reset the key at (`Delivery::fresh_from`).
    pub(super) fresh_from: u64,
    /// The claim spaces' latest revision when the delivery arrived at the host: its ack is
    /// checked against the key's records from there on ([`Ctx::recorded_settle`]).
    pub(super) arrived: u64,
    /// When the server delivered it (ms of the model's clock).
    pub(super) delivered_ms: u64,
    /// Its claim key: the message's key under the route name the host serves
    /// ([`Ctx::route`]).
    pub(super) claim: String,
    /// The generation of the consumer that handed it out ([`Offer::consumer`]).
    ///
    /// [`Offer::consumer`]: super::consumer::Offer::consumer
    pub(super) consumer: u32,
}

impl At {
    /// Which delivery of which consumer's message it is, as acks name it.
    pub(super) fn delivery(&self) -> (Lane, u64, u64, u32) {
        (self.lane, self.sequence, self.number, self.consumer)
    }
}

/// A handler run of an exclusive route, listed in [`World::running`] until dropped.
pub(super) struct Running {
    world: Shared,
    entry: (String, String, String),
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(mut w) = self.world.lock() {
            if let Some(at) = w.running.iter().position(|e| *e == self.entry) {
                w.running.remove(at);
            }
        }
    }
}

/// How a settlement reads in the model: `None` acks or terms, `Some` naks after that many ms.
pub(super) trait NakMs {
    /// The nak delay in ms, `None` for an ack or a term.
    fn nak_ms(self) -> Option<u64>;
}

impl NakMs for Settlement {
    fn nak_ms(self) -> Option<u64> {
        match self {
            Settlement::Ack | Settlement::Term => None,
            Settlement::Nak(delay) => Some(delay.as_millis() as u64),
        }
    }
}

impl Ctx {
    /// Host `host`'s generation `generation`.
    pub fn new(
        world: &Shared,
        settings: Settings,
        seed: u64,
        host: usize,
        generation: u32,
    ) -> Arc<Self> {
        let claimer = |space| {
            let store = SimStore {
                world: world.clone(),
                host,
                space,
            };
            Claimer::new(
                Arc::new(store),
                format!("h{host}.{generation}"),
                Duration::from_millis(settings.lease_ms),
                Duration::from_millis(settings.skew_ms),
            )
        };
        let route = world.lock().expect("one thread").route.clone();
        Arc::new(Self {
            world: world.clone(),
            claimers: [claimer("b:"), claimer("s:")],
            settings,
            seed,
            host,
            route,
            outages: OutageStreak::new(),
            group: SimGroup::new(world, host),
            copier: Default::default(),
        })
    }

    pub(super) fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("one thread")
    }

    fn settle(&self, at: &At, nak: Option<u64>) {
        self.world().settle(self.host, at.delivery(), nak);
    }

    /// Whether a request this host sends now reaches the server: one sent while it is
    /// partitioned from it is lost, and fails at the host's request timeout.
    pub(super) async fn reaches_server(&self) -> bool {
        let cut = {
            let w = self.world();
            w.network.cut_off(self.host, w.now)
        };
        if cut {
            self.sleep(Duration::from_millis(REQUEST_TIMEOUT_MS)).await;
        }
        !cut
    }

    /// Publishes `outputs` in order, as the host pipelines them: each stored or refused on
    /// its own (a publish failing part-way), except that once the server refuses one over its
    /// `max_payload` it closes the connection and the rest are not sent. An error names the
    /// outputs not stored. `by`: the key whose outputs they are and the version that made them.
    pub(super) async fn publish(
        &self,
        outputs: Vec<Output>,
        by: (&str, &Version),
    ) -> Result<Vec<OutputRef>, String> {
        if !self.reaches_server().await {
            return Err("publish timed out: cut off from the server".into());
        }
        let mut w = self.world();
        let mut refused = Vec::new();
        for o in &outputs {
            if !w.publish(self.host, o, by) {
                refused.push(o.id.as_str());
                if o.size > w.max_payload {
                    break;
                }
            }
        }
        match refused.is_empty() {
            true => Ok(Vec::new()),
            false => Err(format!("publish of {} refused", refused.join(", "))),
        }
    }

    /// Settles a delivery with no check of its key's record.
    pub(super) fn settle_unchecked(&self, at: &At, nak: Option<u64>) {
        self.settle(at, nak);
    }

    /// Counts how a delivery ended, as the host's route metrics do: the outage backoff's run.
    pub(super) fn count(&self, outcome: MessageOutcome) {
        self.outages.count(outcome);
    }

    /// The nak delay after an infrastructure error already counted: the host's outage
    /// backoff ([`OutageStreak::retry`]), the model's jitter.
    pub(super) fn outage_delay(&self, number: u64) -> Duration {
        let unit = self.unit();
        self.outages.retry(number, unit)
    }

    /// [`Ctx::outage_delay`] for an error not counted yet ([`OutageStreak::retry_uncounted`]).
    pub(super) fn release_delay(&self, number: u64) -> Duration {
        let unit = self.unit();
        self.outages.retry_uncounted(number, unit)
    }

    /// A jitter draw in `0.0..=1.0` from the run's seeded generator.
    pub(super) fn unit(&self) -> f64 {
        self.world().rng.range(0, 1_000_000) as f64 / 1_000_000.0
    }

    /// A lease write of `key` went unanswered: its lease may lapse, costing an attempt.
    pub(super) fn unconfirmed(&self, key: &str) {
        *self.world().disrupted.entry(key.to_string()).or_default() += 1;
    }

    pub(super) fn violation(&self, what: String) {
        let mut w = self.world();
        w.log(|| format!("VIOLATION {what}"));
        w.violations.push(what);
    }

    /// An exclusive route's run starts: no handler of another message of the entity may be
    /// running under a lease its owner still holds by its own clock ([`World::held`]: the
    /// owner stops at its lease's end by that clock, the others go ahead only past it plus the
    /// skew margin), and none after it in source order may have started.
    pub(super) fn exclusive_start(&self, at: &At, served: &Served, owner: &str) -> Running {
        let mut w = self.world();
        let source = w.streams.message(at.lane, at.sequence).source;
        let space = if served.fenced { "s:" } else { "b:" };
        let mut found = Vec::new();
        // A host paused between its claim and here starts a zombie: its lease lapsed, another
        // host may have finished the message since, and nothing it does can take effect.
        let zombie = !w
            .record(&format!("{space}{}", at.claim))
            .is_some_and(|(r, _)| r.owner == owner && w.held(r));
        for (entity, key, runner) in w.running.iter().filter(|_| !zombie) {
            if *entity != at.entity || *key == at.claim {
                continue;
            }
            let live = w
                .record(&format!("{space}{key}"))
                .is_some_and(|(r, _)| r.owner == *runner && w.held(r));
            if live {
                found.push(format!(
                    "entity {}: {} starts on h{} while {runner} runs {key} under a live lease",
                    at.entity, at.key, self.host
                ));
            }
        }
        // A later message of the entity carrying the same key (a producer's retry) is the
        // same event: a stale copy of the earlier one (its delivery waited in a buffer while
        // the later one reclaimed their coalesced key and failed) runs that key, nothing out
        // of order.
        let latest = w.started.get(&at.entity).copied().unwrap_or_default();
        let same_key = (w.streams.source.iter())
            .filter(|m| m.entity == at.entity && m.sequence > source && m.sequence <= latest)
            .all(|m| m.key == at.key);
        let latest = w.started.entry(at.entity.clone()).or_default();
        if *latest > source && !zombie && !same_key {
            found.push(format!(
                "entity {}: message {source} ({}) runs after message {} (h{}): out of source order",
                at.entity, at.key, *latest, self.host
            ));
        }
        *latest = (*latest).max(source);
        for what in found {
            w.log(|| format!("VIOLATION {what}"));
            w.violations.push(what);
        }
        let entry = (at.entity.clone(), at.claim.clone(), owner.to_string());
        w.running.push(entry.clone());
        Running {
            world: self.world.clone(),
            entry,
        }
    }

    /// Settles a delivery after recording its outcome through the lease, or after its claim
    /// found the key done. An ack must find the outcome durable (the key completed or failed
    /// for good) as the key stood when the delivery arrived or at any point since: an ack
    /// before that loses the message. (Who owns the key by now does not matter: the write
    /// that recorded it went through the lease, and a pause may fall between that write and
    /// this settle.)
    pub(super) fn recorded_settle(&self, at: &At, nak: Option<u64>) {
        self.claimed_settle(at, nak, at.arrived);
    }

    /// [`Ctx::recorded_settle`] for a delivery whose claim was won at revision `claimed` (or,
    /// not won, that arrived at revision `claimed`): its ack must find the key done as it
    /// stood at that revision or at a later one, not only now. A coalesced key can be
    /// reclaimed by another delivery between this one's last write (or read) and its ack
    /// (seeds 7072, 7473, 8384 `--fenced --coalesce`: a stale copy reclaimed a coalesced key,
    /// recorded it coalesced again, and the key's next message reclaimed it before the stale
    /// copy's ack, a no-op since its message was acked long before; a stale copy whose read
    /// found the key coalesced by its own message's other delivery, a lagging replica
    /// answering, while the key's next message had reclaimed it). An ack sent before anything
    /// recorded the outcome still finds the key not done since (unless another host
    /// completed it meanwhile: then the ack loses nothing). A coalesced record counts only for
    /// the message it names and older ones of the key ([`World::done_since`]): a later message
    /// of the key acked against it is lost.
    pub(super) fn claimed_settle(&self, at: &At, nak: Option<u64>, claimed: u64) {
        if nak.is_none() {
            let done = {
                let w = self.world();
                let message = w.streams.message(at.lane, at.sequence).source;
                (["b:", "s:"].iter())
                    .any(|space| w.done_since(&format!("{space}{}", at.claim), claimed, message))
            };
            if !done {
                self.violation(format!(
                    "h{} acked {:?} {}#{} while {} is not done: nothing says it is",
                    self.host, at.lane, at.sequence, at.number, at.key
                ));
            }
        }
        self.settle(at, nak);
    }
}

impl Clock for Ctx {
    /// Waits `duration` of virtual time.
    fn sleep(&self, duration: Duration) -> impl std::future::Future<Output = ()> + Send {
        let world = self.world.clone();
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let until = world.lock().expect("one thread").now.saturating_add(ms);
        std::future::poll_fn(move |_| {
            let now = world.lock().expect("one thread").now;
            if now >= until {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }
}
