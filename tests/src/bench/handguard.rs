//! The baseline the no-op guard is held to: what a user would write instead of dedup-host,
//! with async-nats and no wasm. Per message: KV create of the key (a duplicate whose key
//! exists is acked if completed, else naked), then an update to completed expecting the
//! create's revision, then the ack; 64 messages in flight, one task each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, CreateErrorKind};
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

/// Drains `n` pre-published messages through the hand-written guard, then probes `samples`
/// one at a time. `name` keeps its stream, consumer and bucket apart from other scenarios.
pub(super) async fn run(
    js: &Context,
    name: &str,
    ack: Ack,
    n: usize,
    samples: usize,
) -> anyhow::Result<Figures> {
    let subjects = format!("{name}.>");
    let consumer = super::pull_consumer(js, &format!("HAND_{name}"), &subjects, "guard").await?;
    let bucket = js
        .create_key_value(kv::Config {
            bucket: format!("hand_{name}"),
            history: 1,
            max_age: Duration::from_secs(24 * 3600),
            ..Default::default()
        })
        .await?;
    let settled = Arc::new(AtomicU64::new(0));
    let worker = tokio::spawn(consume(consumer, bucket, ack, settled.clone()));
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

/// Pulls and guards messages until aborted, counting each one settled.
async fn consume(
    consumer: jetstream::consumer::PullConsumer,
    bucket: kv::Store,
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
        let (bucket, settled) = (bucket.clone(), settled.clone());
        tokio::spawn(async move {
            if guard(&bucket, &message, ack).await.is_ok() {
                settled.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    Ok(())
}

/// One message: claim its key, record completion, ack.
async fn guard(bucket: &kv::Store, message: &jetstream::Message, ack: Ack) -> anyhow::Result<()> {
    let id = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|v| v.to_string())
        .unwrap_or_default();
    let key = id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
    let revision = match bucket.create(&key, "in_progress".into()).await {
        Ok(revision) => revision,
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let done = bucket.get(&key).await?.is_some_and(|v| v == "completed");
            let kind = if done {
                AckKind::Ack
            } else {
                AckKind::Nak(None)
            };
            message
                .ack_with(kind)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::bail!("duplicate");
        }
        Err(e) => return Err(e.into()),
    };
    bucket.update(&key, "completed".into(), revision).await?;
    match ack {
        Ack::Confirmed => message.double_ack().await,
        Ack::Plain => message.ack().await,
    }
    .map_err(|e| anyhow::anyhow!("{e}"))
}
