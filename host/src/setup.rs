//! Creating or verifying what the host needs on the server: the source stream and its durable
//! consumers (one per route, plus one for subjects no route takes), the claim bucket, the
//! dead-letter stream and the output streams.

use anyhow::Context as _;
use async_nats::jetstream::kv::{self, Store};
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::Context;

use std::time::Duration;

use futures::StreamExt;

use crate::config::{Config, DedupMode, EffectsMode, Storage};
#[cfg(test)]
use crate::consumers::uncovered_subjects;
pub use crate::consumers::{consumer_specs, route_consumer_name};
pub(crate) use crate::source_consumer::{create_consumer, create_consumer_at};
pub use crate::source_consumer::{route_consumer, unrouted_consumer};
use crate::subject;

/// Handles to everything set up.
pub struct Setup {
    /// The source stream, on which route consumers are created.
    pub source: stream::Stream,
    /// The claim bucket.
    pub claims: Store,
}

/// What the host needs of one stream.
pub(crate) struct StreamSpec {
    pub(crate) name: String,
    pub(crate) subjects: Vec<String>,
    pub(crate) duplicate_window: Duration,
    pub(crate) replicas: usize,
    /// One message per subject, a repeat refused forever (`dedup = "forever"`).
    pub(crate) forever: bool,
    /// Work-queue retention (a message leaves once acked): the exclusive routes' queue.
    pub(crate) work_queue: bool,
    /// Accepts atomic batches and subject rollups, and holds fenced routes' claim records
    /// (`effects = "fenced"`; the claim subjects are in `subjects`).
    pub(crate) fenced: bool,
    /// File or memory storage.
    pub(crate) storage: StorageType,
    /// The config field that names the stream, for messages.
    pub(crate) field: String,
}

impl StreamSpec {
    /// The subjects this stream must capture that `have` does not.
    pub(crate) fn uncovered(&self, have: &[String]) -> Vec<String> {
        self.subjects
            .iter()
            .filter(|want| !have.iter().any(|h| subject::covers(h, want)))
            .cloned()
            .collect()
    }

    /// The configuration to create the stream with.
    pub(crate) fn create_config(&self) -> stream::Config {
        let mut config = stream::Config {
            name: self.name.clone(),
            subjects: self.subjects.clone(),
            duplicate_window: self.duplicate_window,
            num_replicas: self.replicas,
            storage: self.storage,
            ..Default::default()
        };
        if self.forever {
            crate::forever::apply(&mut config);
        }
        if self.work_queue {
            config.retention = stream::RetentionPolicy::WorkQueue;
        }
        if self.fenced {
            config.allow_atomic_publish = true;
            config.allow_rollup = true;
        }
        config
    }

    /// [`Self::create_config`] with `config`'s deployment recorded as the stream's owner.
    pub(crate) fn owned_config(&self, config: &Config) -> stream::Config {
        let mut created = self.create_config();
        crate::ownership::stamp(&mut created.metadata, config);
        created
    }

    /// What an existing stream lacks of this spec's deduplication, if anything.
    pub(crate) fn dedup_difference(&self, have: &stream::Config) -> Option<String> {
        if self.work_queue && have.retention != stream::RetentionPolicy::WorkQueue {
            return Some(format!(
                "has {:?} retention, not work-queue (the queue of exclusive routes)",
                have.retention
            ));
        }
        if self.fenced && !(have.allow_atomic_publish && have.allow_rollup && !have.deny_purge) {
            return Some(format!(
                "does not accept what fenced effects need (atomic batches: {}, rollups: {}, deny purge: {}); fenced streams need allow_atomic and allow_rollup_hdrs, without deny_purge (nats-server 2.12+)",
                have.allow_atomic_publish, have.allow_rollup, have.deny_purge
            ));
        }
        (self.forever && !crate::forever::is_forever(have)).then(|| {
            format!(
                "keeps {} message(s) per subject with discard {:?} (discard new per subject: {}), not one with discard new per subject (dedup = \"forever\")",
                have.max_messages_per_subject, have.discard, have.discard_new_per_subject
            )
        })
    }
}

