//! An operator changes the route's contract under traffic (issue 42, finding 7): `dedup-host
//! setup --change-route` while producers keep publishing. As in production, the operator
//! first reloads every host with the new config (each refuses the route, since it differs from
//! the recorded contract, and drains what it had in flight), then runs the change, which
//! decides as the host's does (`dedup_delivery::change`): what a run does with the record
//! ([`change::run`]: change it, or call a stopped change off), the mark it writes beside the
//! record with its lease (a live mark of another run refuses it, `Changing::live_run`; hosts
//! that start meanwhile stay out), whether the hosts have drained the route
//! ([`change::evidence`], from each host's status: serving, or work in flight), which claim
//! records move and how each is written ([`change::move_claims`], [`change::plan`],
//! [`change::copy_record`], over the model's claim spaces through the scheduler, with its
//! faults), and what a stopped run leaves of its mark ([`change::stop`]). The run can be
//! killed part-way; the operator runs it again (a rerun after the lease lapsed takes the mark
//! over and copies every record again). A refusal of open window keys (window to fenced) makes
//! the operator reload the old config and call the change off; one of open messages of a
//! claim-after route ([`change::open_refuses`]) too, and the operator tries again later
//! ([`settling`]). Exclusive routes are not changed here (their queue's move is not modelled).
//!
//! Checked: when the contract is swapped, each key's record in the new claim store is the one
//! the old store holds (no key half-moved: the move fences each key in the old store before it
//! copies it, so a draining host's write landing late there is refused; a claim created there
//! after the move listed the keys is excused, [`super::moved::late_create`]); at the end, a key completed
//! before the change is unchanged after it (not run again, in either direction: window to
//! fenced, fenced to window, claim after to claim before).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use dedup_delivery::change::{
    self, Claims, Copy, CopyFailed, FenceFailed, Moved, Refused, Run, Stop, Stores,
};
use dedup_host::claim::record::virtual_clock;
use dedup_host::claim::{ClaimError, ClaimRecord, ClaimState};
use dedup_host::config::EffectsMode;
use dedup_host::contract::{ChangeRun, Changing, ContractRecord, RouteContract};

use super::super::route::{HostConfig, Served};
use super::super::store::{Shared, SimStore};
use super::super::world::Rng;
use super::super::{EPOCH_MS, FAULTS_MS};
use super::moved::{late_create, unfenced};
use super::{log, Hosts};

/// The change run's lease (production's is 30 s; shorter here so reruns come sooner).
const LEASE_MS: u64 = 6_000;
/// The model's operator tool sends its store calls as this host index (never a host's: a run
/// has at most four), which no partition cuts off.
const OPERATOR: usize = 9;
/// What the change run's records say wrote them.
const BY: &str = "setup --change-route r";

mod settling;

type Running = Pin<Box<dyn Future<Output = Result<Moved, Failed>>>>;

/// The operator's change, drawn for a run from a generator of its own (runs without it run as
/// before).
pub(super) struct Change {
    /// When the operator next acts, while it has something to do.
    at: Option<u64>,
    /// Whether the hosts were reloaded with the new config yet.
    reloaded: bool,
    /// The operator gave up (open window keys), or went back for a while (open messages of a
    /// claim-after route): the hosts run the old config again, and a run with it calls the
    /// change off.
    back: bool,
    /// Gone back for the old contract's open messages to settle, this many times: after the
    /// call-off, the operator tries the change again later.
    settles: u32,
    settling: bool,
    /// Runs started.
    runs: u32,
    /// The run in flight: its number, whether it marked the record first, and its move.
    run: Option<(u32, bool, Running)>,
    /// How often (thousandths per step) the operator kills a run part-way.
    kills: u64,
    rng: Rng,
    /// Keys completed in the old claim store when the contract was swapped, with their
    /// records (and the new store's space): none may run again.
    settled: Vec<(String, ClaimRecord)>,
    new_space: &'static str,
    /// The keys the last run listed in the old claim space: one created there after it (a
    /// late create) is excused by the half-moved check ([`Hosts::swap`]).
    listed: Rc<RefCell<Vec<String>>>,
}

