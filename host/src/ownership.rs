//! Which deployment owns what on the server (DESIGN.md rule 23). Streams and consumers carry
//! their owner in their `metadata` ([`OWNER_KEY`]), contracts in their record
//! ([`crate::contract::ContractRecord::deployment`]). A config of another deployment that
//! would rebind a consumer, re-record a contract or overwrite a component is refused, naming
//! both deployments and the fix; something recorded before owners were (no owner) is adopted
//! by the first deployment that sets it up.
//!
//! Names compare exactly; a deployment's own former default name is recognised by what it
//! owns and moved to its current name ([`former`]).
//!
//! The same check refuses a silent route rename: a new route whose subject an existing
//! consumer of this deployment serves, for a route the config no longer names, would run every
//! retained message again (new consumer from the start, new claim keys and output ids).

use std::collections::{BTreeSet, HashMap};

use anyhow::Context as _;
use async_nats::jetstream::Context;
use async_nats::jetstream::{consumer, stream};
use futures::StreamExt;
use thiserror::Error;

use crate::config::Config;
use crate::consumers::{consumer_specs, route_consumer_name};
use crate::subject;

mod former;

pub use former::migrate;

/// The metadata key that names the owning deployment of a stream or consumer.
pub const OWNER_KEY: &str = "dedup-host.deployment";

/// Something this config would take from another deployment, or a silent rename.
#[derive(Debug, Error)]
pub enum Conflict {
    /// It belongs to another deployment.
    #[error("{kind} `{name}` belongs to deployment `{owner}`, and this config is deployment `{mine}`: refused to {would}. If this config is that deployment, set `[deployment] name = \"{owner}\"` in it; otherwise give it names of its own: another `[source] stream`, or another route name (on a stream another deployment uses, such as the shared default one, a renamed route also needs `dedup-host setup --apply --share-stream <that stream>` to add its subjects)")]
    Owned {
        /// `consumer`, `contract`, `component` or `stream`.
        kind: &'static str,
        /// Its name on the server.
        name: String,
        /// The owning deployment.
        owner: String,
        /// This config's deployment.
        mine: String,
        /// What this config would have done to it.
        would: String,
        /// The route it belongs to, if any.
        route: Option<String>,
    },
    /// A contract recorded for another consumer of the same route name on the stream.
    #[error("contract `{name}` was recorded for consumer `{recorded}`, and this config's consumer of route `{route}` is `{mine}`: another deployment serves a route of this name on this stream, and the two would share its claim keys (a key one completed would be the other's duplicate, never run); give the route a name of its own, or use another `[source] stream`. If this config is that deployment, set `[source] consumer` back to what it was")]
    Consumer {
        /// The contract, `<bucket>/<route>`.
        name: String,
        /// The route.
        route: String,
        /// The consumer it was recorded for.
        recorded: String,
        /// This config's consumer of the route.
        mine: String,
    },
    /// A new route takes the subject of a consumer of a route this config no longer names.
    #[error("route `{route}` is new, but consumer `{old}` of route `{old_route}`, which this config no longer names, serves its subject `{subject}` (deployment `{mine}`): set up as a new route it would run every retained message again (a new consumer from the start, new claim keys and output ids, a new contract). To rename the route, run `dedup-host setup --config <this config> --rename-route {old_route} {route}` once no host serves `{old_route}` (it carries the claims and the consumer's position over), or keep the name `{old_route}`; to start it over on purpose, delete the old consumer first (`nats consumer rm {stream} {old}`)")]
    Rename {
        /// The new route.
        route: String,
        /// The old route's consumer.
        old: String,
        /// The old route.
        old_route: String,
        /// The new route's subject.
        subject: String,
        /// This config's deployment.
        mine: String,
        /// The source stream.
        stream: String,
    },
}

impl Conflict {
    /// The route of this config it concerns, if any.
    pub fn route(&self) -> Option<&str> {
        match self {
            Conflict::Owned { route, .. } => route.as_deref(),
            Conflict::Rename { route, .. } | Conflict::Consumer { route, .. } => Some(route),
        }
    }
}

/// A route's component was deployed by another deployment or for another consumer.
#[derive(Debug, Error)]
#[error("component `{name}` was deployed by deployment `{owner}` for consumer `{recorded}`, and this config is deployment `{mine}` with consumer `{consumer}` for route `{route}`: refused to overwrite it (components are kept by route name, and the other deployment's hosts run this one). Give the route a name of its own, or use another `[source] stream` or `components.bucket`; if this config is that deployment, set `[source] consumer` (and `[deployment] name`) back to what they were")]
pub struct ComponentOwned {
    /// The object, `<bucket>/<route>`.
    pub name: String,
    /// The route.
    pub route: String,
    /// The deployment that deployed it (`?` when not recorded).
    pub owner: String,
    /// The consumer it was deployed for (`?` when not recorded).
    pub recorded: String,
    /// This config's deployment.
    pub mine: String,
    /// This config's consumer of the route.
    pub consumer: String,
}

