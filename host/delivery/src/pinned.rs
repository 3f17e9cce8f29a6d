//! Which version runs a claimed key (issue 42, finding 8). A canary picks a version per key,
//! but a split change, a rollback, a promotion or a deploy can move a key to another version
//! between two runs of it. Window outputs go out one by one with ids `<claim key>#<index>`
//! whatever the version, so a re-run on another version after a partial publish would mix two
//! versions' effects (an output at the same index dropped as a duplicate, one to another
//! stream stored twice).
//!
//! So before the first window output leaves the host, the claim record names the version that
//! begins the key's effects ([`Lease::begin_effects`](crate::claim::Lease::begin_effects)), and
//! every later claim of the key runs that version ([`version`]): the one installed here, or,
//! when it is not ([`missing`]), the key is given back while that version is still offered to
//! the route's hosts (this host loads it soon) and dead-lettered once it is gone for good
//! (rolled back, promoted away, replaced), never finished by another version in silence.
//!
//! The host decides with these functions over its routes and components bucket
//! (`host/src/pipeline/pinned.rs`), the simulation over its model's versions. A claim-before
//! delivery whose pinned version is not installed here ([`Gone`]) is settled by
//! [`settle_missing`] from [`crate::before::run`], only once the delivery is known to be
//! not superseded: those are settled without running any version.

use std::time::Duration;

use crate::outcome::MessageOutcome;
use crate::revert::{reverted, Fix};
use crate::settle::{self, Settling};

/// The longest nak delay of a key pinned to a version this host has not loaded
/// ([`not_loaded_ceiling`]).
pub const NOT_LOADED_RETRY_MAX: Duration = Duration::from_secs(10);

/// The nak delay ceiling of the `delivered`-th delivery of a key pinned to a version that is
/// offered but not loaded on this host: the outage backoff of its deliveries
/// ([`infra_retry_ceiling`](crate::backoff::infra_retry_ceiling)), 1 s at first (about the
/// time a host takes to notice and compile a new version), doubling up to
/// [`NOT_LOADED_RETRY_MAX`]. A version this host cannot load (it fails to compile here, or its
/// file here differs) never loads: each retry costs a claim and a release (two KV writes) and
/// a warning, and must not come every second forever.
pub fn not_loaded_ceiling(delivered: u64) -> Duration {
    crate::backoff::infra_retry_ceiling(delivered).min(NOT_LOADED_RETRY_MAX)
}

/// Whether a run of version `chosen` may take a key whose record names `began` as the
/// version that began its effects (none: any version may). A claim-after delivery runs only
/// its own version, so this is its whole test ([`crate::after`]).
///
/// With [`Fix::PinnedVersion`] reverted (test-only), any version may, as before the fix.
pub fn may_run(chosen: &str, began: Option<&str>) -> bool {
    began.is_none_or(|b| b == chosen) || reverted(Fix::PinnedVersion)
}

/// The version a claim runs ([`version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned<G> {
    /// Run this one: the version chosen for the key, or the one its claim names, installed here.
    Run(G),
    /// The version the claim names (it may have begun the key's effects) is not installed
    /// here: the chosen version, returned for the caller's logs; do not run it ([`missing`]).
    Gone(G),
}

/// The version a claim runs when the pipeline chose `chosen` (whose digest `digest_of` reads)
/// and the claim names version `claimed` (the version that began the key's effects, if one
/// did; else the chosen one): `chosen` when they agree, else the claimed version if
/// `installed` finds it on this host, else [`Pinned::Gone`].
///
/// With [`Fix::PinnedVersion`] reverted (test-only), always `chosen`, as before the fix.
pub fn version<G>(
    chosen: G,
    digest_of: impl Fn(&G) -> &str,
    claimed: &str,
    installed: impl FnOnce(&str) -> Option<G>,
) -> Pinned<G> {
    if may_run(digest_of(&chosen), Some(claimed)) {
        return Pinned::Run(chosen);
    }
    match installed(claimed) {
        Some(pinned) => Pinned::Run(pinned),
        None => Pinned::Gone(chosen),
    }
}

/// What becomes of a claim whose pinned version is not installed here ([`Pinned::Gone`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// The version is gone for good: dead-letter the key ([`gone`] says why).
    Letter,
    /// Still offered to the route's hosts, not loaded here yet: give the key back, uncounted,
    /// after a delay jittered below `ceiling`.
    NotLoaded {
        /// Why, for the record.
        why: String,
        /// The nak delay's ceiling ([`not_loaded_ceiling`]).
        ceiling: Duration,
    },
    /// Whether it is still offered could not be read: give the key back after the outage
    /// backoff.
    Unknown {
        /// Why, for the record.
        why: String,
    },
}

