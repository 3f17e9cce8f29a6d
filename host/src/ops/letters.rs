//! Dead letters: listing them, replaying them once the handler is fixed, and purging the ones
//! whose replay has completed.
//!
//! A replay puts the original payload and headers back on the original subject with the
//! message id `replay:<letter sequence>`, after resetting the key's permanent failure with a
//! revision-checked write, so the key runs again (attempt 1) on the version deployed now. A
//! replay run twice by mistake runs the key once: the second run finds the key completed (or
//! in progress) and skips it, and its publish would repeat the first's message id. A route
//! keyed by `Nats-Msg-Id` keeps its key: the replay carries the first message id in
//! [`REPLAYED_MSG_ID`], which a host honours only after checking it against this letter
//! (`crate::pipeline::replayed`: the letter's claim key, subject and payload).

use std::time::SystemTime;

use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use bytes::Bytes;
use serde::Serialize;

use crate::claim::{key, ClaimState, ClaimStore as _};
use crate::config::Config;
use crate::idempotency::{MSG_ID, REPLAYED_MSG_ID, REPLAY_ID_PREFIX};
use crate::pipeline::effects::headers;
use crate::runtime::outputs::CONTROL_HEADER_PREFIX;
use crate::scan::{self, Stored};

pub use crate::claim::record::REPLAY_REASON;
use crate::claim::record::RESET_REVISION;

/// One dead letter, as `dead-letters list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Letter {
    /// Its sequence in the dead-letter stream.
    pub sequence: u64,
    /// When it was stored (Unix milliseconds).
    pub time_ms: u64,
    /// The route that matched (empty when none did).
    pub route: String,
    /// The idempotency key (empty when there was none).
    pub key: String,
    /// The last attempt (0 when the message never ran).
    pub attempt: u32,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The subject the original was published on.
    pub subject: String,
    /// The original's sequence in the source stream.
    pub source_sequence: Option<u64>,
    /// The original payload's size when the letter's copy was cut short.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<u64>,
    #[serde(skip)]
    stored: Option<Stored>,
}

impl Letter {
    fn from_stored(m: Stored) -> Self {
        let num = |name| m.header(name).and_then(|v: &str| v.parse().ok());
        Self {
            sequence: m.sequence,
            time_ms: millis(m.time),
            route: m.header(headers::ROUTE).unwrap_or_default().to_string(),
            key: m.header(headers::KEY).unwrap_or_default().to_string(),
            attempt: num(headers::ATTEMPT).unwrap_or(0) as u32,
            reason: m.header(headers::REASON).unwrap_or_default().to_string(),
            subject: m.header(headers::SUBJECT).unwrap_or_default().to_string(),
            source_sequence: num(headers::SEQUENCE),
            truncated: num(headers::TRUNCATED),
            stored: Some(m),
        }
    }

    /// The letter's headers as stored (the host's `Dedup-*` ones and the original's), in order.
    pub fn headers(&self) -> Vec<(String, String)> {
        let Some(headers) = self.stored.as_ref().and_then(|m| m.headers.as_ref()) else {
            return Vec::new();
        };
        headers
            .iter()
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_string()))
            })
            .collect()
    }

    /// The letter's payload (cut short when [`Letter::truncated`] says so).
    pub fn payload(&self) -> &[u8] {
        self.stored.as_ref().map_or(&[], |m| &m.payload[..])
    }

    /// The claim key of a letter that had a route and a key: the one the host recorded, or
    /// for letters older than that header, rebuilt from the shown key (exact unless the key
    /// was escaped or cut for display).
    pub fn claim_key(&self) -> Option<String> {
        let recorded = self
            .stored
            .as_ref()
            .and_then(|m| m.header(headers::CLAIM_KEY))
            .filter(|k| k.starts_with(&format!("{}.", self.route)));
        if let Some(recorded) = recorded {
            return Some(recorded.to_string());
        }
        (!self.route.is_empty() && !self.key.is_empty())
            .then(|| key::encode(&self.route, &self.key))
    }
}

