//! The route table: which handler runs for which subject, with what key source and limits.
//! A route's handler can be swapped while messages run: each message takes the current
//! [`Guest`] once and keeps it to the end, so in-flight work finishes on the old version.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use crate::bindings::Event;
use crate::candidate::Candidate;
use crate::config::{Config, KeySource, MissingKey, RouteConfig};
use crate::metrics::{Metrics, RouteMetrics};
use crate::runtime::{Handler, Invocation, InvokeOptions, Outcome, TrapKind};
use crate::subject;

mod grant;

pub use grant::GrantError;

/// What runs a route's events.
#[derive(Clone, Debug)]
pub enum Guest {
    /// A WebAssembly component.
    Wasm(Handler),
    /// Succeeds at once with no outputs: measures the dedup guard without wasm.
    Noop,
}

impl Guest {
    /// The digest recorded in claims.
    pub fn digest(&self) -> &str {
        match self {
            Guest::Wasm(h) => h.digest(),
            Guest::Noop => "noop",
        }
    }

    /// Runs one event.
    pub async fn invoke(&self, event: Event, options: &InvokeOptions) -> Invocation {
        match self {
            Guest::Wasm(h) => h.invoke(event, options).await,
            Guest::Noop => Invocation {
                outcome: Outcome::Success(Vec::new()),
                logs: Vec::new(),
                elapsed: Default::default(),
                instantiate: Default::default(),
                fuel: None,
                memory_bytes: 0,
                calls: Vec::new(),
            },
        }
    }
}

/// One route, ready to serve.
#[derive(Debug)]
pub struct Route {
    /// Route name.
    pub name: String,
    /// Subject filter.
    pub subject: String,
    /// Key source.
    pub key: KeySource,
    /// What to do without a key.
    pub missing_key: MissingKey,
    /// Largest accepted payload.
    pub max_payload_bytes: usize,
    /// Limits, configuration and grants for invocations.
    pub options: InvokeOptions,
    /// Trap kinds that fail a message at once.
    pub permanent_traps: Vec<TrapKind>,
    /// Guest slots of this route (`concurrency`).
    pub slots: Arc<Semaphore>,
    /// Messages of this route in flight at once.
    pub max_in_flight: usize,
    /// How messages are acked once their outcome is recorded.
    pub ack: crate::config::AckMode,
    /// Where the component comes from: a file, or `None` for the object store.
    pub component_file: Option<PathBuf>,
    /// Largest component accepted, in bytes.
    pub max_component_bytes: usize,
    /// Longest a component may take to compile before it is refused.
    pub compile_timeout: Duration,
    /// The handler being served, if any: swapped by hot loading.
    guest: watch::Sender<Option<Guest>>,
    /// Why the last version offered was refused, if it was.
    refused: std::sync::Mutex<Option<String>>,
    /// Why this host does not serve the route at all: its config differs from the route's
    /// contract on the server ([`crate::contract`]).
    contract_refused: std::sync::Mutex<Option<String>>,
    /// Whether this host's config of the route was found to agree with its contract (set by
    /// the contract check, cleared by a refusal; false until the first check).
    contract_agreed: std::sync::atomic::AtomicBool,
    /// Whether the route's component source has decided: a version served or refused, or
    /// none deployed (withdrawn). Until then the host is not ready.
    decided: std::sync::atomic::AtomicBool,
    /// The candidate version run beside the live one (shadow or canary), if any.
    candidate: RwLock<Option<Arc<Candidate>>>,
    /// This route's series.
    pub metrics: Arc<RouteMetrics>,
    /// One message per entity at a time, in order (`exclusive_by`), if set.
    pub exclusive: Option<Exclusive>,
    /// For a fenced route (`effects = "fenced"`): the output stream its outputs and claim
    /// records are committed to together.
    pub fenced: Option<String>,
    /// Runs first and creates the key completed after publishing (`claim = "after"`).
    pub claim_after: bool,
    /// Whether its next guest call may start on the I/O thread that asks for it.
    pub inline: crate::runtime::inline::InlineGate,
}

