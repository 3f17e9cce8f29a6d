//! The routes a running host serves, as they change: each route's consumer loop and component
//! watcher start and stop with it, and a config reload adds, removes and changes routes while
//! the rest keep serving.
//!
//! - Added: its consumer is created (or bound) and its component loaded.
//! - Removed: it stops pulling, its in-flight messages finish, and the rest wait in the
//!   stream for the route's durable consumer (the consumer of unrouted subjects leaves them).
//! - Changed (subject, key source, limits, grants, concurrency): a new route replaces it;
//!   messages claimed from then on get the new settings, the version served carries over when
//!   the component source is the same, and the old loop drains.
//! - Anything outside `[[routes]]` cannot change live: it is reported as needing a restart.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use dedup_delivery::agreement::{self, Agreement, Comparison, Recheck};
use dedup_delivery::reload;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim::host::HostClaimStore;
use crate::config::diff::ConfigDiff;
use crate::config::{Config, ConfigError, EffectsMode};
use crate::contract::watch::{Following, Update, WatchError};
use crate::pipeline::{self, Role, Shared};
use crate::routes::{Route, Routes};
use crate::runtime::Runtime;

/// What a reload did on one host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReloadReport {
    /// The host.
    pub instance_id: String,
    /// Whether the new config was applied (false: refused whole, nothing changed).
    pub applied: bool,
    /// The routes added, removed and changed, and what needs a restart.
    pub diff: ConfigDiff,
    /// Why the config was refused: every problem.
    pub problems: Vec<String>,
}

/// One served route and the tasks that serve it.
struct Served {
    route: Arc<Route>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Holds the route's serving subscription ([`crate::presence`]) until `tasks` drained.
    presence: crate::presence::Held,
}

/// The live route set of a host.
pub(crate) struct Live {
    pub(crate) config: Mutex<Arc<Config>>,
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) shared: Arc<Shared<HostClaimStore>>,
    pub(crate) runtime: Option<Runtime>,
    pub(crate) routes: Arc<Routes>,
    pub(crate) instance_id: String,
    /// The deployment's route contracts ([`crate::contract`]).
    contracts: async_nats::jetstream::kv::Store,
    /// The contract this host last agreed on, per route: what it keeps serving under when
    /// the record is deleted (a host never records it again).
    held: Mutex<BTreeMap<String, crate::contract::RouteContract>>,
    served: tokio::sync::Mutex<BTreeMap<String, Served>>,
    /// Told when a reload changed the route set: the contract watch follows the new routes.
    routes_changed: tokio::sync::Notify,
    /// Routes replaced or removed by a reload, still draining.
    draining: Mutex<Vec<JoinHandle<()>>>,
    /// Woken by file events in `components.dir`, kept alive by `_dir_watcher`.
    poke: Option<Arc<tokio::sync::Notify>>,
    _dir_watcher: Mutex<Option<Box<dyn notify::Watcher + Send>>>,
}

impl Live {
    /// A host's live set, serving nothing yet; watches `components.dir` when set.
    pub(crate) fn new(
        config: Arc<Config>,
        js: async_nats::jetstream::Context,
        shared: Arc<Shared<HostClaimStore>>,
        runtime: Option<Runtime>,
        routes: Arc<Routes>,
        instance_id: String,
        contracts: async_nats::jetstream::kv::Store,
    ) -> anyhow::Result<Self> {
        let (poke, dir_watcher) = match &config.components.dir {
            Some(dir) if runtime.is_some() => {
                let poke = Arc::new(tokio::sync::Notify::new());
                let dir = config.resolve(dir);
                let interval = config.components.poll_interval;
                let watcher = crate::components::dir::watch(&dir, poke.clone(), interval)?;
                (Some(poke), Some(watcher))
            }
            _ => (None, None),
        };
        Ok(Self {
            config: Mutex::new(config),
            js,
            shared,
            runtime,
            routes,
            instance_id,
            contracts,
            held: Mutex::default(),
            served: tokio::sync::Mutex::default(),
            routes_changed: tokio::sync::Notify::new(),
            draining: Mutex::default(),
            poke,
            _dir_watcher: Mutex::new(dir_watcher),
        })
    }

