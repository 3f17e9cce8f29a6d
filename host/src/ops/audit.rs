//! `dedup-host audit`: a cross-layer reconciliation of the source stream, the claim bucket,
//! the output streams and the dead letters. Every source message's key must be completed
//! with its outputs present, dead-lettered with a failed-for-good record, or still
//! legitimately pending; every output must belong to a completed key, once; every dead
//! letter of a key must have a record.
//!
//! "Pending" means the route's consumer has not acknowledged the message yet (its sequence is
//! above the consumer's ack floor), or a live lease or a retry is under way. The audit reads
//! each store in one pass (ordered consumers), so it runs in seconds for 100,000 messages.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use async_nats::jetstream::Context;
use serde::Serialize;

use super::letters::{self, Letter, Selection};
use crate::claim::{key, ClaimRecord, ClaimState};
use crate::config::{Config, EffectsMode, MissingKey};
use crate::pipeline::effects::output_id;
use crate::pipeline::replayed::key_of;
use crate::scan;
use crate::subject;
use dedup_delivery::journal::{CallRecord, CallState};

/// The audit's findings.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Source messages read.
    pub messages: u64,
    /// Distinct keys among them.
    pub keys: u64,
    /// Keys completed with every output present.
    pub completed: u64,
    /// Keys (or keyless messages) dead-lettered.
    pub dead_lettered: u64,
    /// Keys still being worked on or waiting for a delivery.
    pub pending: u64,
    /// Messages that repeated a key seen before (deduplicated).
    pub duplicates: u64,
    /// Outputs read from the output streams.
    pub outputs: u64,
    /// Outbound HTTP calls left PENDING for longer than the lease: the run that sent them
    /// died (or lost its lease) before recording the answer, so nobody knows whether they took
    /// effect until a re-run resends them or an operator settles the key's dead letter.
    pub pending_calls: u64,
    /// Everything wrong, one entry each.
    pub anomalies: Vec<Anomaly>,
}

/// One thing that breaks the promise.
#[derive(Debug, Serialize, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// The class: `completed_without_outputs`, `outputs_without_completed_record`,
    /// `stuck_claim`, `dead_letter_without_failed_record`, `output_published_twice`,
    /// `lost`, `not_dead_lettered` (past its last delivery, its letter not stored yet),
    /// `missing_stream` (the dead-letter stream is gone).
    pub class: &'static str,
    /// The claim key (or `seq:<n>` for a keyless message, a stream's name for a missing one).
    pub key: String,
    /// What exactly.
    pub detail: String,
}

