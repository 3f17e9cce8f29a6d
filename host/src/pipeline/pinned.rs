//! Which version runs a claimed key, over this host's routes and components bucket: the
//! decision (the version that began a key's effects runs it, or the key is given back or
//! dead-lettered, once it is known not to be superseded) is
//! [`dedup_delivery::pinned`]'s and [`dedup_delivery::before::run`]'s, which the simulation
//! runs too; what is here is where the versions are: the route's live version and candidate
//! ([`installed`]) and whether a version is still offered to the route's hosts (the
//! components bucket, or this host's files). Fenced outputs need no mark: they are stored
//! with the completed record in one atomic batch, or not at all.

use std::path::Path;

use dedup_delivery::pinned::{self, Pinned};

use super::Shared;
use crate::candidate::{files, store as candidates};
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
    /// Whether version `digest` is still offered to `route`'s hosts: its live version or a
    /// running candidate, in its files or in the components bucket. A route served from
    /// files (`component`, `components.dir`) is decided from this host's files alone: another
    /// host's files may offer a version this host's do not, and the other way round.
    pub(super) async fn offered(&self, route: &Route, digest: &str) -> anyhow::Result<bool> {
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
/// and the pipeline chose `chosen` ([`pinned::version`]): the claimed version if installed;
/// otherwise `chosen` with the reason to dead-letter the key instead of running it.
pub(super) fn version(
    route: &Route,
    key: &str,
    chosen: Guest,
    claimed: &str,
) -> (Guest, Option<String>) {
    match pinned::version(chosen, Guest::digest, claimed, |d| installed(route, d)) {
        Pinned::Run(guest) => (guest, None),
        Pinned::Gone(chosen) => (chosen, Some(pinned::gone(&route.name, key, claimed))),
    }
}
