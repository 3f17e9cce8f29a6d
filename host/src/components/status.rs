//! Which version each host serves, per route, in a KV bucket: key `<instance id>`, a JSON
//! [`HostStatus`], rewritten on every change and refreshed while the host lives (entries of
//! hosts gone for [`STATUS_MAX_AGE`] expire).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::kv::{self, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::claim::record::now_ms;
use crate::config::Config;
use crate::routes::Routes;

/// How often a live host refreshes its entry.
const REFRESH: Duration = Duration::from_secs(10);
/// Entries older than this (hosts that stopped) disappear.
pub const STATUS_MAX_AGE: Duration = Duration::from_secs(60);

/// What one host serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStatus {
    /// The host's instance id.
    pub instance_id: String,
    /// When this entry was written, in Unix milliseconds.
    pub updated_ms: u64,
    /// Per route name.
    pub routes: BTreeMap<String, RouteStatus>,
    /// Why the last config reload was refused (the host serves its previous config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_refused: Option<String>,
}

/// What one host serves for one route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStatus {
    /// The digest of the version served; `None`: not served (no valid component).
    pub digest: Option<String>,
    /// Why the last version offered was refused, if it was.
    pub refused: Option<String>,
    /// Why this host does not serve the route at all: its config differs from the route's
    /// contract (absent from hosts older than contracts, which serve it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_refused: Option<String>,
    /// The candidate this host runs beside the live version (`<digest> shadow`, `<digest>
    /// canary 20%`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<String>,
}

/// Opens (or creates) the `components.status_bucket` KV bucket.
pub async fn open(js: &async_nats::jetstream::Context, config: &Config) -> anyhow::Result<Store> {
    let bucket = &config.components.status_bucket;
    if let Ok(store) = js.get_key_value(bucket).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: bucket.clone(),
        history: 1,
        max_age: STATUS_MAX_AGE,
        num_replicas: config.components.replicas,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create KV bucket `{bucket}` (`components.status_bucket`)"))
}

/// Every live host's status.
pub async fn read_all(store: &Store) -> anyhow::Result<Vec<HostStatus>> {
    let mut hosts = Vec::new();
    for key in crate::kv_keys::list(store, "").await? {
        if let Some(bytes) = store.get(&key).await? {
            match serde_json::from_slice(&bytes) {
                Ok(status) => hosts.push(status),
                Err(e) => tracing::warn!(key, "unreadable host status: {e}"),
            }
        }
    }
    Ok(hosts)
}

/// Writes this host's status whenever a route's version changes, and every [`REFRESH`].
pub struct Reporter {
    store: Store,
    instance_id: String,
}

impl Reporter {
    /// A reporter for this host.
    pub async fn open(
        js: &async_nats::jetstream::Context,
        config: &Config,
        instance_id: &str,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            store: open(js, config).await?,
            instance_id: instance_id.to_string(),
        })
    }

    /// Reports until `stopped`, then deletes this host's entry.
    pub async fn run(self, routes: Arc<Routes>, mut stopped: watch::Receiver<bool>) {
        let mut reloads = routes.subscribe();
        loop {
            self.write(&routes).await;
            let mut changes: Vec<_> = routes.iter().map(|r| r.subscribe()).collect();
            let any_change = async {
                if changes.is_empty() {
                    std::future::pending::<()>().await;
                }
                let _ =
                    futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())))
                        .await;
            };
            tokio::select! {
                _ = any_change => {}
                _ = reloads.changed() => {}
                _ = tokio::time::sleep(REFRESH) => {}
                _ = stopped.changed() => break,
            }
        }
        let _ = self.store.delete(&self.instance_id).await;
    }

    async fn write(&self, routes: &Routes) {
        let status = HostStatus {
            instance_id: self.instance_id.clone(),
            updated_ms: now_ms(),
            routes: routes
                .iter()
                .map(|r| {
                    let digest = r.guest().map(|g| g.digest().to_string());
                    (
                        r.name.clone(),
                        RouteStatus {
                            digest,
                            refused: r.refused(),
                            contract_refused: r.contract_refused(),
                            candidate: r
                                .candidate()
                                .filter(|c| c.active())
                                .map(|c| format!("{} {}", c.digest(), c.spec.mode.status())),
                        },
                    )
                })
                .collect(),
            config_refused: routes.refused_config(),
        };
        let bytes = serde_json::to_vec(&status).expect("status serializes");
        if let Err(e) = self.store.put(&self.instance_id, bytes.into()).await {
            tracing::warn!("cannot report this host's versions: {e}");
        }
    }
}
