//! The host's TOML configuration: NATS connection, source stream and consumer, claim bucket,
//! leases, dead letters, output streams and routes. [`Config::load`] parses and validates in
//! one go and reports every problem with its field path.

mod console;
mod deployment;
mod derived;
pub mod diff;
mod effects;
mod modes;
mod names;
mod nats;
mod route;
pub mod schema;
pub mod telemetry;
mod validate;

pub use console::ConsoleConfig;
pub use deployment::DeploymentConfig;
pub use derived::{OUTAGE_BACKOFF_MAX, RERUN_GAP_TERMS};
pub use modes::{AckMode, ClaimMode, DedupMode, EffectsMode};
pub use nats::{without_credentials, NatsConfig};
pub use route::{
    KeySource, MissingKey, RouteConfig, DEFAULT_COMPILE_TIMEOUT, DEFAULT_MAX_COMPONENT_BYTES,
    DEFAULT_PARTITIONS,
};

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Default source stream name.
pub const DEFAULT_STREAM: &str = "DEDUP_EVENTS";
/// Default durable consumer name.
pub const DEFAULT_CONSUMER: &str = "dedup-host";
/// Default claim bucket name.
pub const DEFAULT_BUCKET: &str = "dedup-claims";
/// Default claim record lifetime: the bucket forgets a key after this long.
pub const DEFAULT_CLAIM_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// Default lease on a claim.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default interval between heartbeats (progress ack + lease renewal).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// Default margin added to a lease before another host may reclaim it.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(2);
/// Default consumer ack wait.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// Default number of attempts per key before dead-lettering.
pub const DEFAULT_MAX_DELIVER: u32 = 5;
/// Default source stream duplicate window.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Default output stream duplicate window.
pub const DEFAULT_OUTPUT_DUPLICATE_WINDOW: Duration = Duration::from_secs(600);
/// Default server-side bound on deliveries of one message.
pub const DEFAULT_SERVER_MAX_DELIVER: i64 = 100;
/// Default margin in the duplicate-window rule for outages and paused processes.
pub const DEFAULT_PAUSE_MARGIN: Duration = Duration::from_secs(60);
/// Default guests in flight per host.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Default messages in flight per host (claiming, running, publishing, acking).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// Default bound on waiting for in-flight work at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Default bound on the whole drain at shutdown: below Kubernetes' 30 s termination grace
/// period, so the host reports what it could not ack before it is killed.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(25);
/// Default largest payload a route accepts.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;
/// Default dead-letter subject.
pub const DEFAULT_DEAD_LETTER_SUBJECT: &str = "dedup.dead";
/// Default dead-letter stream.
pub const DEFAULT_DEAD_LETTER_STREAM: &str = "DEDUP_DEAD";

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How to reach NATS. No URLs means: `dedup-host dev` starts a local server.
    #[serde(default)]
    pub nats: NatsConfig,
    /// This host process.
    #[serde(default)]
    pub host: HostConfig,
    /// The stream events arrive on and the durable consumer reading it.
    #[serde(default)]
    pub source: SourceConfig,
    /// The KV bucket holding claims, and the lease timing.
    #[serde(default)]
    pub claims: ClaimsConfig,
    /// Where permanently failed messages go.
    #[serde(default)]
    pub dead_letter: DeadLetterConfig,
    /// Streams that capture handler outputs; created when missing, and their duplicate windows
    /// are checked against the retry timing.
    #[serde(default)]
    pub output_streams: Vec<OutputStreamConfig>,
    /// Where components come from besides files, the compile cache, and hot-loading timing.
    #[serde(default)]
    pub components: ComponentsConfig,
    /// Subject filters and the handler for each.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Where OpenTelemetry spans go (off by default).
    #[serde(default)]
    pub telemetry: telemetry::TelemetryConfig,
    /// Where `dedup-host console` listens and who may log in.
    #[serde(default)]
    pub console: ConsoleConfig,
    /// Which deployment this config belongs to: the owner recorded on what it creates.
    #[serde(default)]
    pub deployment: DeploymentConfig,
    /// Directory that relative paths (components, creds, certificates) are resolved against;
    /// set by [`Config::load`] to the config file's directory.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Component sources and the compile cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ComponentsConfig {
    /// NATS Object Store bucket holding the components of routes that name no `component`
    /// file: object `<route name>`, uploaded with `dedup-host deploy`. Created when missing.
    /// Default `dedup-components-<source stream>` (`dedup-components` on the default stream).
    #[schemars(extend("x-default-text" = "`dedup-components-<source stream>`"))]
    pub bucket: String,
    /// KV bucket where each host reports the version it serves per route
    /// (`dedup-host routes` reads it). Created when missing. Default
    /// `dedup-hosts-<source stream>` (`dedup-hosts` on the default stream).
    #[schemars(extend("x-default-text" = "`dedup-hosts-<source stream>`"))]
    pub status_bucket: String,
    /// Compiled components are kept here, so a restart does not recompile unchanged ones
    /// (relative to the config file). Must be writable by the host only.
    pub cache_dir: Option<PathBuf>,
    /// How often component files are checked for a new version.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub poll_interval: Duration,
    /// Replicas of the component object store and the host-status bucket when created.
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub replicas: usize,
    /// A directory of components: `<route>.wasm` serves the route of that name, for every
    /// route that names no `component` file (instead of the object store). Watched for new,
    /// replaced and removed files; a file is taken once it has stopped changing.
    pub dir: Option<PathBuf>,
}

