//! Test-only switches that each undo one fix, so that the simulation (`simulate --revert`,
//! `simulate --canaries`) and the integration tests can show what the fix prevents: the
//! reverted-fix canaries of `docs/src/how/simulation.md`.
//!
//! A switch is off unless the process sets [`ENV`] (a comma-separated list of [`Fix`] names)
//! or the simulation calls [`set`] on its thread. Checking one costs a thread-local read and
//! one atomic load.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Test-only: a comma-separated list of fix names (`Fix::name`) to revert in this process.
/// Never set in production: each name undoes a fix that keeps a guarantee.
pub const ENV: &str = "DEDUP_HOST_TEST_REVERT";

/// The former one-fix switch, still honoured: reverts [`Fix::AheadWait`].
pub const AHEAD_ENV: &str = "DEDUP_HOST_TEST_REVERT_AHEAD_WAIT";

macro_rules! fixes {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// One fix that a test-only switch can undo.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Fix {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Fix {
            /// Every fix with a switch, in the order of the table in `docs/src/how/simulation.md`.
            pub const ALL: &'static [Fix] = &[$(Fix::$variant,)*];

            /// The fix's name, as [`ENV`] and `simulate --revert` take it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Fix::$variant => $name,)*
                }
            }

            /// What reverting it does, one sentence (the first line of its doc comment).
            pub fn reverted_means(self) -> &'static str {
                match self {
                    $(Fix::$variant => first_line(&[$($doc,)*]),)*
                }
            }
        }
    };
}

