//! `dedup-host setup --plan` and `--apply`: the changes an existing deployment needs to match
//! its config, like `terraform plan/apply`. Each change says what it does and its risk; a
//! change that would lose or weaken something already stored is refused with what to do
//! instead. Widening a stream's subjects, raising a duplicate window, a bucket's history or
//! max age, and changing replicas are made in place (the server keeps every message).

use std::time::Duration;

use async_nats::jetstream::stream;
use async_nats::jetstream::Context;
use serde::Serialize;

use crate::config::Config;
use crate::setup::{self, StreamSpec};

/// One change to one stream or bucket.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// `stream` or `kv bucket`.
    pub kind: &'static str,
    /// Its name on the server.
    pub name: String,
    /// The config field it comes from.
    pub field: String,
    /// What changes, from what to what.
    pub what: String,
    /// What happens while it is made, or why it is refused and what to do instead.
    pub risk: String,
    /// Whether `--apply` makes it.
    pub safe: bool,
    /// Set by `--apply`: whether the server took it (`None` when not attempted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied: Option<Result<(), String>>,
}

/// What changing a stream's replicas does while it runs.
const REPLICAS_RISK: &str = "the server copies or drops replicas in the background and elects a leader (a pause of a few seconds); needs as many servers as replicas";

/// A planned update of one stream: the changes and the stream config that makes them.
struct Update {
    changes: Vec<Change>,
    config: stream::Config,
}

/// What the deployment needs changed; nothing is changed. Missing items are not listed
/// (`setup` creates them).
pub async fn plan(js: &Context, config: &Config, shared: &[String]) -> anyhow::Result<Vec<Change>> {
    Ok(updates(js, config, shared)
        .await?
        .into_iter()
        .flat_map(|u| u.changes)
        .collect())
}

/// Makes the safe changes of the plan, one stream at a time, and returns the whole plan with
/// what became of each change.
pub async fn apply(
    js: &Context,
    config: &Config,
    shared: &[String],
) -> anyhow::Result<Vec<Change>> {
    let mut all = Vec::new();
    for mut update in updates(js, config, shared).await? {
        let wanted = update.changes.iter().any(|c| c.safe);
        let outcome = if wanted {
            Some(
                js.update_stream(&update.config)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("the server refused it: {e}")),
            )
        } else {
            None
        };
        for change in &mut update.changes {
            if change.safe {
                change.applied = outcome.clone();
            }
        }
        all.extend(update.changes);
    }
    Ok(all)
}

/// The updates the config needs. A change to a stream another deployment uses is refused
/// unless `shared` names the stream (`--share-stream`), and says so either way.
async fn updates(js: &Context, config: &Config, shared: &[String]) -> anyhow::Result<Vec<Update>> {
    let mut updates = Vec::new();
    for spec in setup::stream_specs(config) {
        if let Ok(mut existing) = js.get_stream(&spec.name).await {
            let have = existing.info().await?.config.clone();
            let mut update = stream_update(&spec, have);
            let users = crate::ownership::other_users(js, config, &spec.name).await?;
            if !users.is_empty() {
                let allowed = shared.contains(&spec.name);
                for change in &mut update.changes {
                    share_risk(change, &users, &config.deployment_name(), allowed);
                }
            }
            updates.push(update);
        }
    }
    let bucket = setup::claim_bucket_config(config);
    if let Ok(mut existing) = js.get_stream(format!("KV_{}", bucket.bucket)).await {
        let have = existing.info().await?.config.clone();
        updates.push(bucket_update(config, have));
    }
    Ok(updates)
}

/// Marks a change to a stream that deployment(s) `users` also use: refused unless `allowed`
/// (the operator named the stream with `--share-stream`).
fn share_risk(change: &mut Change, users: &[String], mine: &str, allowed: bool) {
    let who = format!(
        "stream `{}` is shared: deployment(s) {} use it too (this config is deployment `{mine}`), and the change affects them",
        change.name,
        users.iter().map(|u| format!("`{u}`")).collect::<Vec<_>>().join(", ")
    );
    if allowed {
        change.risk = format!("{who} (allowed by --share-stream); {}", change.risk);
    } else if change.safe {
        change.safe = false;
        change.risk = format!(
            "refused: {who}; give this config a stream of its own (`[source] stream`), or pass `--share-stream {}` if both deployments mean to share it (without that: {})",
            change.name, change.risk
        );
    }
}

