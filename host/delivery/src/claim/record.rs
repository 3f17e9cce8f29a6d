//! The claim record stored under each key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Where a key is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    /// An owner is running the handler under a lease.
    InProgress,
    /// The handler succeeded and its outputs were published.
    Completed,
    /// The last attempt failed; `permanent` says whether it may be retried.
    Failed,
}

/// Where one output was stored, as its publish acknowledgement said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRef {
    /// The stream that captured it.
    pub stream: String,
    /// Its sequence there (for a duplicate, the sequence of the copy stored first).
    pub sequence: u64,
    /// Whether the stream reported it as a duplicate of one already stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// The value of one claim key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// State of the key.
    pub state: ClaimState,
    /// Instance id of the host that wrote the record.
    pub owner: String,
    /// Random per claim attempt: tells this host's own timed-out create from someone else's.
    pub nonce: u64,
    /// Attempts so far (1 for the first claim), across every host.
    pub attempt: u32,
    /// Unix milliseconds when the lease lapses (in progress only).
    pub lease_expires_ms: u64,
    /// Digest of the component that ran (or runs).
    pub digest: String,
    /// The version (component digest) whose window outputs may already be stored for this
    /// key: written before its first output is published, and kept by every later record.
    /// A re-run runs this version or, when it is no longer installed, none (dead-lettered):
    /// one key's effects never mix two versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects_by: Option<String>,
    /// Window outputs of this key may be stored by a version nobody recorded (a claim-after
    /// key, which has no record while it runs, whose publish failed part-way, or that the
    /// server gave up delivering): it blocks what [`ClaimRecord::effects_by`] blocks (a
    /// change to fenced effects, a rename) without choosing the version a re-run runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown_effects: bool,
    /// The claim key this key's outputs were published under, when not the key the record
    /// is stored under: `setup --rename-route` carries completed records to the new route's
    /// keys, and their outputs keep their ids (the old claim key + `#index`). `None`: its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_as: Option<String>,
    /// The claim key this key's outbound calls take their idempotency keys from
    /// (`<calls_as>.call.<index>`, DESIGN.md rule 24), when not the key the record is stored
    /// under: `setup --rename-route` sets it to the old route's claim key (a key renamed
    /// twice keeps the first), and every later claim of the key carries it on, so a call
    /// sent under the old name and sent again under the new one (its dead letter replayed)
    /// carries the key the provider saw. `None`: its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_as: Option<String>,
    /// Why the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A failure that will never be retried (rejected or out of attempts; dead-lettered).
    #[serde(default)]
    pub permanent: bool,
    /// Unix milliseconds before which a failed key is not run again (its backoff): a second
    /// delivery of the key meanwhile is answered Busy instead of running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<u64>,
    /// The fencing token of the claim that wrote this record (the revision that won it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    /// The source stream sequence of the message whose run wrote this record (an exclusive
    /// route's original, not its queue copy), so `inspect` finds it without reading the
    /// stream. `None` in records written without one (older hosts, operator tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_sequence: Option<u64>,
    /// Where each output of a completed key was stored, in output order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputRef>,
    /// Completed by a fenced commit: this many outputs were stored in the same atomic batch,
    /// at the sequences right before this record's own in the same stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_outputs: Option<u32>,
    /// Unix milliseconds of the first claim.
    pub created_ms: u64,
    /// Unix milliseconds of this write.
    pub updated_ms: u64,
}

impl ClaimRecord {
    /// Serializes to the stored JSON.
    pub fn to_bytes(&self) -> bytes::Bytes {
        // Sized for a record with a few outputs, so it is written without growing.
        let mut out = Vec::with_capacity(320);
        serde_json::to_writer(&mut out, self).expect("claim record serializes");
        out.into()
    }

    /// Parses stored JSON.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Whether the key was completed without running because a newer message of its entity
    /// was waiting (`coalesce`): a later message with the same key runs (it is the newest).
    pub fn is_coalesced(&self) -> bool {
        self.state == ClaimState::Completed && self.reason.as_deref() == Some(COALESCED_REASON)
    }

    /// Whether window outputs of this key may be stored ([`ClaimRecord::effects_by`] or
    /// [`ClaimRecord::unknown_effects`]).
    pub fn may_have_effects(&self) -> bool {
        self.effects_by.is_some() || self.unknown_effects
    }

    /// The claim key this key's outputs were published under, the record being stored under
    /// `claim_key` ([`ClaimRecord::outputs_as`]).
    pub fn outputs_key<'a>(&'a self, claim_key: &'a str) -> &'a str {
        self.outputs_as.as_deref().unwrap_or(claim_key)
    }

    /// The claim key this key's outbound calls derive their idempotency keys from, the
    /// record being stored under `claim_key` ([`ClaimRecord::calls_as`]).
    pub fn calls_key<'a>(&'a self, claim_key: &'a str) -> &'a str {
        self.calls_as.as_deref().unwrap_or(claim_key)
    }