impl Default for ComponentsConfig {
    fn default() -> Self {
        Self {
            bucket: "dedup-components".into(),
            status_bucket: "dedup-hosts".into(),
            cache_dir: Some(PathBuf::from(".dedup-host/cache")),
            poll_interval: Duration::from_millis(500),
            replicas: 1,
            dir: None,
        }
    }
}

/// Settings of this host process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Identifies this process in claim records; generated per process start when unset.
    /// Two live processes must never share one.
    #[schemars(extend("x-default-text" = "generated per start"))]
    pub instance_id: Option<String>,
    /// Guests of one route running at once (each route's default; see `routes[].concurrency`).
    /// Routes have separate slots, so a slow or hostile route cannot take another's.
    #[schemars(range(min = 1))]
    pub concurrency: usize,
    /// Messages of one route in flight at once (each route's default). Most of a message's
    /// life is network round trips (claim, publish, record, ack) that need no guest slot, so
    /// this is larger than `concurrency`.
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
    /// How many guests that run past their first 2 ms may execute at once; they take turns
    /// a millisecond at a time. Keeps loops and heavy handlers from taking every core from
    /// short handlers and the host's own work. Default: half the cores, at least one.
    #[schemars(range(min = 1), extend("x-default-text" = "half the cores, at least one"))]
    pub long_running_lanes: Option<usize>,
    /// How much of each linear memory a freed instance-pool slot keeps resident, resetting in
    /// place only the pages its last instance wrote, so the next instance takes no page
    /// faults. Up to this much memory per slot in use stays resident; 0 gives every page back
    /// to the kernel after each invocation (slower, least memory). Default 16 MiB.
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub keep_resident_bytes: usize,
    /// How long shutdown waits for in-flight work.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub shutdown_grace: Duration,
    /// How long the whole drain at shutdown may take (in-flight work, acks, the final
    /// flush): past it the host gives up flushing, says how many deliveries it could not ack
    /// (they are redelivered and their claims answer), and exits non-zero.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub drain_timeout: Duration,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (for example `0.0.0.0:9464`);
    /// nothing is served when unset.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// How log lines are written to stderr: `text` for people, `json` for log shippers.
    pub log_format: LogFormat,
    /// How messages are acked once their outcome is recorded (each route's default; see
    /// `routes[].ack`): `plain` (default) or `confirmed`.
    pub ack: AckMode,
}

/// How log lines are written.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, with the message's route, key, attempt, fencing token,
    /// digest and trace id.
    Json,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            instance_id: None,
            concurrency: DEFAULT_CONCURRENCY,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            long_running_lanes: None,
            keep_resident_bytes: crate::runtime::engine::DEFAULT_KEEP_RESIDENT_BYTES,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            metrics_addr: None,
            log_format: LogFormat::Text,
            ack: AckMode::Plain,
        }
    }
}