fn first_line(docs: &[&'static str]) -> &'static str {
    docs.first().map_or("", |line| line.trim())
}

fixes! {
    // The seven findings of the first guarantees issue.
    /// 1: an exclusive route's partition count from the host's own size, not its contract.
    PartitionsFromContract = "partitions-from-contract",
    /// 2: a host serves a route whatever its recorded contract says (no contract check).
    /// `contract::judge` skips the comparison; the owner and consumer checks stay.
    ContractCheck = "contract-check",
    /// 3: a claim-after replay creates the key's record instead of replacing the failed one.
    ReplayReplaces = "replay-replaces",
    /// 4a: retries after an outage every second, with no outage backoff.
    /// Found since the end check counts a message the server gave up on at its default
    /// bound (the sweep letters it, which the other checks excuse).
    OutageBackoff = "outage-backoff",
    /// 4b: no stranded-message marker before a message's last delivery.
    /// (`marker::around`.)
    LastDeliveryMarker = "last-delivery-marker",
    /// 5: no per-output size check (every output passes `over_max_payload`).
    OutputSizeCheck = "output-size-check",
    /// 6: a coalesced key counts as completed at the claim.
    CoalescedNotCompleted = "coalesced-not-completed",
    /// 7: a write conflict loses the lease (a write that landed late is not adopted).
    LateWriteAdopted = "late-write-adopted",
    // Found by the simulation.
    /// A stale read after a write conflict loses the lease.
    StaleReadAfterConflict = "stale-read-after-conflict",
    /// A read that lags a replay's reset revision is taken as the key's state, not read again.
    ReplayResetRevision = "replay-reset-revision",
    /// A busy key's nak delay is capped below the outage backoff's ceiling.
    /// Found as [`Fix::OutageBackoff`] is: the copies' deliveries are spent.
    BusyDelayCoversOutage = "busy-delay-covers-outage",
    /// The settle order records the outcome before publishing the outputs.
    SettleOrder = "settle-order",
    /// A claim-before delivery that finds its key busy acks instead of naking.
    BusyNaks = "busy-naks",
    /// A claim-after delivery acks before its settled write.
    AfterAckOrder = "after-ack-order",
    /// The queue stage acks a source message before its copy is stored.
    QueueAckOrder = "queue-ack-order",
    /// The stranded-message marker is removed after a last delivery that did not end the message.
    MarkerKept = "marker-kept",
    /// A claim-after write that meets another delivery's publish-failed mark counts as a duplicate.
    PublishFailedMark = "publish-failed-mark",
    /// A queued message behind an earlier one of its entity still in the queue goes on to its claim.
    AheadWait = "ahead-wait",
    /// The outcome write is exempt from the lease's local expiry check.
    OutcomeWriteFenced = "outcome-write-fenced",
    /// A claim's lease is counted from when its answer came back, not from when it was sent.
    LeaseFromSend = "lease-from-send",
    // The findings of "Guarantees at the edges" (issue 42).
    /// 42.2: a rebind uses the config the host started with, not the live one.
    RebindLiveConfig = "rebind-live-config",
    /// 42.4: a deleted contract record lets a host record its own config again.
    DeletedContractStays = "deleted-contract-stays",
    /// 42.5: an output's size counts its own header names and values only (no `: `, CRLF or `NATS/1.0` framing), plus a fixed budget for the host's headers that an inherited trace context outgrows.
    WireSize = "wire-size",
    /// 42.6: a message is coalesced behind a newer sibling whose key will not run.
    CoalesceBehindRunnable = "coalesce-behind-runnable",
    /// 42.9: the duplicate window required of an output stream leaves out the outage backoff.
    WindowCoversOutage = "window-covers-outage",
    /// 42.10: the queue stage writes no stranded-message marker.
    QueueStageMarker = "queue-stage-marker",
    /// 42.10: a replay's reset holds for five deliveries only; a lagging read after that ends it.
    LaggingReplayRuns = "lagging-replay-runs",
    /// Group commit: a queued fenced commit is sent whenever its batch goes, even once its lease lapsed by the host's clock as it waited.
    /// (`group::run`; found by the simulation once it ran the host's committers: a host cut off waits out its request timeout.)
    GroupCommitLapse = "group-commit-lapse",
    /// 42.8: a claim runs the version chosen for its key now, not the one that began the key's effects.
    /// (`pinned::may_run`, claim before and after; a re-run after a partial publish may mix two versions' outputs.)
    PinnedVersion = "pinned-version",
    /// 42.8: window outputs go out with no mark of the version that began them (`Lease::begin_effects` only confirms the lease; a claim-after publish-failed mark names no version).
    EffectsMark = "effects-mark",
    /// 42.7: `setup --change-route` copies only settled records (create-only, no refusal of open window keys), and none across buckets.
    ChangeMovesClaims = "change-moves-claims",
    /// 42.3: a rename carries no claim records and its new consumer starts at the first retained message (`DeliverAll`), as a route renamed in the config did.
    RenameCarriesHistory = "rename-carries-history",
    /// A claim-after route is renamed while its consumer has messages delivered and not acknowledged (found by the simulation).
    RenameWaitsForClaimAfter = "rename-waits-for-claim-after",
    /// A claim-after route is renamed while the server gave up on a message of it not dead-lettered yet (a stranded-message marker stands for it), and its new consumer starts after the old one's ack floor rather than its last delivery: the sweep letters it, or the new consumer delivers it again, under the new name (found by the simulation, seed 14265 `--claim-after`).
    RenameWaitsForGivenUp = "rename-waits-for-given-up",
    /// A claim-after publish-failed mark counts the delivery as an attempt, which a claim-before route spends after `setup --change-route` (found by the simulation).
    MarkSpendsNoAttempt = "mark-spends-no-attempt",
    /// `setup --change-route` copies each claim record as listed, without fencing it in the old claim store first: a draining host's write still on its way lands there after the copy (found by the simulation).
    ChangeFencesClaims = "change-fences-claims",
    /// A claim-before delivery whose pinned version is not installed here is dead-lettered or given back before it is judged late or superseded (found by the simulation).
    /// (`before::run`; a stale copy of a settled message that reclaims a coalesced key after a promote dead-letters it.)
    PinnedAfterLate = "pinned-after-late",
    /// A delivery of a message that an earlier delivery of it coalesced reclaims the key and may run it, while that delivery's late ack lets the entity's next message start beside the run.
    /// (`Claimer::claim_message`; found by the simulation, seed 10901 `--fenced --coalesce`: a host paused past the ack wait between its coalesce write and its ack.)
    CoalescedMessageSettled = "coalesced-message-settled",
    /// `setup --change-route` from claim after to claim before goes ahead while the old contract's messages are delivered and not acknowledged, or given up and not dead-lettered yet.
    /// (`change::open_refuses`; found by the simulation, seed 26406 `--claim-after`: a run that published with its settled write lost ran again under claim before, on a version promoted meanwhile.)
    ChangeWaitsForClaimAfter = "change-waits-for-claim-after",
    /// A host takes every `MAX_DELIVERIES` advisory and sweeps every stranded-message marker of its claim bucket and streams, another deployment's too, and letters their messages under its own routes (or none); two deployments' markers of one message share a key.
    /// (`stranded::Marker::swept_by`, the advisory loop's consumer check; no seed: the simulation runs one deployment. Its test is `markers_per_deployment`.)
    MarkersPerDeployment = "markers-per-deployment",
    /// A host letters a given-up message of a route it does not serve, its config differing from the route's contract (a change not applied yet, hosts of mixed configs), under its own config's key, claim mode and effects.
    /// (`pipeline/undeliverable.rs`; no seed: the simulation's hosts share one config. Its test is `letter_where_served`.)
    LetterWhereServed = "letter-where-served",
    // The copier of an exclusive route (issue 44).
    /// 44: a copier's takeover copies nothing the last copier left (its ack floor to its last delivery) before its own deliveries.
    CopierRange = "copier-range",
}

/// Unset: [`ENV`] not read yet.
const UNREAD: u64 = u64::MAX;

static REVERTED: AtomicU64 = AtomicU64::new(UNREAD);

thread_local! {
    /// What [`set`] chose for this thread, over [`ENV`].
    static ON_THIS_THREAD: Cell<Option<u64>> = const { Cell::new(None) };
}

impl Fix {
    /// The fix named `name`, if any.
    pub fn parse(name: &str) -> Option<Fix> {
        Fix::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// Its bit in a mask: its place in [`Fix::ALL`], which lists the variants in declaration
    /// order (checked by a unit test).
    fn bit(self) -> u64 {
        1 << (self as u64)
    }
}

/// Whether `fix` is reverted on this thread (test-only).
pub fn reverted(fix: Fix) -> bool {
    if let Some(mask) = ON_THIS_THREAD.with(Cell::get) {
        return mask & fix.bit() != 0;
    }
    let mut mask = REVERTED.load(Ordering::Relaxed);
    if mask == UNREAD {
        mask = from_env();
        REVERTED.store(mask, Ordering::Relaxed);
    }
    mask & fix.bit() != 0
}

/// The fixes reverted on this thread (what a host logs at start: never empty in production).
pub fn active() -> Vec<Fix> {
    Fix::ALL.iter().copied().filter(|f| reverted(*f)).collect()
}

/// Reverts exactly `fixes` from now on, on this thread only, whatever [`ENV`] says
/// (test-only: the simulation runs every host on one thread, and sets it between runs).
pub fn set(fixes: &[Fix]) {
    let mask = fixes.iter().fold(0, |m, f| m | f.bit());
    ON_THIS_THREAD.with(|on| on.set(Some(mask)));
}

fn from_env() -> u64 {
    let mut mask = 0;
    if std::env::var_os(AHEAD_ENV).is_some() {
        mask |= Fix::AheadWait.bit();
    }
    if let Ok(names) = std::env::var(ENV) {
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match Fix::parse(name) {
                Some(f) => mask |= f.bit(),
                None => tracing::error!("{ENV}: no fix is named `{name}`; ignored"),
            }
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fix_has_a_distinct_name_and_a_bit_and_a_sentence() {
        assert!(Fix::ALL.len() < 64);
        for (i, f) in Fix::ALL.iter().enumerate() {
            assert_eq!(Fix::parse(f.name()), Some(*f));
            assert_eq!(f.bit(), 1 << i, "{f:?} is not in ALL at its declared place");
            assert!(!f.reverted_means().is_empty(), "{f:?}");
        }
    }

    #[test]
    fn a_switch_set_on_one_thread_leaves_the_others_alone() {
        set(&[Fix::SettleOrder]);
        // The other thread reads the environment: only meaningful where it names no fix.
        let env_clean = std::env::var_os(ENV).is_none() && std::env::var_os(AHEAD_ENV).is_none();
        assert!(reverted(Fix::SettleOrder));
        assert!(!reverted(Fix::BusyNaks));
        let elsewhere = std::thread::spawn(|| reverted(Fix::SettleOrder)).join();
        assert!(!elsewhere.expect("thread") || !env_clean);
        set(&[]);
        assert!(!reverted(Fix::SettleOrder));
    }
}
