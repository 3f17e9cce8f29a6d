//! Dead letters: listing them, replaying them once the handler is fixed, and purging the ones
//! whose replay has completed.
//!
//! A replay puts the original payload and headers back on the original subject with the
//! message id `replay:<letter sequence>`, after resetting the key's permanent failure with a
//! revision-checked write, so the key runs again (attempt 1) on the version deployed now. A
//! replay run twice by mistake runs the key once: the second run finds the key completed (or
//! in progress) and skips it, or its publish repeats the first's message id and the reset is
//! put back ([`super::replay`]). Replay and purge find the key where the route's contract
//! says its claims live ([`super::claims`]). A route keyed by `Nats-Msg-Id` keeps its key:
//! the replay carries the first message id in
//! [`REPLAYED_MSG_ID`](crate::idempotency::REPLAYED_MSG_ID), which a host honours only after
//! checking it against this letter (`crate::pipeline::replayed`: the letter's claim key,
//! subject and payload).

use std::time::SystemTime;

use async_nats::jetstream::Context;
use serde::Serialize;

use super::claims::Claims;
use crate::claim::{key, ClaimState};
use crate::config::Config;
use crate::idempotency::{MSG_ID, REPLAY_ID_PREFIX};
use crate::pipeline::effects::headers;
use crate::scan::{self, Stored};