impl Change {
    /// One run in four that is not exclusive (and has no rename and no contract deletion)
    /// changes its route's contract at a time in the fault period.
    pub(super) fn draw(seed: u64, exclusive: bool, other: bool) -> Self {
        let mut rng = Rng::new(seed.rotate_left(47) ^ 0xC4A6);
        let at = (!exclusive && !other && rng.chance(250))
            .then(|| EPOCH_MS + rng.range(2_000, FAULTS_MS));
        let kills = match rng.chance(500) {
            true => rng.range(1, 20),
            false => 0,
        };
        Self {
            at,
            reloaded: false,
            back: false,
            settles: 0,
            settling: false,
            runs: 0,
            run: None,
            kills,
            rng,
            settled: Vec::new(),
            new_space: "b:",
            listed: Rc::default(),
        }
    }

    /// When the operator acts next, if it does.
    pub(super) fn next_event(&self) -> Option<u64> {
        self.at
    }

    /// Whether the operator still has the change to finish (the simulation does not end
    /// before it does).
    pub(super) fn busy(&self) -> bool {
        self.run.is_some() || self.at.is_some()
    }
}

/// Why a move stopped.
#[derive(Debug)]
enum Failed {
    Refused(Refused),
    Copy(CopyFailed),
    Fence(FenceFailed),
    Read(ClaimError),
    /// Another run took the mark over.
    Lost,
}

impl From<Refused> for Failed {
    fn from(r: Refused) -> Self {
        Failed::Refused(r)
    }
}

impl From<FenceFailed> for Failed {
    fn from(f: FenceFailed) -> Self {
        Failed::Fence(f)
    }
}

impl From<CopyFailed> for Failed {
    fn from(c: CopyFailed) -> Self {
        Failed::Copy(c)
    }
}

/// The claim spaces of a contract's claims (the bucket, or the fenced stream's subjects).
fn space_of(contract: &RouteContract) -> &'static str {
    match contract.claims.starts_with("stream ") {
        true => "s:",
        false => "b:",
    }
}

/// The model's side of the seam ([`Stores`]): the old and new claim spaces (read from their
/// leader where production's move reads so, `SimStore::get_from_leader`), and the run's hold
/// on its mark (renewed once a third of the lease passed, at once: the contract store answers
/// at once).
struct SimStores {
    world: Shared,
    from: SimStore,
    to: SimStore,
    run: String,
    renewed: u64,
    units: Rc<Cell<u64>>,
    /// The keys [`Stores::records`] listed.
    listed: Rc<RefCell<Vec<String>>>,
}

impl Stores for SimStores {
    type Old = SimStore;
    type To = SimStore;
    type Error = Failed;

    async fn records(&mut self) -> Result<Vec<(String, ClaimRecord)>, Failed> {
        let keys = self
            .world
            .lock()
            .expect("one thread")
            .claims_in(self.from.space);
        *self.listed.borrow_mut() = keys.iter().map(|(k, _)| k.clone()).collect();
        let mut records = Vec::new();
        for (key, _) in keys {
            self.keep()?;
            if let Some((record, _)) = self.from.get_fresh(&key).await.map_err(Failed::Read)? {
                records.push((key, record));
            }
        }
        Ok(records)
    }

    async fn planned(&mut self, _: &[Copy]) -> Result<(), Failed> {
        Ok(()) // the model's keys make no outbound calls: no journals
    }

    async fn before(&mut self, _: usize) -> Result<(), Failed> {
        self.keep()
    }

    fn old(&self, claim_key: &str) -> (&SimStore, String) {
        (&self.from, claim_key.to_string())
    }

    fn to(&self, claim_key: &str) -> (&SimStore, String) {
        (&self.to, claim_key.to_string())
    }

    async fn remove(&mut self, claim_key: &str, _: u64) -> Result<(), Failed> {
        // The model's claim spaces never lose a key (no deletion, no age limit), so no fence
        // finds one gone: `change::forget` is the unit tests' (`change_tests`).
        unreachable!("the model removed claim key {claim_key} from no claim space")
    }

    fn moved(&mut self) {
        self.units.set(self.units.get() + 1);
    }
}