/// Every stream the config needs: the source, the dead-letter stream, the output streams.
pub(crate) fn stream_specs(config: &Config) -> Vec<StreamSpec> {
    let mut specs = vec![
        StreamSpec {
            name: config.source.stream.clone(),
            subjects: config.source_subjects(),
            duplicate_window: config.source.duplicate_window,
            replicas: config.source.replicas,
            forever: config.source.dedup == DedupMode::Forever,
            work_queue: false,
            fenced: false,
            storage: StorageType::File,
            field: "source.stream".into(),
        },
        StreamSpec {
            name: config.dead_letter.stream.clone(),
            subjects: vec![config.dead_letter.subject.clone()],
            duplicate_window: config.dead_letter.duplicate_window,
            replicas: config.dead_letter.replicas,
            forever: false,
            work_queue: false,
            fenced: false,
            storage: StorageType::File,
            field: "dead_letter.stream".into(),
        },
    ];
    for (i, o) in config.output_streams.iter().enumerate() {
        let fenced = o.effects == EffectsMode::Fenced;
        let mut subjects = o.subjects.clone();
        if fenced {
            subjects.push(crate::fenced::claim_subjects(&o.name));
        }
        specs.push(StreamSpec {
            name: o.name.clone(),
            subjects,
            duplicate_window: o.duplicate_window,
            replicas: o.replicas,
            forever: o.dedup == DedupMode::Forever,
            work_queue: false,
            fenced,
            storage: storage_type(o.storage),
            field: format!("output_streams[{i}]"),
        });
    }
    if config.routes.iter().any(|r| r.exclusive_by.is_some()) {
        specs.push(StreamSpec {
            name: crate::exclusive::stream_name(config),
            subjects: vec![crate::exclusive::stream_subjects(config)],
            duplicate_window: config.source.duplicate_window,
            replicas: config.source.replicas,
            forever: false,
            work_queue: true,
            fenced: false,
            storage: StorageType::File,
            field: "routes[].exclusive_by".into(),
        });
    }
    specs
}

/// Creates what is missing and checks what exists: an existing stream or bucket with the
/// wrong subjects or settings is reported, never silently bound.
pub async fn ensure(js: &Context, config: &Config) -> anyhow::Result<Setup> {
    // Another deployment's consumers and contracts, and a silent route rename, are refused
    // before anything is created (DESIGN.md rule 23).
    crate::ownership::refuse(crate::ownership::check(js, config).await?)?;
    // An output subject that no stream captures would be retried without end: a config
    // error, found before anything is created (the config's own streams count).
    crate::capture::check_outputs(js, config).await?;
    let mut specs = stream_specs(config).into_iter();
    let source = ensure_stream(js, specs.next().expect("the source stream"), config).await?;
    check_covers(&source, config)?;
    let mut dead = ensure_stream(js, specs.next().expect("the dead-letter stream"), config).await?;
    let window = dead.info().await?.config.duplicate_window;
    let gap = config.dead_letter_gap();
    anyhow::ensure!(
        window > gap,
        "dead-letter stream `{}` has a duplicate window of {window:?}, not longer than lease + clock_skew + largest backoff ({gap:?}): a dead letter could be stored twice; raise its duplicate window",
        config.dead_letter.stream
    );
    for output in specs {
        let fenced = output.fenced;
        let mut stream = ensure_stream(js, output, config).await?;
        // What exists decides, not what the config would create.
        let c = stream.info().await?.config.clone();
        if fenced && c.num_replicas == 1 && c.storage == StorageType::File {
            tracing::warn!(
                "output stream `{}` is fenced at one replica on file storage: nats-server stages every atomic batch in a file store of its own, so each commit waits milliseconds (the host sends the commits waiting together, one batch at a time, which keeps throughput up under load but not latency); give it 3 replicas on a cluster for speed",
                c.name
            );
        }
    }
    check_output_windows(js, config).await?;
    refuse_silent_rename(js, config).await?;
    let claims = ensure_bucket(js, config).await?;
    // What a former default name of this deployment owns is not moved here: only an explicit
    // `setup` moves it ([`crate::ownership::migrate`]). Hosts of the old and the new config
    // run side by side in a rolling restart, and each start would move it back and forth.
    Ok(Setup { source, claims })
}

/// Creates or checks the queue of the exclusive routes (a route added by a reload may be
/// the first).
pub async fn ensure_queue(js: &Context, config: &Config) -> anyhow::Result<stream::Stream> {
    let spec = stream_specs(config)
        .into_iter()
        .find(|s| s.work_queue)
        .context("no route is exclusive")?;
    ensure_stream(js, spec, config).await
}

/// Every stream a route may publish to (the configured output streams, and any other stream
/// capturing an allowed output subject, such as the source stream of a chained route) must
/// keep message ids longer than the longest gap between two runs of one key.
async fn check_output_windows(js: &Context, config: &Config) -> anyhow::Result<()> {
    let gap = config.longest_rerun_gap();
    for c in &output_stream_configs(js, config).await? {
        if crate::forever::is_forever(c) {
            // It refuses a re-run's output by its subject, however late.
            continue;
        }
        for r in &config.routes {
            if config.fenced_stream(r).is_some() {
                // Its re-runs are refused by the fence, however late.
                continue;
            }
            let reached = r
                .allowed_outputs
                .iter()
                .find(|f| c.subjects.iter().any(|s| subject::overlaps(f, s)));
            if let Some(f) = reached {
                anyhow::ensure!(
                    c.duplicate_window > gap,
                    "stream `{}` captures route `{}`'s output subject `{f}` but keeps message ids for {:?}, not longer than the longest gap between two runs of one key ({gap:?} = {}): a re-run could publish an output twice; raise the stream's duplicate window with `dedup-host setup --apply` (`--plan` shows the change first)",
                    c.name,
                    r.name,
                    c.duplicate_window,
                    crate::config::RERUN_GAP_TERMS
                );
            }
        }
    }
    Ok(())
}