/// How an exclusive route tells entities apart and queues their messages.
#[derive(Debug, Clone)]
pub struct Exclusive {
    /// Where the entity key comes from.
    pub by: KeySource,
    /// Partitions (each hands out a window of messages, one of an entity at a time): the
    /// route's `partitions`.
    pub partitions: usize,
    /// Skip a message when a newer one of its entity is waiting.
    pub coalesce: bool,
}

impl Route {
    /// Whether the route may publish outputs at all (`allowed_outputs` names some).
    pub fn may_publish(&self) -> bool {
        (self.options.allowed_outputs.as_ref()).is_some_and(|o| !o.is_empty())
    }

    /// The handler now being served; `None` while the route has no (valid) component.
    pub fn guest(&self) -> Option<Guest> {
        self.guest.borrow().clone()
    }

    /// Serves `guest` from now on (`None`: stop serving); returns the previous one.
    /// Messages already running keep the version they started with.
    pub fn serve(&self, guest: Option<Guest>) -> Option<Guest> {
        *self.refused.lock().expect("refused lock") = None;
        self.metrics.serving(guest.as_ref().map(Guest::digest));
        self.decide();
        self.guest.send_replace(guest)
    }

    /// Records that the source has nothing for this route (withdrawn, never deployed).
    pub fn decide(&self) {
        self.decided
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the route is served, or deliberately not served (withdrawn or never
    /// deployed). False while its first version loads, or after that version was refused.
    pub fn settled(&self) -> bool {
        if self.contract_refused().is_some() {
            return false;
        }
        self.guest.borrow().is_some()
            || (self.decided.load(std::sync::atomic::Ordering::Relaxed) && self.refused().is_none())
    }

    /// Records that a new version was refused; the current one keeps serving.
    pub fn refuse(&self, reason: String) {
        self.metrics.refusal();
        self.decide();
        *self.refused.lock().expect("refused lock") = Some(reason);
        // Wake status reporters; the guest itself is unchanged.
        self.guest.send_modify(|_| {});
    }

    /// Records that this host's config of the route agrees with its contract: it serves it.
    pub fn agree_with_contract(&self) {
        self.record_contract(true, None);
    }

    /// Records why this host does not serve the route (`None`: no reason to report, as while
    /// a contract change keeps it out).
    pub fn refuse_contract(&self, reason: Option<String>) {
        self.record_contract(false, reason);
    }

    /// Records the contract check's verdict: whether the config agrees, and why the route is
    /// not served if it is not.
    fn record_contract(&self, agreed: bool, refused: Option<String>) {
        (self.contract_agreed).store(agreed, std::sync::atomic::Ordering::SeqCst);
        *self.contract_refused.lock().expect("refused lock") = refused;
        self.guest.send_modify(|_| {});
    }

    /// Whether this host's config of the route agrees with its contract, as last checked:
    /// `false` before the first check (a route just added or replaced by a reload) and while
    /// refused. What is done for the route outside its pipeline under its settings (a given-up
    /// message's letter) waits for it.
    pub fn agrees_with_contract(&self) -> bool {
        (self.contract_agreed).load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Why this host does not serve the route, if its config differs from the contract.
    pub fn contract_refused(&self) -> Option<String> {
        self.contract_refused.lock().expect("refused lock").clone()
    }

    /// Why the last version offered was refused, if it was.
    pub fn refused(&self) -> Option<String> {
        self.refused.lock().expect("refused lock").clone()
    }

    /// The version that runs the message with idempotency key `key`: a canary candidate's
    /// for its share of keys, else the live one; `None` while the route is not served.
    pub fn guest_for(&self, key: &str) -> Option<Guest> {
        let live = self.guest()?;
        let candidate = self.candidate.read().expect("candidate lock");
        match candidate.as_ref().filter(|c| c.runs_key(key)) {
            Some(c) => Some(Guest::Wasm(c.handler.clone())),
            None => Some(live),
        }
    }

    /// The candidate run beside the live version, if any.
    pub fn candidate(&self) -> Option<Arc<Candidate>> {
        self.candidate.read().expect("candidate lock").clone()
    }

    /// Runs `candidate` beside the live version from now on (`None`: no candidate);
    /// messages already running keep the version they started with.
    pub fn set_candidate(&self, candidate: Option<Arc<Candidate>>) {
        self.metrics
            .rollout
            .canary_share(candidate.as_ref().map_or(0, |c| c.share()));
        *self.candidate.write().expect("candidate lock") = candidate;
        // Wake status reporters.
        self.guest.send_modify(|_| {});
    }

    /// Follows changes of the served handler.
    pub fn subscribe(&self) -> watch::Receiver<Option<Guest>> {
        self.guest.subscribe()
    }

    /// Where the claim of idempotency key `key` is kept: a key of the claim bucket, or for a
    /// fenced route a subject of its output stream ([`crate::fenced`]).
    pub fn claim_key(&self, key: &str) -> String {
        let claim_key = crate::claim::key::encode(&self.name, key);
        match &self.fenced {
            Some(stream) => crate::fenced::claim_subject(stream, &claim_key),
            None => claim_key,
        }
    }

    /// Whether a trap of this kind fails the message without a retry.
    pub fn is_permanent(&self, kind: TrapKind) -> bool {
        kind == TrapKind::ForbiddenOutput || self.permanent_traps.contains(&kind)
    }
}

/// All routes of a host. Route filters never overlap (validated), so at most one matches.
/// The set changes on a config reload ([`Routes::set`]); readers take a snapshot.
#[derive(Debug, Default)]
pub struct Routes {
    routes: RwLock<Vec<Arc<Route>>>,
    /// Subjects of routes removed by a reload: their messages wait for the route's return.
    parked: RwLock<Vec<String>>,
    /// Why the last config reload was refused, if it was.
    refused_config: std::sync::Mutex<Option<String>>,
    /// Bumped on every change of the set.
    generation: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl Routes {
    /// Every route of the config, none of them served yet: each route's component is
    /// compiled by its source ([`crate::components`]) off the start-up path, so one route's
    /// slow compile never delays the others. Refused when a route's outbound-HTTP grant
    /// cannot be built ([`GrantError`]).
    pub fn unloaded(config: &Config) -> Result<Self, GrantError> {
        Self::build(config, None)
    }

    /// Builds routes from the config with the given guest for every route (benchmarks).
    pub fn with_guest(config: &Config, guest: Guest) -> Self {
        Self::build(config, Some(guest)).expect("every route's outbound-HTTP grant builds")
    }

    fn build(config: &Config, guest: Option<Guest>) -> Result<Self, GrantError> {
        let metrics = Arc::new(Metrics::new());
        let routes = config
            .routes
            .iter()
            .map(|r| Self::route(config, r, guest.clone(), &metrics))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            routes: RwLock::new(routes),
            metrics,
            ..Self::default()
        })
    }

    /// A new, unserved route for `r` (a reload adds or changes it with [`Routes::set`]);
    /// refused when its outbound-HTTP grant cannot be built ([`GrantError`]).
    pub fn new_route(&self, config: &Config, r: &RouteConfig) -> Result<Arc<Route>, GrantError> {
        Self::route(config, r, None, &self.metrics)
    }

    /// Replaces the set. Removed routes' subjects are parked: the consumer of unrouted
    /// subjects leaves their messages to the route's durable consumer, which keeps them.
    pub fn set(&self, routes: Vec<Arc<Route>>) {
        let old = std::mem::replace(&mut *self.routes.write().expect("routes lock"), routes);
        let mut parked = self.parked.write().expect("routes lock");
        let now = self.iter().collect::<Vec<_>>();
        parked.extend(
            old.iter()
                .filter(|o| !now.iter().any(|r| r.subject == o.subject))
                .map(|o| o.subject.clone()),
        );
        parked.retain(|p| !now.iter().any(|r| r.subject == *p));
        drop(parked);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Follows changes of the set (and of the reload's refusal).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Records why a reload was refused (`None`: the last one applied).
    pub fn refuse_config(&self, problems: Option<String>) {
        *self.refused_config.lock().expect("routes lock") = problems;
        self.generation.send_modify(|g| *g += 1);
    }

    /// Why the last config reload was refused, if it was.
    pub fn refused_config(&self) -> Option<String> {
        self.refused_config.lock().expect("routes lock").clone()
    }

    /// Whether `subject` belongs to a route removed by a reload.
    pub fn is_parked(&self, subject: &str) -> bool {
        let parked = self.parked.read().expect("routes lock");
        parked.iter().any(|p| subject::matches(p, subject))
    }

    /// The series of this host (every route's, and those of messages no route takes).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn route(
        config: &Config,
        r: &RouteConfig,
        guest: Option<Guest>,
        metrics: &Metrics,
    ) -> Result<Arc<Route>, GrantError> {
        let http = grant::http_grant(config, r, metrics)?;
        let route_metrics = metrics.route(&r.name);
        route_metrics.serving(guest.as_ref().map(Guest::digest));
        let fenced = config.fenced_stream(r).map(|o| o.name.clone());
        let mut limits = r.limits.clone();
        if fenced.is_some() {
            // One batch holds every output and the claim record.
            limits.max_outputs = limits.max_outputs.min(crate::limits::MAX_FENCED_OUTPUTS);
        }
        Ok(Arc::new(Route {
            name: r.name.clone(),
            subject: r.subject.clone(),
            key: r.key.clone(),
            missing_key: r.missing_key,
            max_payload_bytes: r.max_payload_bytes,
            options: InvokeOptions {
                limits,
                config: Arc::new(r.config.clone()),
                allowed_outputs: Some(r.allowed_outputs.clone().into()),
                read_only_dir: r
                    .read_only_dir
                    .as_ref()
                    .map(|d| Arc::new(config.resolve(d))),
                route_lanes: Some(Arc::new(Semaphore::new(config.route_lanes()))),
                http,
                journal: None,
            },
            permanent_traps: r.permanent_traps.clone(),
            slots: Arc::new(Semaphore::new(r.concurrency(&config.host))),
            max_in_flight: r.max_in_flight(&config.host),
            ack: r.ack(&config.host),
            component_file: r.component.as_ref().map(|f| config.resolve(f)).or_else(|| {
                let dir = config.components.dir.as_ref()?;
                Some(config.resolve(dir).join(format!("{}.wasm", r.name)))
            }),
            max_component_bytes: r.max_component_bytes,
            compile_timeout: r.compile_timeout,
            exclusive: r.exclusive_by.as_ref().map(|by| Exclusive {
                by: by.clone(),
                partitions: crate::exclusive::partitions(config, r),
                coalesce: r.coalesce,
            }),
            fenced,
            claim_after: r.claim == crate::config::ClaimMode::After,
            inline: Default::default(),
            guest: watch::Sender::new(guest),
            refused: std::sync::Mutex::new(None),
            contract_refused: std::sync::Mutex::new(None),
            contract_agreed: std::sync::atomic::AtomicBool::new(false),
            decided: std::sync::atomic::AtomicBool::new(false),
            candidate: RwLock::new(None),
            metrics: route_metrics,
        }))
    }

    /// The route whose filter matches `subject`.
    pub fn find(&self, subject: &str) -> Option<Arc<Route>> {
        let routes = self.routes.read().expect("routes lock");
        routes
            .iter()
            .find(|r| subject::matches(&r.subject, subject))
            .cloned()
    }

    /// The route named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Route>> {
        let routes = self.routes.read().expect("routes lock");
        routes.iter().find(|r| r.name == name).cloned()
    }

    /// A snapshot of every route.
    pub fn iter(&self) -> std::vec::IntoIter<Arc<Route>> {
        self.routes.read().expect("routes lock").clone().into_iter()
    }
}
