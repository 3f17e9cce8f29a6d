//! Reading a whole stream or bucket quickly: an ordered consumer (ephemeral, no acks, one
//! pass), so that the audit of 100,000 messages takes seconds, not one request per message.
//! A push consumer delivering to this client's inbox: a pull from a consumer the server
//! names would need `CONSUMER.MSG.NEXT.<stream>.*`, which reaches every durable on the
//! stream (`crate::permissions::grants`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::push::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;

use crate::claim::ClaimRecord;

/// One stored message.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its stream sequence.
    pub sequence: u64,
    /// The subject it was published on.
    pub subject: String,
    /// Its headers, if any.
    pub headers: Option<HeaderMap>,
    /// Its payload.
    pub payload: Bytes,
    /// When the stream stored it.
    pub time: SystemTime,
}

impl Stored {
    /// The value of header `name`, if set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str())
    }
}

/// How long a scan waits for the next message before giving up.
const STALL: Duration = Duration::from_secs(10);

/// Every message of `stream` (only those stored at or after `since`, when given, and matching
/// `filter` when not empty), in order.
pub async fn stream(
    js: &Context,
    stream: &str,
    filter: &str,
    since: Option<SystemTime>,
) -> anyhow::Result<Vec<Stored>> {
    let deliver_policy = match since {
        Some(t) => DeliverPolicy::ByStartTime {
            start_time: offset(t),
        },
        None => DeliverPolicy::All,
    };
    scan(js, stream, filter, deliver_policy, false).await
}

/// Every message of `stream` from sequence `start_sequence` on (matching `filter` when not
/// empty), in order.
pub async fn stream_from(
    js: &Context,
    stream: &str,
    filter: &str,
    start_sequence: u64,
) -> anyhow::Result<Vec<Stored>> {
    let start_sequence = start_sequence.max(1);
    let policy = DeliverPolicy::ByStartSequence { start_sequence };
    scan(js, stream, filter, policy, false).await
}

/// The last `n` messages of `stream` (fewer when it holds fewer), in order.
pub async fn tail(js: &Context, stream: &str, n: u64) -> anyhow::Result<Vec<Stored>> {
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read stream `{stream}`: {e}"))?;
    let last = s.info().await?.state.last_sequence;
    let start_sequence = last.saturating_sub(n.saturating_sub(1)).max(1);
    scan(
        js,
        stream,
        "",
        DeliverPolicy::ByStartSequence { start_sequence },
        false,
    )
    .await
}

/// The last value of every key in the claim bucket: claim key → (record, revision). Values
/// that do not parse are skipped (the pipeline dead-letters what meets them), and so are the
/// host's own markers (`crate::stranded`), which are not claims.
pub async fn claims(
    js: &Context,
    bucket: &str,
) -> anyhow::Result<HashMap<String, (ClaimRecord, u64)>> {
    let mut out = HashMap::new();
    for (key, m) in kv_latest(js, bucket, ">").await? {
        if let Ok(record) = ClaimRecord::from_bytes(&m.payload) {
            out.insert(key, (record, m.sequence));
        }
    }
    Ok(out)
}

/// The last value of every key of KV `bucket` matching `filter` (a subject filter over the
/// keys, `>` for all), with its key; deleted and purged keys are left out.
pub async fn kv_latest(
    js: &Context,
    bucket: &str,
    filter: &str,
) -> anyhow::Result<Vec<(String, Stored)>> {
    let prefix = format!("$KV.{bucket}.");
    let messages = scan(
        js,
        &format!("KV_{bucket}"),
        &format!("{prefix}{filter}"),
        DeliverPolicy::LastPerSubject,
        false,
    )
    .await?;
    Ok(messages
        .into_iter()
        .filter(|m| m.header("KV-Operation").is_none())
        .filter_map(|m| Some((m.subject.strip_prefix(&prefix)?.to_string(), m)))
        .collect())
}

/// The claim records a fenced output stream holds: claim key → (record, revision).
pub async fn fenced_claims(
    js: &Context,
    stream: &str,
) -> anyhow::Result<HashMap<String, (ClaimRecord, u64)>> {
    let filter = crate::fenced::claim_subjects(stream);
    let messages = scan(js, stream, &filter, DeliverPolicy::LastPerSubject, false).await?;
    let mut out = HashMap::with_capacity(messages.len());
    for m in messages {
        let Some(key) = crate::fenced::claim_key_of(stream, &m.subject) else {
            continue;
        };
        if let Ok(record) = ClaimRecord::from_bytes(&m.payload) {
            out.insert(key.to_string(), (record, m.sequence));
        }
    }
    Ok(out)
}

/// The output ids stored in `stream` (`Nats-Msg-Id`, or a fenced output's
/// `Dedup-Output-Id`), with every sequence carrying each (headers only: payloads are not
/// read).
pub async fn message_ids(js: &Context, stream: &str) -> anyhow::Result<HashMap<String, Vec<u64>>> {
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    for m in scan(js, stream, "", DeliverPolicy::All, true).await? {
        let fenced = m.header(crate::fenced::OUTPUT_ID);
        if let Some(id) = m.header("Nats-Msg-Id").or(fenced) {
            out.entry(id.to_string()).or_default().push(m.sequence);
        }
    }
    Ok(out)
}

async fn scan(
    js: &Context,
    stream: &str,
    filter: &str,
    deliver_policy: DeliverPolicy,
    headers_only: bool,
) -> anyhow::Result<Vec<Stored>> {
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read stream `{stream}`: {e}"))?;
    let state = s.info().await?.state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return Ok(out);
    }
    let consumer = s
        .create_consumer(OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: filter.to_string(),
            deliver_policy,
            headers_only,
            ..Default::default()
        })
        .await?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await?;
    loop {
        let next = tokio::time::timeout(STALL, messages.next()).await;
        let message = match next {
            Ok(Some(m)) => m?,
            Ok(None) => break,
            Err(_) => anyhow::bail!("reading stream `{stream}` stalled for {STALL:?}"),
        };
        let info = message.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (sequence, pending, published) = (info.stream_sequence, info.pending, info.published);
        out.push(Stored {
            sequence,
            subject: message.subject.to_string(),
            headers: message.headers.clone(),
            payload: message.payload.clone(),
            time: system_time(published),
        });
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// `t` as the time type JetStream consumers take.
pub fn offset(t: SystemTime) -> time::OffsetDateTime {
    let nanos = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos as i128)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn system_time(t: time::OffsetDateTime) -> SystemTime {
    let nanos = u64::try_from(t.unix_timestamp_nanos()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
}