impl SimStores {
    fn keep(&mut self) -> Result<(), Failed> {
        let mut w = self.world.lock().expect("one thread");
        let now = w.now;
        if now < self.renewed + LEASE_MS / 3 {
            return Ok(());
        }
        let key = &mut w.contract;
        let mine = (key.changing.as_mut())
            .and_then(|c| c.run.as_mut())
            .filter(|r| r.id == self.run);
        let Some(run) = mine else {
            return Err(Failed::Lost);
        };
        run.lease_until_ms = now + LEASE_MS;
        key.revision += 1;
        self.renewed = now;
        Ok(())
    }
}

impl Hosts {
    /// The operator's change at `now`: reloads the hosts, runs the change (again after a
    /// refusal, a failure or a kill), and polls the run in flight.
    pub(super) fn changes(&mut self, now: u64) {
        self.poll_change(now);
        if self.change.run.is_some() || self.change.at.is_none_or(|at| at > now) {
            return;
        }
        if !self.change.reloaded {
            self.change.reloaded = true;
            log(&self.world, || {
                "operator reloads every host with the route's new contract".into()
            });
            self.reload_all(true);
        }
        self.start_change(now);
    }

    /// Every host takes its config changed (`changed`) or as it was: by reload, or by a
    /// restart where the host refuses the reload (a fenced route would run unfenced).
    fn reload_all(&mut self, changed: bool) {
        let now = self.world.lock().expect("one thread").now;
        for i in 0..self.hosts.len() {
            let config = HostConfig {
                changed,
                ..self.hosts[i].config
            };
            let h = &mut self.hosts[i];
            if !h.down {
                h.reload(&self.world, config, i);
            }
            if h.config != config {
                // Down, or its reload refused: it starts (again) with the new config.
                if !h.down {
                    super::disrupt(&self.world, &h.work);
                    drop(std::mem::take(&mut h.work));
                    h.down = true;
                    h.paused_until = now + self.change.rng.range(0, 2_000);
                    log(&self.world, || {
                        format!("h{i} restarted with the new config")
                    });
                }
                h.config = config;
            }
        }
    }

    /// The config the operator runs the change with.
    fn operator_config(&self) -> HostConfig {
        HostConfig {
            changed: !self.change.back,
            ..self.hosts[0].config
        }
    }

