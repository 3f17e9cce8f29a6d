//! Shadow findings on the server, for `dedup-host diff`: a KV bucket `<components.bucket>-diffs`
//! with, per route and candidate, each host's counts (`<route>.<digest>.counts.<host>`), the
//! first sample of each kind of difference (`….first.<kind>`) and the last
//! [`LAST_SAMPLES`] samples (`….last.<n>`). Each host aggregates in memory and writes its
//! counts once a second; samples are written as found, at most [`SAMPLES_PER_SECOND`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::kv::{self, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::compare::{Kind, Summary};
use crate::config::Config;

/// How many recent samples are kept per route and candidate.
pub const LAST_SAMPLES: u64 = 100;
/// Samples a host writes per second at most; more are counted, not stored.
const SAMPLES_PER_SECOND: u32 = 20;
/// How long findings are kept.
const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often a host writes its counts.
const FLUSH: Duration = Duration::from_secs(1);
/// How long a host waits to try opening the findings bucket again.
const OPEN_RETRY: Duration = Duration::from_secs(5);

/// One host's (or, summed, every host's) shadow counts for one candidate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Comparisons made.
    pub compared: u64,
    /// With no difference.
    pub matches: u64,
    /// With differences of the candidate's own.
    pub differences: u64,
    /// Differences by kind.
    pub kinds: BTreeMap<Kind, u64>,
    /// With differences also seen between two live runs (`secondary`): noise.
    pub noise: u64,
    /// Shadow runs skipped: the route had no spare slot.
    pub skipped: u64,
    /// Guest time summed, live and candidate, in microseconds.
    pub live_time_us: u64,
    /// See `live_time_us`.
    pub candidate_time_us: u64,
    /// Fuel summed, where metered.
    pub live_fuel: u64,
    /// See `live_fuel`.
    pub candidate_fuel: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.compared += other.compared;
        self.matches += other.matches;
        self.differences += other.differences;
        for (k, n) in &other.kinds {
            *self.kinds.entry(*k).or_default() += n;
        }
        self.noise += other.noise;
        self.skipped += other.skipped;
        self.live_time_us += other.live_time_us;
        self.candidate_time_us += other.candidate_time_us;
        self.live_fuel += other.live_fuel;
        self.candidate_fuel += other.candidate_fuel;
    }
}

/// A difference found, with both runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The message's stream sequence.
    pub sequence: u64,
    /// Its idempotency key.
    pub key: String,
    /// When it was compared, in Unix milliseconds.
    pub at_ms: u64,
    /// Where the runs differ (`outputs[0].payload/amount`), the candidate's own.
    pub differences: Vec<String>,
    /// Kinds of those differences.
    pub kinds: Vec<Kind>,
    /// The live run.
    pub live: Summary,
    /// The candidate's run.
    pub candidate: Summary,
}

/// What one shadow run found, sent to the recorder.
#[derive(Debug)]
pub struct Finding {
    /// The route.
    pub route: String,
    /// The candidate's digest.
    pub digest: String,
    /// Counts to add (one comparison, or one skipped run).
    pub counts: Counts,
    /// A sample, for a difference.
    pub sample: Option<Sample>,
}

/// The findings bucket of a deployment.
pub fn bucket_name(components_bucket: &str) -> String {
    format!("{components_bucket}-diffs")
}

/// Opens (or creates, with the components bucket's replicas) the findings bucket.
pub async fn open(js: &async_nats::jetstream::Context, config: &Config) -> anyhow::Result<Store> {
    let bucket = bucket_name(&config.components.bucket);
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: bucket.clone(),
        description: "dedup-host shadow differences: counts per host, samples".into(),
        history: 1,
        max_age: MAX_AGE,
        num_replicas: config.components.replicas,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create KV bucket `{bucket}` (shadow findings)"))
}

/// The key prefix of `route`'s findings about candidate `digest`.
fn prefix(route: &str, digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("{}.{}", token(route), &hex[..hex.len().min(16)])
}