impl Letter {
    /// The original's `Nats-Msg-Id` when it was the key the host claimed (the letter's claim
    /// key is made of it): what a replay asks to keep as its key. A producer's own copy of the
    /// `Dedup-Original-Nats-Msg-Id` header (two values) or a key from elsewhere gives none;
    /// the host checks the same against this letter before honouring it
    /// (`crate::pipeline::replayed`).
    fn first_msg_id(&self) -> Option<String> {
        let m = self.stored.as_ref()?.headers.as_ref()?;
        let name = format!("{}{MSG_ID}", headers::ORIGINAL_PREFIX);
        let mut values = m.get_all(name.as_str());
        let (Some(id), None) = (values.next(), values.next()) else {
            return None;
        };
        let id = id.as_str().trim();
        let recorded = m.get(headers::CLAIM_KEY)?.as_str();
        (recorded == key::encode(&self.route, id)).then(|| id.to_string())
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Which letters a command works on.
#[derive(Debug, Default, Clone)]
pub struct Selection {
    /// Only this route's.
    pub route: Option<String>,
    /// Only letters stored at or after this time.
    pub since: Option<SystemTime>,
    /// Only letters stored before this time.
    pub until: Option<SystemTime>,
    /// Only letters whose reason contains this text (in any case).
    pub reason: Option<String>,
    /// Only these letter sequences (all when empty).
    pub sequences: Vec<u64>,
}

impl Selection {
    /// The letters selected, in words (confirmations and the activity log).
    pub fn describe(&self) -> String {
        let time = |t: &SystemTime| humantime::format_rfc3339_seconds(*t).to_string();
        let mut parts = Vec::new();
        if let Some(r) = &self.route {
            parts.push(format!("route {r:?}"));
        }
        if let Some(r) = &self.reason {
            parts.push(format!("reason contains {r:?}"));
        }
        if let Some(t) = &self.since {
            parts.push(format!("since {}", time(t)));
        }
        if let Some(t) = &self.until {
            parts.push(format!("until {}", time(t)));
        }
        if !self.sequences.is_empty() {
            parts.push(format!("sequences {:?}", self.sequences));
        }
        if parts.is_empty() {
            "every dead letter".into()
        } else {
            parts.join(", ")
        }
    }
}

/// The dead letters the selection names, oldest first.
pub async fn list(
    js: &Context,
    config: &Config,
    selection: &Selection,
) -> anyhow::Result<Vec<Letter>> {
    if let Some(route) = &selection.route {
        anyhow::ensure!(
            config.routes.iter().any(|r| r.name == *route),
            "route `{route}` is not in this config (it has {:?}): pass the config of the deployment that has it",
            config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>()
        );
    }
    let stored = scan::stream(js, &config.dead_letter.stream, "", selection.since).await?;
    let reason = selection.reason.as_ref().map(|r| r.to_lowercase());
    let letters: Vec<Letter> = stored
        .into_iter()
        .map(Letter::from_stored)
        .filter(|l| is_ours(config, l))
        .filter(|l| selection.route.as_ref().is_none_or(|r| *r == l.route))
        .filter(|l| selection.sequences.is_empty() || selection.sequences.contains(&l.sequence))
        .filter(|l| selection.until.is_none_or(|t| l.time_ms < millis(t)))
        .filter(|l| {
            reason
                .as_ref()
                .is_none_or(|r| l.reason.to_lowercase().contains(r))
        })
        .collect();
    let unknown: Vec<u64> = selection
        .sequences
        .iter()
        .filter(|s| !letters.iter().any(|l| l.sequence == **s))
        .copied()
        .collect();
    anyhow::ensure!(
        unknown.is_empty(),
        "no dead letter of this config's routes has sequence {unknown:?} in stream `{}`: `dedup-host dead-letters --config FILE list` shows them",
        config.dead_letter.stream
    );
    Ok(letters)
}

/// Whether a letter belongs to this config's deployment: one of its routes, or (no route)
/// a subject of its source. A dead-letter stream shared by several deployments holds theirs too.
fn is_ours(config: &Config, letter: &Letter) -> bool {
    if letter.route.is_empty() {
        return letter.subject.is_empty()
            || config
                .source_subjects()
                .iter()
                .any(|s| crate::subject::matches(s, &letter.subject));
    }
    config.routes.iter().any(|r| r.name == letter.route)
}

/// What a replay or purge did (or, dry, would do) with one letter.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    /// The letter's sequence.
    pub sequence: u64,
    /// Its route and key.
    pub route: String,
    /// Its key.
    pub key: String,
    /// `replayed`, `purged`, or `skipped`.
    pub action: &'static str,
    /// Details: why skipped, or what was written.
    pub detail: String,
}

/// What a replay or purge did, in one line: `3 replayed, 1 skipped`.
pub fn summary(actions: &[Action]) -> String {
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for a in actions {
        *counts.entry(a.action).or_default() += 1;
    }
    if counts.is_empty() {
        return "nothing matched".into();
    }
    counts
        .iter()
        .map(|(a, n)| format!("{n} {a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Replays each letter (see the module documentation). With `dry_run`, only says what it
/// would do.
pub async fn replay(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    dry_run: bool,
) -> anyhow::Result<Vec<Action>> {
    let store = crate::fenced::host_store(js, config).await?;
    let mut actions = Vec::with_capacity(letters.len());
    for letter in letters {
        let action = |action, detail: String| Action {
            sequence: letter.sequence,
            route: letter.route.clone(),
            key: letter.key.clone(),
            action,
            detail,
        };
        if letter.subject.is_empty() {
            actions.push(action(
                "skipped",
                "not a dead letter: no Dedup-Original-Subject".into(),
            ));
            continue;
        }
        let (payload, original_headers) = match original(js, config, &letter).await {
            Ok(found) => found,
            Err(e) => {
                actions.push(action("skipped", format!("{e:#}")));
                continue;
            }
        };
        let mut reset = None;
        if let Some(claim_key) = letter.claim_key() {
            let claim_key = crate::fenced::store_key(config, &letter.route, &claim_key);
            // No record (aged out or never claimed): the replay claims afresh.
            if let Some((record, revision)) = store.get(&claim_key).await? {
                if !record.replayable() {
                    let state = format!("{:?}", record.state).to_lowercase();
                    actions.push(action("skipped", format!("key is {state} (attempt {}): replayed already, or retried by the pipeline", record.attempt)));
                    continue;
                }
                reset = Some((claim_key, record, revision));
            }
        }
        let detail = format!(
            "on `{}` as message id `{REPLAY_ID_PREFIX}{}`{}",
            letter.subject,
            letter.sequence,
            if reset.is_some() {
                ", key reset to run again"
            } else {
                ""
            }
        );
        if dry_run {
            actions.push(action("would replay", detail));
            continue;
        }
        let mut h = original_headers;
        if let Some((claim_key, mut record, revision)) = reset {
            record.reset_for_replay(letter.sequence);
            match store.update(&claim_key, &record, revision).await {
                // Hosts reading the key from a lagging replica wait for this revision.
                Ok(reset) => h.insert(RESET_REVISION, reset.to_string().as_str()),
                Err(e) => {
                    actions.push(action(
                        "skipped",
                        format!("key changed meanwhile, not reset: {e}"),
                    ));
                    continue;
                }
            }
        }
        if let Some(id) = letter.first_msg_id() {
            h.insert(REPLAYED_MSG_ID, id.as_str());
        }
        h.insert(
            MSG_ID,
            format!("{REPLAY_ID_PREFIX}{}", letter.sequence).as_str(),
        );
        let published = match js
            .publish_with_headers(letter.subject.clone(), h, payload)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match published {
            Ok(()) => actions.push(action("replayed", detail)),
            // The key stays reset (marked as a replay's): running the replay again retries it.
            Err(e) => actions.push(action(
                "skipped",
                format!(
                    "publish on `{}` failed, run the replay again: {e}",
                    letter.subject
                ),
            )),
        }
    }
    Ok(actions)
}

/// The original payload and headers: the letter's own copy, or the source stream's message
/// when the letter was cut short. The host's `Dedup-*` headers and every `Nats-*` control
/// header are left out (kept copies included): they belong to the first delivery.
async fn original(
    js: &Context,
    config: &Config,
    letter: &Letter,
) -> anyhow::Result<(Bytes, HeaderMap)> {
    let stored = letter
        .stored
        .as_ref()
        .expect("listed letters carry their message");
    let (payload, source_headers) = match (letter.truncated, letter.source_sequence) {
        (None, _) => (stored.payload.clone(), stored.headers.clone()),
        (Some(_), Some(seq)) => {
            let stream = js.get_stream(&config.source.stream).await?;
            let m = stream.get_raw_message(seq).await.map_err(|e| {
                anyhow::anyhow!("the letter holds a cut payload and source message {seq} is gone ({e}): nothing whole to replay")
            })?;
            (m.payload, Some(m.headers))
        }
        (Some(_), None) => {
            anyhow::bail!("the letter holds a cut payload and names no source message")
        }
    };
    let mut h = HeaderMap::new();
    for (name, values) in source_headers.iter().flat_map(|h| h.iter()) {
        let n: &str = name.as_ref();
        let lower = n.to_ascii_lowercase();
        if lower.starts_with("dedup-")
            || lower.starts_with(&CONTROL_HEADER_PREFIX.to_ascii_lowercase())
        {
            continue;
        }
        for v in values {
            h.append(name.clone(), v.clone());
        }
    }
    Ok((payload, h))
}

/// Deletes the letters whose key has completed since (their replay ran). A letter without a
/// key is deleted only when named by sequence: nothing else can tell that it was handled.
pub async fn purge(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    named: bool,
    dry_run: bool,
) -> anyhow::Result<Vec<Action>> {
    let store = crate::fenced::host_store(js, config).await?;
    let stream = js.get_stream(&config.dead_letter.stream).await?;
    let mut actions = Vec::new();
    for letter in letters {
        let done = match letter.claim_key() {
            Some(claim_key) => {
                let claim_key = crate::fenced::store_key(config, &letter.route, &claim_key);
                store
                    .get(&claim_key)
                    .await?
                    .is_some_and(|(r, _)| r.state == ClaimState::Completed)
            }
            None => named,
        };
        let (action, detail) = match (done, dry_run) {
            (false, _) => (
                "skipped",
                "its key has not completed since: replay it first".to_string(),
            ),
            (true, true) => ("would purge", String::new()),
            (true, false) => {
                stream.delete_message(letter.sequence).await?;
                ("purged", String::new())
            }
        };
        actions.push(Action {
            sequence: letter.sequence,
            route: letter.route,
            key: letter.key,
            action,
            detail,
        });
    }
    Ok(actions)
}
