//! Creating or verifying what the host needs on the server: the source stream and its durable
//! consumers (one per route, plus one for subjects no route takes), the claim bucket, the
//! dead-letter stream and the output streams.

use anyhow::Context as _;
use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::jetstream::kv::{self, Store};
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::Context;

use crate::config::{Config, Storage};
use crate::subject;

/// Handles to everything set up.
pub struct Setup {
    /// The source stream, on which route consumers are created.
    pub source: stream::Stream,
    /// The claim bucket.
    pub claims: Store,
}

/// Creates what is missing and checks what exists.
pub async fn ensure(js: &Context, config: &Config) -> anyhow::Result<Setup> {
    let source = ensure_stream(
        js,
        &config.source.stream,
        config.source_subjects(),
        config.source.duplicate_window,
        "source.stream",
    )
    .await?;
    check_covers(&source, config)?;
    ensure_stream(
        js,
        &config.dead_letter.stream,
        vec![config.dead_letter.subject.clone()],
        config.source.duplicate_window,
        "dead_letter.stream",
    )
    .await?;
    for (i, o) in config.output_streams.iter().enumerate() {
        let mut s = ensure_stream(
            js,
            &o.name,
            o.subjects.clone(),
            o.duplicate_window,
            &format!("output_streams[{i}]"),
        )
        .await?;
        let window = s.info().await?.config.duplicate_window;
        let gap = config.longest_rerun_gap();
        anyhow::ensure!(
            window > gap,
            "output stream `{}` has a duplicate window of {window:?}, shorter than the longest gap between two runs of one key ({gap:?}): a re-run could publish an output twice; raise the stream's duplicate_window",
            o.name
        );
    }
    let claims = ensure_bucket(js, config).await?;
    Ok(Setup { source, claims })
}

/// The durable name of a route's consumer: `<source.consumer>-<route>`.
pub fn route_consumer_name(config: &Config, route: &str) -> String {
    format!("{}-{route}", config.source.consumer)
}

/// Creates or updates the durable consumer of one route: it sees only the route's subject,
/// so a slow route never holds back another, and a route that is not served leaves its
/// messages waiting in the stream.
pub async fn route_consumer(
    source: &stream::Stream,
    config: &Config,
    route: &str,
    filter: &str,
) -> anyhow::Result<PullConsumer> {
    let name = route_consumer_name(config, route);
    create_consumer(source, config, &name, vec![filter.to_string()]).await
}

/// The consumer for source subjects no route covers, named `source.consumer`: it
/// dead-letters what no route takes. `None` when the routes cover every source subject
/// (a leftover consumer of that name is then deleted).
pub async fn unrouted_consumer(
    source: &stream::Stream,
    config: &Config,
) -> anyhow::Result<Option<PullConsumer>> {
    let name = &config.source.consumer;
    let covered = config
        .source_subjects()
        .iter()
        .all(|s| config.routes.iter().any(|r| subject::covers(&r.subject, s)));
    if covered {
        if source.consumer_info(name).await.is_ok() {
            source
                .delete_consumer(name)
                .await
                .with_context(|| format!("cannot delete unused consumer `{name}`"))?;
        }
        return Ok(None);
    }
    let consumer = create_consumer(source, config, name, config.source_subjects()).await?;
    Ok(Some(consumer))
}

async fn create_consumer(
    source: &stream::Stream,
    config: &Config,
    name: &str,
    filter_subjects: Vec<String>,
) -> anyhow::Result<PullConsumer> {
    source
        .create_consumer(pull::Config {
            durable_name: Some(name.to_string()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: config.source.ack_wait,
            // Unlimited: the host counts attempts per key and dead-letters by itself.
            max_deliver: -1,
            max_ack_pending: config.source.max_ack_pending,
            filter_subjects,
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "cannot create or update consumer `{name}` on stream `{}` (`source.consumer`)",
                config.source.stream
            )
        })
}

async fn ensure_stream(
    js: &Context,
    name: &str,
    subjects: Vec<String>,
    duplicate_window: std::time::Duration,
    field: &str,
) -> anyhow::Result<stream::Stream> {
    js.get_or_create_stream(stream::Config {
        name: name.to_string(),
        subjects,
        duplicate_window,
        storage: StorageType::File,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create or open stream `{name}` (`{field}`)"))
}

/// An existing source stream must capture every route's subjects.
fn check_covers(stream: &stream::Stream, config: &Config) -> anyhow::Result<()> {
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

async fn ensure_bucket(js: &Context, config: &Config) -> anyhow::Result<Store> {
    let c = &config.claims;
    if let Ok(store) = js.get_key_value(&c.bucket).await {
        // Never recreate a bucket under running hosts: revisions would go backwards.
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: c.bucket.clone(),
        history: 1,
        max_age: c.max_age,
        num_replicas: c.replicas,
        storage: match c.storage {
            Storage::File => StorageType::File,
            Storage::Memory => StorageType::Memory,
        },
        ..Default::default()
    })
    .await
    .with_context(|| {
        format!(
            "cannot create claim bucket `{}` (`claims.bucket`)",
            c.bucket
        )
    })
}