/// The source stream and its durable pull consumer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// Stream name; created when missing, verified when present.
    pub stream: String,
    /// Subjects the stream captures (used when creating it; checked to cover every route).
    #[schemars(extend("x-default-text" = "the routes' subjects"))]
    pub subjects: Vec<String>,
    /// The stream's duplicate window for publishers' `Nats-Msg-Id`.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub duplicate_window: Duration,
    /// Durable consumer name; created or bound.
    pub consumer: String,
    /// How long the server waits for an ack (or progress) before redelivering.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub ack_wait: Duration,
    /// Most attempts per key, counted in the claim record across all hosts. The server's own
    /// bound on deliveries is `server_max_deliver`, far above this; infrastructure retries (an
    /// outage) count no attempt.
    #[schemars(range(min = 1))]
    pub max_deliver: u32,
    /// Nak delay for each failed attempt (the last entry repeats).
    #[serde(with = "crate::durations::list")]
    #[schemars(with = "Vec<crate::durations::Text>")]
    pub backoff: Vec<Duration>,
    /// Most unacknowledged messages the consumer hands out.
    pub max_ack_pending: i64,
    /// Stream replicas when the host creates the stream (1, 3 or 5; 3 on a cluster).
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub replicas: usize,
    /// The server-side bound on deliveries of one message. Far above `max_deliver`: the host
    /// counts attempts itself. It exists so that a message the client cannot even parse (a
    /// header that is not UTF-8, stored through a raw publish) stops being redelivered; when
    /// the server gives up, the host dead-letters the message from the stream.
    pub server_max_deliver: i64,
    /// `window` (default) or `forever`: with `forever` the stream keeps one message per
    /// subject and refuses a repeat at any later time; every route's key must then come from
    /// the subject (`orders.created.<order-id>`).
    pub dedup: DedupMode,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            stream: DEFAULT_STREAM.into(),
            subjects: Vec::new(),
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            consumer: DEFAULT_CONSUMER.into(),
            ack_wait: DEFAULT_ACK_WAIT,
            max_deliver: DEFAULT_MAX_DELIVER,
            backoff: vec![
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(30),
            ],
            max_ack_pending: 1_000,
            replicas: 1,
            server_max_deliver: DEFAULT_SERVER_MAX_DELIVER,
            dedup: DedupMode::Window,
        }
    }
}

/// Storage of the claim bucket or of an output stream.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// On disk (survives server restarts).
    #[default]
    File,
    /// In memory.
    Memory,
}

/// The claim bucket and lease timing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClaimsConfig {
    /// KV bucket name; created when missing. Never recreate it under running hosts. Default
    /// `dedup-claims-<source stream>` (`dedup-claims` on the default stream).
    #[schemars(extend("x-default-text" = "`dedup-claims-<source stream>`"))]
    pub bucket: String,
    /// How long the bucket keeps a claim record (it must outlive every redelivery of a key).
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub max_age: Duration,
    /// Bucket replicas (1, 3 or 5).
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub replicas: usize,
    /// Bucket storage.
    pub storage: Storage,
    /// How long a claim stays valid without renewal.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub lease: Duration,
    /// How often a running claim is renewed and the message's ack wait reset.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub heartbeat: Duration,
    /// Extra time past a lease's expiry before another host may reclaim it.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub clock_skew: Duration,
    /// How long a NATS outage or a paused host process may delay a run's effects, on top of
    /// the timing above; part of what every output stream's duplicate window must outlast.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub pause_margin: Duration,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        Self {
            bucket: DEFAULT_BUCKET.into(),
            max_age: DEFAULT_CLAIM_MAX_AGE,
            replicas: 1,
            storage: Storage::File,
            lease: DEFAULT_LEASE,
            heartbeat: DEFAULT_HEARTBEAT,
            clock_skew: DEFAULT_CLOCK_SKEW,
            pause_margin: DEFAULT_PAUSE_MARGIN,
        }
    }
}

