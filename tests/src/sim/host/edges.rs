//! The edges of issue 42 the model reaches beside the hosts' ordinary life: an operator
//! deleting the route's contract record (and recording it again with `setup`), the hosts'
//! contract watches that see it (finding 4), and a host's re-bind of the source consumer
//! after its pulls failed, from the config it started with (finding 2).

use dedup_delivery::agreement::{self, Recheck};

use super::super::network::Stream;
use super::super::route::{self, HostConfig, Served};
use super::super::world::Rng;
use super::{log, Hosts};

/// The edges of issue 42 the model reaches, drawn for a run from a generator of their own.
pub(super) struct Edges {
    /// The host that started with an older config of the route, not exclusive (a reload made
    /// it exclusive before the run): its re-binds read that config.
    pub(super) stale: Option<usize>,
    /// When an operator deletes the contract record.
    pub(super) delete_at: Option<u64>,
    /// When an operator's `setup` records it again.
    pub(super) setup_at: Option<u64>,
}

impl Edges {
    /// One exclusive run in two has a host that started with the route not exclusive; one
    /// run in two of those whose host 0 reloads a changed route has an operator delete the
    /// contract record up to 5 s after that reload (the hosts' watches see it), and `setup`
    /// record it again 2 to 20 s later (hosts that restarted meanwhile hold no contract and
    /// are refused until then).
    pub(super) fn draw(
        rng: &mut Rng,
        hosts: usize,
        exclusive: bool,
        reload_at: Option<u64>,
    ) -> Self {
        let stale = (exclusive && rng.chance(500)).then(|| rng.range(0, hosts as u64 - 1));
        let delete_at = reload_at
            .filter(|_| rng.chance(500))
            .map(|at| at + rng.range(0, 5_000));
        Self {
            stale: stale.map(|h| h as usize),
            delete_at,
            setup_at: delete_at.map(|at| at + rng.range(2_000, 20_000)),
        }
    }
}

impl Hosts {
    /// An operator deletes the route's contract record, or records it again with `setup`
    /// (of the config every host but host 0 runs), when [`Edges`] drew it.
    pub(super) fn operator(&mut self, now: u64) {
        if self.delete_at.is_some_and(|at| at <= now) {
            self.delete_at = None;
            let mut w = self.world.lock().expect("one thread");
            w.contract.delete();
            w.log(|| "an operator deletes the route's contract record".into());
        }
        if self.setup_at.is_some_and(|at| at <= now) {
            self.setup_at = None;
            let last = self.hosts.len() - 1;
            let config = HostConfig {
                changed: false,
                ..self.hosts[last].config
            };
            let comparison = route::setup(&self.world, &Served::new(&config));
            log(&self.world, || {
                format!("an operator's setup records the route's contract: {comparison:?}")
            });
        }
    }

    /// Each running host's contract watch sees a changed record, after a moment, and checks
    /// the route again as `Live::recheck` does ([`agreement::recheck`]): a served route is
    /// compared anew (and stops if it no longer agrees), a refused one started (compared as it
    /// starts). A host cut off from the server sees nothing until it heals.
    pub(super) fn watch(&mut self, now: u64) {
        let (revision, cut) = {
            let w = self.world.lock().expect("one thread");
            let cut: Vec<bool> = (0..self.hosts.len())
                .map(|i| w.network.cut_off(i, now))
                .collect();
            (w.contract.revision, cut)
        };
        for (i, h) in self.hosts.iter_mut().enumerate() {
            if h.seen >= revision || !h.ready(now) || cut[i] || !self.edges.chance(300) {
                continue;
            }
            h.seen = revision;
            let served = h.served.is_some();
            log(&self.world, || {
                format!("h{i}'s contract watch sees revision {revision}")
            });
            match agreement::recheck(served, !served, false) {
                Recheck::Agree | Recheck::Start => {
                    let config = h.config;
                    h.configure(&self.world, config, i);
                }
                Recheck::Nothing => {}
            }
        }
    }

    /// A serving host whose pulls fail (its source stream electing a leader, or the host cut
    /// off from the server) re-binds the route's source consumer once they work again, as
    /// `pipeline/consume.rs` does ([`route::rebind`]), writing the consumer's settings.
    pub(super) fn rebinds(&mut self, now: u64) {
        let mut w = self.world.lock().expect("one thread");
        let electing = w.network.electing(Stream::Source, now);
        for (i, h) in self.hosts.iter_mut().enumerate() {
            let Some(served) = h.served.as_ref().filter(|_| h.ready(now)) else {
                continue;
            };
            if electing || w.network.cut_off(i, now) {
                h.rebind = true;
                continue;
            }
            if !std::mem::take(&mut h.rebind) {
                continue;
            }
            let have = w.streams.source_consumer.clone();
            let bound = route::rebind(&h.started, served, &have);
            w.log(|| {
                let changed = have.differences(&bound);
                format!("h{i} re-binds the source consumer: {changed:?}")
            });
            w.streams.source_consumer = bound;
        }
    }
}