    fn config(&self) -> Arc<Config> {
        self.config.lock().expect("config lock").clone()
    }

    /// Starts serving `route` if its config agrees with the route's contract (recording it
    /// when the route has none): binds its consumer (patiently), starts its loop and its
    /// component watcher. A route that disagrees is refused on this host (not an error: its
    /// messages wait in the stream). `added` marks a route added by a reload.
    pub(crate) async fn start(&self, route: Arc<Route>, added: bool) -> anyhow::Result<()> {
        let config = self.config();
        // Taken before the contract is read, and so before the first pull: a
        // `setup --change-route` that finds no host serving cannot meet one that read the
        // old contract a moment earlier (dropped again when the route is refused).
        let presence =
            crate::presence::hold(&self.js.client(), &config, &route.name, &self.instance_id)
                .await?;
        if !self.agrees(&config, &route).await? {
            return Ok(());
        }
        let source = self.js.get_stream(&config.source.stream).await?;
        let consumer = crate::setup::patiently(|| {
            crate::setup::route_consumer(
                &source,
                &config,
                &route.name,
                &route.subject,
                route.exclusive.is_some(),
            )
        })
        .await?;
        let (stop, stopped) = watch::channel(false);
        let role = match route.exclusive {
            Some(_) => Role::Queue,
            None => Role::Process,
        };
        let mut tasks = vec![pipeline::spawn_route(
            self.shared.clone(),
            consumer,
            route.clone(),
            role,
            stopped.clone(),
        )];
        if let Some(exclusive) = &route.exclusive {
            let queue =
                crate::setup::patiently(|| crate::setup::ensure_queue(&self.js, &config)).await?;
            for p in 0..exclusive.partitions {
                let consumer = crate::setup::patiently(|| {
                    crate::exclusive::partition_consumer(&queue, &config, &route.name, p)
                })
                .await?;
                tasks.push(pipeline::spawn_route(
                    self.shared.clone(),
                    consumer,
                    route.clone(),
                    Role::Partition(p),
                    stopped.clone(),
                ));
            }
        }
        if let Some(runtime) = &self.runtime {
            let watcher = crate::components::watch_route(
                (&self.js, &self.instance_id),
                runtime.clone(),
                &config,
                route.clone(),
                added,
                self.poke.clone(),
                stopped,
            );
            tasks.extend(watcher);
        }
        let served = Served {
            route,
            stop,
            tasks,
            presence,
        };
        let previous = self
            .served
            .lock()
            .await
            .insert(served.route.name.clone(), served);
        if let Some(previous) = previous {
            self.retire(previous);
        }
        Ok(())
    }

    /// Whether `route` agrees with its contract; records why not on the route and stops
    /// serving it when it does not.
    async fn agrees(&self, config: &Config, route: &Route) -> anyhow::Result<bool> {
        let Some(rc) = config.routes.iter().find(|r| r.name == route.name) else {
            return Ok(false);
        };
        let held = self
            .held
            .lock()
            .expect("held lock")
            .get(&route.name)
            .cloned();
        let agreed = crate::setup::patiently(|| async {
            let by = &self.instance_id;
            let store = &self.contracts;
            match crate::contract::agree_serving(store, config, rc, by, held.as_ref()).await {
                Ok(contract) => Ok(Ok(contract)),
                Err(e) => match e.comparison() {
                    Some(comparison) => Ok(Err((comparison, e.to_string()))),
                    None => Err(anyhow::Error::from(e)),
                },
            }
        })
        .await?;
        let (comparison, reason) = match agreed {
            Ok(contract) => {
                let mut held = self.held.lock().expect("held lock");
                held.insert(route.name.clone(), contract);
                (Comparison::Agrees, None)
            }
            Err((comparison, reason)) => (comparison, Some(reason)),
        };
        let serving = self.served.lock().await.contains_key(&route.name);
        // Checked again for every change of the record (and once more as the contract watch
        // starts, right after the host's start): a refusal already reported is not logged
        // again.
        let reported = reason.is_some() && route.contract_refused() == reason;
        match agreement::decide(comparison, serving) {
            Agreement::Serve => {
                route.agree_with_contract();
                return Ok(true);
            }
            Agreement::KeepServing => {
                tracing::warn!(
                    route = route.name,
                    "a contract change of the route is under way; this host serves it and keeps serving (the change refuses while a host serves)"
                );
                return Ok(true);
            }
            Agreement::StayOut if !reported => {
                tracing::warn!("{}", reason.as_deref().unwrap_or_default())
            }
            Agreement::Refuse { .. } if !reported => {
                tracing::error!("{}", reason.as_deref().unwrap_or_default())
            }
            Agreement::StayOut | Agreement::Refuse { .. } => {}
        }
        // A route served so far drains first, and only then reports itself refused: a contract
        // change waits for that report, so nothing of the old contract is still running when
        // the new one starts elsewhere.
        let served = self.served.lock().await.remove(&route.name);
        if let Some(served) = served {
            stop(served).await;
        }
        route.refuse_contract(reason);
        Ok(false)
    }

