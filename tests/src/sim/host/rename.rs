//! An operator renames the route under traffic (issue 42, finding 3): `dedup-host setup
//! --rename-route OLD NEW` while producers keep publishing. As in production, no host may
//! serve the old name while it runs (`refuse_while_served`): the operator stops every host
//! (each takes no more deliveries and drains its work; one that has not finished within the
//! drain timeout, a paused one say, exits with its work dropped, as a killed host's). Then
//! the rename decides as the host's does (`dedup_delivery::rename`): refused while a key of
//! the old name is open ([`rename::unsettled`]) or, on a claim-after route, while the old
//! consumer has deliveries not acknowledged ([`rename::pending_refuses`]) or the server gave
//! up on a message not dead-lettered yet (a marker of the model's stands for it:
//! [`rename::given_up_refuses`]), and then
//! the hosts start again under the old name and the operator tries again later; else every
//! claim record is carried to the new name's key
//! ([`rename::renamed_key`], [`rename::carried`]), the old source consumer is deleted and a
//! new one created from the old one's ack floor + 1, or on a claim-after route after its
//! last delivery ([`rename::start`]), over the retained
//! history (`consumer::history`), and the hosts start again with configs that name the route
//! anew (their claim keys carry the new name, `World::route`). The model's one contract
//! record stands for the route's under either name. Exclusive routes are not renamed (the
//! host refuses: their queue partitions are named after the route).

use dedup_delivery::rename;
use dedup_host::claim::ClaimRecord;

use super::super::consumer::Lane;
use super::super::world::Rng;
use super::super::{EPOCH_MS, FAULTS_MS};
use super::{disrupt, log, space, Hosts};

/// How long a stopped host drains its work before it exits anyway (`host.drain_timeout`).
const DRAIN_MS: u64 = 10_000;
/// How many times the operator tries before leaving the route under its old name.
const TRIES: u32 = 12;

/// The operator's rename, drawn for a run from a generator of its own (runs without it run
/// as before).
pub(super) struct Rename {
    /// When the operator next stops the hosts to rename the route.
    at: Option<u64>,
    /// Since when the hosts have been stopping, while they are.
    stopping: Option<u64>,
    tries: u32,
    rng: Rng,
}

impl Rename {
    /// One run in four that is not exclusive renames its route at a time in the fault period
    /// (producers still publishing).
    pub(super) fn draw(seed: u64, exclusive: bool) -> Self {
        let mut rng = Rng::new(seed.rotate_left(41) ^ 0x4E4A);
        let at = (!exclusive && rng.chance(250)).then(|| EPOCH_MS + rng.range(2_000, FAULTS_MS));
        Self {
            at,
            stopping: None,
            tries: 0,
            rng,
        }
    }

    /// Whether the hosts are being stopped for the rename (they take no deliveries).
    pub(super) fn stopping(&self) -> bool {
        self.stopping.is_some()
    }

    /// When the operator acts next, if it does.
    pub(super) fn next_event(&self) -> Option<u64> {
        match self.stopping {
            Some(since) => Some(since + DRAIN_MS),
            None => self.at,
        }
    }
}

