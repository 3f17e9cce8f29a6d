//! `dead-letters replay`: putting letters back on their original subject once the handler is
//! fixed (see [`super::letters`] for what a replay carries).
//!
//! The key is reset where the route's contract says its claims live ([`super::claims`]),
//! before the publish. A publish the source stream answers as a duplicate (the same letter
//! replayed again inside its duplicate window) stored nothing: the reset is then put back as
//! it was, so a key is never left reset with no message to run it, and the letter is reported
//! `already replayed` with what became of the first replay.
//!
//! A key's journal of outbound HTTP calls (DESIGN.md rule 24) is kept: the calls whose answer
//! was recorded are replayed to the new run, not sent again; a call left PENDING (outcome
//! unknown, which is what the operator replays after checking with the provider) is cleared
//! and sent again under the same idempotency key. With `fresh_effects`
//! (`--fresh-effects`) the whole journal is discarded first and every call is sent again.
//!
//! A letter of a route this config no longer names because it was renamed (`setup
//! --rename-route OLD NEW`) is replayed against `NEW`, which consumes its message and holds
//! the key's claim ([`super::renamed`]); the action's detail says so. A letter of a route
//! the config does not name and that no route was renamed from is refused: nothing would
//! run its key.
//!
//! A key the operator accepted as settled when its route changed to fenced effects
//! or renamed (`setup --change-route R --accept-dead KEY`, `--rename-route`;
//! [`ClaimRecord::is_accepted_dead`]) is refused unless forced: its window outputs may be
//! stored, and a run now would publish them again under other message ids (or none).

use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use bytes::Bytes;

use super::claims::{Claim, Claims};
use super::letters::{Action, Letter};
use super::renamed::Target;
use crate::claim::record::RESET_REVISION;
use crate::claim::{ClaimRecord, ClaimState};
use crate::config::Config;
use crate::idempotency::{MSG_ID, REPLAYED_MSG_ID, REPLAY_ID_PREFIX};
use crate::runtime::outputs::CONTROL_HEADER_PREFIX;

/// Replays each letter (see the module documentation). With `dry_run`, only says what it
/// would do. Keys accepted as settled are refused ([`replay_with`] forces them).
pub async fn replay(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    dry_run: bool,
) -> anyhow::Result<Vec<Action>> {
    replay_with(js, config, letters, dry_run, false).await
}

/// [`replay`]; with `force`, keys accepted as settled are replayed too (`--force`).
pub async fn replay_with(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    dry_run: bool,
    force: bool,
) -> anyhow::Result<Vec<Action>> {
    let fresh_effects = false;
    replay_effects(js, config, letters, dry_run, force, fresh_effects).await
}

/// [`replay_with`]; with `fresh_effects`, each key's journal of outbound calls is discarded
/// before its letter is published, so the new run sends every call again
/// (`--fresh-effects`).
pub async fn replay_effects(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    dry_run: bool,
    force: bool,
    fresh_effects: bool,
) -> anyhow::Result<Vec<Action>> {
    let refusals = crate::refusals::Refusals::process();
    replay_observed(
        js,
        config,
        letters,
        dry_run,
        force,
        fresh_effects,
        &refusals,
    )
    .await
}

