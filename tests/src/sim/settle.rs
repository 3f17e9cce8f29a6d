//! How a simulated host handles one delivery. A claim-before route's delivery runs the host's
//! own loop ([`dedup_delivery::before`]: the claim's answer, the handler beside the heartbeat,
//! the settle order) over the model ([`super::running`]); a claim-after route's delivery the
//! host's own run ([`dedup_delivery::after`]: the read, the handler, publish, record, ack) over
//! the model ([`super::after`]); an exclusive route's source message the host's own queue
//! stage ([`dedup_delivery::queue`], [`super::queue`]); each under the host's stranded-message
//! marker ([`dedup_delivery::marker`], [`super::marker`]). The protocol calls are the host's
//! own ([`Claimer`], [`Lease`]); so are the outage backoff ([`infra_retry_ceiling`]) and the
//! last-delivery test ([`stranded::last_delivery`]). The checks made as the host's code runs
//! are here too: an exclusive route's overlapping runs, an ack before the outcome is durable,
//! a lease given up while still its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::{after, before, marker, queue};
use dedup_host::claim::{ClaimState, Claimer, Lease};
use dedup_host::pipeline::infra_retry_ceiling;
use dedup_host::stranded;

use super::after::SimAfter;
use super::consumer::{Lane, Offer};
use super::marker::SimMarker;
use super::queue::SimQueue;
use super::route::Served;
use super::running::{SimRun, SimUnclaimed};
use super::store::{Shared, SimStore};
use super::world::{Rng, World};
use super::Settings;

/// The size of an output the handler of an oversized key returns (over 1 MiB).
pub(super) const OVERSIZED: usize = 2 << 20;

/// What one host generation needs to settle a delivery.
pub struct Ctx {
    pub(super) world: Shared,
    /// Claims in the bucket, and in the fenced stream.
    claimers: [Claimer<SimStore>; 2],
    pub(super) settings: Settings,
    seed: u64,
    pub(super) host: usize,
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

/// What a key's handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// Fails its first `n` attempts (`u32::MAX`: all), then succeeds.
    Fails(u32),
    /// Returns an output over the server's max payload, every time.
    Oversized,
}