/// The owner recorded in a stream's or consumer's metadata.
pub fn owner(metadata: &HashMap<String, String>) -> Option<&str> {
    metadata.get(OWNER_KEY).map(String::as_str)
}

/// Records `config`'s deployment as the owner in `metadata`.
pub fn stamp(metadata: &mut HashMap<String, String>, config: &Config) {
    metadata.insert(OWNER_KEY.to_string(), config.deployment_name());
}

/// Every conflict `config` would cause on the server: consumers of another deployment it
/// would rebind, contracts of another deployment it would take as its own, silent renames.
/// Reads only.
pub async fn check(js: &Context, config: &Config) -> anyhow::Result<Vec<Conflict>> {
    let mut conflicts = Vec::new();
    let existing = former::source_consumers(js, config).await?;
    let others = Others::of(config, &existing);
    consumers(&others, &existing, &mut conflicts);
    renames(config, &others, &existing, &mut conflicts);
    contracts(js, config, &others, &mut conflicts).await?;
    Ok(conflicts)
}

/// Tells this config's deployment from others: its current name, and the former default
/// names that what it owns proves ([`former::names`]).
struct Others<'a> {
    config: &'a Config,
    former: BTreeSet<String>,
}

impl<'a> Others<'a> {
    fn of(config: &'a Config, existing: &[consumer::Info]) -> Self {
        Others {
            config,
            former: former::names(config, existing),
        }
    }

    /// Whether `owner` is another deployment.
    fn is_other(&self, owner: &str) -> bool {
        self.config.is_other_deployment(owner) && !self.former.contains(owner)
    }

    /// Whether binding consumer `name` (now `have`) to the filters `want` would take it from
    /// another deployment: it records another owner (not this config's current or former
    /// name) and other filters (a consumer another deployment owns with these very filters
    /// consumes what this config would anyway, and is only read).
    fn consumer_conflict(
        &self,
        name: &str,
        have: &consumer::Config,
        want: &[String],
    ) -> Option<Conflict> {
        let owner = owner(&have.metadata)?;
        let filters = filters(have);
        let config = self.config;
        (self.is_other(owner) && filters != want).then(|| Conflict::Owned {
            kind: "consumer",
            route: (config.routes.iter())
                .find(|r| route_consumer_name(config, &r.name) == name)
                .map(|r| r.name.clone()),
            name: name.to_string(),
            owner: owner.to_string(),
            mine: config.deployment_name(),
            would: format!("rebind it from {filters:?} to {want:?}"),
        })
    }
}

/// The former default names of `config`'s deployment that what it owns on the server proves
/// ([`former::names`]): what the next explicit `setup` moves to its current name ([`migrate`]).
pub async fn former_names(js: &Context, config: &Config) -> anyhow::Result<BTreeSet<String>> {
    let existing = former::source_consumers(js, config).await?;
    Ok(former::names(config, &existing))
}

/// New routes of `config` that would take over the subject of a route it no longer names (a
/// rename that is not `setup --rename-route`): what a reload refuses, as a start does.
pub async fn renamed(js: &Context, config: &Config) -> anyhow::Result<Vec<Conflict>> {
    let mut conflicts = Vec::new();
    let existing = former::source_consumers(js, config).await?;
    renames(
        config,
        &Others::of(config, &existing),
        &existing,
        &mut conflicts,
    );
    Ok(conflicts)
}

/// The deployments other than `config`'s that use stream `name`: its recorded owner and the
/// owners of its consumers, other than this config's current and former names.
pub async fn other_users(js: &Context, config: &Config, name: &str) -> anyhow::Result<Vec<String>> {
    let Ok(mut stream) = js.get_stream(name).await else {
        return Ok(Vec::new());
    };
    let info = stream.info().await?;
    let existing = former::source_consumers(js, config).await?;
    let others = Others::of(config, &existing);
    let mut users: Vec<String> = owner(&info.config.metadata)
        .filter(|o| others.is_other(o))
        .into_iter()
        .map(str::to_string)
        .collect();
    let mut list = stream.consumers();
    while let Some(info) = list.next().await {
        let info = info.with_context(|| format!("cannot list the consumers of stream `{name}`"))?;
        let Some(o) = owner(&info.config.metadata) else {
            continue;
        };
        if others.is_other(o) {
            users.push(o.to_string());
        }
    }
    users.sort();
    users.dedup();
    Ok(users)
}

/// The filter subjects of a consumer, however the server holds them.
fn filters(c: &consumer::Config) -> Vec<String> {
    let mut have = c.filter_subjects.clone();
    if !c.filter_subject.is_empty() {
        have.push(c.filter_subject.clone());
    }
    have
}

/// Consumers this config needs that another deployment owns with other filters.
fn consumers(others: &Others, existing: &[consumer::Info], out: &mut Vec<Conflict>) {
    for (name, want, _) in consumer_specs(others.config) {
        let Some(info) = existing.iter().find(|i| i.name == name) else {
            continue;
        };
        out.extend(others.consumer_conflict(&name, &info.config, &want));
    }
}