impl Hosts {
    /// The operator's rename at `now`: stops the hosts, and once every one is down, renames
    /// the route (or is refused) and starts them again.
    pub(super) fn renames(&mut self, now: u64) {
        if self.rename.at.is_none_or(|at| at > now) {
            return;
        }
        let since = *self.rename.stopping.get_or_insert_with(|| {
            log(&self.world, || {
                "operator stops every host to rename the route".into()
            });
            now
        });
        for (i, h) in self.hosts.iter_mut().enumerate() {
            if !h.down && (h.work.is_empty() || now >= since + DRAIN_MS) {
                disrupt(&self.world, &h.work);
                let dropped = std::mem::take(&mut h.work);
                log(&self.world, || {
                    format!("h{i} stopped ({} deliveries dropped)", dropped.len())
                });
                h.down = true;
            }
            // Not started again (a fault's restart time is overruled) until the rename ends.
            h.paused_until = u64::MAX;
        }
        if !self.hosts.iter().all(|h| h.down) {
            return;
        }
        self.rename.stopping = None;
        match self.rename_route(now) {
            Ok(done) => {
                log(&self.world, || format!("setup --rename-route: {done}"));
                self.rename.at = None;
            }
            Err(refused) => {
                self.rename.tries += 1;
                let again =
                    (self.rename.tries < TRIES).then(|| now + self.rename.rng.range(5_000, 15_000));
                log(&self.world, || {
                    format!("setup --rename-route refused: {refused}; next try at {again:?}")
                });
                self.rename.at = again;
            }
        }
        // Every host starts again, with its config naming the route as it is named now.
        for h in &mut self.hosts {
            h.paused_until = now + self.rename.rng.range(0, 2_000);
        }
    }

    /// `setup --rename-route` from the route's current name to the next, with every host
    /// stopped: what it did, or why it was refused (nothing changed).
    fn rename_route(&mut self, now: u64) -> Result<String, String> {
        let mut w = self.world.lock().expect("one thread");
        if w.contract.record.is_none() {
            return Err("the route has no contract: nothing to rename".into());
        }
        let space = space(&w);
        let old = w.route.clone();
        let new = format!("r{}.", w.names.len());
        // Every claim record of the old name, read from the leader (the store's own value).
        let mut keys: Vec<String> = (w.streams.source.iter()).map(|m| m.key.clone()).collect();
        keys.sort();
        keys.dedup();
        let records: Vec<(String, String, ClaimRecord)> = (keys.into_iter())
            .filter_map(|key| {
                let claim = format!("{old}{key}");
                let (record, _) = w.record(&format!("{space}{claim}"))?;
                Some((key, claim, record.clone()))
            })
            .collect();
        let open: Vec<&str> = (records.iter())
            .filter(|(_, _, r)| rename::unsettled(r, false))
            .map(|(_, claim, _)| claim.as_str())
            .collect();
        if !open.is_empty() {
            return Err(format!("unsettled keys {}", open.join(", ")));
        }
        let pending = w.streams.ack_pending();
        let claim_after = self.settings.mode.claim_after;
        if rename::pending_refuses(claim_after, pending) {
            return Err(format!(
                "a claim-after route with {pending} deliveries not acknowledged"
            ));
        }
        let consumer = rename::OldConsumer {
            ack_floor: w.streams.ack_floor(),
            delivered: w.streams.delivered(),
            ack_pending: pending,
        };
        // The model's one route consumes every source message.
        let marked: Vec<u64> = (w.streams.markers.keys())
            .filter(|(lane, _)| *lane == Lane::Source)
            .map(|(_, sequence)| *sequence)
            .collect();
        if let Some(given_up) = rename::given_up_refuses(claim_after, &marked) {
            return Err(format!(
                "a claim-after route with messages given up on: {given_up:?}"
            ));
        }
        let mut carried = 0;
        for (key, claim, record) in records {
            if record.state == dedup_host::claim::ClaimState::Completed && !record.is_coalesced() {
                w.settled_before.entry(key).or_insert_with(|| old.clone());
            }
            let Some(record) = rename::carried(record, &claim) else {
                continue;
            };
            let to = rename::renamed_key(&old, &new, &claim);
            if w.operator_create(&format!("{space}{to}"), &record)
                .is_some()
            {
                carried += 1;
            }
        }
        let floor = w.streams.ack_floor();
        let start = rename::start(consumer, claim_after);
        let again = w.streams.replace_source_consumer(start, now);
        w.route = new.clone();
        w.names.push(new.clone());
        Ok(format!(
            "route {old:?} is now {new:?}: {carried} claim records carried, the new consumer starts at {start:?} (the old one's ack floor {floor}), {again} settled messages delivered again"
        ))
    }
}