    /// Checks route `name` again after its contract changed: a served route that no longer
    /// agrees stops (its in-flight messages finish), a refused one that now agrees starts.
    /// A refused route whose record was just marked as changing (`marked`) is left alone:
    /// trying it would take its serving subscription for a moment, which the change's probe,
    /// sent right after the mark, would take for a host serving the route. The record the
    /// change ends with is rechecked in turn.
    pub(crate) async fn recheck(&self, name: &str, marked: bool) {
        let Some(route) = self.routes.get(name) else {
            return;
        };
        let served = self.served.lock().await.contains_key(name);
        let refused = route.contract_refused().is_some();
        let result = match agreement::recheck(served, refused, marked) {
            Recheck::Agree => self.agrees(&self.config(), &route).await.map(|_| ()),
            Recheck::Start => self.start(route, true).await,
            Recheck::Nothing => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(
                route = name,
                "cannot check the route's changed contract: {e:#}"
            );
        }
    }

    /// Stops a replaced or removed route in the background: its loop drains while the rest
    /// (and its replacement) keep serving.
    fn retire(&self, served: Served) {
        let mut draining = self.draining.lock().expect("draining lock");
        draining.retain(|t| !t.is_finished());
        draining.push(tokio::spawn(stop(served)));
    }

    /// Stops every route (draining each), for shutdown.
    pub(crate) async fn stop_all(&self) {
        let served = std::mem::take(&mut *self.served.lock().await);
        let draining = std::mem::take(&mut *self.draining.lock().expect("draining lock"));
        futures::future::join_all(served.into_values().map(stop)).await;
        futures::future::join_all(draining).await;
    }

