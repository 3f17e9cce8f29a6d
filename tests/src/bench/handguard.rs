//! The baselines the host is held to: what a user would write instead of dedup-host, with
//! async-nats and no wasm; 64 messages in flight, one task each. Per message:
//! - [`Guard::Record`]: KV create of the key (a duplicate whose key exists is acked if
//!   completed, else naked), an update to completed expecting the create's revision, the ack;
//! - [`Guard::Output`]: the same with one output published between (its message id the key,
//!   its stored answer awaited), as the host's window mode does;
//! - [`Guard::Fenced`]: the claim created on a stream subject (expected last subject sequence
//!   0), then one atomic batch of the output and the completed record (expected at the
//!   create's sequence), the ack, as the host's fenced mode does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, CreateErrorKind};
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::{self, AckKind, Context};
use async_nats::HeaderMap;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::pipeline::Figures;
use super::{percentiles, publish_many};

/// Messages in flight at once, as in the other pipeline scenarios.
const CONCURRENCY: usize = 64;

/// How the hand-written guard acks after recording completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// `double_ack`: the server confirms (what exactly-once needs before moving on).
    Confirmed,
    /// `ack`: fire and forget.
    Plain,
}

/// What the hand-written guard does per message (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Claim and completion in a KV bucket.
    Record,
    /// Claim, one output with a message id, completion.
    Output,
    /// Claim on a stream subject, then the output and completion as one atomic batch, on a
    /// stream of this storage.
    Fenced(StorageType),
}

/// Where one hand-written guard keeps its state.
#[derive(Clone)]
struct Stores {
    js: Context,
    /// The claim bucket ([`Guard::Record`] and [`Guard::Output`]).
    bucket: Option<kv::Store>,
    /// The subject outputs are published on.
    output: String,
    /// The prefix of claim subjects ([`Guard::Fenced`]).
    claims: String,
    /// The stream that stores outputs (and the claims of [`Guard::Fenced`]).
    stream: String,
}

