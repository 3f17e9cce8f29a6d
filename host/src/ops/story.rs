//! One key's whole story, for `dedup-host inspect`: its claim record, the outputs it
//! published and whether each is still in its stream, its outbound HTTP calls (the journal),
//! its dead letters, and the source messages that carry it. It costs the same whatever the size of the claim store and the
//! source stream: the source messages are found by sequence (the record's, the letters')
//! and among those still waiting for the route, never by reading the route's whole subject.

use std::collections::BTreeSet;

use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::Context;
use serde::Serialize;

use super::claims::{Claims, RouteClaims};
use super::letters::{self, Letter, Selection};
use crate::claim::{key, ClaimRecord};
use crate::config::{Config, RouteConfig};
use crate::pipeline::effects::output_id;
use crate::pipeline::replayed::key_of;
use crate::scan;
use dedup_delivery::journal::{CallRecord, CallState};
use dedup_delivery::redact::mask_url;

/// Which key to tell about.
#[derive(Debug, Clone)]
pub enum Target {
    /// An idempotency key of the route.
    Key(String),
    /// A source stream sequence: its key is derived as the pipeline would.
    Sequence(u64),
}

/// Everything known about one key.
#[derive(Debug, Serialize)]
pub struct Story {
    /// The route.
    pub route: String,
    /// The idempotency key.
    pub key: String,
    /// The key in the claim bucket.
    pub claim_key: String,
    /// Where the claim was looked up: the route's contract decides, this config only when
    /// none is recorded.
    pub claims: RouteClaims,
    /// One line: what became of the key.
    pub verdict: String,
    /// The claim record, if the bucket holds one.
    pub claim: Option<ClaimRecord>,
    /// The record's revision in the bucket.
    pub revision: Option<u64>,
    /// The outputs the completed record lists.
    pub outputs: Vec<OutputState>,
    /// Its outbound HTTP calls, as journaled, by index.
    pub calls: Vec<CallView>,
    /// Dead letters of this key.
    pub dead_letters: Vec<Letter>,
    /// Sequences in the source stream whose message carries this key and is still stored:
    /// the one the claim record names (the run that wrote it), its dead letters' originals,
    /// the one asked about, and any still waiting for the route. A repeat of a settled key,
    /// acknowledged as a duplicate, is not looked for (that would read the whole subject).
    pub source_sequences: Vec<u64>,
}

/// One output of a completed key.
#[derive(Debug, Serialize)]
pub struct OutputState {
    /// Its `Nats-Msg-Id`.
    pub id: String,
    /// The stream that stored it.
    pub stream: String,
    /// Its sequence there.
    pub sequence: u64,
    /// Whether that sequence still holds it.
    pub present: bool,
}

/// One journaled outbound call of a key.
#[derive(Debug, Serialize)]
pub struct CallView {
    /// Its index in the run.
    pub index: u32,
    /// The request's method.
    pub method: String,
    /// The request's URL, its credentials and secret parameters masked
    /// ([`dedup_delivery::redact::mask_url`]).
    pub url: String,
    /// The answer's status, once recorded.
    pub status: Option<u16>,
    /// When the record was written (Unix milliseconds): the answer, or the intent.
    pub at_ms: u64,
    /// `sent` (by the key's latest run), `replayed` (sent by an earlier run; the latest run
    /// got the recorded answer, nothing was sent), or `pending` (sent, answer never
    /// recorded: outcome unknown).
    pub how: &'static str,
    /// The idempotency key it carried.
    pub idempotency_key: String,
}

impl CallView {
    /// The view of `record`, for a key whose latest run holds fencing token `latest`.
    fn of(record: CallRecord, latest: Option<u64>) -> Self {
        let earlier = matches!((record.token, latest), (Some(t), Some(l)) if t != l);
        let how = match record.state {
            CallState::Pending => "pending",
            CallState::Sent if earlier => "replayed",
            CallState::Sent => "sent",
        };
        // Shown to whoever reads the story: a URL's credentials and secret parameters
        // masked (the journal keeps the exact request).
        Self {
            index: record.index,
            method: record.method,
            url: mask_url(&record.url),
            status: record.response.map(|r| r.status),
            at_ms: record.at_ms,
            how,
            idempotency_key: mask_url(&record.idempotency_key),
        }
    }
}

