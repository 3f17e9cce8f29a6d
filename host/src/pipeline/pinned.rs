//! Which version runs a claimed key. A canary picks a version per key (a stable hash of
//! the key, [`crate::candidate::canary`]), but a split change, a rollback, a promotion or a
//! deploy can move a key to another version between two runs of it. Window outputs go out
//! one by one with ids `<claim key>#<index>` whatever the version, so a re-run on another
//! version after a partial publish would mix two versions' effects (an output at the same
//! index dropped as a duplicate, one to another stream stored twice).
//!
//! So before the first window output leaves the host, the claim record names the version
//! that begins the key's effects
//! ([`ClaimRecord::effects_by`](crate::claim::record::ClaimRecord::effects_by), one
//! revision-checked write that also confirms the lease); every later claim of the key runs
//! that version, and when it is no longer installed the key is dead-lettered, never run by
//! another version in silence. A run that fails before publishing (a retry, a trap, a host
//! that died mid-guest) leaves no mark: its re-run may take any version. Fenced outputs need
//! no mark: they are stored with the completed record in one atomic batch, or not at all.


use super::Shared;
use crate::claim::ClaimStore;
use crate::routes::{Guest, Route};

/// The installed version of `route` whose digest is `digest`: the live one or its
/// candidate (even one this host has decided to roll back or promote: it is still loaded).
pub(super) fn installed(route: &Route, digest: &str) -> Option<Guest> {
    if let Some(live) = route.guest().filter(|g| g.digest() == digest) {
        return Some(live);
    }
    let candidate = route.candidate().filter(|c| c.digest() == digest)?;
    Some(Guest::Wasm(candidate.handler.clone()))
}

impl<S: ClaimStore> Shared<S> {
    /// The version a claim of `route`'s key `key` runs: see [`version`].
    pub(super) fn pinned_version(
        &self,
        route: &Route,
        key: &str,
        chosen: Guest,
        claimed: &str,
    ) -> (Guest, Option<String>) {
        version(route, key, chosen, claimed)
    }
}

/// The version a claim of `route`'s key `key` runs when the claim names version `claimed`
/// and the pipeline chose `chosen`: `chosen` when they agree, else the claimed version if
/// installed. Otherwise `chosen` with the reason to dead-letter the key instead of running it.
pub(super) fn version(
    route: &Route,
    key: &str,
    chosen: Guest,
    claimed: &str,
) -> (Guest, Option<String>) {
    if chosen.digest() == claimed {
        return (chosen, None);
    }
    match installed(route, claimed) {
        Some(pinned) => (pinned, None),
        None => (chosen, Some(gone(&route.name, key, claimed))),
    }
}

/// Why key `key` of `route` is not run: the version that may have begun its effects,
/// `digest`, is no longer installed.
pub(super) fn gone(route: &str, key: &str, digest: &str) -> String {
    format!(
        "key `{key}` of route `{route}`: version {digest} may have published some of its outputs already and is no longer installed (rolled back, promoted away or replaced), so no other version runs it; to finish it with that version, install it again (as the live version or a canary) and replay this letter; to run it on the current version, accepting that outputs already stored stay, delete the claim key (see `Dedup-Claim-Key`) and replay"
    )
}