/// Whether binding consumer `name` of the source stream `source` (now `have`) to the filters
/// `want` would take it from another deployment: it records another owner and other filters
/// (a consumer another deployment owns with these very filters consumes what this config
/// would anyway, and is only read). A former default name of this deployment ([`former`]) is
/// not another: a deployment that widens its source subjects re-filters its own unrouted
/// consumer. Checked before every create or update of a route consumer, at set-up, at
/// start, on reload and on every re-bind; lists the stream's consumers only when the owner
/// is not this config's current name.
pub async fn consumer_conflict(
    source: &stream::Stream,
    config: &Config,
    name: &str,
    have: &consumer::Config,
    want: &[String],
) -> anyhow::Result<Option<Conflict>> {
    let exact = Others {
        config,
        former: BTreeSet::new(),
    };
    if exact.consumer_conflict(name, have, want).is_none() {
        return Ok(None);
    }
    let existing = former::stream_consumers(source, &config.source.stream).await?;
    Ok(Others::of(config, &existing).consumer_conflict(name, have, want))
}

/// New routes whose subject a consumer of this deployment serves for a route it no longer
/// names.
fn renames(config: &Config, others: &Others, existing: &[consumer::Info], out: &mut Vec<Conflict>) {
    let mine = config.deployment_name();
    let prefix = format!("{}-", config.source.consumer);
    for r in &config.routes {
        let name = route_consumer_name(config, &r.name);
        if existing.iter().any(|i| i.name == name) {
            continue;
        }
        for info in existing {
            let Some(old_route) = info.name.strip_prefix(&prefix) else {
                continue;
            };
            let named = config.routes.iter().any(|o| o.name == old_route);
            // A consumer of another deployment is never this config's old route; one with
            // no owner (made before owners were recorded) or a default name may be.
            let theirs = owner(&info.config.metadata).is_some_and(|o| others.is_other(o));
            if named || theirs {
                continue;
            }
            if filters(&info.config)
                .iter()
                .any(|f| subject::overlaps(f, &r.subject))
            {
                out.push(Conflict::Rename {
                    route: r.name.clone(),
                    old: info.name.clone(),
                    old_route: old_route.to_string(),
                    subject: r.subject.clone(),
                    mine: mine.clone(),
                    stream: config.source.stream.clone(),
                });
            }
        }
    }
}

/// Contracts of this config's routes recorded by another deployment.
async fn contracts(
    js: &Context,
    config: &Config,
    others: &Others<'_>,
    out: &mut Vec<Conflict>,
) -> anyhow::Result<()> {
    let mine = config.deployment_name();
    let Ok(store) = js.get_key_value(crate::contract::bucket_name(config)).await else {
        return Ok(());
    };
    for r in &config.routes {
        let Some((record, _)) = crate::contract::read(&store, &r.name).await? else {
            continue;
        };
        let record = record.with_live_subjects(js, config).await;
        if let Some(recorded) = crate::contract::other_consumer(&record, config, &r.name) {
            out.push(Conflict::Consumer {
                name: format!("{}/{}", store.name, r.name),
                route: r.name.clone(),
                recorded,
                mine: route_consumer_name(config, &r.name),
            });
            continue;
        }
        match record.other_owner(config, &r.name) {
            Some(owner) if others.is_other(owner) => out.push(Conflict::Owned {
                kind: "contract",
                name: format!("{}/{}", store.name, r.name),
                owner: owner.to_string(),
                mine: mine.clone(),
                would: "take it as this config's own".into(),
                route: Some(r.name.clone()),
            }),
            _ => {}
        }
    }
    Ok(())
}

/// Whether overwriting route `route`'s component, object `<bucket>/<route>` recorded as
/// deployed by `deployment` for `consumer` (either unrecorded in an older object), would take
/// it from another deployment: another route consumer (two deployments on one stream with
/// one route name), or another deployment than this config's current or former name.
pub async fn component_conflict(
    js: &Context,
    config: &Config,
    object: (&str, &str),
    consumer: Option<&str>,
    deployment: Option<&str>,
) -> anyhow::Result<Option<ComponentOwned>> {
    let (bucket, route) = object;
    let mine = route_consumer_name(config, route);
    let other_consumer = consumer.is_some_and(|c| c != mine);
    let other_deployment = match deployment {
        Some(d) if config.is_other_deployment(d) => {
            let existing = former::source_consumers(js, config).await?;
            Others::of(config, &existing).is_other(d)
        }
        _ => false,
    };
    Ok(
        (other_consumer || other_deployment).then(|| ComponentOwned {
            name: format!("{bucket}/{route}"),
            route: route.to_string(),
            owner: deployment.unwrap_or("?").to_string(),
            recorded: consumer.unwrap_or("?").to_string(),
            mine: config.deployment_name(),
            consumer: mine,
        }),
    )
}

/// Every conflict a command found, one per line: it was refused and changed nothing.
#[derive(Debug, Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct Conflicts(pub Vec<Conflict>);

/// Fails with every conflict ([`Conflicts`]), when there is any.
pub fn refuse(conflicts: Vec<Conflict>) -> anyhow::Result<()> {
    if conflicts.is_empty() {
        return Ok(());
    }
    Err(Conflicts(conflicts).into())
}