/// Where permanently failed messages go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLetterConfig {
    /// Subject dead letters are published on. Default `dedup.dead.<source stream>`
    /// (`dedup.dead` on the default stream).
    #[schemars(extend("x-default-text" = "`dedup.dead.<source stream>`"))]
    pub subject: String,
    /// Stream capturing that subject; created when missing. Default `<source stream>_DEAD`
    /// (`DEDUP_DEAD` on the default stream).
    #[schemars(extend("x-default-text" = "`<source stream>_DEAD`"))]
    pub stream: String,
    /// The stream's duplicate window (dead letters carry deterministic ids): must exceed
    /// lease + clock skew + the largest backoff.
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub duplicate_window: Duration,
    /// Stream replicas when the host creates it (1, 3 or 5).
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub replicas: usize,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        Self {
            subject: DEFAULT_DEAD_LETTER_SUBJECT.into(),
            stream: DEFAULT_DEAD_LETTER_STREAM.into(),
            duplicate_window: DEFAULT_OUTPUT_DUPLICATE_WINDOW,
            replicas: 1,
        }
    }
}

/// A stream that captures handler outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputStreamConfig {
    /// Stream name.
    pub name: String,
    /// Subjects it captures (used when creating it).
    pub subjects: Vec<String>,
    /// Duplicate window; must exceed the longest gap between two runs of one key (lease,
    /// clock skew, the largest backoff, the pause margin and a run's wall limit: a config
    /// whose window is shorter is refused, naming the sum).
    #[serde(default = "default_output_window", with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub duplicate_window: Duration,
    /// Stream replicas when the host creates it (1, 3 or 5).
    #[serde(default = "one")]
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub replicas: usize,
    /// `window` (default) or `forever`: with `forever` the stream keeps one message per
    /// subject, so a re-run's output is refused at any later time (for handlers whose output
    /// subjects carry the event's identity, `ledger.entries.<transaction>`), and its duplicate
    /// window need not outlast a re-run.
    #[serde(default)]
    pub dedup: DedupMode,
    /// `window` (default) or `fenced`: a fenced stream also accepts atomic batches and holds,
    /// under `_dedup.claims.<name>.>`, the claim records of the routes with
    /// `effects = "fenced"` whose outputs it captures (downstream consumers filter on their
    /// own subjects). Its duplicate window plays no part for those routes.
    #[serde(default)]
    pub effects: EffectsMode,
    /// `file` (default) or `memory`, when the host creates it; `setup` reports a stream whose
    /// storage differs.
    #[serde(default)]
    pub storage: Storage,
}

fn one() -> usize {
    1
}

fn default_output_window() -> Duration {
    DEFAULT_OUTPUT_DUPLICATE_WINDOW
}

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// No config file was named.
    #[error("no config file: pass --config FILE (before or after the subcommand), or set DEDUP_HOST_CONFIG")]
    Missing,
    /// The file could not be read.
    #[error("config `{path}`: cannot read it: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config `{path}`: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the field and line.
        message: String,
    },
    /// The values are inconsistent; every problem is listed.
    #[error("config `{path}` has {} problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<Problem>,
    },
}

/// One problem in a configuration, with the field path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the field, e.g. `routes[0].subject`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.field, self.message)
    }
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, path, base)
    }

    /// Parses and validates configuration text; `path` names it in errors and `base_dir`
    /// resolves relative paths.
    pub fn parse(text: &str, path: &Path, base_dir: PathBuf) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        config.base_dir = base_dir;
        if let Ok(table) = text.parse::<toml::Table>() {
            config.derive_names(&table);
        }
        config.validate().map_err(|problems| ConfigError::Invalid {
            path: path.to_path_buf(),
            problems,
        })?;
        Ok(config)
    }

    /// Resolves a path from the file against the config's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// The component file route `r` is served from (its `component`, or its file in
    /// `components.dir`), or `None` when it is served from the object store.
    pub fn component_file(&self, r: &RouteConfig) -> Option<PathBuf> {
        if let Some(file) = &r.component {
            return Some(self.resolve(file));
        }
        self.components
            .dir
            .as_ref()
            .map(|dir| self.resolve(dir).join(format!("{}.wasm", r.name)))
    }

    /// Every subject the host consumes: the source stream's subjects, or the route filters
    /// when the stream's subjects are not given.
    pub fn source_subjects(&self) -> Vec<String> {
        if self.source.subjects.is_empty() {
            self.routes.iter().map(|r| r.subject.clone()).collect()
        } else {
            self.source.subjects.clone()
        }
    }
}