/// What becomes of the `delivered`-th delivery of a key pinned to version `digest`, not
/// installed on this host, when reading whether the route's hosts are still offered that
/// version gave `offered`.
pub fn missing(digest: &str, offered: Result<bool, String>, delivered: u64) -> Missing {
    match offered {
        Ok(false) => Missing::Letter,
        Ok(true) => Missing::NotLoaded {
            why: format!(
                "version {digest}, which began this key's effects, is not loaded on this host yet"
            ),
            ceiling: not_loaded_ceiling(delivered),
        },
        Err(e) => Missing::Unknown {
            why: format!("cannot tell whether version {digest}, which began this key's effects, is still installed: {e}"),
        },
    }
}

/// A claim-before delivery whose claim names a version not installed on this host
/// ([`Pinned::Gone`]): it does not run; [`settle_missing`] settles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// The version the claim names (the one that may have begun the key's effects).
    pub digest: String,
    /// Why the key is dead-lettered if that version is gone for good ([`gone`]).
    pub reason: String,
    /// How many times the server delivered the message (this delivery included).
    pub delivered: u64,
}

/// Settles claim-before delivery `gone` (in `t`), whose pinned version is not installed
/// here, as [`missing`] decides from `offered` (whether the route's hosts are still offered
/// that version): dead-lettered, or given back uncounted after a delay that `jittered` draws
/// below the ceiling, or after the outage backoff.
pub async fn settle_missing<T: Settling>(
    t: &T,
    gone: &Gone,
    offered: Result<bool, String>,
    jittered: impl FnOnce(Duration) -> Duration,
) -> MessageOutcome {
    match missing(&gone.digest, offered, gone.delivered) {
        Missing::Letter => settle::give_up(t, &gone.reason).await,
        Missing::NotLoaded { why, ceiling } => {
            settle::release_after(t, &why, jittered(ceiling)).await
        }
        Missing::Unknown { why } => settle::release(t, &why).await,
    }
}

/// Why key `key` of `route` is not run: the version that may have begun its effects,
/// `digest`, is no longer installed.
pub fn gone(route: &str, key: &str, digest: &str) -> String {
    format!(
        "key `{key}` of route `{route}`: version {digest} may have published some of its outputs already and is no longer installed (rolled back, promoted away or replaced), so no other version runs it; to finish it with that version, install it again (as the live version or a canary) and replay this letter; to run it on the current version, accepting that outputs already stored stay, delete the claim key (see `Dedup-Claim-Key`) and replay"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_pinned_to_a_version_not_loaded_here_backs_off_with_its_deliveries() {
        assert_eq!(not_loaded_ceiling(1), Duration::from_secs(1));
        assert_eq!(not_loaded_ceiling(2), Duration::from_secs(2));
        assert_eq!(not_loaded_ceiling(4), Duration::from_secs(8));
        for delivered in 1..200 {
            assert!(not_loaded_ceiling(delivered + 1) >= not_loaded_ceiling(delivered));
            assert!(not_loaded_ceiling(delivered) <= NOT_LOADED_RETRY_MAX);
        }
        assert_eq!(not_loaded_ceiling(100), NOT_LOADED_RETRY_MAX);
        // 100 deliveries last over 40 minutes, not 100 seconds.
        let total: Duration = (1..=100)
            .map(|d| crate::backoff::jittered(not_loaded_ceiling(d), 0.0))
            .sum();
        assert!(total > Duration::from_secs(6 * 60), "{total:?}");
    }

    #[test]
    fn a_claim_runs_the_version_that_began_its_key_or_none() {
        let installed = |d: &str| (d == "v2").then(|| d.to_string());
        let run = |chosen: &str, claimed: &str| {
            version(chosen.to_string(), String::as_str, claimed, installed)
        };
        assert_eq!(run("v1", "v1"), Pinned::Run("v1".into()));
        assert_eq!(run("v1", "v2"), Pinned::Run("v2".into()));
        assert_eq!(run("v1", "v3"), Pinned::Gone("v1".into()));
        assert_eq!(missing("v3", Ok(false), 1), Missing::Letter);
        assert!(
            matches!(missing("v3", Ok(true), 3), Missing::NotLoaded { ceiling, .. } if ceiling == not_loaded_ceiling(3))
        );
        assert!(
            matches!(missing("v3", Err("down".into()), 1), Missing::Unknown { why } if why.contains("down"))
        );
        let reason = gone("r", "k", "v3");
        assert!(
            reason.contains("`k`") && reason.contains("v3") && reason.contains("install it again")
        );
    }
}