/// Runs the audit over source messages stored since `since` (all when `None`).
pub async fn run(
    js: &Context,
    config: &Config,
    since: Option<SystemTime>,
) -> anyhow::Result<Report> {
    let source = scan::stream(js, &config.source.stream, "", since).await?;
    let mut claims = scan::claims(js, &config.claims.bucket).await?;
    for s in &config.output_streams {
        if s.effects == EffectsMode::Fenced {
            claims.extend(scan::fenced_claims(js, &s.name).await?);
        }
    }
    // A missing dead-letter stream is itself an anomaly (reported below), not a failed audit.
    let dead_letter_stream = js.get_stream(&config.dead_letter.stream).await.is_ok();
    let letters = match dead_letter_stream {
        true => letters::list(js, config, &Selection::default()).await?,
        false => Vec::new(),
    };
    let mut ack_floors = HashMap::new();
    let stream = js.get_stream(&config.source.stream).await?;
    for r in &config.routes {
        let floor = super::waiting::settled_floor(js, config, &stream, r).await?;
        ack_floors.insert(r.name.clone(), floor);
    }
    let mut outputs: HashMap<String, Vec<(String, u64)>> = HashMap::new(); // id → (stream, seq)
    for s in &config.output_streams {
        for (id, seqs) in scan::message_ids(js, &s.name).await? {
            let entry = outputs.entry(id).or_default();
            entry.extend(seqs.into_iter().map(|seq| (s.name.clone(), seq)));
        }
    }

    let audited: HashSet<&str> = config
        .output_streams
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    let mut report = Report {
        messages: source.len() as u64,
        outputs: outputs.values().map(|v| v.len() as u64).sum(),
        ..Report::default()
    };
    let now = crate::claim::record::now_ms();
    let letter_keys: HashSet<String> = letters.iter().filter_map(Letter::claim_key).collect();
    let lettered_seqs: HashSet<u64> = letters.iter().filter_map(|l| l.source_sequence).collect();
    let mut anomaly = |class, key: &str, detail: String| {
        report.anomalies.push(Anomaly {
            class,
            key: key.to_string(),
            detail,
        })
    };

    if !dead_letter_stream {
        let name = &config.dead_letter.stream;
        anomaly(
            "missing_stream",
            name,
            format!("dead-letter stream `{name}` does not exist: no letter can be stored until `dedup-host setup --config FILE` creates it again"),
        );
    }

    // Source messages, judged per key by the key's latest message.
    let mut keys: HashMap<String, (u64, String)> = HashMap::new(); // claim key → (last seq, route)
    let (mut duplicates, mut dead_lettered, mut pending) = (0, 0, 0);
    for m in &source {
        let routed = config
            .routes
            .iter()
            .find(|r| subject::matches(&r.subject, &m.subject));
        let Some(route) = routed else {
            if lettered_seqs.contains(&m.sequence) {
                dead_lettered += 1;
            }
            continue; // no route: dead-lettered by the unrouted consumer, or waiting for it
        };
        let dead = &config.dead_letter.stream;
        let (subject, headers) = (&m.subject, m.headers.as_ref());
        let derived = key_of(js, dead, &route.key, subject, headers, &m.payload).await?;
        let id = match (derived, route.missing_key) {
            (Ok(k), _) => k,
            (Err(_), MissingKey::StreamSequence) => format!("seq-{}", m.sequence),
            (Err(_), MissingKey::DeadLetter) => {
                if lettered_seqs.contains(&m.sequence) {
                    dead_lettered += 1;
                } else if m.sequence <= ack_floors[&route.name] {
                    anomaly(
                        "lost",
                        &format!("seq:{}", m.sequence),
                        "keyless message acknowledged without a dead letter".into(),
                    );
                } else {
                    pending += 1;
                }
                continue;
            }
        };
        let claim_key = key::encode(&route.name, &id);
        if keys
            .insert(claim_key, (m.sequence, route.name.clone()))
            .is_some()
        {
            duplicates += 1;
        }
    }
    let mut completed = 0;
    for (claim_key, (seq, route)) in &keys {
        let acked = *seq <= ack_floors[route];
        match claims.get(claim_key).map(|(r, _)| r) {
            Some(r) if r.state == ClaimState::Completed => {
                // A renamed route's carried record names the key its outputs were published under.
                let missing = missing_outputs(r.outputs_key(claim_key), r, &outputs, &audited);
                if missing.is_empty() {
                    completed += 1;
                } else {
                    anomaly(
                        "completed_without_outputs",
                        claim_key,
                        format!(
                            "completed, but output(s) {} are in no output stream",
                            missing.join(", ")
                        ),
                    );
                }
            }
            Some(r) if r.state == ClaimState::Failed && r.permanent => dead_lettered += 1,
            Some(r) if r.state == ClaimState::InProgress && r.lease_expires_ms < now && acked => {
                anomaly("stuck_claim", claim_key, format!("in progress by `{}` with a lease that lapsed {} ms ago, and no delivery left to retry it", r.owner, now - r.lease_expires_ms));
            }
            Some(_) => pending += 1,
            // A message dead-lettered before its key was read (an oversized payload) has a
            // letter without a key: its source sequence says it was handled.
            None if letter_keys.contains(claim_key) || lettered_seqs.contains(seq) => {
                dead_lettered += 1
            }
            None if acked => {
                anomaly("lost", claim_key, format!("source message {seq} was acknowledged, but the key has no claim record and no dead letter"));
            }
            None => pending += 1,
        }
    }

    // Outputs: each must belong to a completed key, and be stored once.
    for (id, copies) in &outputs {
        let Some((claim_key, _index)) = id.rsplit_once('#') else {
            continue; // not published by the host
        };
        if copies.len() > 1 {
            let at: Vec<_> = copies.iter().map(|(s, q)| format!("{s}:{q}")).collect();
            anomaly(
                "output_published_twice",
                claim_key,
                format!(
                    "output `{id}` is stored {} times ({})",
                    copies.len(),
                    at.join(", ")
                ),
            );
        }
        match claims.get(claim_key).map(|(r, _)| r) {
            Some(r) if r.state == ClaimState::Completed => {}
            Some(r) if r.state == ClaimState::InProgress && r.lease_expires_ms >= now => {}
            Some(r) => anomaly(
                "outputs_without_completed_record",
                claim_key,
                format!("output `{id}` exists but the key is {:?}", r.state),
            ),
            None => anomaly(
                "outputs_without_completed_record",
                claim_key,
                format!("output `{id}` exists but the key has no claim record"),
            ),
        }
    }

    // Dead letters of a key must have its record.
    for l in &letters {
        let Some(claim_key) = l.claim_key() else {
            continue;
        };
        if l.attempt > 0 && !claims.contains_key(&claim_key) {
            anomaly(
                "dead_letter_without_failed_record",
                &claim_key,
                format!(
                    "dead letter {} (attempt {}) but the key has no claim record",
                    l.sequence, l.attempt
                ),
            );
        }
    }

    // Messages the server delivers no more whose letter is not stored yet: hosts retry them.
    // Another deployment's are its own audit's (one whose consumer cannot be judged now is
    // listed).
    let markers = crate::stranded::list(js, &config.claims.bucket).await?;
    let consumers = crate::stranded::owner::Consumers::of(config);
    for (m, _) in consumers.keep(js, markers, true).await {
        let at = if m.stream == config.source.stream {
            format!("seq:{}", m.sequence)
        } else {
            format!("{}:seq:{}", m.stream, m.sequence)
        };
        let why = m.error.as_deref().unwrap_or("not tried yet");
        anomaly(
            "not_dead_lettered",
            &at,
            format!(
                "message {} of `{}` was delivered {} times and is delivered no more ({}); its dead letter is not stored: {why} (tried {} times since {} ms ago; hosts keep trying)",
                m.sequence, m.stream, m.deliveries, m.reason, m.tries, now.saturating_sub(m.since_ms)
            ),
        );
    }

    report.pending_calls = pending_calls(js, config, now).await?;
    report.keys = keys.len() as u64;
    report.completed = completed;
    report.dead_lettered = dead_lettered;
    report.pending = pending;
    report.duplicates = duplicates;
    report
        .anomalies
        .sort_by(|a, b| (a.class, &a.key).cmp(&(b.class, &b.key)));
    Ok(report)
}