    /// One run of `setup --change-route`, up to the move of the claims (started, polled by
    /// [`Hosts::poll_change`]); a refusal before it is the operator's to retry later.
    fn start_change(&mut self, now: u64) {
        let config = self.operator_config();
        let wanted = Served::new(&config).contract;
        let skew = Duration::from_millis(self.settings.skew_ms);
        self.change.runs += 1;
        let number = self.change.runs;
        let again = now + self.change.rng.range(2_000, 8_000);
        let mut w = self.world.lock().expect("one thread");
        let key = w.contract.clone();
        let recorded = key.record.as_ref().filter(|_| !key.deleted);
        let same = recorded.is_some_and(|r| r.contract == wanted);
        let run = change::run(recorded.is_some(), same, key.changing.is_some());
        let live = (key.changing.as_ref()).and_then(|c| c.live_run(now, skew).cloned());
        if let Some(live) = live.filter(|_| matches!(run, Run::Change | Run::CallOff)) {
            w.log(|| {
                format!(
                    "change run {number} refused: the mark is held by run {}",
                    live.id
                )
            });
            self.change.at = Some(again);
            return;
        }
        let Some(recorded) = recorded.cloned() else {
            w.log(|| format!("change run {number}: no contract recorded; the operator stops"));
            self.change.at = None;
            return;
        };
        match run {
            Run::Record | Run::Unchanged => {
                w.log(|| format!("change run {number}: unchanged"));
                self.change.at = self.change.again_after_settling(now);
                return;
            }
            Run::CallOff => {
                w.contract.changing = None;
                w.contract.revision += 1;
                w.log(|| format!("change run {number}: called off, the mark cleared"));
                self.change.at = self.change.again_after_settling(now);
                return;
            }
            Run::Change => {}
        }
        // The mark, written before the drain is checked: a host starting after it stays out.
        let first = key.changing.is_none();
        let since = key.changing.as_ref().map_or(now, |c| c.since_ms);
        let id = format!("op{number}");
        w.contract.changing = Some(Changing {
            to: wanted.clone(),
            since_ms: since,
            run: Some(ChangeRun {
                id: id.clone(),
                host: "operator".into(),
                user: "sim".into(),
                pid: number,
                started_ms: now,
                lease_until_ms: now + LEASE_MS,
            }),
        });
        w.contract.revision += 1;
        drop(w);
        // Each host's status: serving the route, or still draining what it had in flight.
        let status: Vec<String> = (self.hosts.iter().enumerate())
            .filter(|(_, h)| h.served.is_some() || !h.work.is_empty())
            .map(|(i, _)| format!("h{i}"))
            .collect();
        let evidence = change::evidence(None, &status);
        if !evidence.is_empty() {
            log(&self.world, || {
                format!("change run {number} refused: still served: {evidence:?}")
            });
            self.stopped(&id, change::stop(false, true, first));
            self.change.at = Some(again);
            return;
        }
        let old = recorded.contract.clone();
        if self.waits_for_open((number, &id, first), (&old, &wanted), again) {
            return;
        }
        let (from, to) = (space_of(&old), space_of(&wanted));
        log(&self.world, || {
            format!("change run {number} ({id}) moves the claims {from} -> {to}")
        });
        let stores = SimStores {
            world: self.world.clone(),
            from: SimStore {
                world: self.world.clone(),
                host: OPERATOR,
                space: from,
            },
            to: SimStore {
                world: self.world.clone(),
                host: OPERATOR,
                space: to,
            },
            run: id,
            renewed: now,
            units: Rc::new(Cell::new(0)),
            listed: Rc::default(),
        };
        self.change.listed = stores.listed.clone();
        let window_to_fenced =
            old.effects == EffectsMode::Window && wanted.effects == EffectsMode::Fenced;
        let moving = old.claims != wanted.claims;
        let (old_claims, new_claims) = (old.claims.clone(), wanted.claims.clone());
        let future = async move {
            let mut stores = stores;
            if !moving {
                return Ok(Moved::default());
            }
            let claims = Claims {
                from: &old_claims,
                to: &new_claims,
                window_to_fenced,
            };
            change::move_claims(&mut stores, claims, &|_| false, BY).await
        };
        self.change.run = Some((number, first, Box::pin(future)));
    }

    /// Polls the run in flight at `now` (the operator's clock is true time); it may be killed
    /// at an await point. A finished move swaps the contract.
    fn poll_change(&mut self, now: u64) {
        let Some((number, first, mut future)) = self.change.run.take() else {
            return;
        };
        if self.change.kills > 0 && self.change.rng.chance(self.change.kills) {
            log(&self.world, || {
                format!("change run {number} killed part-way (its mark stays, its lease live)")
            });
            drop(future); // its requests stay with the server
            self.change.at = Some(now + self.change.rng.range(1_000, 2 * LEASE_MS));
            return;
        }
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        virtual_clock::set(Some(now));
        let polled = future.as_mut().poll(&mut cx);
        virtual_clock::set(None);
        let std::task::Poll::Ready(result) = polled else {
            self.change.run = Some((number, first, future));
            return;
        };
        let id = format!("op{number}");
        let again = now + self.change.rng.range(2_000, 8_000);
        match result {
            Ok(moved) => self.swap(number, &id, moved),
            Err(Failed::Lost) => {
                log(&self.world, || format!("change run {number} lost its mark"));
                self.change.at = Some(again);
            }
            Err(Failed::Refused(refused)) => {
                log(&self.world, || {
                    format!("change run {number} refused: {refused}; the operator reloads the old config and calls it off")
                });
                self.stopped(&id, change::stop(false, true, first));
                self.change.back = true;
                self.reload_all(false);
                self.change.at = Some(again);
            }
            Err(e) => {
                let e = match e {
                    Failed::Copy(e) => e.to_string(),
                    Failed::Fence(e) => e.to_string(),
                    Failed::Read(e) => format!("reading a claim record: {e}"),
                    Failed::Refused(_) | Failed::Lost => unreachable!("handled above"),
                };
                log(&self.world, || format!("change run {number} stopped: {e}"));
                self.stopped(&id, change::stop(false, false, first));
                self.change.at = Some(again);
            }
        }
    }