/// The changes that make an existing stream what `spec` needs.
fn stream_update(spec: &StreamSpec, have: stream::Config) -> Update {
    let change = |what: String, risk: &str, safe: bool| Change {
        kind: "stream",
        name: spec.name.clone(),
        field: spec.field.clone(),
        what,
        risk: risk.to_string(),
        safe,
        applied: None,
    };
    let mut changes = Vec::new();
    let mut config = have.clone();
    let uncovered = spec.uncovered(&have.subjects);
    if !uncovered.is_empty() {
        config.subjects.extend(uncovered.iter().cloned());
        changes.push(change(
            format!("subjects {:?} -> {:?}", have.subjects, config.subjects),
            "none: stored messages stay; the stream also captures the new subjects from now on (refused by the server if another stream captures them)",
            true,
        ));
    }
    window_change(&mut changes, &mut config, spec.duplicate_window, &change);
    replicas_change(&mut changes, &mut config, spec.replicas, &change);
    if have.storage != spec.storage {
        changes.push(change(
            format!("storage {:?} -> {:?}", have.storage, spec.storage),
            "refused: the server cannot change a stream's storage; create a new stream with the new storage and move the messages (`nats stream backup` / `restore`), or keep the storage in the config",
            false,
        ));
    }
    if let Some(difference) = spec.dedup_difference(&have) {
        changes.push(change(
            difference,
            "refused: changing retention, per-subject limits or batch settings can discard stored messages or change what a publish means; name a new stream in the config and move the messages to it",
            false,
        ));
    }
    Update { changes, config }
}

/// Changes the replicas in place (the server moves the data).
fn replicas_change(
    changes: &mut Vec<Change>,
    config: &mut stream::Config,
    want: usize,
    change: &dyn Fn(String, &str, bool) -> Change,
) {
    if config.num_replicas != want {
        let what = format!("replicas {} -> {want}", config.num_replicas);
        config.num_replicas = want;
        changes.push(change(what, REPLICAS_RISK, true));
    }
}

/// Raises a duplicate window; a lower one is refused (repeats published before the change
/// could get through).
fn window_change(
    changes: &mut Vec<Change>,
    config: &mut stream::Config,
    want: Duration,
    change: &dyn Fn(String, &str, bool) -> Change,
) {
    let have = config.duplicate_window;
    if have == want {
        return;
    }
    let what = format!(
        "duplicate window {} -> {}",
        humantime::format_duration(have),
        humantime::format_duration(want)
    );
    if want > have {
        config.duplicate_window = want;
        changes.push(change(
            what,
            "none: the stream remembers message ids longer from now on",
            true,
        ));
    } else {
        changes.push(change(
            what,
            "refused: a shorter window lets through repeats the stream would drop now; keep the longer window in the config (it is allowed), or shorten it with `nats stream edit` once you are sure",
            false,
        ));
    }
}

/// The changes that make an existing claim bucket what the config needs.
fn bucket_update(config: &Config, have: stream::Config) -> Update {
    let name = config.claims.bucket.clone();
    let change = |what: String, risk: &str, safe: bool| Change {
        kind: "kv bucket",
        name: name.clone(),
        field: "claims.bucket".into(),
        what,
        risk: risk.to_string(),
        safe,
        applied: None,
    };
    let want = setup::claim_bucket_config(config);
    let mut changes = Vec::new();
    let mut updated = have.clone();
    if !setup::claim_history_ok(have.max_messages_per_subject) {
        updated.max_messages_per_subject = setup::CLAIM_HISTORY;
        let safe = have.max_messages_per_subject > setup::CLAIM_HISTORY;
        changes.push(change(
            format!(
                "history {} -> {}",
                have.max_messages_per_subject,
                setup::CLAIM_HISTORY
            ),
            if safe {
                "none for claims: older revisions of each key are dropped"
            } else {
                "refused: name another bucket"
            },
            safe,
        ));
    }
    if have.max_age != want.max_age {
        let what = format!(
            "max age {} -> {}",
            humantime::format_duration(have.max_age),
            humantime::format_duration(want.max_age)
        );
        // Zero is no limit at all.
        let longer =
            !have.max_age.is_zero() && (want.max_age.is_zero() || want.max_age > have.max_age);
        if longer {
            updated.max_age = want.max_age;
            changes.push(change(
                what,
                "none: records are kept longer from now on",
                true,
            ));
        } else {
            changes.push(change(
                what,
                "refused: a shorter max age removes claim records at once, and a redelivery of a completed key would run again; keep the longer max age in the config",
                false,
            ));
        }
    }
    replicas_change(&mut changes, &mut updated, want.num_replicas, &change);
    Update {
        changes,
        config: updated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widen() -> Change {
        Change {
            kind: "stream",
            name: "DEDUP_EVENTS".into(),
            field: "source.stream".into(),
            what: "subjects [\"a.*\"] -> [\"a.*\", \"b.*\"]".into(),
            risk: "none".into(),
            safe: true,
            applied: None,
        }
    }

    #[test]
    fn a_change_to_a_shared_stream_is_refused_unless_named() {
        let users = ["team-1".to_string()];
        let mut refused = widen();
        share_risk(&mut refused, &users, "team-2", false);
        assert!(!refused.safe);
        for part in [
            "refused",
            "`team-1`",
            "`team-2`",
            "--share-stream DEDUP_EVENTS",
        ] {
            assert!(refused.risk.contains(part), "{part}: {}", refused.risk);
        }
        let mut allowed = widen();
        share_risk(&mut allowed, &users, "team-2", true);
        assert!(
            allowed.safe && allowed.risk.contains("shared"),
            "{}",
            allowed.risk
        );
    }
}