/// [`replay_effects`], naming in each letter's failure the refusal `refusals` saw (the
/// console's own connection for this replay: never another action's refusal).
pub async fn replay_observed(
    js: &Context,
    config: &Config,
    letters: Vec<Letter>,
    dry_run: bool,
    force: bool,
    fresh_effects: bool,
    refusals: &crate::refusals::Refusals,
) -> anyhow::Result<Vec<Action>> {
    let mut claims = Claims::new(js, config).await?;
    super::letters::refuse_changing(&claims, &letters).await?;
    let mut actions = Vec::with_capacity(letters.len());
    for letter in letters {
        // A write the server refuses is dropped and named on the connection: each letter's
        // failure says which subject to grant ([`crate::refusals`]), not a timeout.
        let started = std::time::Instant::now();
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
        // A letter of a renamed route is replayed against the route it was renamed to
        // ([`super::renamed`]): that route consumes the message and holds its claim.
        let (own, renamed) = match super::renamed::target(&mut claims, config, letter.parts())
            .await?
        {
            Target::Own => (true, None),
            Target::Renamed { to, claim } => {
                if let Some(run) = claims.change_running(&to).await? {
                    actions.push(action(
                        "refused",
                        format!("route `{}` was renamed to `{to}`, which {run} is changing: replay again once it is done", letter.route),
                    ));
                    continue;
                }
                (false, Some((to, *claim)))
            }
            Target::Gone(why) => {
                actions.push(action("refused", why));
                continue;
            }
        };
        let (payload, original_headers) = match original(js, config, &letter).await {
            Ok(found) => found,
            Err(e) => {
                actions.push(action("skipped", format!("{e:#}")));
                continue;
            }
        };
        let renamed_to = renamed.as_ref().map(|(to, _)| to.clone());
        let claim = match (renamed, letter.claim_key()) {
            (Some((_, claim)), _) => Some(claim),
            (None, Some(claim_key)) if own => Some(claims.get(&letter.route, &claim_key).await?),
            (None, _) => None,
        };
        let mut reset = None;
        if let Some((record, revision)) = claim.as_ref().and_then(|c| c.record.clone()) {
            if record.is_accepted_dead() && !force {
                actions.push(action("refused", accepted_dead(&record)));
                continue;
            }
            if !record.replayable() {
                let state = format!("{:?}", record.state).to_lowercase();
                actions.push(action(
                    "skipped",
                    format!(
                        "key is {state} (attempt {}): replayed already, or retried by the pipeline",
                        record.attempt
                    ),
                ));
                continue;
            }
            reset = Some((record, revision));
        }
        // No record (aged out or never claimed): the replay claims afresh.
        let detail = format!(
            "{}on `{}` as message id `{REPLAY_ID_PREFIX}{}`{}{}",
            renamed_to
                .as_ref()
                .map(|to| format!(
                    "route `{}` was renamed to `{to}`: the key is replayed as `{to}`'s ({}); ",
                    letter.route,
                    claim.as_ref().map_or(String::new(), |c| c.key.clone())
                ))
                .unwrap_or_default(),
            letter.subject,
            letter.sequence,
            if reset.is_some() {
                ", key reset to run again"
            } else {
                ""
            },
            claim
                .as_ref()
                .map(|c| format!("; claims in {}", c.claims.describe()))
                .unwrap_or_default(),
        );
        if dry_run {
            let calls = match (&claim, fresh_effects) {
                (Some(_), true) => "; its journaled calls would be discarded and sent again",
                _ => "",
            };
            actions.push(action("would replay", format!("{detail}{calls}")));
            continue;
        }
        let mut h = original_headers;
        // The record overwritten and the reset's revision, to put it back on a duplicate.
        let mut written = None;
        if let (Some(claim), Some((previous, revision))) = (&claim, reset) {
            let mut next = previous.clone();
            next.reset_for_replay(letter.sequence);
            match claim.update(&next, revision).await {
                // Hosts reading the key from a lagging replica wait for this revision.
                Ok(reset) => {
                    h.insert(RESET_REVISION, reset.to_string().as_str());
                    written = Some((previous, reset));
                }
                Err(e) => {
                    let why = match refusals.since(started) {
                        Some(denied) => format!("key not reset: {denied} ({e})"),
                        None => format!("key changed meanwhile, not reset: {e}"),
                    };
                    actions.push(action("skipped", why));
                    continue;
                }
            }
        }
        let mut detail = detail;
        if let Some(claim) = &claim {
            // After the reset: no run holds the key until the letter is published.
            match claim.calls(js).discard(fresh_effects).await {
                Ok(0) => {}
                Ok(n) if fresh_effects => detail.push_str(&format!(
                    "; its journal discarded ({n} call record(s)): every call is sent again"
                )),
                Ok(n) => detail.push_str(&format!(
                    "; {n} call(s) of unknown outcome cleared: sent again under the same idempotency key"
                )),
                Err(e) => {
                    if let Some((previous, reset)) = written {
                        let _ = claim.update(&previous, reset).await;
                    }
                    actions.push(action(
                        "skipped",
                        format!(
                            "the key's call journal could not be cleared ({}): the key was put back as it was; run the replay again",
                            refusals.or_refused(e, started)
                        ),
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
            Ok(ack) => ack.await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match published {
            Ok(ack) if ack.duplicate => {
                let what = put_back(claim.as_ref(), written).await;
                actions.push(action("already replayed", duplicate(&letter, &ack, &what)));
            }
            Ok(_) => actions.push(action("replayed", detail)),
            // The key stays reset (marked as a replay's): running the replay again retries it.
            Err(e) => actions.push(action(
                "skipped",
                format!(
                    "publish on `{}` failed, run the replay again: {}",
                    letter.subject,
                    refusals.or_refused(e, started)
                ),
            )),
        }
    }
    Ok(actions)
}

/// Puts back the record a replay reset before its publish turned out a duplicate (nothing new
/// will run the key); says what the key holds now.
async fn put_back(claim: Option<&Claim>, written: Option<(ClaimRecord, u64)>) -> String {
    let (Some(claim), Some((previous, reset))) = (claim, written) else {
        return "that replay's message runs the key, or ran it".into();
    };
    match claim.update(&previous, reset).await {
        Ok(_) if previous.state == ClaimState::Failed && previous.permanent => format!(
            "that replay ran and failed again (attempt {}: {}), so the key was put back as it was, failed for good: replay the key's newest dead letter instead",
            previous.attempt,
            previous.reason.as_deref().unwrap_or("no reason recorded")
        ),
        Ok(_) => "that replay's message has not run yet and runs the key (left reset for it)".into(),
        // Written since the reset: a host claimed the key (the first replay's message).
        Err(e) => format!("the key changed since this reset ({e}): a host is running it"),
    }
}

/// Why the letter of a key accepted as settled is not replayed, and how to replay it anyway.
fn accepted_dead(record: &ClaimRecord) -> String {
    let reason = record.reason.as_deref().unwrap_or_default();
    format!(
        "refused: {reason}. Its window outputs may be stored under message ids a run now would not repeat (the route is now fenced, or renamed), so a replay would publish them again; replay it with `--force` only if duplicates of those outputs are acceptable"
    )
}

/// The detail of a replay whose publish was a duplicate.
fn duplicate(letter: &Letter, ack: &PublishAck, what: &str) -> String {
    format!(
        "already replayed: message id `{REPLAY_ID_PREFIX}{}` is in stream `{}` at sequence {} (inside its duplicate window), so nothing new was stored; {what}",
        letter.sequence, ack.stream, ack.sequence
    )
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