    /// Applies a new config (or reports why it was refused): see the module documentation.
    pub(crate) async fn reload(&self, new: Result<Config, ConfigError>) -> ReloadReport {
        let mut report = ReloadReport {
            instance_id: self.instance_id.clone(),
            applied: false,
            diff: ConfigDiff::default(),
            problems: Vec::new(),
        };
        let new = match new {
            Ok(new) => new,
            Err(e) => {
                report.problems = problems(&e);
                let text = report.problems.join("; ");
                tracing::error!("config reload refused, the running config keeps serving: {text}");
                self.routes.refuse_config(Some(text));
                return report;
            }
        };
        let old = self.config();
        report.diff = ConfigDiff::between(&old, &new);
        // Everything outside the routes stays as it runs until a restart.
        let running = Arc::new(Config {
            routes: new.routes.clone(),
            ..(*old).clone()
        });
        report.problems = unfenced(&running);
        report.problems.extend(self.uncaptured(&running).await);
        report.problems.extend(self.renamed(&running).await);
        let diff = reload::Diff {
            added: &report.diff.added,
            removed: &report.diff.removed,
            changed: &report.diff.changed,
        };
        let currents: Vec<Option<Arc<Route>>> = (running.routes.iter())
            .map(|r| self.routes.get(&r.name))
            .collect();
        let names = running.routes.iter().map(|r| r.name.as_str());
        let plan = reload::plan(names.zip(currents.iter().map(Option::is_some)), diff);
        // Each route the reload adds or changes is built before anything changes: one that
        // cannot be (its outbound-HTTP grant's `ca_file` became unreadable) refuses it.
        let mut built = std::collections::HashMap::new();
        for (r, (_, step)) in running.routes.iter().zip(&plan.steps) {
            if *step == reload::Step::Keep {
                continue;
            }
            match self.routes.new_route(&running, r) {
                Ok(route) => {
                    report
                        .problems
                        .extend(ungranted(self.routes.get(&r.name), &route));
                    built.insert(r.name.clone(), route);
                }
                Err(e) => report.problems.push(e.to_string()),
            }
        }
        if !report.problems.is_empty() {
            let text = report.problems.join("; ");
            tracing::error!("config reload refused, the running config keeps serving: {text}");
            self.routes.refuse_config(Some(text));
            return report;
        }
        *self.config.lock().expect("config lock") = running.clone();
        self.routes_changed.notify_one();
        let mut routes = Vec::new();
        let mut start = Vec::new();
        let planned = running.routes.iter().zip(currents).zip(&plan.steps);
        for ((r, current), (_, step)) in planned {
            match (step, current) {
                (reload::Step::Keep, Some(route)) => routes.push(route),
                (reload::Step::Keep, None) => {
                    unreachable!("the plan keeps only a route in the set")
                }
                (reload::Step::Start { added, replaces }, current) => {
                    let route = built
                        .remove(&r.name)
                        .expect("built before the reload applied");
                    let same_source =
                        current.filter(|c| *replaces && c.component_file == route.component_file);
                    let carried = same_source.as_ref().and_then(|c| c.guest());
                    if carried.is_some() {
                        route.serve(carried);
                    }
                    // A candidate (shadow or canary) keeps running through the reload.
                    route.set_candidate(same_source.and_then(|c| c.candidate()));
                    start.push((route.clone(), *added));
                    routes.push(route);
                }
            }
        }
        self.routes.set(routes);
        self.routes.refuse_config(None);
        for (route, added) in start {
            let name = route.name.clone();
            if let Err(e) = self.start(route, added).await {
                let problem = format!("route `{name}` not started: {e:#}");
                tracing::error!("{problem}");
                report.problems.push(problem);
            }
        }
        {
            let mut served = self.served.lock().await;
            for name in &plan.retired {
                if let Some(removed) = served.remove(name) {
                    self.retire(removed);
                }
            }
        }
        report.applied = true;
        tracing::warn!(
            added = ?report.diff.added,
            removed = ?report.diff.removed,
            changed = ?report.diff.changed,
            restart_needed = ?report.diff.restart_needed,
            "config reloaded"
        );
        report
    }
}

/// Stops one route's tasks and waits for them (its loop drains first).
async fn stop(served: Served) {
    let _ = served.stop.send(true);
    futures::future::join_all(served.tasks).await;
    // Only now, drained, does the route stop counting as served.
    drop(served.presence);
}

impl Live {
    /// The routes' output subjects that no stream captures, as a start refuses them (a
    /// reload creates no stream: `dedup-host setup` with the new config does).
    async fn uncaptured(&self, running: &Config) -> Vec<String> {
        match crate::capture::check(&self.js, running).await {
            crate::capture::OutputCheck::Captured => Vec::new(),
            crate::capture::OutputCheck::Refused(refused) => refused
                .0
                .iter()
                .map(|u| format!("{u}; a reload creates no stream: run `dedup-host setup` with this config first, then reload"))
                .collect(),
            crate::capture::OutputCheck::Unchecked(warnings) => {
                for warning in &warnings {
                    tracing::warn!("reload: {warning}");
                }
                Vec::new()
            }
        }
    }

    /// Routes a reload would add under a new name over a route it removes: set up as new
    /// routes they would run every retained message again, so the reload is refused whole
    /// (as a start refuses them), with the way to rename.
    async fn renamed(&self, running: &Config) -> Vec<String> {
        match crate::ownership::renamed(&self.js, running).await {
            Ok(conflicts) => conflicts
                .iter()
                .map(|c| {
                    let (old, new) = match c {
                        crate::ownership::Conflict::Rename { old_route, route, .. } => {
                            (old_route.as_str(), route.as_str())
                        }
                        _ => ("", ""),
                    };
                    format!("{c}. To rename by reload: reload the hosts with a config that leaves out both `{old}` and `{new}`, run `dedup-host setup --config <this config> --rename-route {old} {new}`, then reload with this config")
                })
                .collect(),
            Err(e) => vec![format!(
                "cannot check whether a new route renames a removed one: {e:#}; reload again once the server answers"
            )],
        }
    }
}

