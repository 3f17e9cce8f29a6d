//! What each host publishes for the console (`dedup-host console`): every [`EVERY`], a
//! [`HostStats`] snapshot of its cumulative counters per route, its version, start time and
//! readiness, on `_dedup.feed.<status bucket>.<host>`, in a memory stream that keeps [`KEEP`]
//! of them. The console reads that window back, so it needs no list of hosts; a host that
//! cannot publish (the stream is being created, NATS is away) skips a beat and tries again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream::{self, StorageType};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::claim::record::now_ms;
use crate::config::Config;
use crate::health::Health;
use crate::metrics::RouteCounts;
use crate::routes::Routes;
use crate::subject::FEED_PREFIX;

/// How often a host publishes its snapshot.
pub const EVERY: Duration = Duration::from_secs(3);
/// How much of the feed the stream keeps (the console's charts show 15 minutes).
pub const KEEP: Duration = Duration::from_secs(16 * 60);

/// One host's snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    /// The host's instance id.
    pub instance_id: String,
    /// The `dedup-host` version it runs.
    pub version: String,
    /// When it started, in Unix milliseconds.
    pub started_ms: u64,
    /// When this snapshot was taken, in Unix milliseconds.
    pub at_ms: u64,
    /// Whether `/readyz` would answer 200.
    pub ready: bool,
    /// Why it is not ready, one sentence each.
    #[serde(default)]
    pub missing: Vec<String>,
    /// What needs an operator without making it unready.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Cumulative counters and current gauges per route name.
    #[serde(default)]
    pub routes: BTreeMap<String, RouteCounts>,
}

/// The stream holding every host's snapshots of this deployment.
pub fn stream_name(config: &Config) -> String {
    format!("FEED_{}", config.components.status_bucket)
}

/// The subjects of that stream.
fn subjects(config: &Config) -> String {
    format!("{FEED_PREFIX}{}.*", config.components.status_bucket)
}

/// The subject one host publishes on: its instance id as one subject token.
pub fn subject(config: &Config, instance_id: &str) -> String {
    let token: String = instance_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{FEED_PREFIX}{}.{token}", config.components.status_bucket)
}

/// Opens (or creates) the feed stream.
pub async fn open(
    js: &async_nats::jetstream::Context,
    config: &Config,
) -> anyhow::Result<stream::Stream> {
    let name = stream_name(config);
    let per_host = (KEEP.as_secs() / EVERY.as_secs()) as i64 * 2;
    js.get_or_create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subjects(config)],
        storage: StorageType::Memory,
        max_age: KEEP,
        max_messages_per_subject: per_host,
        num_replicas: config.components.replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot create the console's feed stream `{name}`: {e}"))
}

/// Publishes this host's snapshot every [`EVERY`] until `stopped`, and a last one then.
pub async fn run(
    client: async_nats::Client,
    config: Arc<Config>,
    instance_id: String,
    routes: Arc<Routes>,
    health: Arc<Health>,
    mut stopped: watch::Receiver<bool>,
) {
    let started_ms = now_ms();
    let subject = subject(&config, &instance_id);
    let js = async_nats::jetstream::new(client.clone());
    let mut opened = false;
    loop {
        if !opened {
            opened = match open(&js, &config).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!("console feed: {e:#}");
                    false
                }
            };
        }
        let done = *stopped.borrow();
        if opened {
            let stats = snapshot(&instance_id, started_ms, &routes, &health);
            let bytes = serde_json::to_vec(&stats).expect("host stats serialize");
            // A core publish: the stream captures it; a missed beat costs nothing.
            let _ = client.publish(subject.clone(), bytes.into()).await;
        }
        if done {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// This host's snapshot now.
pub fn snapshot(instance_id: &str, started_ms: u64, routes: &Routes, health: &Health) -> HostStats {
    let readiness = health.readiness();
    HostStats {
        instance_id: instance_id.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_ms,
        at_ms: now_ms(),
        ready: readiness.ready,
        missing: readiness.missing,
        warnings: readiness.warnings,
        routes: routes
            .iter()
            .map(|r| {
                let mut counts = r.metrics.counts();
                counts.free_slots = r.slots.available_permits() as u64;
                (r.name.clone(), counts)
            })
            .collect(),
    }
}