    /// What run `id` leaves of its mark when it stopped ([`change::stop`]).
    fn stopped(&mut self, id: &str, stop: Stop) {
        let mut w = self.world.lock().expect("one thread");
        let key = &mut w.contract;
        let Some(mark) = key.changing.as_mut() else {
            return;
        };
        if mark.run.as_ref().is_none_or(|r| r.id != id) {
            return;
        }
        match stop {
            Stop::Leave => return,
            Stop::Clear => key.changing = None,
            Stop::Release => {
                if let Some(run) = mark.run.as_mut() {
                    run.lease_until_ms = 0;
                }
            }
        }
        key.revision += 1;
    }

    /// The change's last write: the new contract, the mark cleared, by revision (a run that
    /// lost its mark writes nothing). Checks that no key is half-moved.
    fn swap(&mut self, number: u32, id: &str, moved: Moved) {
        let config = self.operator_config();
        let wanted = Served::new(&config).contract;
        let parsed = config.config();
        let mut w = self.world.lock().expect("one thread");
        let now = w.now;
        let mine = (w.contract.changing.as_ref())
            .and_then(|c| c.run.as_ref())
            .is_some_and(|r| r.id == id);
        if !mine {
            w.log(|| format!("change run {number} lost its mark before its last write"));
            self.change.at = Some(now + 2_000);
            return;
        }
        let old = w
            .contract
            .record
            .clone()
            .expect("a changed route has a record");
        let (from, to) = (space_of(&old.contract), space_of(&wanted));
        if from != to {
            for (key, record) in w.claims_in(from) {
                let there = w.record(&format!("{to}{key}")).map(|(r, _)| r);
                if there.is_none() && late_create(&self.change.listed.borrow(), &key, &record) {
                    w.log(|| {
                        format!("key {key} was created in {from} after the move listed the keys: a late create, left behind")
                    });
                    continue;
                }
                if there.map(unfenced) != Some(unfenced(&record)) {
                    let what = format!(
                        "key {key} is half-moved by the contract change: {from} holds {:?}, {to} holds {:?}",
                        (record.state, record.permanent),
                        there.map(|r| (r.state, r.permanent))
                    );
                    w.log(|| format!("VIOLATION {what}"));
                    w.violations.push(what);
                }
            }
        }
        self.change.settled = (w.claims_in(from).into_iter())
            .filter(|(_, r)| r.state == ClaimState::Completed)
            .collect();
        self.change.new_space = to;
        // The model's note of keys the server gave up on moves with their claims.
        let carried: Vec<String> = (w.gave_up.iter())
            .filter_map(|k| Some(format!("{to}{}", k.strip_prefix(from)?)))
            .collect();
        w.gave_up.extend(carried);
        let record = ContractRecord {
            recorded_ms: now,
            ..ContractRecord::new(wanted, BY, &parsed, &parsed.routes[0])
        };
        w.contract.record = Some(record);
        w.contract.changing = None;
        w.contract.revision += 1;
        w.log(|| {
            format!(
                "change run {number} swaps the contract ({} claims moved)",
                moved.claims
            )
        });
        self.change.at = None;
    }

    /// Keys completed before the change that ran again after it (their record in the new
    /// claim store is not the one moved), unless an operator replayed them.
    pub fn changed_keys(&self, w: &super::super::world::World) -> Vec<String> {
        let space = self.change.new_space;
        (self.change.settled.iter())
            .filter(|(key, record)| {
                let plain = key.strip_prefix(w.route.as_str()).unwrap_or(key);
                !w.replayed.contains(plain)
                    && w.record(&format!("{space}{key}")).map(|(r, _)| unfenced(r))
                        != Some(unfenced(record))
            })
            .map(|(key, _)| {
                format!("key {key}, completed before the contract change, ran again after it")
            })
            .collect()
    }
}
