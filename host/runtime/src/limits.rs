//! Per-invocation resource limits for guests.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default CPU-time deadline for one invocation.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// The default wall-clock limit of an invocation, in multiples of its CPU deadline: room for a
/// busy machine to stretch the guest's work, and a bound for a guest that waits instead of
/// computing (a sleep uses no CPU).
pub const WALL_FACTOR: u32 = 3;
/// Default cap on a guest's linear memory, per memory.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 << 20;
/// Default cap on table elements per table.
pub const DEFAULT_TABLE_ELEMENTS: u64 = 20_000;
/// Default cap on outputs per invocation.
pub const DEFAULT_MAX_OUTPUTS: usize = 1_000;
/// Most outputs of a fenced route's invocation: an atomic batch holds at most 1,000 messages,
/// one of them the claim record (`max_outputs` is lowered to this for fenced routes).
pub const MAX_FENCED_OUTPUTS: usize = 999;
/// Default cap on the summed payload and header bytes of all outputs of one invocation.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 8 << 20;
/// Default cap on log lines per invocation.
pub const DEFAULT_MAX_LOG_LINES: usize = 1_000;
/// Default cap on log bytes (messages plus fields) per invocation.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 256 << 10;
/// Default cap on core instances per invocation (a component is several core instances).
pub const DEFAULT_INSTANCES: usize = 64;
/// Default cap on linear memories per invocation.
pub const DEFAULT_MEMORIES: usize = 8;
/// Default cap on tables per invocation.
pub const DEFAULT_TABLES: usize = 16;

/// What one invocation of a guest may consume. Breaking any limit ends the invocation with a
/// trap outcome whose kind names the limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// CPU time the guest may use for instantiation plus the call, measured on the threads
    /// that run it and checked at every epoch tick (a busy machine stretches wall time, not
    /// the guest's own work).
    #[serde(with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub deadline: Duration,
    /// Wall-clock limit for instantiation plus the call, whatever the guest does with it
    /// (computing, sleeping, waiting in a host call); unset, 3 times `deadline`. It bounds
    /// how long one run can hold a key, so the duplicate-window rule counts it.
    #[serde(
        default,
        with = "crate::durations::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::durations::Text>")]
    #[schemars(extend("x-default-text" = "3 x `deadline`"))]
    pub wall: Option<Duration>,
    /// Fuel per invocation (about one unit per WebAssembly instruction): a deterministic CPU
    /// budget on top of the deadline. `None` (the default) leaves only the deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fuel: Option<u64>,
    /// Largest size a linear memory may grow to, in bytes.
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub memory_bytes: u64,
    /// Largest number of elements a table may grow to.
    pub table_elements: u64,
    /// Most core instances one invocation may create.
    pub instances: usize,
    /// Most linear memories one invocation may create.
    pub memories: usize,
    /// Most tables one invocation may create.
    pub tables: usize,
    /// Most outputs one invocation may return.
    pub max_outputs: usize,
    /// Most bytes (payloads, subjects and headers) all outputs of one invocation may carry.
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub max_output_bytes: u64,
    /// Most log lines one invocation may write.
    pub max_log_lines: usize,
    /// Most log bytes (messages and fields) one invocation may write.
    #[serde(deserialize_with = "crate::size::deserialize")]
    #[schemars(with = "crate::size::Text")]
    pub max_log_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            wall: None,
            fuel: None,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            table_elements: DEFAULT_TABLE_ELEMENTS,
            instances: DEFAULT_INSTANCES,
            memories: DEFAULT_MEMORIES,
            tables: DEFAULT_TABLES,
            max_outputs: DEFAULT_MAX_OUTPUTS,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_log_lines: DEFAULT_MAX_LOG_LINES,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
        }
    }
}

impl Limits {
    /// The wall-clock limit of one invocation: `wall`, or [`WALL_FACTOR`] times `deadline`.
    pub fn wall_limit(&self) -> Duration {
        self.wall.unwrap_or(self.deadline * WALL_FACTOR)
    }
}