/// The configs of every stream on the server; when they cannot be listed (the user may not),
/// those of the streams `config` names, with a warning that others were not checked.
async fn output_stream_configs(
    js: &Context,
    config: &Config,
) -> anyhow::Result<Vec<stream::Config>> {
    let mut listed = Vec::new();
    let mut streams = js.streams();
    while let Some(info) = streams.next().await {
        match info {
            Ok(info) => listed.push(info.config),
            Err(e) => {
                tracing::warn!("cannot list the server's streams ({e}; may this user not send `$JS.API.STREAM.LIST`?): only the duplicate windows of this config's own streams are checked against the longest gap between two runs of one key");
                let names = std::iter::once(&config.source.stream)
                    .chain(config.output_streams.iter().map(|o| &o.name));
                let mut own = Vec::new();
                for name in names {
                    let mut stream = js.get_stream(name).await.with_context(|| {
                        format!("cannot read stream `{name}` to check its duplicate window")
                    })?;
                    own.push(stream.info().await?.config.clone());
                }
                return Ok(own);
            }
        }
    }
    Ok(listed)
}

/// A deployment that ran before default names were derived from the source stream used the
/// shared ones (`dedup-claims`, ...): starting it on new names would forget every completed
/// key. Refused, with the lines that keep its names, when the source stream has this config's
/// route consumers, the derived claim bucket does not exist and the shared one does.
async fn refuse_silent_rename(js: &Context, config: &Config) -> anyhow::Result<()> {
    let keep = config.derived_names();
    let legacy = crate::config::DEFAULT_BUCKET;
    if keep.is_empty()
        || js.get_key_value(&config.claims.bucket).await.is_ok()
        || js.get_key_value(legacy).await.is_err()
    {
        return Ok(());
    }
    let Ok(source) = js.get_stream(&config.source.stream).await else {
        return Ok(());
    };
    for r in &config.routes {
        if source
            .consumer_info(route_consumer_name(config, &r.name))
            .await
            .is_ok()
        {
            anyhow::bail!(
                "stream `{}` has route `{}`'s consumer, but not the claim bucket `{}` named after it, while the shared `{legacy}` exists: this deployment ran before default names were taken from the source stream. Keep its records by naming them in the config: {}",
                config.source.stream,
                r.name,
                config.claims.bucket,
                keep.join(", ")
            );
        }
    }
    Ok(())
}

/// How long set-up keeps trying while the servers do not answer (a cluster electing a leader
/// after a node was lost, say).
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// [`ensure`], tried again while the servers do not answer in time or the cluster is still
/// forming (no peers to place replicas on yet); a refusal (wrong subjects, a window too short)
/// is reported at once.
pub async fn ensure_patiently(js: &Context, config: &Config) -> anyhow::Result<Setup> {
    patiently(|| ensure(js, config)).await
}

