//! The hand-written baseline of a route making one outbound call (issue 45): what a user
//! would write instead of dedup-host, with async-nats and hyper and no wasm; 64 messages in
//! flight, one task each. Per message: the claim create of [`handguard`](super::handguard)'s
//! guard (a duplicate is settled as it settles one), the journal's PENDING record put under
//! `<key>.call.0` in the same bucket, the POST (`Idempotency-Key` header) through a pooled
//! hyper client, the answered (SENT) record put under the same key, the output published
//! with the key as its message id (its stored answer awaited), the update to completed
//! expecting the create's revision, and a plain ack. The journal records are the host's own
//! type ([`CallRecord`]), so they are as big as the host's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::kv::{self, CreateErrorKind};
use async_nats::jetstream::stream;
use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use dedup_delivery::journal::{
    idempotency_key, CallRecord, CallRequest, CallState, RecordedResponse,
};
use futures::StreamExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::handguard::{key_of, settle_duplicate};

/// Messages in flight at once, as in the host benches.
const CONCURRENCY: usize = 64;

/// The largest answer read (the endpoint answers a few bytes).
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// What every message's task shares.
#[derive(Clone)]
struct Worker {
    js: Context,
    bucket: kv::Store,
    output: String,
    client: Client<HttpConnector, String>,
}

/// Starts the hand-written caller on subjects `<name>.>`: the task that consumes (abort it to
/// stop) and the count of messages it has settled. Each message's payload is the `http-call`
/// guest's (`{"calls": [{"url": ..., "body": ...}]}`); its first call is made.
pub(super) async fn start(
    js: &Context,
    name: &str,
) -> anyhow::Result<(tokio::task::JoinHandle<anyhow::Result<()>>, Arc<AtomicU64>)> {
    let consumer =
        super::pull_consumer(js, &format!("HAND_{name}"), &format!("{name}.>"), "guard").await?;
    js.get_or_create_stream(stream::Config {
        name: format!("HANDOUT_{name}"),
        subjects: vec![format!("out{name}.>")],
        ..Default::default()
    })
    .await?;
    let bucket = js
        .create_key_value(kv::Config {
            bucket: format!("hand_{name}"),
            history: 1,
            max_age: Duration::from_secs(24 * 3600),
            ..Default::default()
        })
        .await?;
    let worker = Worker {
        js: js.clone(),
        bucket,
        output: format!("out{name}.done"),
        client: Client::builder(TokioExecutor::new()).build_http(),
    };
    let settled = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(consume(consumer, worker, settled.clone()));
    Ok((task, settled))
}

/// Pulls and handles messages until aborted, counting each one settled.
async fn consume(
    consumer: jetstream::consumer::PullConsumer,
    worker: Worker,
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
        let (worker, settled) = (worker.clone(), settled.clone());
        tokio::spawn(async move {
            let acked = match handle(&worker, &message).await {
                Ok(true) => message.ack().await.is_ok(),
                Ok(false) => false,
                Err(e) => {
                    eprintln!("hand-written caller: {e:#}");
                    false
                }
            };
            if acked {
                settled.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    Ok(())
}

/// One message: claim, journal, call, journal, output, completion. `false` for a duplicate
/// (settled here).
async fn handle(worker: &Worker, message: &jetstream::Message) -> anyhow::Result<bool> {
    let bucket = &worker.bucket;
    let key = key_of(message);
    let revision = match bucket.create(&key, "in_progress".into()).await {
        Ok(revision) => revision,
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let done = bucket.get(&key).await?.is_some_and(|v| v == "completed");
            settle_duplicate(message, done).await?;
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let input: serde_json::Value = serde_json::from_slice(&message.payload)?;
    let call = &input["calls"][0];
    let url = call["url"].as_str().context("the payload names no url")?;
    let body = call["body"].as_str().unwrap_or_default();
    let request = CallRequest::new("POST", url, body.as_bytes());
    let journal_key = idempotency_key(&key, 0);
    let record = |state, response| CallRecord {
        index: 0,
        state,
        method: request.method.clone(),
        url: request.url.clone(),
        body_digest: request.body_digest.clone(),
        idempotency_key: journal_key.clone(),
        at_ms: now_ms(),
        response,
        token: Some(revision),
    };
    let pending = record(CallState::Pending, None).to_bytes();
    bucket.put(&journal_key, pending.into()).await?;
    let answer = post(&worker.client, url, &journal_key, body).await?;
    anyhow::ensure!(
        answer.status == 201,
        "the endpoint answered {}",
        answer.status
    );
    let result = serde_json::json!([{
        "status": answer.status,
        "body": String::from_utf8_lossy(&answer.body),
        "error": null,
    }]);
    let sent = record(CallState::Sent, Some(answer)).to_bytes();
    bucket.put(&journal_key, sent.into()).await?;
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", key.as_str());
    let payload = serde_json::to_vec(&result)?;
    (worker.js)
        .publish_with_headers(worker.output.clone(), h, payload.into())
        .await?
        .await?;
    bucket.update(&key, "completed".into(), revision).await?;
    Ok(true)
}

/// POSTs `body` to `url` with idempotency key `key`; the answer as the journal records it.
async fn post(
    client: &Client<HttpConnector, String>,
    url: &str,
    key: &str,
    body: &str,
) -> anyhow::Result<RecordedResponse> {
    let request = axum::http::Request::post(url)
        .header("Idempotency-Key", key)
        .body(body.to_string())?;
    let (parts, incoming) = client.request(request).await?.into_parts();
    let body = axum::body::to_bytes(axum::body::Body::new(incoming), MAX_RESPONSE_BYTES).await?;
    let headers = parts
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
        .collect();
    Ok(RecordedResponse {
        status: parts.status.as_u16(),
        headers,
        body: body.to_vec(),
    })
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
