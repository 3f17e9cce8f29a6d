//! A deployment's former default names. The default (`auto-<hash>`) name hashes the source
//! subjects, so a deployment that adds a subject (or a route, when `[source] subjects` is
//! unset) gets a new name, while the server still records the old one as owner. Names are
//! compared exactly; a former default name is recognised as this config's own only by what
//! it owns: a route consumer of this config's name with exactly the filters this config
//! still gives it, and nothing else it owns on the stream. Any other name, default or not,
//! is another deployment. An explicit `setup` then moves the recorded owner to the current
//! name ([`migrate`]), saying so; a host start does not (hosts of the old and the new config
//! run side by side in a rolling restart, and would move it back and forth).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use async_nats::jetstream::Context;
use async_nats::jetstream::{consumer, stream};
use futures::StreamExt;

use crate::config::{Config, DeploymentConfig};
use crate::consumers::route_consumer_name;

/// The former default names of `config`'s deployment that the consumers `existing` (of the
/// source stream) prove: every consumer a name owns on the stream is one this config names,
/// with the very filters this config gives it, and at least one is a route consumer (a
/// route subject widened to cover its old one, and this config's unrouted consumer within
/// its source subjects, neither prove nor contradict). A name that also owns a consumer
/// this config does not name is another deployment's, however many of this config's
/// consumers it shares. Empty when this config's name is set explicitly (set names compare
/// exactly).
pub fn names(config: &Config, existing: &[consumer::Info]) -> BTreeSet<String> {
    let mine = config.deployment_name();
    if config.deployment.name.is_some() {
        return BTreeSet::new();
    }
    // Per recorded default name: (proved by one consumer, contradicted by one).
    let mut verdicts: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for info in existing {
        let Some(owner) = super::owner(&info.config.metadata) else {
            continue;
        };
        if owner == mine || !DeploymentConfig::is_default(owner) {
            continue;
        }
        let verdict = verdicts.entry(owner).or_default();
        match evidence(config, info) {
            Evidence::Proves => verdict.0 = true,
            Evidence::Neutral => {}
            Evidence::Contradicts => verdict.1 = true,
        }
    }
    verdicts
        .into_iter()
        .filter(|(_, (proved, contradicted))| *proved && !contradicted)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// What one consumer of a former default name says of it being `config`'s own.
enum Evidence {
    /// A route consumer of this config with exactly the filters this config gives it.
    Proves,
    /// A consumer this config names whose filters this config still covers.
    Neutral,
    /// A consumer this config does not name, or names with filters it no longer serves.
    Contradicts,
}

/// What consumer `info` says of its owner being a former name of `config`'s deployment.
fn evidence(config: &Config, info: &consumer::Info) -> Evidence {
    let filters = super::filters(&info.config);
    let within = |outer: &[String]| {
        !filters.is_empty()
            && filters
                .iter()
                .all(|f| outer.iter().any(|o| crate::subject::covers(o, f)))
    };
    if let Some(r) =
        (config.routes.iter()).find(|r| route_consumer_name(config, &r.name) == info.name)
    {
        let subject = [r.subject.clone()];
        if filters == subject {
            return Evidence::Proves;
        }
        return match within(&subject) {
            true => Evidence::Neutral,
            false => Evidence::Contradicts,
        };
    }
    if info.name == config.source.consumer && within(&config.source_subjects()) {
        return Evidence::Neutral;
    }
    Evidence::Contradicts
}

/// Whether `config` names consumer `name`: one of its route consumers, or its unrouted one.
fn named(config: &Config, name: &str) -> bool {
    name == config.source.consumer
        || (config.routes.iter()).any(|r| route_consumer_name(config, &r.name) == name)
}

/// Every consumer of `config`'s source stream, or none when the stream does not exist.
pub async fn source_consumers(
    js: &Context,
    config: &Config,
) -> anyhow::Result<Vec<consumer::Info>> {
    let Ok(source) = js.get_stream(&config.source.stream).await else {
        return Ok(Vec::new());
    };
    stream_consumers(&source, &config.source.stream).await
}

/// Every consumer of stream `source`, named `name`.
pub async fn stream_consumers(
    source: &stream::Stream,
    name: &str,
) -> anyhow::Result<Vec<consumer::Info>> {
    let mut existing = Vec::new();
    let mut list = source.consumers();
    while let Some(info) = list.next().await {
        existing.push(info.with_context(|| {
            format!("cannot list the consumers of stream `{name}` to check who owns them")
        })?);
    }
    Ok(existing)
}

/// Moves what `config`'s deployment recorded under a former default name ([`names`]) to its
/// current name: the owner of its streams and of the source stream's consumers, and the
/// deployment of its routes' contracts. Returns one line per move, for the operator. Run
/// by an explicit `setup` after every check passed: it changes only what is this
/// deployment's own.
pub async fn migrate(js: &Context, config: &Config) -> anyhow::Result<Vec<String>> {
    let existing = source_consumers(js, config).await?;
    let former = names(config, &existing);
    let mut moved = Vec::new();
    if former.is_empty() {
        return Ok(moved);
    }
    let mine = config.deployment_name();
    let is_former = |m: &std::collections::HashMap<String, String>| {
        super::owner(m).is_some_and(|o| former.contains(o))
    };
    // Contracts and streams first, consumers last: the consumers are the only proof of the
    // former name, so a run that stopped part-way is finished by running it again.
    moved.extend(contracts(js, config, &former, &mine).await?);
    for name in stream_names(config) {
        let Ok(mut stream) = js.get_stream(&name).await else {
            continue;
        };
        let mut c = stream.info().await?.config.clone();
        if is_former(&c.metadata) {
            let was = super::owner(&c.metadata).unwrap_or_default().to_string();
            c.metadata.insert(super::OWNER_KEY.into(), mine.clone());
            js.update_stream(&c).await.with_context(|| {
                format!("cannot record deployment `{mine}` as the owner of stream `{name}`")
            })?;
            moved.push(format!("stream `{name}`: owner `{was}` -> `{mine}`"));
        }
    }
    if let Ok(source) = js.get_stream(&config.source.stream).await {
        // Only the consumers this config names (every one the former name owns is, or it
        // would not be proved).
        let own = existing
            .iter()
            .filter(|i| is_former(&i.config.metadata) && named(config, &i.name));
        for info in own {
            let mut c = info.config.clone();
            let was = super::owner(&c.metadata).unwrap_or_default().to_string();
            c.metadata.insert(super::OWNER_KEY.into(), mine.clone());
            source.update_consumer(c).await.with_context(|| {
                format!(
                    "cannot record deployment `{mine}` as the owner of consumer `{}`",
                    info.name
                )
            })?;
            moved.push(format!(
                "consumer `{}`: owner `{was}` -> `{mine}`",
                info.name
            ));
        }
    }
    if !moved.is_empty() {
        let names: Vec<&str> = former.iter().map(String::as_str).collect();
        tracing::warn!(
            "deployment `{mine}` was recorded as {names:?} (its former default name, before its source subjects changed; it owns this config's route consumers with this config's filters): moved to `{mine}`: {}",
            moved.join("; ")
        );
    }
    Ok(moved)
}

/// The streams a deployment creates: its source, dead-letter and output streams and the
/// exclusive routes' queue.
fn stream_names(config: &Config) -> Vec<String> {
    let mut names = vec![
        config.source.stream.clone(),
        config.dead_letter.stream.clone(),
    ];
    names.extend(config.output_streams.iter().map(|o| o.name.clone()));
    if config.routes.iter().any(|r| r.exclusive_by.is_some()) {
        names.push(crate::exclusive::stream_name(config));
    }
    names
}

/// Records `mine` in the contracts of `config`'s routes recorded under a `former` name.
async fn contracts(
    js: &Context,
    config: &Config,
    former: &BTreeSet<String>,
    mine: &str,
) -> anyhow::Result<Vec<String>> {
    let mut moved = Vec::new();
    let Ok(store) = js.get_key_value(crate::contract::bucket_name(config)).await else {
        return Ok(moved);
    };
    for r in &config.routes {
        let (found, changing) = crate::contract::lookup_marked(&store, &r.name).await?;
        let crate::contract::Lookup::Recorded(mut record, revision) = found else {
            continue;
        };
        let Some(was) = record.deployment.clone().filter(|d| former.contains(d)) else {
            continue;
        };
        record.deployment = Some(mine.to_string());
        // Proved by the route's consumer, whose filter is the route's subject.
        record.subjects = Some(vec![r.subject.clone()]);
        // A change under way (`setup --change-route`) keeps its mark.
        let bytes = crate::contract::encode(&record, changing.as_ref());
        // Against the revision read: a contract changed meanwhile is left as it is.
        store
            .update(&r.name, bytes, revision)
            .await
            .with_context(|| {
                format!(
                    "cannot record deployment `{mine}` in contract `{}/{}` (it changed meanwhile? run it again)",
                    store.name, r.name
                )
            })?;
        moved.push(format!(
            "contract `{}/{}`: deployment `{was}` -> `{mine}`",
            store.name, r.name
        ));
    }
    Ok(moved)
}
