//! Where a route's claims live, for the operator commands (`inspect`, `dead-letters replay`
//! and `purge`): the route's recorded contract decides (DESIGN rule 19), as it does for every
//! serving host; this config only when no contract is recorded, and the commands say so.
//!
//! An operator's config may differ from the contract (another claim bucket, window where the
//! route was set up fenced): reading or resetting the claim where that config points would
//! find nothing, or reset a record no host reads.

use std::collections::BTreeMap;

use async_nats::jetstream::Context;
use serde::Serialize;
use thiserror::Error;

use crate::claim::host::HostClaimStore;
use crate::claim::kv::KvClaimStore;
use crate::claim::{ClaimError, ClaimRecord, ClaimStore as _};
use crate::config::Config;
use crate::contract;

/// Why a route's claims could not be located.
#[derive(Debug, Error)]
pub enum LocateError {
    /// The contract names a place this command cannot parse.
    #[error("route `{route}`: its contract records claims in `{claims}`, which is neither `bucket <name>` nor `stream <name>`; record it anew with `dedup-host setup --config <config> --change-route {route}`")]
    Unparsable {
        /// The route.
        route: String,
        /// The recorded `claims` field.
        claims: String,
    },
    /// The contract belongs to another deployment.
    #[error("route `{route}`'s contract belongs to deployment `{owner}`, and this config is deployment `{mine}`: its claims are not this config's to read or reset; pass that deployment's config (or set `[deployment] name = \"{owner}\"` if this is it)")]
    Owned {
        /// The route.
        route: String,
        /// The deployment that recorded the contract.
        owner: String,
        /// This config's deployment.
        mine: String,
    },
    /// The contract bucket or the claim bucket could not be read.
    #[error("route `{route}`: {reason}")]
    Unavailable {
        /// The route.
        route: String,
        /// What failed, and where.
        reason: String,
    },
}

/// Where one route's claim records are kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Place {
    /// Keys of this KV bucket.
    Bucket(String),
    /// Claim subjects of this fenced output stream.
    Stream(String),
}

/// What decided where a route's claims are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The route's recorded contract.
    Contract,
    /// This config: the route has no contract recorded.
    Config,
}

/// Where a route's claims live, and what said so.
#[derive(Debug, Clone, Serialize)]
pub struct RouteClaims {
    /// The place.
    pub place: Place,
    /// What decided it.
    pub origin: Origin,
}

impl RouteClaims {
    /// The key the claim store knows claim key `claim_key` by (a claim subject when fenced).
    pub fn store_key(&self, claim_key: &str) -> String {
        match &self.place {
            Place::Bucket(_) => claim_key.to_string(),
            Place::Stream(stream) => crate::fenced::claim_subject(stream, claim_key),
        }
    }

    /// In words, for the commands' output: `bucket `x` (from the route's contract)`.
    pub fn describe(&self) -> String {
        let place = match &self.place {
            Place::Bucket(b) => format!("bucket `{b}`"),
            Place::Stream(s) => format!("fenced stream `{s}`"),
        };
        match self.origin {
            Origin::Contract => format!("{place} (from the route's contract)"),
            Origin::Config => format!("{place} (no contract recorded: from this config)"),
        }
    }
}

