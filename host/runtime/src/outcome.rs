//! What one invocation of a guest produced.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bindings::{Level, Output};

/// The result of running one event through a guest.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The handler succeeded; the host publishes these outputs, in order.
    Success(Vec<Output>),
    /// The handler asked to be run again later.
    Retry {
        /// The handler's reason.
        reason: String,
        /// The handler's requested delay, if any.
        delay: Option<Duration>,
    },
    /// The handler refused the message permanently.
    Reject {
        /// The handler's reason.
        reason: String,
    },
    /// The guest trapped or broke a limit: its instance was discarded and nothing it produced
    /// is used.
    Trap(Trap),
}

impl Outcome {
    /// A short lowercase name for the outcome kind: `success`, `retry`, `reject` or `trap`.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Success(_) => "success",
            Outcome::Retry { .. } => "retry",
            Outcome::Reject { .. } => "reject",
            Outcome::Trap(_) => "trap",
        }
    }

    /// The failure reason, or `None` for a success.
    pub fn reason(&self) -> Option<String> {
        match self {
            Outcome::Success(_) => None,
            Outcome::Retry { reason, .. } | Outcome::Reject { reason } => Some(reason.clone()),
            Outcome::Trap(trap) => Some(trap.to_string()),
        }
    }
}

/// Why a guest's instance was discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrapKind {
    /// The guest ran past its wall-clock deadline.
    Timeout,
    /// The guest used up its fuel budget.
    Fuel,
    /// The guest tried to grow a memory or table past its limit.
    Memory,
    /// The guest exhausted its call stack.
    StackOverflow,
    /// The guest returned more outputs, or bigger ones, than allowed.
    OutputLimit,
    /// The guest returned an output on a subject its route does not allow. Always permanent:
    /// running the same code again would do the same.
    ForbiddenOutput,
    /// The guest logged more than allowed.
    LogLimit,
    /// The guest trapped by itself: a panic, `unreachable`, an invalid memory access, ...
    Guest,
    /// The host could not instantiate the component (its start code trapped, or it needs more
    /// instances, memories or tables than its route allows).
    Instantiate,
    /// The host's instance pool had no room at that moment. An infrastructure condition, not
    /// the guest's fault: the message is retried later without counting an attempt.
    PoolFull,
}

impl TrapKind {
    /// A short name used in reasons and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::Timeout => "timeout",
            TrapKind::Fuel => "fuel exhausted",
            TrapKind::Memory => "memory limit",
            TrapKind::StackOverflow => "stack overflow",
            TrapKind::OutputLimit => "output limit",
            TrapKind::ForbiddenOutput => "forbidden output",
            TrapKind::LogLimit => "log limit",
            TrapKind::Guest => "guest trap",
            TrapKind::Instantiate => "instantiation failed",
            TrapKind::PoolFull => "instance pool full",
        }
    }
}

/// A trapped invocation: which limit or fault, and the details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trap {
    /// The class of trap.
    pub kind: TrapKind,
    /// Human-readable details (the trap message, the guest's panic message, the limit).
    pub message: String,
}

impl fmt::Display for Trap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

/// One line a guest logged through the `log` import.
#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    /// Severity, lowercase (`trace` .. `error`).
    pub level: &'static str,
    /// The message.
    pub message: String,
    /// Extra key/value pairs.
    pub fields: Vec<(String, String)>,
}

/// Everything one invocation produced.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The outcome.
    pub outcome: Outcome,
    /// The lines the guest logged, in order (up to the log budget).
    pub logs: Vec<LogLine>,
    /// Wall-clock time of instantiation plus the call.
    pub elapsed: Duration,
    /// The part of `elapsed` spent setting up the store and instantiating.
    pub instantiate: Duration,
    /// Fuel the guest consumed, when fuel is metered.
    pub fuel: Option<u64>,
    /// The largest linear memory the guest grew to, in bytes.
    pub memory_bytes: u64,
    /// The outbound HTTP requests the guest made, in call order (empty without
    /// `wasi:http`): what a shadow run's comparison shows.
    pub calls: Vec<dedup_delivery::journal::CallRequest>,
}

/// The lowercase name of a log level.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}
