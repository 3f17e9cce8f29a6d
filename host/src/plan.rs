//! `dedup-host setup --plan` and `--apply`: the changes an existing deployment needs to match
//! its config, like `terraform plan/apply`. Each change says what it does and its risk; a
//! change that would lose or weaken something already stored is refused with what to do
//! instead. Widening a stream's subjects, raising a duplicate window, a bucket's history or
//! max age, changing replicas and letting an output stream take fenced commits are made in
//! place (the server keeps every message). Turning on an existing stream's rollups (for fenced
//! commits) lets any client that may publish there purge it, so it is made only when the
//! operator names the stream (`--allow-rollup S`).

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
    /// Made by the next plain `setup`, not by `--apply` (a former default name's move).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_setup: bool,
    /// Made by `setup --change-route R`, not by `--apply` (a route's contract); not a
    /// refusal.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_change_route: bool,
}

impl Change {
    /// The change as a plan prints it: its state, what changes, and (indented) its risk, or
    /// why it is refused and what to do instead.
    pub fn render(&self) -> String {
        let state = match (&self.applied, self.safe) {
            _ if self.by_setup => "at setup".to_string(),
            _ if self.by_change_route => "next step".to_string(),
            (Some(Ok(())), _) => "applied".to_string(),
            (Some(Err(_)), _) => "NOT MADE".to_string(),
            (None, true) => "to apply".to_string(),
            (None, false) => "REFUSED".to_string(),
        };
        let mut text = format!(
            "{state:<9} {} {} ({}): {}",
            self.kind, self.name, self.field, self.what
        );
        let label = match (self.safe, self.by_change_route) {
            (_, true) => "how",
            (true, _) => "risk",
            (false, _) => "why",
        };
        text.push_str(&indented(label, &self.risk));
        if let Some(Err(e)) = &self.applied {
            text.push_str(&indented("error", e));
        }
        text
    }
}

/// `label: text` on lines of at most [`WIDTH`] characters, each indented under the state.
fn indented(label: &str, text: &str) -> String {
    let indent = " ".repeat(10);
    let mut out = String::new();
    let mut line = format!("{indent}{label}: ");
    let hang = " ".repeat(label.len() + 2);
    for word in text.split(' ') {
        if line.trim().len() > label.len() + 1 && line.len() + word.len() > WIDTH {
            out.push('\n');
            out.push_str(line.trim_end());
            line = format!("{indent}{hang}");
        }
        line.push_str(word);
        line.push(' ');
    }
    out.push('\n');
    out.push_str(line.trim_end());
    out
}

/// The width a plan's text wraps at.
const WIDTH: usize = 100;

/// What changing a stream's replicas does while it runs.
const REPLICAS_RISK: &str = "the server copies or drops replicas in the background and elects a leader (a pause of a few seconds); needs as many servers as replicas";

/// A planned update of one stream: the changes and the stream config that makes them.
struct Update {
    changes: Vec<Change>,
    config: stream::Config,
}

/// What the deployment needs changed; nothing is changed. Missing items are not listed
/// (`setup` creates them). Consumers and contracts of another deployment that this config
/// would rebind or take as its own are listed first, refused.
pub async fn plan(js: &Context, config: &Config, consent: &Consent) -> anyhow::Result<Vec<Change>> {
    let mut all = refusals(js, config).await?;
    all.extend(moves(js, config).await?);
    all.extend(contract_changes(js, config).await?);
    all.extend(
        updates(js, config, consent)
            .await?
            .into_iter()
            .flat_map(|u| u.changes),
    );
    Ok(all)
}

