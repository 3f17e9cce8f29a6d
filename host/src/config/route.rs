//! A route: which subject it takes, where its keys come from, what its guest may do, and how
//! its messages are run (in parallel, or one per entity at a time).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{AckMode, ClaimMode, EffectsMode, HostConfig, DEFAULT_MAX_PAYLOAD};
use crate::limits::Limits;
use crate::runtime::TrapKind;

/// Where a route finds a message's idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum KeySource {
    /// A header's value.
    Header(String),
    /// A subject token, 0-based (`orders.<id>.created` -> 1).
    SubjectToken(usize),
    /// A JSON pointer into the payload (`/order/id`).
    JsonPointer(String),
}

impl Default for KeySource {
    fn default() -> Self {
        KeySource::Header("Nats-Msg-Id".into())
    }
}

/// What to do with a message that carries no idempotency key.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MissingKey {
    /// Dead-letter it with the reason, then terminate it.
    #[default]
    DeadLetter,
    /// Use the stream sequence as the key (dedups redeliveries, not republishes).
    StreamSequence,
}

/// One route: a subject filter and its handler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Route name: `[A-Za-z0-9_-]+`, unique. It prefixes claim keys and output ids.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub name: String,
    /// Subject filter (NATS wildcards allowed).
    pub subject: String,
    /// Path of the component (relative to the config file), watched for new versions. When
    /// unset, the component is object `<name>` of the `components.bucket` object store, and
    /// the route is served only while that object exists.
    #[serde(default)]
    pub component: Option<PathBuf>,
    /// Where the idempotency key comes from (default: the `Nats-Msg-Id` header).
    #[serde(default)]
    #[schemars(extend("x-default-text" = "`{ header = \"Nats-Msg-Id\" }`"))]
    pub key: KeySource,
    /// What to do when the key is missing.
    #[serde(default)]
    pub missing_key: MissingKey,
    /// Where the entity key comes from, for a route that works on one message per entity at
    /// a time, across every host, in publish order (same forms as `key`). None (the
    /// default): messages run in parallel whatever they concern.
    #[serde(default)]
    pub exclusive_by: Option<KeySource>,
    /// With `exclusive_by`: a message is skipped (completed without running) when a newer one
    /// of its entity is already waiting, so the handler sees the latest state.
    #[serde(default)]
    pub coalesce: bool,
    /// With `exclusive_by`: how many partitions the route's entities are spread over (each
    /// hands out up to 32 messages at once, one of an entity at a time), the same on every host: recorded in the route's contract on
    /// the server, never derived from a host's size (default 16).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1024), extend("x-default-text" = "16"))]
    pub partitions: Option<usize>,
    /// Largest payload accepted; bigger ones are dead-lettered.
    #[serde(default = "default_max_payload")]
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub max_payload_bytes: usize,
    /// Values the guest reads through the `config` import.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Resource limits of each invocation.
    #[serde(default)]
    #[schemars(extend("x-default-text" = "each key's default, below"))]
    pub limits: Limits,
    /// Trap kinds that fail a message at once instead of being retried, e.g.
    /// `["timeout", "memory"]` (names as in the claim record). `forbidden_output` always is.
    #[serde(default)]
    pub permanent_traps: Vec<TrapKind>,
    /// Subject filters the handler may publish outputs to (wildcards allowed). Empty (the
    /// default): no outputs at all. An output elsewhere fails its message permanently.
    #[serde(default)]
    pub allowed_outputs: Vec<String>,
    /// `window` (default): outputs are deduplicated by the receiving stream inside its
    /// duplicate window. `fenced`: outputs and completion are one atomic batch on the fenced
    /// output stream capturing every `allowed_outputs` filter, refused for a stale owner.
    #[serde(default)]
    pub effects: EffectsMode,
    /// `before` (default): claim under a lease, then run. `after`: run, publish, then create
    /// the key as completed (one write; only for cheap handlers with a deadline of at most
    /// 5 s).
    #[serde(default)]
    pub claim: ClaimMode,
    /// Outbound HTTP the handler may make (`wasi:http`), each call journaled under the claim
    /// so a re-run replays it instead of sending it again. None (the default): no HTTP at
    /// all; a component importing `wasi:http` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<crate::runtime::http::HttpConfig>,
    /// A directory the handler may read (not write), seen by the guest as `/data`.
    /// Relative to the config file. None by default: no files at all.
    #[serde(default)]
    pub read_only_dir: Option<PathBuf>,
    /// Guests of this route running at once; `host.concurrency` when unset.
    #[serde(default)]
    #[schemars(range(min = 1), extend("x-default-text" = "`host.concurrency`"))]
    pub concurrency: Option<usize>,
    /// Messages of this route in flight at once; `host.max_in_flight` when unset.
    #[serde(default)]
    #[schemars(range(min = 1), extend("x-default-text" = "`host.max_in_flight`"))]
    pub max_in_flight: Option<usize>,
    /// How this route's messages are acked once their outcome is recorded: `plain` or
    /// `confirmed`; `host.ack` when unset.
    #[serde(default)]
    #[schemars(extend("x-default-text" = "`host.ack`"))]
    pub ack: Option<AckMode>,
    /// Largest component accepted for this route, in bytes; a bigger one is refused before
    /// it is compiled (default 64 MiB; the Python runtime is about 18 MB).
    #[serde(default = "default_max_component_bytes")]
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub max_component_bytes: usize,
    /// Most CPU time a new component may take to compile (measured in CPU time, so a busy
    /// machine does not refuse it; wall time is bounded at ten times this); a slower one is
    /// refused (default 60s).
    #[serde(default = "default_compile_timeout", with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub compile_timeout: Duration,
}

/// Default partitions of an exclusive route.
pub const DEFAULT_PARTITIONS: usize = 16;
/// Most partitions an exclusive route may have.
pub const MAX_PARTITIONS: usize = 1024;

/// Default largest component a route accepts.
pub const DEFAULT_MAX_COMPONENT_BYTES: usize = 64 << 20;
/// Default bound on compiling one component.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(60);

fn default_max_component_bytes() -> usize {
    DEFAULT_MAX_COMPONENT_BYTES
}

fn default_compile_timeout() -> Duration {
    DEFAULT_COMPILE_TIMEOUT
}

impl RouteConfig {
    /// The partitions of an exclusive route: its `partitions`, or [`DEFAULT_PARTITIONS`].
    pub fn partitions(&self) -> usize {
        self.partitions.unwrap_or(DEFAULT_PARTITIONS).max(1)
    }

    /// Guests of this route running at once.
    pub fn concurrency(&self, host: &HostConfig) -> usize {
        self.concurrency.unwrap_or(host.concurrency)
    }

    /// Messages of this route in flight at once.
    pub fn max_in_flight(&self, host: &HostConfig) -> usize {
        self.max_in_flight.unwrap_or(host.max_in_flight)
    }

    /// How this route's messages are acked.
    pub fn ack(&self, host: &HostConfig) -> AckMode {
        self.ack.unwrap_or(host.ack)
    }
}

fn default_max_payload() -> usize {
    DEFAULT_MAX_PAYLOAD
}
