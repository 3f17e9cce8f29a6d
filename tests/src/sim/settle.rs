//! How a simulated host handles one delivery. A claim-before route's delivery runs the host's
//! own loop ([`dedup_delivery::before`]: the claim's answer, the handler beside the heartbeat,
//! the settle order) over the model ([`super::running`]); a claim-after route's delivery the
//! host's own run ([`dedup_delivery::after`]: the read, the handler, publish, record, ack) over
//! the model ([`super::after`]); an exclusive route's source message the host's own queue
//! stage ([`dedup_delivery::queue`], [`super::queue`]); each under the host's stranded-message
//! marker ([`dedup_delivery::marker`], [`super::marker`]). The protocol calls are the host's
//! own ([`Claimer`], [`Lease`]); so are the outage backoff (the host's `OutageStreak`, kept by
//! [`Ctx`]) and the last-delivery test ([`stranded::last_delivery`]). A lease given up while
//! still its own is checked here.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dedup_delivery::clock::Clock;
use dedup_delivery::copier::Turn;
use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::{after, ahead, before, marker, queue};
use dedup_host::claim::{record, ClaimState, Claimer, Lease};
use dedup_host::stranded;

use super::after::SimAfter;
use super::consumer::{Lane, Offer};
use super::ctx::{At, Ctx};
use super::marker::SimMarker;
use super::queue::SimQueue;
use super::route::Served;
use super::running::{SimRun, SimUnclaimed};
use super::store::SimStore;

impl Ctx {
    /// Settles `offer` with the route as `served` describes it, once it waited `buffered` in
    /// the host (behind the partition's permit), if it did.
    /// An exclusive route's source delivery comes with its `turn` among its entity's copies.
    pub async fn handle(
        &self,
        offer: Offer,
        served: Served,
        buffered: Option<Duration>,
        turn: Option<(Turn, Option<String>)>,
    ) {
        // A partition never gives a queued message up: only the source's deliveries have a
        // last one, marked around their work.
        let bound = self.settings.server_max_deliver as i64;
        let last = offer.lane == Lane::Source && stranded::last_delivery(offer.number, bound);
        // The queue stage marks a last delivery too, as the host's does.
        let queues = offer.lane == Lane::Source && self.settings.mode.exclusive;
        let last = last && (!queues || queue::marks_last_delivery());
        // A proven replay's reset holds on every delivery (the host confirms it with the
        // stream leader; the model's replays are always proven).
        // The claim spaces' revision as the delivery arrives, before any wait in the buffer.
        let arrived_at = self.world().last_revision();
        let at = At {
            lane: offer.lane,
            sequence: offer.message.sequence,
            number: offer.number,
            key: offer.message.key.clone(),
            entity: offer.message.entity.clone(),
            fresh_from: record::fresh_from(offer.message.fresh_from, offer.number),
            arrived: arrived_at,
            delivered_ms: self.world().now,
            claim: format!("{}{}", self.route, offer.message.key),
            consumer: offer.consumer,
        };
        if let Some(wait) = buffered {
            self.sleep(wait).await;
        }
        // The host's marker around a last delivery ([`marker::around`]).
        let marked = SimMarker { ctx: self, at: &at };
        let work = async {
            if let (true, Some((turn, pin))) = (queues, &turn) {
                let source = offer.message.source;
                return queue::queue(&SimQueue {
                    ctx: self,
                    at: &at,
                    source,
                    served: &served,
                    turn,
                    pin: pin.as_deref(),
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

    /// Claim before: the host's own loop ([`before::claimed`], [`before::run`]) over the
    /// model.
    async fn deliver(&self, at: &At, served: &Served) {
        let claimer = &self.claimers[usize::from(served.fenced)];
        let unclaimed = SimUnclaimed { ctx: self, at };
        // A queued message waits while an earlier one of its entity is still queued, and is
        // dropped once its own copy is gone: the host's own decision ([`ahead::clear`]).
        if at.lane == Lane::Queue && !ahead::clear(&unclaimed).await {
            return;
        }
        // Every record the claim writes names its source message, as the host's do.
        let sequence = Some(self.world().streams.message(at.lane, at.sequence).source);
        // The version the host's split chooses; the claim names the one that began the key's
        // effects, if one did ([`super::pinned`]).
        let chosen = self.chosen(&at.key);
        // A window route's claim names the version that begins its effects, as the host's does.
        let (key, fresh_from) = (&at.claim, at.fresh_from);
        let claim = match served.fenced {
            true => (claimer.claim_message(key, &chosen, fresh_from, sequence)).await,
            false => (claimer.claim_window_message(key, &chosen, fresh_from, sequence)).await,
        };
        let Some(lease) = before::claimed(&unclaimed, claim).await else {
            return;
        };
        // A queued message claimed past its hold reads its subject again, as the host's does.
        let age = match at.number {
            1 => Duration::from_millis(self.world().now.saturating_sub(at.delivered_ms)),
            _ => Duration::MAX,
        };
        if at.lane == Lane::Queue && !ahead::still_first(&unclaimed, &lease, age).await {
            return;
        }
        let owner = claimer.owner();
        let mut run = SimRun::new(self, at, &lease, claimer.store(), served, owner, chosen);
        self.pin(&mut run).await;
        let outcome = before::run(&run).await;
        self.count(outcome);
        // A lease that lapsed by the host's clock was given up by design, not found lost.
        if outcome == MessageOutcome::LostClaim && !run.lapsed.load(Ordering::Relaxed) {
            self.lost(claimer, &at.claim, &lease);
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

    /// Claim after: the host's own run ([`after::run`]) over the model.
    async fn deliver_after(&self, at: &At) {
        let claimer = &self.claimers[0];
        after::run(&SimAfter {
            ctx: self,
            at,
            claimer,
            version: self.chosen(&at.key),
        })
        .await
    }
}