/// What `key`'s handler does in run `seed` (before any replay).
pub fn handler(seed: u64, key: &str) -> Handler {
    let h = key.bytes().fold(seed ^ 0xfeed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    match Rng::new(h).bits() % 20 {
        0..=9 => Handler::Fails(0),
        10..=15 => Handler::Fails(1),
        16..=18 => Handler::Fails(u32::MAX),
        _ => Handler::Oversized,
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
        Arc::new(Self {
            world: world.clone(),
            claimers: [claimer("b:"), claimer("s:")],
            settings,
            seed,
            host,
        })
    }

    pub(super) fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("one thread")
    }

    /// Settles `offer` with the route as `served` describes it.
    pub async fn handle(&self, offer: Offer, served: Served) {
        let at = At {
            lane: offer.lane,
            sequence: offer.message.sequence,
            number: offer.number,
            key: offer.message.key.clone(),
            entity: offer.message.entity.clone(),
            // A proven replay's reset holds on every delivery (the host confirms it with the
            // stream leader; the model's replays are always proven).
            fresh_from: offer.message.fresh_from,
        };
        // The host's marker around a last delivery ([`marker::around`]).
        let last = stranded::last_delivery(at.number, self.settings.server_max_deliver as i64);
        let marked = SimMarker { ctx: self, at: &at };
        let work = async {
            if at.lane == Lane::Source && self.settings.mode.exclusive {
                let source = offer.message.source;
                return queue::queue(&SimQueue {
                    ctx: self,
                    at: &at,
                    source,
                    served: &served,
                })
                .await;
            }
            match served.claim_after {
                false => self.deliver(&at, &served).await,
                true => self.deliver_after(&at).await,
            }
        };
        marker::around(last.then_some(&marked), work).await
    }

    fn settle(&self, at: &At, nak: Option<u64>) {
        self.world().settle(at.lane, at.sequence, at.number, nak);
    }

    /// Settles a delivery with no check of its key's record.
    pub(super) fn settle_unchecked(&self, at: &At, nak: Option<u64>) {
        self.settle(at, nak);
    }

    /// The nak delay after an infrastructure error: the host's ceiling, our jitter.
    pub(super) fn infra_delay(&self, number: u64) -> u64 {
        let ceiling = infra_retry_ceiling(number).as_millis() as u64;
        let mut w = self.world();
        w.rng.range(ceiling / 2, ceiling)
    }

    /// How long the handler runs on `attempt` of `key`.
    pub(super) fn work_ms(&self, key: &str, attempt: u32) -> u64 {
        let h = key.bytes().fold(self.seed ^ u64::from(attempt), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let most = match self.settings.mode.claim_after {
            false => self.settings.lease_ms * 2,
            true => self.settings.ack_wait_ms / 2,
        };
        Rng::new(h).bits() % most
    }

    /// What `key`'s handler does now: a replayed key's handler was fixed.
    pub(super) fn handler(&self, key: &str) -> Handler {
        match self.world().replayed.contains(key) {
            true => Handler::Fails(0),
            false => handler(self.seed, key),
        }
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

    /// Claim before: the host's own loop ([`before::claimed`], [`before::run`]) over the
    /// model.
    async fn deliver(&self, at: &At, served: &Served) {
        let claimer = &self.claimers[usize::from(served.fenced)];
        let claim = claimer.claim_fresh(&at.key, "d", at.fresh_from).await;
        let unclaimed = SimUnclaimed { ctx: self, at };
        let Some(lease) = before::claimed(&unclaimed, claim).await else {
            return;
        };
        let run = SimRun::new(self, at, &lease, claimer.store(), served, claimer.owner());
        let outcome = before::run(&run).await;
        // A lease that lapsed by the host's clock was given up by design, not found lost.
        if outcome == MessageOutcome::LostClaim && !run.lapsed.load(Ordering::Relaxed) {
            self.lost(claimer, &at.key, &lease);
        }
    }

    /// An exclusive route's run starts: no handler of another message of the entity may be
    /// running under a live lease, and none after it in source order may have started.
    pub(super) fn exclusive_start(&self, at: &At, served: &Served, owner: &str) -> Running {
        let mut w = self.world();
        let source = w.streams.message(at.lane, at.sequence).source;
        let skew = Duration::from_millis(self.settings.skew_ms);
        let space = if served.fenced { "s:" } else { "b:" };
        let now = w.now;
        let mut found = Vec::new();
        // A host paused between its claim and here starts a zombie: its lease lapsed, another
        // host may have finished the message since, and nothing it does can take effect.
        let zombie = !w
            .record(&format!("{space}{}", at.key))
            .is_some_and(|(r, _)| {
                r.state == ClaimState::InProgress && r.owner == owner && !r.lease_lapsed(now, skew)
            });
        for (entity, key, runner) in w.running.iter().filter(|_| !zombie) {
            if *entity != at.entity || *key == at.key {
                continue;
            }
            let live = w.record(&format!("{space}{key}")).is_some_and(|(r, _)| {
                r.state == ClaimState::InProgress
                    && r.owner == *runner
                    && !r.lease_lapsed(now, skew)
            });
            if live {
                found.push(format!(
                    "entity {}: {} starts on h{} while {runner} runs {key} under a live lease",
                    at.entity, at.key, self.host
                ));
            }
        }
        let latest = w.started.entry(at.entity.clone()).or_default();
        if *latest > source && !zombie {
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
        let entry = (at.entity.clone(), at.key.clone(), owner.to_string());
        w.running.push(entry.clone());
        Running {
            world: self.world.clone(),
            entry,
        }
    }

    /// The lease was found taken over: touch nothing. It must really be another's.
    fn lost(&self, claimer: &Claimer<SimStore>, key: &str, lease: &Lease<SimStore>) {
        let mine = claimer.owner().to_string();
        let space = if std::ptr::eq(claimer, &self.claimers[1]) {
            "s:"
        } else {
            "b:"
        };
        let record = self.world().record(&format!("{space}{key}")).cloned();
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
    pub(super) fn recorded_settle(&self, at: &At, nak: Option<u64>) {
        if nak.is_none() {
            let state = {
                let w = self.world();
                ["b:", "s:"]
                    .iter()
                    .filter_map(|space| w.record(&format!("{space}{}", at.key)))
                    .map(|(r, _)| (r.state, r.permanent))
                    .find(|s| matches!(s, (ClaimState::Completed, _) | (ClaimState::Failed, true)))
            };
            if state.is_none() {
                self.violation(format!(
                    "h{} acked {:?} {}#{} while {} is not done: nothing says it is",
                    self.host, at.lane, at.sequence, at.number, at.key
                ));
            }
        }
        self.settle(at, nak);
    }

    /// Claim after: the host's own run ([`after::run`]) over the model.
    async fn deliver_after(&self, at: &At) {
        let claimer = &self.claimers[0];
        after::run(&SimAfter {
            ctx: self,
            at,
            claimer,
        })
        .await
    }
}