/// Drains `n` pre-published messages through the hand-written guard, then probes `samples`
/// one at a time. `name` keeps its streams, consumer and bucket apart from other scenarios.
pub(super) async fn run(
    js: &Context,
    name: &str,
    guard: Guard,
    ack: Ack,
    n: usize,
    samples: usize,
) -> anyhow::Result<Figures> {
    let (worker, settled) = start(js, name, guard, ack).await?;
    let wait = |target: u64, probe: bool| {
        let settled = settled.clone();
        async move {
            if probe {
                let done = move || settled.load(Ordering::Relaxed) >= target;
                return super::wait_until(done).await;
            }
            while settled.load(Ordering::Relaxed) < target {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    publish_many(
        js,
        &format!("{name}.warm"),
        &format!("{name}-warm"),
        200,
        &[b'a'; 1024],
    )
    .await?;
    wait(200, false).await;
    publish_many(js, &format!("{name}.x"), name, n, &[b'a'; 1024]).await?;
    let started = Instant::now();
    let cpu = super::process_cpu();
    wait(200 + n as u64, false).await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu_per_message = Some((super::process_cpu() - cpu) / n as u32);
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let done = settled.load(Ordering::Relaxed);
        let t = Instant::now();
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{name}-probe-{i}").as_str());
        js.publish_with_headers(format!("{name}.probe"), h, vec![b'a'; 1024].into())
            .await?
            .await?;
        wait(done + 1, true).await;
        lat.push(t.elapsed());
    }
    worker.abort();
    Ok(Figures {
        rate,
        latency: percentiles(&mut lat),
        cpu_per_message,
    })
}

/// Starts the hand-written guard on subjects `<name>.>`: the task that consumes (abort it to
/// stop) and the count of messages it has settled.
pub(super) async fn start(
    js: &Context,
    name: &str,
    guard: Guard,
    ack: Ack,
) -> anyhow::Result<(tokio::task::JoinHandle<anyhow::Result<()>>, Arc<AtomicU64>)> {
    let subjects = format!("{name}.>");
    let consumer = super::pull_consumer(js, &format!("HAND_{name}"), &subjects, "guard").await?;
    let stores = stores(js, name, guard).await?;
    let settled = Arc::new(AtomicU64::new(0));
    let worker = tokio::spawn(consume(consumer, stores, guard, ack, settled.clone()));
    Ok((worker, settled))
}

/// Creates what `guard` writes to: the claim bucket, or the fenced stream, and the stream
/// that stores outputs.
async fn stores(js: &Context, name: &str, guard: Guard) -> anyhow::Result<Stores> {
    let output = format!("out{name}.done");
    let claims = format!("out{name}.claims");
    let stream_name = format!("HANDOUT_{name}");
    let mut stream = stream::Config {
        name: stream_name.clone(),
        subjects: vec![format!("out{name}.>")],
        ..Default::default()
    };
    if let Guard::Fenced(storage) = guard {
        stream.storage = storage;
        stream.allow_atomic_publish = true;
        stream.allow_rollup = true;
    }
    js.get_or_create_stream(stream).await?;
    let bucket = match guard {
        Guard::Fenced(_) => None,
        Guard::Record | Guard::Output => Some(
            js.create_key_value(kv::Config {
                bucket: format!("hand_{name}"),
                history: 1,
                max_age: Duration::from_secs(24 * 3600),
                ..Default::default()
            })
            .await?,
        ),
    };
    Ok(Stores {
        js: js.clone(),
        bucket,
        output,
        claims,
        stream: stream_name,
    })
}

/// Pulls and guards messages until aborted, counting each one settled.
async fn consume(
    consumer: jetstream::consumer::PullConsumer,
    stores: Stores,
    guard: Guard,
    ack: Ack,
    settled: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(CONCURRENCY)
        .messages()
        .await?;
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
        let permit = permits.clone().acquire_owned().await?;
        let (stores, settled) = (stores.clone(), settled.clone());
        tokio::spawn(async move {
            let done = match guard {
                Guard::Record | Guard::Output => guard_kv(&stores, &message, guard).await,
                Guard::Fenced(_) => guard_fenced(&stores, &message).await,
            };
            let acked = match done {
                Ok(Settled::Completed) => match ack {
                    Ack::Confirmed => message.double_ack().await,
                    Ack::Plain => message.ack().await,
                }
                .is_ok(),
                Ok(Settled::Duplicate) | Err(_) => false,
            };
            if acked {
                settled.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    Ok(())
}

/// How one message ended, short of its final ack.
enum Settled {
    /// Run and recorded: ack it.
    Completed,
    /// Its key was claimed already; settled here.
    Duplicate,
}

/// The message's idempotency key: its message id, made safe for a KV key or a subject token.
pub(super) fn key_of(message: &jetstream::Message) -> String {
    let id = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.to_string())
        .unwrap_or_default();
    id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
}

/// Acks a duplicate whose key is completed, naks one still in progress.
pub(super) async fn settle_duplicate(
    message: &jetstream::Message,
    completed: bool,
) -> anyhow::Result<()> {
    let kind = if completed {
        AckKind::Ack
    } else {
        AckKind::Nak(None)
    };
    message
        .ack_with(kind)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// [`Guard::Record`] and [`Guard::Output`]: claim the key in the bucket, publish the output
/// (for `Output`), record completion.
async fn guard_kv(
    stores: &Stores,
    message: &jetstream::Message,
    guard: Guard,
) -> anyhow::Result<Settled> {
    let bucket = stores.bucket.as_ref().expect("a KV guard has a bucket");
    let key = key_of(message);
    let revision = match bucket.create(&key, "in_progress".into()).await {
        Ok(revision) => revision,
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let done = bucket.get(&key).await?.is_some_and(|v| v == "completed");
            settle_duplicate(message, done).await?;
            return Ok(Settled::Duplicate);
        }
        Err(e) => return Err(e.into()),
    };
    if guard == Guard::Output {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", key.as_str());
        let payload = message.payload.to_ascii_uppercase();
        stores
            .js
            .publish_with_headers(stores.output.clone(), h, payload.into())
            .await?
            .await?;
    }
    bucket.update(&key, "completed".into(), revision).await?;
    Ok(Settled::Completed)
}

/// [`Guard::Fenced`]: claim the key on its stream subject, then commit the output and the
/// completed record as one atomic batch that the server stores only if the claim is still at
/// the create's sequence.
async fn guard_fenced(stores: &Stores, message: &jetstream::Message) -> anyhow::Result<Settled> {
    let key = key_of(message);
    let claim = format!("{}.{key}", stores.claims);
    let mut h = HeaderMap::new();
    h.insert("Nats-Expected-Last-Subject-Sequence", "0");
    let created = stores
        .js
        .publish_with_headers(claim.clone(), h, "in_progress".into())
        .await?
        .await;
    let revision = match created {
        Ok(ack) => ack.sequence,
        Err(_) => {
            let stream = stores.js.get_stream(&stores.stream).await?;
            let last = stream.get_last_raw_message_by_subject(&claim).await;
            let done = last.is_ok_and(|m| &m.payload[..] == b"completed");
            settle_duplicate(message, done).await?;
            return Ok(Settled::Duplicate);
        }
    };
    let batch = format!("b-{key}");
    let mut h = HeaderMap::new();
    h.insert("Nats-Batch-Id", batch.as_str());
    h.insert("Nats-Batch-Sequence", "1");
    let payload = message.payload.to_ascii_uppercase();
    stores
        .js
        .client()
        .publish_with_headers(stores.output.clone(), h, payload.into())
        .await?;
    let mut h = HeaderMap::new();
    h.insert("Nats-Batch-Id", batch.as_str());
    h.insert("Nats-Batch-Sequence", "2");
    h.insert("Nats-Batch-Commit", "1");
    h.insert(
        "Nats-Expected-Last-Subject-Sequence",
        revision.to_string().as_str(),
    );
    stores
        .js
        .publish_with_headers(claim, h, "completed".into())
        .await?
        .await?;
    Ok(Settled::Completed)
}