/// The deployment's contract bucket: `None` only when the server says it does not exist;
/// a server that does not answer is waited out for a few seconds, then an error.
async fn contract_bucket(
    js: &Context,
    config: &Config,
) -> anyhow::Result<Option<async_nats::jetstream::kv::Store>> {
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    let bucket = contract::bucket_name(config);
    for _ in 0..10 {
        match js.get_stream(format!("KV_{bucket}")).await {
            Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND) => {
                return Ok(None)
            }
            Ok(_) => {
                if let Ok(store) = js.get_key_value(&bucket).await {
                    return Ok(Some(store));
                }
            }
            Err(e) => tracing::warn!("contract bucket `{bucket}` did not answer, retrying: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    anyhow::bail!("the contract bucket `{bucket}` did not answer: cannot tell where the routes' claims live; nothing was read or changed, run the command again once the server answers")
}

/// The claims of a deployment's routes, located once per route, with one store per bucket.
pub struct Claims {
    js: Context,
    config: Config,
    contracts: Option<async_nats::jetstream::kv::Store>,
    routes: BTreeMap<String, RouteClaims>,
    stores: BTreeMap<String, HostClaimStore>,
}

impl Claims {
    /// Locates claims for `config`'s routes on demand.
    pub async fn new(js: &Context, config: &Config) -> anyhow::Result<Self> {
        // No contract bucket: no route was ever set up with contracts, the config decides.
        // Only a bucket known to be absent counts as none: one that did not answer (a
        // timeout, a leader election) would send a replay or purge to the config's store.
        let contracts = contract_bucket(js, config).await?;
        Ok(Self {
            js: js.clone(),
            config: config.clone(),
            contracts,
            routes: BTreeMap::new(),
            stores: BTreeMap::new(),
        })
    }

    /// Where `route`'s claims live.
    pub async fn locate(&mut self, route: &str) -> Result<RouteClaims, LocateError> {
        if let Some(found) = self.routes.get(route) {
            return Ok(found.clone());
        }
        let recorded = match &self.contracts {
            Some(store) => {
                contract::read(store, route)
                    .await
                    .map_err(|e| LocateError::Unavailable {
                        route: route.to_string(),
                        reason: e.to_string(),
                    })?
            }
            None => None,
        };
        let found = match recorded {
            Some((record, _)) => {
                let record = record.with_live_subjects(&self.js, &self.config).await;
                if let Some(owner) = record.other_owner(&self.config, route) {
                    return Err(LocateError::Owned {
                        route: route.to_string(),
                        owner: owner.to_string(),
                        mine: self.config.deployment_name(),
                    });
                }
                RouteClaims {
                    place: parse(route, &record.contract.claims)?,
                    origin: Origin::Contract,
                }
            }
            None => RouteClaims {
                place: self.place_in_config(route),
                origin: Origin::Config,
            },
        };
        self.routes.insert(route.to_string(), found.clone());
        Ok(found)
    }

    /// The run changing `route`'s contract (`setup --change-route` or `--rename-route`) while
    /// its mark's lease is live, in words; `None` when no run holds it.
    pub async fn change_running(&self, route: &str) -> Result<Option<String>, LocateError> {
        let Some(store) = &self.contracts else {
            return Ok(None);
        };
        let (_, marked) =
            contract::lookup_marked(store, route)
                .await
                .map_err(|e| LocateError::Unavailable {
                    route: route.to_string(),
                    reason: e.to_string(),
                })?;
        let now = crate::claim::record::now_ms();
        let skew = self.config.claims.clock_skew;
        Ok(marked
            .as_ref()
            .and_then(|m| m.live_run(now, skew))
            .map(|run| run.describe(now)))
    }

    fn place_in_config(&self, route: &str) -> Place {
        let fenced = (self.config.routes.iter())
            .find(|r| r.name == route)
            .and_then(|r| self.config.fenced_stream(r));
        match fenced {
            Some(o) => Place::Stream(o.name.clone()),
            None => Place::Bucket(self.config.claims.bucket.clone()),
        }
    }

    /// The store that holds `claims`' records.
    async fn store(
        &mut self,
        route: &str,
        claims: &RouteClaims,
    ) -> Result<HostClaimStore, LocateError> {
        // A fenced route's records live in its stream; the bucket is only for window routes.
        let bucket = match &claims.place {
            Place::Bucket(b) => b.clone(),
            Place::Stream(_) => self.config.claims.bucket.clone(),
        };
        if let Some(store) = self.stores.get(&bucket) {
            return Ok(store.clone());
        }
        let kv = self
            .js
            .get_key_value(&bucket)
            .await
            .map_err(|e| LocateError::Unavailable {
                route: route.to_string(),
                reason: format!(
                    "cannot open claim bucket `{bucket}` (claims in {}): {e}",
                    claims.describe()
                ),
            })?;
        let store = HostClaimStore::new(KvClaimStore::new(kv), self.js.clone());
        self.stores.insert(bucket, store.clone());
        Ok(store)
    }

    /// The claim record of `claim_key` of `route`, with its revision, and where it was read.
    pub async fn get(&mut self, route: &str, claim_key: &str) -> anyhow::Result<Claim> {
        let claims = self.locate(route).await?;
        let store = self.store(route, &claims).await?;
        let key = claims.store_key(claim_key);
        let record = store.get(&key).await?;
        Ok(Claim {
            store,
            key,
            record,
            claims,
        })
    }
}

/// One claim as read, with the store and key to write it back.
pub struct Claim {
    store: HostClaimStore,
    /// The key in the store.
    pub key: String,
    /// The record and its revision, if one exists.
    pub record: Option<(ClaimRecord, u64)>,
    /// Where it lives and what said so.
    pub claims: RouteClaims,
}

impl Claim {
    /// The key's journaled outbound calls, beside its claim.
    pub fn calls(&self, js: &Context) -> super::calls::KeyCalls {
        let bucket = match &self.claims.place {
            Place::Bucket(b) => b.as_str(),
            Place::Stream(_) => "", // the key is a fenced claim subject: its stream holds them
        };
        super::calls::KeyCalls::of(js, bucket, &self.key)
    }

    /// Writes `record` over revision `revision` (revision-checked); the new revision.
    pub async fn update(&self, record: &ClaimRecord, revision: u64) -> Result<u64, ClaimError> {
        self.store.update(&self.key, record, revision).await
    }
}

/// The place a contract's `claims` field names.
fn parse(route: &str, claims: &str) -> Result<Place, LocateError> {
    match claims.split_once(' ') {
        Some(("bucket", name)) if !name.is_empty() => Ok(Place::Bucket(name.to_string())),
        Some(("stream", name)) if !name.is_empty() => Ok(Place::Stream(name.to_string())),
        _ => Err(LocateError::Unparsable {
            route: route.to_string(),
            claims: claims.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contract_names_a_bucket_or_a_stream() {
        assert_eq!(
            parse("r", "bucket dedup-claims").unwrap(),
            Place::Bucket("dedup-claims".into())
        );
        assert_eq!(
            parse("r", "stream OUT").unwrap(),
            Place::Stream("OUT".into())
        );
        assert!(parse("r", "table x").is_err());
        assert!(parse("r", "bucket").is_err());
        let fenced = RouteClaims {
            place: Place::Stream("OUT".into()),
            origin: Origin::Contract,
        };
        assert_eq!(fenced.store_key("r.k"), "_dedup.claims.OUT.r.k");
        let window = RouteClaims {
            place: Place::Bucket("b".into()),
            origin: Origin::Config,
        };
        assert_eq!(window.store_key("r.k"), "r.k");
        assert!(window.describe().contains("no contract recorded"));
    }
}