/// The problem of a reload that takes outbound HTTP away from a route whose served component
/// makes calls (`current` is the route as it runs, `route` as the reload builds it): the
/// component would be carried over and every call denied with nothing saying why, where a
/// start refuses such a component.
fn ungranted(current: Option<Arc<Route>>, route: &Route) -> Option<String> {
    let guest = current?.guest()?;
    let imports_http = matches!(&guest, crate::routes::Guest::Wasm(h) if h.imports_http());
    (imports_http && route.options.http.is_none()).then(|| format!(
        "route `{}`: the component it serves ({}) imports `wasi:http/outgoing-handler`, and this config no longer grants it outbound HTTP (no `[routes.http]`): keep the route's `[routes.http]`, or deploy a component that makes no HTTP calls first, then reload",
        route.name,
        guest.digest(),
    ))
}

/// The fenced routes that the running output streams cannot fence (a reload that needs an
/// output stream change, which takes a restart): refused rather than run unfenced
/// ([`reload::unfenced`]).
fn unfenced(running: &Config) -> Vec<String> {
    reload::unfenced(running.routes.iter().map(|r| reload::Fencing {
        route: &r.name,
        fenced: r.effects == EffectsMode::Fenced,
        captured: running.fenced_stream(r).is_some(),
        allowed_outputs: &r.allowed_outputs,
    }))
}

/// How long a route whose contract the server refused to follow waits to be tried again.
const CONTRACT_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// What following the routes' contracts brought.
enum Followed {
    /// A route's record or change (`None`: every followed route's watch ended).
    Update(Option<Result<Update, WatchError>>),
    /// Time to try the refused routes again.
    Retry,
}

/// Follows the contract records of the deployment's routes (its own keys of the bucket the
/// source stream's deployments share, [`crate::contract::watch`]): each one as it is when the
/// watch starts (or starts again, after a reload changed the routes or the watch ended, so
/// nothing changed meanwhile is missed), then every change, is checked by [`Live::recheck`].
pub(crate) fn follow_contracts(
    live: Arc<Live>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let routes: Vec<String> = live
                .config()
                .routes
                .iter()
                .map(|r| r.name.clone())
                .collect();
            let client = live.js.client();
            // Each route on its own: one the server refuses leaves the others followed.
            let mut following = Following::default();
            for e in following.add(&client, &live.contracts, &routes).await {
                tracing::warn!("{e}; the other routes' contracts are followed meanwhile, and this one is tried again every {CONTRACT_RETRY:?}");
            }
            let mut ended = routes.is_empty();
            while !ended {
                let event = tokio::select! {
                    u = following.next(), if !following.is_empty() => Followed::Update(u),
                    _ = tokio::time::sleep(CONTRACT_RETRY), if following.has_refused() => Followed::Retry,
                    _ = live.routes_changed.notified() => break,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                match event {
                    Followed::Update(Some(Ok(update))) => {
                        let marked = crate::contract::is_marked(&update.value);
                        live.recheck(&update.route, marked).await
                    }
                    Followed::Update(Some(Err(e))) => tracing::warn!("route contract watch: {e}"),
                    Followed::Update(None) => ended = true,
                    Followed::Retry => {
                        for e in following.retry(&client, &live.contracts).await {
                            tracing::debug!("still refused: {e}");
                        }
                    }
                }
            }
            if !ended {
                continue;
            }
            // The watch ended (a server restart, say) or there is no route: follow again,
            // without spinning.
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = live.routes_changed.notified() => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    })
}

/// Every problem of a refused config, one sentence each.
fn problems(e: &ConfigError) -> Vec<String> {
    match e {
        ConfigError::Invalid { problems, .. } => problems
            .iter()
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect(),
        other => vec![other.to_string()],
    }
}
