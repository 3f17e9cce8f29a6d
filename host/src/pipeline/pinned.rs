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
//! that version. A host that has not loaded it yet (another host installed it a moment ago)
//! gives the key back and naks it; once the version is gone for good (rolled back, removed,
//! replaced) the key is dead-lettered, never run by another version in silence. A run that fails before publishing (a retry, a trap, a host
//! that died mid-guest) leaves no mark: its re-run may take any version. Fenced outputs need
//! no mark: they are stored with the completed record in one atomic batch, or not at all.

use std::path::Path;
use std::time::Duration;

use super::message::Claimed;
use super::Shared;
use crate::candidate::{files, store as candidates};
use crate::claim::ClaimStore;
use crate::routes::{Guest, Route};

/// The longest nak delay of a key pinned to a version this host has not loaded ([`not_loaded_ceiling`]).
const NOT_LOADED_RETRY_MAX: Duration = Duration::from_secs(10);

/// The nak delay ceiling of the `delivered`-th delivery of a key pinned to a version that is
/// offered but not loaded on this host: the outage backoff of its deliveries
/// ([`infra_retry_ceiling`](dedup_delivery::backoff::infra_retry_ceiling)), 1 s at first
/// (about the time a host takes to notice and compile a new version), doubling up to
/// [`NOT_LOADED_RETRY_MAX`]. A version this host cannot load (it fails to compile here, or
/// its file here differs) never loads: each retry costs a claim and a release (two KV
/// writes) and a warning, and must not come every second forever.
fn not_loaded_ceiling(delivered: u64) -> Duration {
    dedup_delivery::backoff::infra_retry_ceiling(delivered).min(NOT_LOADED_RETRY_MAX)
}

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

    /// Settles claim `c`, whose pinned version is not installed on this host (`reason` from
    /// [`gone`]): given back and naked while that version is still offered to the route's
    /// hosts (this host loads it soon), dead-lettered once it is gone for good.
    pub(super) async fn pinned_missing(&self, c: &Claimed<'_, S>, reason: &str) {
        let digest = c.lease.digest().await;
        match self.offered(c.route, &digest).await {
            Ok(false) => self.give_up(c, reason).await,
            Ok(true) => {
                let why = format!("version {digest}, which began this key's effects, is not loaded on this host yet");
                let ceiling = not_loaded_ceiling(c.d.delivered);
                let delay =
                    dedup_delivery::backoff::jittered(ceiling, rand::random_range(0.0..=1.0));
                self.release_after(c, &why, delay).await
            }
            Err(e) => {
                let why = format!("cannot tell whether version {digest}, which began this key's effects, is still installed: {e:#}");
                self.release(c, &why).await
            }
        }
    }

    /// Whether version `digest` is still offered to `route`'s hosts: its live version or a
    /// running candidate, in its files or in the components bucket. A route served from
    /// files (`component`, `components.dir`) is decided from this host's files alone: another
    /// host's files may offer a version this host's do not, and the other way round.
    async fn offered(&self, route: &Route, digest: &str) -> anyhow::Result<bool> {
        if let Some(live) = &route.component_file {
            return Ok(offered_in_files(live, digest).await);
        }
        let bucket = &self.config.components.bucket;
        let bucket = self.js.get_object_store(bucket).await?;
        let live = crate::components::store::deployed(&bucket, &route.name).await;
        if live.as_deref() == Some(digest) {
            return Ok(true);
        }
        let candidate = candidates::current(&bucket, &route.name).await?;
        Ok(candidate.is_some_and(|spec| spec.digest == digest && spec.running()))
    }
}

/// Whether the live file `live`, or a valid candidate beside it, is version `digest`.
async fn offered_in_files(live: &Path, digest: &str) -> bool {
    let is = |bytes: &[u8]| crate::runtime::digest(bytes) == digest;
    if tokio::fs::read(live).await.is_ok_and(|b| is(&b)) {
        return true;
    }
    let Ok(bytes) = tokio::fs::read(files::candidate_path(live)).await else {
        return false;
    };
    is(&bytes) && files::spec(live, &bytes, 0).is_ok()
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
            .map(|d| dedup_delivery::backoff::jittered(not_loaded_ceiling(d), 0.0))
            .sum();
        assert!(total > Duration::from_secs(6 * 60), "{total:?}");
    }
}