/// Runs `step` until it succeeds, tried again for up to a minute while the servers do not
/// answer in time or the cluster is still forming; a refusal is returned at once.
pub async fn patiently<T, F, Fut>(mut step: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(250);
    loop {
        match step().await {
            Ok(done) => return Ok(done),
            // A refused subject does not heal by waiting.
            Err(e) if crate::refusals::since(started).is_some() => {
                return Err(crate::refusals::explain(e, started))
            }
            Err(e) if is_transient(&e) && started.elapsed() < SETUP_PATIENCE => {
                tracing::warn!("set-up: the servers are not ready, retrying in {wait:?}: {e:#}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether an error says the servers are not ready, rather than that they refused.
fn is_transient(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}").to_ascii_lowercase();
    [
        "timed out",
        "no responders",
        "temporarily unavailable",
        "deadline has elapsed",
        "no suitable peers",
    ]
    .iter()
    .any(|t| text.contains(t))
}

async fn ensure_stream(
    js: &Context,
    spec: StreamSpec,
    config: &Config,
) -> anyhow::Result<stream::Stream> {
    let (name, field) = (&spec.name, &spec.field);
    if let Ok(mut existing) = js.get_stream(name).await {
        let info = existing
            .info()
            .await
            .with_context(|| format!("cannot read stream `{name}` (`{field}`)"))?;
        let have = &info.config.subjects;
        let uncovered = spec.uncovered(have);
        anyhow::ensure!(
            uncovered.is_empty(),
            "stream `{name}` (`{field}`) exists but captures {have:?}, not {uncovered:?}: `dedup-host setup --plan` shows the change and `dedup-host setup --apply` widens its subjects (or name another stream)"
        );
        if let Some(difference) = spec.dedup_difference(&info.config) {
            anyhow::bail!("stream `{name}` (`{field}`) exists but {difference}: recreate it, or name another stream");
        }
        return Ok(existing);
    }
    js.create_stream(spec.owned_config(config))
        .await
        .with_context(|| format!("cannot create stream `{name}` (`{field}`)"))
}

/// An existing source stream must capture every route's subjects, and keep its messages for
/// several consumers (one per route).
fn check_covers(stream: &stream::Stream, config: &Config) -> anyhow::Result<()> {
    let retention = stream.cached_info().config.retention;
    anyhow::ensure!(
        retention == stream::RetentionPolicy::Limits,
        "stream `{}` (`source.stream`) has {retention:?} retention; the host needs limits retention (one consumer per route)",
        config.source.stream
    );
    let subjects = &stream.cached_info().config.subjects;
    for r in &config.routes {
        anyhow::ensure!(
            subjects.iter().any(|s| subject::covers(s, &r.subject)),
            "stream `{}` captures {subjects:?}, which does not include route `{}`'s subject `{}`: add it to the stream",
            config.source.stream, r.name, r.subject
        );
    }
    Ok(())
}

/// The server's storage type for a configured one.
pub(crate) fn storage_type(storage: Storage) -> StorageType {
    match storage {
        Storage::File => StorageType::File,
        Storage::Memory => StorageType::Memory,
    }
}

/// How many records per key a new claim bucket keeps. Two, not one: the write that completes
/// a key then removes nothing (with one, every completion also deleted the claim before it,
/// about a tenth of the server's work per guarded message), and the max age still bounds the
/// bucket. Compare-and-swap only ever looks at the latest record.
pub(crate) const CLAIM_HISTORY: i64 = 2;

/// Whether an existing claim bucket's history works: one or [`CLAIM_HISTORY`] records per key
/// (a bucket created by an older host keeps one).
pub(crate) fn claim_history_ok(history: i64) -> bool {
    history == 1 || history == CLAIM_HISTORY
}

/// The configuration to create the claim bucket with: [`CLAIM_HISTORY`], the configured max
/// age, replicas and storage.
pub(crate) fn claim_bucket_config(config: &Config) -> kv::Config {
    let c = &config.claims;
    kv::Config {
        bucket: c.bucket.clone(),
        history: CLAIM_HISTORY,
        max_age: c.max_age,
        num_replicas: c.replicas,
        storage: storage_type(c.storage),
        ..Default::default()
    }
}

async fn ensure_bucket(js: &Context, config: &Config) -> anyhow::Result<Store> {
    let c = &config.claims;
    if let Ok(store) = js.get_key_value(&c.bucket).await {
        // Never recreate a bucket under running hosts: revisions would go backwards.
        let mut status = store.status().await.with_context(|| {
            format!("cannot read claim bucket `{}` (`claims.bucket`)", c.bucket)
        })?;
        let history = status.info.config.max_messages_per_subject;
        anyhow::ensure!(
            claim_history_ok(history),
            "claim bucket `{}` (`claims.bucket`) exists with history {history}; claims need history {CLAIM_HISTORY} (or 1): name another bucket",
            c.bucket
        );
        let _ = &mut status;
        return Ok(store);
    }
    js.create_key_value(claim_bucket_config(config))
        .await
        .with_context(|| {
            format!(
                "cannot create claim bucket `{}` (`claims.bucket`)",
                c.bucket
            )
        })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(subjects: &str, routes: &[&str]) -> Config {
        let routes: String = routes
            .iter()
            .enumerate()
            .map(|(i, s)| format!("[[routes]]\nname = \"r{i}\"\nsubject = \"{s}\"\n"))
            .collect();
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nsubjects = [{subjects}]\n{routes}"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn the_unrouted_consumer_skips_subjects_a_route_takes_whole() {
        // `orders.>` is taken whole by one route; `misc.*` only in part.
        let c = config("\"orders.>\", \"misc.*\"", &["orders.>", "misc.a"]);
        assert_eq!(uncovered_subjects(&c), ["misc.*"]);
        let specs = consumer_specs(&c);
        let unrouted = specs.iter().find(|(name, ..)| *name == c.source.consumer);
        assert_eq!(
            unrouted.map(|s| s.1.clone()),
            Some(vec!["misc.*".to_string()])
        );
        // Every subject taken whole: no consumer for unrouted subjects at all.
        let c = config("\"orders.>\", \"misc.*\"", &["orders.>", "misc.*"]);
        assert!(uncovered_subjects(&c).is_empty());
        assert!(consumer_specs(&c)
            .iter()
            .all(|(n, ..)| *n != c.source.consumer));
    }
}