pub use crate::claim::record::REPLAY_REASON;

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
    pub(super) stored: Option<Stored>,
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

    /// The route, original subject and claim key of the letter, as
    /// [`super::renamed::target`] takes them.
    pub(super) fn parts(&self) -> (&str, &str, Option<String>) {
        (&self.route, &self.subject, self.claim_key())
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
    pub(super) fn first_msg_id(&self) -> Option<String> {
        let m = self.stored.as_ref()?.headers.as_ref()?;
        let name = format!("{}{MSG_ID}", headers::ORIGINAL_PREFIX);
        let mut values = m.get_all(name.as_str());
        let (Some(id), None) = (values.next(), values.next()) else {
            return None;
        };
        let id = id.as_str().trim();
        let recorded = m.get(headers::CLAIM_KEY)?.as_str();
        if recorded == key::encode(&self.route, id) {
            return Some(id.to_string());
        }
        // The letter of a replay (its own id `replay:<n>`) ran under the first message id,
        // which its shown key is when it encodes to the recorded claim key.
        (id.starts_with(REPLAY_ID_PREFIX) && recorded == key::encode(&self.route, &self.key))
            .then(|| self.key.clone())
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A dead-letter command's refusal, decided against what the server holds; nothing was
/// changed. (A route the config does not name is a usage error instead: the config decides it.)
#[derive(Debug, thiserror::Error)]
pub enum LetterError {
    /// Sequences that are not letters of this config's deployment (none, or another's).
    #[error("no dead letter of this config's routes has sequence {sequences:?} in stream `{stream}`: `dedup-host dead-letters --config FILE list` shows them")]
    NotOurs {
        /// The sequences asked for that are not this deployment's letters.
        sequences: Vec<u64>,
        /// The dead-letter stream.
        stream: String,
    },
    /// A route of the letters has its contract changed by a running `setup --change-route`
    /// (or `--rename-route`), which moves its claim records.
    #[error("route `{route}`'s contract is being changed by {run}: that run moves the route's claim records, and a replay or purge now could reset or read a record it is moving; nothing was done. Run this command again once that run has finished; if it died, finish the change (or call it off) with `dedup-host setup --config <config> --change-route {route}` once its lease has lapsed")]
    Changing {
        /// The route.
        route: String,
        /// The run holding the route's change mark, in words.
        run: String,
    },
}

/// Refuses letters of a route whose contract a live `setup --change-route` or
/// `--rename-route` run is changing ([`LetterError::Changing`]): checked for every route
/// before anything is done.
pub(super) async fn refuse_changing(claims: &Claims, letters: &[Letter]) -> anyhow::Result<()> {
    let routes: std::collections::BTreeSet<&str> = letters
        .iter()
        .map(|l| l.route.as_str())
        .filter(|r| !r.is_empty())
        .collect();
    for route in routes {
        if let Some(run) = claims.change_running(route).await? {
            return Err(LetterError::Changing {
                route: route.to_string(),
                run,
            }
            .into());
        }
    }
    Ok(())
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
    list_letters(js, config, selection, false).await
}

/// [`list`], with the letters of routes renamed since (`setup --rename-route OLD NEW`, `NEW`
/// in this config; [`super::renamed`]): what `dead-letters list` and `replay` work on. A
/// letter of a route this config does not name that the selection names (`--route OLD`,
/// `--sequence`) is listed too, so a replay says why it is refused when nothing was renamed.
pub async fn list_with_renamed(
    js: &Context,
    config: &Config,
    selection: &Selection,
) -> anyhow::Result<Vec<Letter>> {
    list_letters(js, config, selection, true).await
}

async fn list_letters(
    js: &Context,
    config: &Config,
    selection: &Selection,
    renamed: bool,
) -> anyhow::Result<Vec<Letter>> {
    let named = |route: &str| config.routes.iter().any(|r| r.name == route);
    if let Some(route) = selection.route.as_deref().filter(|r| !renamed && !named(r)) {
        anyhow::bail!(
            "route `{route}` is not in this config (it has {:?}): pass the config of the deployment that has it",
            config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>()
        );
    }
    let stored = scan::stream(js, &config.dead_letter.stream, "", selection.since).await?;
    let reason = selection.reason.as_ref().map(|r| r.to_lowercase());
    let mut claims = None;
    let mut letters = Vec::new();
    for letter in stored.into_iter().map(Letter::from_stored) {
        if is_ours(config, &letter) {
            letters.push(letter);
            continue;
        }
        if !renamed || letter.route.is_empty() {
            continue;
        }
        let chosen = selection.route.as_deref() == Some(letter.route.as_str())
            || selection.sequences.contains(&letter.sequence);
        if !chosen && selection.route.is_some() {
            continue;
        }
        if claims.is_none() {
            claims = Some(super::claims::Claims::new(js, config).await?);
        }
        let opened = claims.as_mut().expect("opened above");
        let target = super::renamed::target(opened, config, letter.parts()).await?;
        if chosen || matches!(target, super::renamed::Target::Renamed { .. }) {
            letters.push(letter);
        }
    }
    if let Some(route) = selection.route.as_deref().filter(|r| !named(r)) {
        anyhow::ensure!(
            letters.iter().any(|l| l.route == route),
            "route `{route}` is not in this config (it has {:?}), and no dead letter names it: pass the config of the deployment that has it",
            config.routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>()
        );
    }
    let letters: Vec<Letter> = letters
        .into_iter()
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
    if !unknown.is_empty() {
        return Err(LetterError::NotOurs {
            sequences: unknown,
            stream: config.dead_letter.stream.clone(),
        }
        .into());
    }
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
    /// `replayed`, `purged`, `skipped`, or `refused` (a key accepted as settled, see
    /// `replay --force`).
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

/// Deletes the letters whose key has completed since (their replay ran). A letter without a
/// key is deleted only when named by sequence: nothing else can tell that it was handled.
pub async fn purge(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    named: bool,
    dry_run: bool,
) -> anyhow::Result<Vec<Action>> {
    let mut claims = Claims::new(js, config).await?;
    refuse_changing(&claims, &letters).await?;
    let stream = js.get_stream(&config.dead_letter.stream).await?;
    let mut actions = Vec::new();
    for letter in letters {
        let (done, place) = match letter.claim_key() {
            Some(claim_key) => {
                let claim = claims.get(&letter.route, &claim_key).await?;
                let done =
                    (claim.record.as_ref()).is_some_and(|(r, _)| r.state == ClaimState::Completed);
                (done, format!("claims in {}", claim.claims.describe()))
            }
            None => (named, "named by sequence".to_string()),
        };
        let (action, detail) = match (done, dry_run) {
            (false, _) => (
                "skipped",
                format!("its key has not completed since: replay it first ({place})"),
            ),
            (true, true) => ("would purge", place),
            (true, false) => {
                stream.delete_message(letter.sequence).await?;
                ("purged", place)
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