/// Tells `target`'s story on `route`.
pub async fn tell(
    js: &Context,
    config: &Config,
    route: &str,
    target: Target,
) -> anyhow::Result<Story> {
    let Some(r) = config.routes.iter().find(|r| r.name == route) else {
        let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
        anyhow::bail!(
            "no route `{route}` in the config (routes: {})",
            names.join(", ")
        );
    };
    let source = js.get_stream(&config.source.stream).await?;
    let mut source_sequences = BTreeSet::new();
    let key = match target {
        Target::Key(k) => k,
        Target::Sequence(seq) => {
            let m = source
                .get_raw_message(seq)
                .await
                .map_err(|e| anyhow::anyhow!("source message {seq}: {e}"))?;
            if !crate::subject::matches(&r.subject, &m.subject) {
                anyhow::bail!(
                    "source message {seq} is on `{}`, not route `{route}`'s `{}`",
                    m.subject,
                    r.subject
                );
            }
            let dead = &config.dead_letter.stream;
            source_sequences.insert(seq);
            key_of(js, dead, &r.key, &m.subject, Some(&m.headers), &m.payload)
                .await?
                .map_err(|e| anyhow::anyhow!("source message {seq} has no key: {e}"))?
        }
    };
    let claim_key = key::encode(route, &key);
    let found = Claims::new(js, config)
        .await?
        .get(route, &claim_key)
        .await?;
    let store_key = found.key.clone();
    let journal = found.calls(js);
    let (claim, revision) = match found.record {
        Some((record, revision)) => (Some(record), Some(revision)),
        None => (None, None),
    };
    let mut outputs = Vec::new();
    // A renamed route's carried record names the key its outputs were published under.
    let outputs_key = claim
        .as_ref()
        .map_or(claim_key.as_str(), |c| c.outputs_key(&claim_key));
    for (i, o) in claim.iter().flat_map(|c| c.outputs.iter()).enumerate() {
        let id = output_id(outputs_key, i);
        let present = match js.get_stream(&o.stream).await {
            Ok(s) => s.get_raw_message(o.sequence).await.is_ok_and(|m| {
                m.headers
                    .get("Nats-Msg-Id")
                    .is_some_and(|v| v.as_str() == id)
            }),
            Err(_) => false,
        };
        outputs.push(OutputState {
            id,
            stream: o.stream.clone(),
            sequence: o.sequence,
            present,
        });
    }
    // A fenced commit's outputs are the sequences right before its record, same stream.
    if let (Some(n), Some(revision), Some(stream)) = (
        claim.as_ref().and_then(|c| c.batch_outputs),
        revision,
        crate::claim::stream::stream_of(&store_key).filter(|_| store_key != claim_key),
    ) {
        let s = js.get_stream(stream).await?;
        for i in 0..u64::from(n) {
            let id = output_id(outputs_key, i as usize);
            let sequence = revision - u64::from(n) + i;
            let present = s.get_raw_message(sequence).await.is_ok_and(|m| {
                m.headers
                    .get(crate::fenced::OUTPUT_ID)
                    .is_some_and(|v| v.as_str() == id)
            });
            outputs.push(OutputState {
                id,
                stream: stream.to_string(),
                sequence,
                present,
            });
        }
    }
    // The latest run's token: a completed or failed record names it; the winning write of a
    // run in progress carries none yet, its revision is the token.
    let latest = claim
        .as_ref()
        .and_then(|c| c.fencing_token)
        .or(revision.filter(|_| claim.is_some()));
    let calls = journal
        .records()
        .await?
        .into_iter()
        .map(|r| CallView::of(r, latest))
        .collect();
    let selection = Selection {
        route: Some(route.to_string()),
        ..Selection::default()
    };
    let dead_letters: Vec<Letter> = letters::list(js, config, &selection)
        .await?
        .into_iter()
        .filter(|l| l.key == key)
        .collect();
    let named = (claim.iter().filter_map(|c| c.source_sequence))
        .chain(dead_letters.iter().filter_map(|l| l.source_sequence))
        .collect::<BTreeSet<u64>>();
    for seq in named {
        if !source_sequences.contains(&seq) && carries(js, config, &source, r, seq, &key).await? {
            source_sequences.insert(seq);
        }
    }
    // Those not settled yet are above the route's floor: read only them.
    let floor = super::waiting::settled_floor(js, config, &source, r).await?;
    for m in scan::stream_from(js, &config.source.stream, &r.subject, floor + 1).await? {
        let dead = &config.dead_letter.stream;
        let derived = key_of(js, dead, &r.key, &m.subject, m.headers.as_ref(), &m.payload).await?;
        if derived.is_ok_and(|k| k == key) {
            source_sequences.insert(m.sequence);
        }
    }
    let source_sequences = source_sequences.into_iter().collect();
    let mut story = Story {
        route: route.to_string(),
        key,
        claim_key,
        claims: found.claims,
        verdict: String::new(),
        claim,
        revision,
        outputs,
        calls,
        dead_letters,
        source_sequences,
    };
    story.verdict = verdict(&story);
    Ok(story)
}