/// Makes the safe changes of the plan, one stream at a time, and returns the whole plan with
/// what became of each change. When another deployment's consumer or contract is in the way
/// ([`refusals`]), nothing is made: a refused command changes nothing.
pub async fn apply(
    js: &Context,
    config: &Config,
    consent: &Consent,
) -> anyhow::Result<Vec<Change>> {
    let mut all = refusals(js, config).await?;
    let blocked = !all.is_empty();
    all.extend(moves(js, config).await?);
    all.extend(contract_changes(js, config).await?);
    for mut update in updates(js, config, consent).await? {
        let wanted = update.changes.iter().any(|c| c.safe);
        let outcome = if blocked {
            Some(Err(NOT_MADE.to_string()))
        } else if wanted {
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

/// Why `--apply` made a safe change of a plan that another deployment's things block.
const NOT_MADE: &str =
    "not made: a refusal above blocks the whole plan (nothing changes until every check passes)";

/// The consumers and contracts of another deployment that this config would rebind or take
/// as its own ([`crate::ownership::check`]), each as a refused change naming both
/// deployments and the fix.
async fn refusals(js: &Context, config: &Config) -> anyhow::Result<Vec<Change>> {
    use crate::ownership::Conflict;
    let conflicts = crate::ownership::check(js, config).await?;
    Ok(conflicts
        .into_iter()
        .filter_map(|c| {
            let (kind, name, what) = match &c {
                Conflict::Owned {
                    kind, name, would, ..
                } => (*kind, name.clone(), would.clone()),
                Conflict::Consumer {
                    name,
                    recorded,
                    mine,
                    ..
                } => (
                    "contract",
                    name.clone(),
                    format!("serve it through consumer `{mine}`, not `{recorded}`"),
                ),
                // `setup` refuses a silent rename; the plan changes no consumer.
                Conflict::Rename { .. } => return None,
            };
            Some(Change {
                kind,
                name,
                field: c.route().map(|r| format!("routes.{r}")).unwrap_or_default(),
                what,
                risk: c.to_string(),
                safe: false,
                applied: None,
                by_setup: false,
                by_change_route: false,
            })
        })
        .collect())
}

/// The former default names (`auto-...`) of this config's deployment that the next plain
/// `setup` moves to its current name ([`crate::ownership::migrate`]): a plan says so, since
/// `--apply` does not make the move and the name on the server changes.
async fn moves(js: &Context, config: &Config) -> anyhow::Result<Vec<Change>> {
    let mine = config.deployment_name();
    let former = crate::ownership::former_names(js, config).await?;
    Ok(former
        .into_iter()
        .map(|was| Change {
            kind: "deployment",
            name: was.clone(),
            field: "deployment.name".into(),
            what: format!("owner `{was}` -> `{mine}`"),
            risk: format!("none: this config's deployment was recorded under its former default name `{was}` (the default name follows the source subjects, which changed). The next plain `dedup-host setup` (not `--apply`) records `{mine}` as the owner of what `{was}` owns of this config: its streams, the consumers this config names, its routes' contracts. Hosts still running the old config keep serving (they know the route by its consumer); set `[deployment] name` to keep one name from now on"),
            safe: true,
            applied: None,
            by_setup: true,
            by_change_route: false,
        })
        .collect())
}

/// This deployment's routes whose config differs from their recorded contract (window to
/// fenced effects, another claim bucket, ...): `--apply` never changes a contract, so each
/// names the command that does, `setup --change-route R`. Read only: a missing contract
/// bucket means no contract is recorded yet.
async fn contract_changes(js: &Context, config: &Config) -> anyhow::Result<Vec<Change>> {
    let Ok(store) = js.get_key_value(crate::contract::bucket_name(config)).await else {
        return Ok(Vec::new());
    };
    let mut changes = Vec::new();
    for route in &config.routes {
        let Some((recorded, _)) = crate::contract::read(&store, &route.name).await? else {
            continue;
        };
        // Another deployment's contract is a refusal above, not a change of this one.
        if recorded.other_owner(config, &route.name).is_some() {
            continue;
        }
        let differences =
            crate::contract::differences(&recorded.contract, &crate::contract::of(config, route));
        if differences.is_empty() {
            continue;
        }
        let name = &route.name;
        changes.push(Change {
            kind: "contract",
            name: format!("{}/{name}", store.name),
            field: format!("routes.{name}"),
            what: format!(
                "{} (made by `dedup-host setup --change-route {name}`)",
                differences.join("; ")
            ),
            risk: format!("a route's contract (what every host must agree on) changes only by `dedup-host setup --config <this config> --change-route {name}`, never by `--apply`: make the stream changes listed here first (`--apply`), reload or restart the hosts with this config (each then refuses the route and drains it), then run it; it moves the route's claims and queued messages and records the new contract. Until then hosts of this config refuse the route"),
            safe: false,
            applied: None,
            by_setup: false,
            by_change_route: true,
        });
    }
    Ok(changes)
}

/// What the operator allowed beyond the safe changes, each by naming the stream.
#[derive(Debug, Clone, Default)]
pub struct Consent {
    /// Streams another deployment uses that may be changed (`--share-stream S`).
    pub shared: Vec<String>,
    /// Existing streams whose rollups may be turned on for fenced commits (`--allow-rollup S`).
    pub rollups: Vec<String>,
}

/// The updates the config needs. A change to a stream another deployment uses is refused
/// unless `consent` names the stream (`--share-stream`), and says so either way.
async fn updates(js: &Context, config: &Config, consent: &Consent) -> anyhow::Result<Vec<Update>> {
    let mut updates = Vec::new();
    for spec in setup::stream_specs(config) {
        if let Ok(mut existing) = js.get_stream(&spec.name).await {
            let have = existing.info().await?.config.clone();
            let rollups = consent.rollups.contains(&spec.name);
            let mut update = stream_update(&spec, have, rollups);
            let users = crate::ownership::other_users(js, config, &spec.name).await?;
            if !users.is_empty() {
                let allowed = consent.shared.contains(&spec.name);
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
    let names: Vec<String> = users.iter().map(|u| format!("`{u}`")).collect();
    let who = match names.as_slice() {
        [one] => format!("deployment {one} uses it too"),
        many => format!("deployments {} use it too", many.join(", ")),
    };
    let name = &change.name;
    let alone = change.risk.strip_prefix("none: ").unwrap_or(&change.risk);
    if allowed {
        change.risk =
            format!("stream `{name}` is shared ({who}; allowed by --share-stream {name}): {alone}");
    } else if change.safe {
        change.safe = false;
        change.risk = format!(
            "stream `{name}` is shared: {who} (this config is deployment `{mine}`), and the change affects it. Give this config a stream of its own (`[source] stream`), or pass `--share-stream {name}` if both deployments mean to share it. Alone, the change would be safe: {alone}"
        );
    }
}

/// The changes that make an existing stream what `spec` needs; `rollups`: the operator allowed
/// turning its rollups on (`--allow-rollup`).
fn stream_update(spec: &StreamSpec, have: stream::Config, rollups: bool) -> Update {
    let change = |what: String, risk: &str, safe: bool| Change {
        kind: "stream",
        name: spec.name.clone(),
        field: spec.field.clone(),
        what,
        risk: risk.to_string(),
        safe,
        applied: None,
        by_setup: false,
        by_change_route: false,
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
            "the server cannot change a stream's storage; create a new stream with the new storage and move the messages (`nats stream backup` / `restore`), or keep the storage in the config",
            false,
        ));
    }
    fence_change(&mut changes, &mut config, spec, rollups, &change);
    if let Some(difference) = spec.dedup_difference(&config) {
        changes.push(change(
            difference,
            "changing retention, per-subject limits or batch settings can discard stored messages or change what a publish means; name a new stream in the config and move the messages to it",
            false,
        ));
    }
    Update { changes, config }
}

/// Makes an existing output stream accept what fenced routes commit with (atomic batches and
/// rollups), in place: nothing stored changes, and window publishes go on as before, so hosts
/// of the old config keep serving while a route moves from window to fenced effects. Turning
/// rollups on is refused unless `rollups` (`--allow-rollup`): any client that may publish to
/// the stream could then purge it. A stream that denies purges is left to
/// [`StreamSpec::dedup_difference`] (refused).
fn fence_change(
    changes: &mut Vec<Change>,
    config: &mut stream::Config,
    spec: &StreamSpec,
    rollups: bool,
    change: &dyn Fn(String, &str, bool) -> Change,
) {
    if !spec.fenced || config.deny_purge || (config.allow_atomic_publish && config.allow_rollup) {
        return;
    }
    let what = format!(
        "atomic batches {} -> true, rollups {} -> true (fenced effects)",
        config.allow_atomic_publish, config.allow_rollup
    );
    let taken = "stored messages stay and publishes without a batch are taken as before (hosts of the old config keep serving); the stream also accepts the atomic batches and rollups fenced routes commit with (nats-server 2.12+)";
    if config.allow_rollup {
        config.allow_atomic_publish = true;
        changes.push(change(what, &format!("none: {taken}"), true));
        return;
    }
    let name = &spec.name;
    let purge = format!("with rollups on, any client allowed to publish to stream `{name}` can purge it with one message carrying `Nats-Rollup: all`: every output and every fenced claim record stored there (a purged completed key runs again)");
    if !rollups {
        changes.push(change(
            what,
            &format!("{purge}. Allow publishing to `{name}` only to the hosts (account permissions), then pass `--allow-rollup {name}` to make the change; fenced routes cannot commit without it"),
            false,
        ));
        return;
    }
    config.allow_atomic_publish = true;
    config.allow_rollup = true;
    changes.push(change(
        what,
        &format!("{purge} (allowed by --allow-rollup {name}); {taken}"),
        true,
    ));
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
            "a shorter window lets through repeats the stream would drop now; keep the longer window in the config (it is allowed), or shorten it with `nats stream edit` once you are sure",
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
        by_setup: false,
        by_change_route: false,
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
                "a lower history drops revisions a claim may still need; name another bucket"
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
                "a shorter max age removes claim records at once, and a redelivery of a completed key would run again; keep the longer max age in the config",
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
            by_setup: false,
            by_change_route: false,
        }
    }

    #[test]
    fn a_change_to_a_shared_stream_is_refused_unless_named() {
        let users = ["team-1".to_string()];
        let mut refused = widen();
        share_risk(&mut refused, &users, "team-2", false);
        assert!(!refused.safe);
        for part in [
            "deployment `team-1` uses it too",
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
