//! Moving a route's claim records between claim stores (a bucket, or a fenced stream), for a
//! contract change and a rename: which keys a route has, where each lives, and copying a
//! record so that the store the route was served from wins.

use anyhow::Context as _;
use async_nats::jetstream::Context;
use futures::StreamExt;

use crate::claim::host::HostClaimStore;
use crate::claim::kv::KvClaimStore;
use crate::claim::record::ClaimRecord;
use crate::claim::{ClaimState, ClaimStore};
use crate::config::Config;
use dedup_delivery::claim::key::is_claim_key;

/// Keys the operator accepted as settled though they failed for good after their window
/// outputs may have been stored (`--accept-dead KEY`): they can never complete, so they move
/// as they are, still dead-lettered, marked as accepted ([`ClaimRecord::accept_dead`]), and a
/// replay of their letters is refused unless forced.
#[derive(Debug, Clone, Default)]
pub struct AcceptedDead(Vec<String>);

impl AcceptedDead {
    /// The keys named, each a claim key (`<route>.<key>` as a refusal lists it) or a
    /// message's idempotency key.
    pub fn new(keys: &[String]) -> Self {
        Self(keys.to_vec())
    }

    /// Whether claim key `claim_key` of route `route` was named.
    pub fn accepts(&self, route: &str, claim_key: &str) -> bool {
        self.0
            .iter()
            .any(|k| k == claim_key || crate::claim::key::encode(route, k) == claim_key)
    }

    /// Refuses keys named that are no dead-lettered (failed for good) key among route
    /// `route`'s claim `records`: unknown, or not dead-lettered, accepting them means nothing.
    pub fn check(
        &self,
        route: &str,
        records: &[(String, ClaimRecord)],
    ) -> Result<(), NotDeadLettered> {
        let dead = |k: &str| {
            records.iter().any(|(key, r)| {
                r.state == ClaimState::Failed
                    && r.permanent
                    && (k == key || crate::claim::key::encode(route, k) == *key)
            })
        };
        let keys: Vec<String> = self.0.iter().filter(|k| !dead(k)).cloned().collect();
        if keys.is_empty() {
            return Ok(());
        }
        Err(NotDeadLettered {
            route: route.to_string(),
            keys,
        })
    }
}

/// `--accept-dead` named keys that are not dead-lettered keys of the route.
#[derive(Debug, thiserror::Error)]
#[error("`--accept-dead` named {}: not a dead-lettered key of route `{route}` (unknown, or not failed for good); nothing was changed. Name only keys a refusal listed as dead-lettered (`dedup-host inspect --route {route} --key <key>` shows one), or drop the flag", keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "))]
pub struct NotDeadLettered {
    /// The route.
    pub route: String,
    /// The keys named that are not dead-lettered, as named.
    pub keys: Vec<String>,
}

/// Where a contract's claims live, as the host's claim store knows a claim key there.
pub(crate) fn store_key(claims: &str, claim_key: &str) -> String {
    match claims.strip_prefix("stream ") {
        Some(stream) => crate::fenced::claim_subject(stream, claim_key),
        None => claim_key.to_string(),
    }
}

/// Every claim record of `route` in the claim store of `claims`, each read from its
/// stream's leader (a replica may lag behind the last write): (claim key, record). The run's
/// `lease` is kept while it reads.
pub(crate) async fn read_records(
    js: &Context,
    store: &HostClaimStore,
    claims: &str,
    route: &str,
    lease: &mut super::Lease,
) -> anyhow::Result<Vec<(String, ClaimRecord)>> {
    let mut records = Vec::new();
    for claim_key in claim_keys(js, claims, route).await? {
        lease.keep().await?;
        if let Some((record, _)) = store
            .get_from_leader(&store_key(claims, &claim_key))
            .await?
        {
            records.push((claim_key, record));
        }
    }
    Ok(records)
}

/// Writes `record`, read from the store the route was served from, to `key` of claim store
/// `to`, writing over a record `to` kept from before ([`dedup_delivery::change::copy_record`]).
/// Whether it wrote.
pub(crate) async fn copy_record(
    to: &HostClaimStore,
    key: &str,
    record: &ClaimRecord,
) -> anyhow::Result<bool> {
    Ok(dedup_delivery::change::copy_record(to, key, record).await?)
}

/// Whether a key failed for good (dead-lettered) after its window outputs may have been
/// stored ([`dedup_delivery::change::dead_with_effects`]).
pub(crate) fn dead_with_effects(record: &ClaimRecord) -> bool {
    dedup_delivery::change::dead_with_effects(record)
}

/// The claim store holding the claims of a contract's `claims` (`bucket <name>` or
/// `stream <name>`), reached by [`store_key`].
pub(crate) async fn claim_store(
    js: &Context,
    config: &Config,
    claims: &str,
) -> anyhow::Result<HostClaimStore> {
    // A fenced store still needs a bucket for keys outside streams; none is used here.
    let bucket = claims
        .strip_prefix("bucket ")
        .unwrap_or(&config.claims.bucket);
    let kv = js.get_key_value(bucket).await.map_err(|e| {
        anyhow::anyhow!("cannot open claim bucket `{bucket}` ({claims}): {e}; create it with `dedup-host setup --config <the config that names it>`")
    })?;
    Ok(HostClaimStore::new(KvClaimStore::new(kv), js.clone()))
}

/// The claim keys of `route` in a claim store (`bucket <name>` or `stream <name>`); not its
/// calls' journal entries, which are not claim records (they move with their claim:
/// [`super::calls`]). Listed by
/// the stream's leader (STREAM.INFO with a subjects filter): a bucket's `keys()` reads through
/// an ordered consumer, which a lagging replica may serve without a key written just before.
async fn claim_keys(js: &Context, claims: &str, route: &str) -> anyhow::Result<Vec<String>> {
    if let Some(stream) = claims.strip_prefix("stream ") {
        let filter = crate::fenced::claim_subject(stream, &format!("{route}.>"));
        let subjects = subjects_from_leader(js, stream, filter).await?;
        return Ok(subjects
            .iter()
            .filter_map(|s| crate::fenced::claim_key_of(stream, s))
            .filter(|k| is_claim_key(k))
            .map(str::to_string)
            .collect());
    }
    let bucket = claims.strip_prefix("bucket ").unwrap_or(claims);
    let prefix = format!("$KV.{bucket}.");
    let subjects =
        subjects_from_leader(js, &format!("KV_{bucket}"), format!("{prefix}{route}.>")).await?;
    // A deleted key still has its deletion marker; reading it from the leader skips it.
    Ok(subjects
        .iter()
        .filter_map(|s| s.strip_prefix(&prefix))
        .filter(|k| is_claim_key(k))
        .map(str::to_string)
        .collect())
}

/// The subjects of stream `stream` matching `filter` that hold a message, as its leader
/// answers STREAM.INFO.
pub(super) async fn subjects_from_leader(
    js: &Context,
    stream: &str,
    filter: String,
) -> anyhow::Result<Vec<String>> {
    let s = js
        .get_stream(stream)
        .await
        .with_context(|| format!("cannot open stream `{stream}` to list claim keys"))?;
    let mut info = s.info_with_subjects(filter).await?;
    let mut subjects = Vec::new();
    while let Some(entry) = info.next().await {
        let (subject, _) = entry?;
        subjects.push(subject);
    }
    Ok(subjects)
}