/// Whether the source stream still holds message `seq` on `route`'s subject, carrying `key`.
async fn carries(
    js: &Context,
    config: &Config,
    source: &Stream,
    route: &RouteConfig,
    seq: u64,
    key: &str,
) -> anyhow::Result<bool> {
    let Ok(m) = source.get_raw_message(seq).await else {
        return Ok(false); // removed by the stream's limits, or purged
    };
    if !crate::subject::matches(&route.subject, &m.subject) {
        return Ok(false);
    }
    let dead = &config.dead_letter.stream;
    let derived = key_of(
        js,
        dead,
        &route.key,
        &m.subject,
        Some(&m.headers),
        &m.payload,
    )
    .await?;
    Ok(derived.is_ok_and(|k| k == key))
}

fn verdict(s: &Story) -> String {
    use crate::claim::ClaimState::*;
    let now = crate::claim::record::now_ms();
    match &s.claim {
        None if s.source_sequences.is_empty() && s.dead_letters.is_empty() => {
            "unknown: no claim record, no dead letter, no source message carries this key".into()
        }
        None if !s.dead_letters.is_empty() => "dead-lettered before it was claimed".into(),
        None => "not claimed yet (waiting in the stream, or its record aged out)".into(),
        Some(c) => match c.state {
            Completed => {
                let missing = s.outputs.iter().filter(|o| !o.present).count();
                let outputs = s.outputs.len();
                if missing == 0 {
                    format!("completed on attempt {} with {outputs} output(s), all present", c.attempt)
                } else {
                    format!("completed on attempt {} with {outputs} output(s); {missing} no longer in their stream", c.attempt)
                }
            }
            Failed if c.permanent => format!(
                "dead-lettered after attempt {}: {}",
                c.attempt,
                c.reason.as_deref().unwrap_or("")
            ),
            Failed => format!(
                "attempt {} failed, will be retried{}: {}",
                c.attempt,
                c.retry_at_ms
                    .filter(|t| *t > now)
                    .map(|t| format!(" {}", crate::times::relative(t, now)))
                    .unwrap_or_default(),
                c.reason.as_deref().unwrap_or("")
            ),
            InProgress if c.lease_expires_ms < now => format!(
                "in progress on attempt {} by `{}`, lease lapsed {}: another host will take it over",
                c.attempt,
                c.owner,
                crate::times::relative(c.lease_expires_ms, now)
            ),
            InProgress => format!("in progress on attempt {} by `{}`", c.attempt, c.owner),
        },
    }
}