    /// Whether a dead-letter replay may reset this record: failed for good, or reset by an
    /// earlier replay whose publish did not happen.
    pub fn replayable(&self) -> bool {
        self.state == ClaimState::Failed
            && (self.permanent
                || self
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(REPLAY_REASON)))
    }

    /// Marks a key failed for good after its window outputs may have been stored as accepted
    /// by the operator with `--accept-dead` of `change` (the command, e.g. `setup
    /// --change-route R`): it moves as it is, and a dead-letter replay refuses it unless
    /// forced. The mark lives in the reason, ahead of the failure's own.
    pub fn accept_dead(&mut self, change: &str) {
        if self.is_accepted_dead() {
            return;
        }
        let was = self.reason.as_deref().unwrap_or("no reason recorded");
        self.reason = Some(format!("{ACCEPTED_DEAD_REASON} ({change}); {was}"));
    }

    /// Whether the operator accepted this dead-lettered key as settled ([`Self::accept_dead`]).
    pub fn is_accepted_dead(&self) -> bool {
        self.state == ClaimState::Failed
            && self.permanent
            && self
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(ACCEPTED_DEAD_REASON))
    }

    /// Resets the record so the key runs again (attempt 1) when dead letter `letter` is
    /// replayed: failed, not for good, no backoff, marked as a replay's.
    pub fn reset_for_replay(&mut self, letter: u64) {
        self.state = ClaimState::Failed;
        self.permanent = false;
        self.attempt = 0;
        self.retry_at_ms = None;
        self.reason = Some(format!("{REPLAY_REASON} {letter}"));
        self.updated_ms = now_ms();
    }

    /// Whether another host may take the key over now: in progress, but the lease plus the
    /// clock-skew margin has passed.
    pub fn lease_lapsed(&self, now_ms: u64, skew: Duration) -> bool {
        self.state == ClaimState::InProgress
            && now_ms
                > self
                    .lease_expires_ms
                    .saturating_add(skew.as_millis() as u64)
    }
}

/// How many times a read that lags a known revision is repeated before the caller is told to
/// come back later.
pub const STALE_READS: u32 = 3;

/// The header of a replayed message naming the revision at which the replay reset its key:
/// a read of the key below it is stale. Only the replay command sets it: a host honours it
/// only on a message the dead-letter stream proves a replay of its key and whose reset the
/// claim store's leader holds (`pipeline/reset.rs`), on every delivery.
pub const RESET_REVISION: &str = "Dedup-Reset-Revision";

/// The revision delivery number `delivered` of a message reads its key against: `reset`, the
/// revision a proven replay reset the key at ([`RESET_REVISION`]; 0: none), on every delivery,
/// however long a replica lags (issue 42, finding 10). With [`Fix::LaggingReplayRuns`]
/// reverted (test-only), only on the first five deliveries, as before that fix.
///
/// [`Fix::LaggingReplayRuns`]: crate::revert::Fix::LaggingReplayRuns
pub fn fresh_from(reset: u64, delivered: u64) -> u64 {
    use crate::revert::{reverted, Fix};
    match delivered > 5 && reverted(Fix::LaggingReplayRuns) {
        true => 0,
        false => reset,
    }
}

/// The reason a replay writes into the claim record it resets.
pub const REPLAY_REASON: &str = "replay of dead letter";

/// The start of the reason of a key the operator accepted as settled though dead-lettered
/// after its window outputs may have been stored ([`ClaimRecord::accept_dead`]).
pub const ACCEPTED_DEAD_REASON: &str = "accepted as settled with --accept-dead";

/// The reason of a key completed without running by a coalescing route.
pub const COALESCED_REASON: &str = "coalesced: a newer message of its entity was waiting";

/// The current wall-clock time in Unix milliseconds: the one clock of the claim protocol
/// (leases, backoffs, lease freshness), so a simulation can replace it ([`virtual_clock`]).
pub fn now_ms() -> u64 {
    if let Some(now) = virtual_clock::now() {
        return now;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A clock the fault simulation (`tests/src/sim`) sets for the thread it runs on: virtual
/// time, plus the skew of the simulated host being polled. Unset (always, outside the
/// simulation) it costs one thread-local read per [`now_ms`].
pub mod virtual_clock {
    use std::cell::Cell;

    thread_local! {
        static NOW: Cell<Option<u64>> = const { Cell::new(None) };
    }

    /// The virtual time, if this thread has one.
    pub fn now() -> Option<u64> {
        NOW.with(Cell::get)
    }

    /// Milliseconds on a clock that never goes back (the virtual time in a simulation, else
    /// time since the process's first read): for how long ago a write was, which a wall-clock
    /// step backwards must not stretch.
    pub fn monotonic_ms() -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        now().unwrap_or_else(|| {
            START
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_millis() as u64
        })
    }

    /// Sets (or, with `None`, removes) this thread's virtual time, in Unix milliseconds.
    pub fn set(now_ms: Option<u64>) {
        NOW.with(|c| c.set(now_ms));
    }
}

/// A record of `state` owned by `h1`, every other field empty: the unit tests' fixture.
#[cfg(test)]
pub(crate) fn sample(state: ClaimState, permanent: bool) -> ClaimRecord {
    ClaimRecord {
        state,
        owner: "h1".into(),
        nonce: 0,
        attempt: 1,
        lease_expires_ms: 0,
        digest: String::new(),
        effects_by: None,
        unknown_effects: false,
        outputs_as: None,
        calls_as: None,
        reason: None,
        permanent,
        retry_at_ms: None,
        fencing_token: None,
        source_sequence: None,
        outputs: Vec::new(),
        batch_outputs: None,
        created_ms: 0,
        updated_ms: 0,
    }
}