/// `s` with every character a KV key does not allow replaced.
fn token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Opens the findings bucket (retrying every [`OPEN_RETRY`]: a host never waits for it to
/// serve), then aggregates findings and writes them until `stopped`. Findings made while the
/// bucket cannot be opened wait in the channel, and beyond its bound are dropped.
pub async fn run(
    js: async_nats::jetstream::Context,
    config: Arc<Config>,
    instance: String,
    mut findings: mpsc::Receiver<Finding>,
    mut stopped: watch::Receiver<bool>,
) {
    let store = loop {
        match open(&js, &config).await {
            Ok(store) => break store,
            Err(e) => {
                tracing::warn!(
                    "shadow findings are not stored yet: {e:#}; retrying in {OPEN_RETRY:?}"
                );
                tokio::select! {
                    _ = tokio::time::sleep(OPEN_RETRY) => {}
                    _ = stopped.changed() => return,
                }
            }
        }
    };
    let host = token(&instance);
    let mut counts: HashMap<(String, String), Counts> = HashMap::new();
    let mut dirty = false;
    let mut written = 0u32;
    let mut serial: u64 = rand::random::<u32>().into();
    let mut tick = tokio::time::interval(FLUSH);
    loop {
        tokio::select! {
            found = findings.recv() => {
                let Some(f) = found else { break };
                let p = prefix(&f.route, &f.digest);
                counts.entry((f.route, f.digest)).or_default().add(&f.counts);
                dirty = true;
                let Some(sample) = f.sample else { continue };
                if written >= SAMPLES_PER_SECOND {
                    continue;
                }
                written += 1;
                serial += 1;
                if let Ok(json) = serde_json::to_vec(&sample) {
                    for kind in &sample.kinds {
                        // First of its kind: only if none is stored yet.
                        let _ = store.create(format!("{p}.first.{}", kind.label()), json.clone().into()).await;
                    }
                    let n = serial % LAST_SAMPLES;
                    if let Err(e) = store.put(format!("{p}.last.{n}"), json.into()).await {
                        tracing::debug!("cannot store a shadow sample: {e}");
                    }
                }
            }
            _ = tick.tick() => {
                written = 0;
                if dirty {
                    dirty = !flush(&store, &host, &counts).await;
                }
            }
            _ = stopped.changed() => break,
        }
    }
    flush(&store, &host, &counts).await;
}

async fn flush(store: &Store, host: &str, counts: &HashMap<(String, String), Counts>) -> bool {
    let mut ok = true;
    for ((route, digest), c) in counts {
        let key = format!("{}.counts.{host}", prefix(route, digest));
        let Ok(json) = serde_json::to_vec(c) else {
            continue;
        };
        if let Err(e) = store.put(key, json.into()).await {
            tracing::debug!("cannot store shadow counts: {e}");
            ok = false;
        }
    }
    ok
}

/// Every host's findings about `route`'s candidate `digest`.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Counts summed over hosts.
    pub counts: Counts,
    /// Hosts that reported.
    pub hosts: usize,
    /// The first sample of each kind.
    pub first: BTreeMap<String, Sample>,
    /// Recent samples, oldest first.
    pub last: Vec<Sample>,
}

/// Reads the findings about `route`'s candidate `digest`.
pub async fn read(store: &Store, route: &str, digest: &str) -> anyhow::Result<Report> {
    let p = format!("{}.", prefix(route, digest));
    let keys = crate::kv_keys::list(store, &p)
        .await
        .context("cannot list the shadow findings")?;
    let mut report = Report::default();
    for key in keys.iter().filter(|k| k.starts_with(&p)) {
        let Some(value) = store.get(key).await? else {
            continue;
        };
        let rest = &key[p.len()..];
        if rest.starts_with("counts.") {
            let c: Counts = serde_json::from_slice(&value)?;
            report.counts.add(&c);
            report.hosts += 1;
        } else if let Some(kind) = rest.strip_prefix("first.") {
            report
                .first
                .insert(kind.to_string(), serde_json::from_slice(&value)?);
        } else if rest.starts_with("last.") {
            report.last.push(serde_json::from_slice(&value)?);
        }
    }
    report.last.sort_by_key(|s| s.at_ms);
    Ok(report)
}