/// Outbound calls journaled PENDING before the lease (plus the clock-skew margin) ago, in the
/// claim bucket and the fenced streams: journal records sit beside the claims, under
/// `<claim>.call.<index>`, and are no keys of their own.
async fn pending_calls(js: &Context, config: &Config, now: u64) -> anyhow::Result<u64> {
    let claims = &config.claims;
    let before = now.saturating_sub((claims.lease + claims.clock_skew).as_millis() as u64);
    let stale = |payload: &[u8]| {
        CallRecord::from_bytes(payload)
            .is_ok_and(|r| r.state == CallState::Pending && r.at_ms < before)
    };
    let mut count = 0;
    for (key, m) in scan::kv_latest(js, &claims.bucket, ">").await? {
        if key.contains(".call.") && stale(&m.payload) {
            count += 1;
        }
    }
    for s in &config.output_streams {
        if s.effects != EffectsMode::Fenced {
            continue;
        }
        let filter = crate::fenced::claim_subjects(&s.name);
        let mut latest = HashMap::new();
        for m in scan::stream(js, &s.name, &filter, None).await? {
            if m.subject.contains(".call.") {
                latest.insert(m.subject, m.payload);
            }
        }
        count += latest.values().filter(|p| stale(p)).count() as u64;
    }
    Ok(count)
}

/// The output ids a completed record lists that no output stream holds. Outputs sent to a
/// stream the config does not list cannot be checked and count as present.
fn missing_outputs(
    claim_key: &str,
    record: &ClaimRecord,
    outputs: &HashMap<String, Vec<(String, u64)>>,
    audited: &HashSet<&str>,
) -> Vec<String> {
    record
        .outputs
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let id = output_id(claim_key, i);
            let present = outputs
                .get(&id)
                .is_some_and(|c| c.iter().any(|(s, _)| *s == o.stream));
            (audited.contains(o.stream.as_str()) && !present).then_some(id)
        })
        .chain(
            // A fenced commit's outputs, identified by their Dedup-Output-Id.
            (0..record.batch_outputs.unwrap_or(0) as usize)
                .map(|i| output_id(claim_key, i))
                .filter(|id| !outputs.contains_key(id)),
        )
        .collect()
}
