//! A route's contract (DESIGN.md rule 19): what every host must agree on for the route's
//! guarantees, recorded on the server when the route is first set up and checked by every host
//! at start, on every reload and whenever the record changes.
//!
//! A host's own config never decides these alone: hosts differ in size, and rolling restarts
//! and reloads put old and new configs side by side. A route whose config differs from its
//! contract is refused on that host (its messages wait in the stream); changing a contract is
//! an explicit operation, `dedup-host setup --change-route R` ([`crate::contract_change`]).
//!
//! The records live in the KV bucket `dedup-contracts-<source stream>`, key `<route>`, kept
//! without a max age (a contract outlives every claim).

use anyhow::Context as _;
use async_nats::jetstream::kv::{self, Store};
use async_nats::jetstream::Context;
use dedup_delivery::agreement::Comparison;
use dedup_delivery::contract::{self, ContractStore, Found, Verdict, Writer, Written};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::{
    ClaimMode, Config, DedupMode, EffectsMode, KeySource, MissingKey, RouteConfig,
};

mod changing;
pub mod watch;

pub use changing::{encode, is_marked, lookup_marked, ChangeRun, Changing};

/// What every host serving a route must agree on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteContract {
    /// Where the route's claim records live: `bucket <name>`, or `stream <name>` for a fenced
    /// route (its claims sit beside its outputs).
    pub claims: String,
    /// `window` or `fenced` effects.
    pub effects: EffectsMode,
    /// Claim `before` or `after` running.
    pub claim: ClaimMode,
    /// Where the idempotency key comes from.
    pub key: KeySource,
    /// What a message without a key becomes.
    pub missing_key: MissingKey,
    /// Whether the source stream refuses a repeated subject forever (`source.dedup`).
    pub forever: bool,
    /// Where an exclusive route's entity comes from.
    pub exclusive_by: Option<KeySource>,
    /// Whether an exclusive route skips a message with a newer one of its entity waiting.
    pub coalesce: bool,
    /// An exclusive route's partitions.
    pub partitions: Option<usize>,
    /// Whether an exclusive route's messages are queued by one pinned host, many at a time,
    /// fenced on its epoch (the copier, `dedup_delivery::copier`). A record without it was
    /// written by a host that queues one message at a time, unfenced: such hosts must not
    /// queue beside a copier, so a host refuses that record until `setup --change-route`
    /// records the copier (refused while a host serves the route), and those hosts cannot
    /// read a record with it (`deny_unknown_fields`), so they refuse the route.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copier: bool,
    /// How many of an exclusive route's messages a partition hands out at once, never giving
    /// one up (`exclusive::PARTITION_WINDOW`; its entity's later messages wait behind a
    /// message still queued, `dedup_delivery::ahead`). A record without it was written by a
    /// host that counts on one message at a time per partition: beside a window, it would
    /// run an entity's next message while the previous one runs. So a host refuses that
    /// record until `setup --change-route` records the window (refused while a host serves
    /// the route), and those hosts cannot read a record with it (`deny_unknown_fields`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_window: Option<i64>,
}

/// A contract as stored, with who recorded it and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractRecord {
    /// The contract.
    pub contract: RouteContract,
    /// Who wrote it: a host's instance id, or `setup`.
    pub recorded_by: String,
    /// When, in Unix milliseconds.
    pub recorded_ms: u64,
    /// The deployment that owns the route (DESIGN.md rule 23); `None` in a record written
    /// before owners were recorded (the first deployment to set the route up adopts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The durable consumer that serves the route (`<source.consumer>-<route>`); `None` in a
    /// record written before consumers were recorded. Two deployments on one stream with the
    /// same route name but their own `[source] consumer` would share the route's claim keys
    /// (one team's key completed is the other's duplicate): the consumer tells them apart
    /// where two default deployment names cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// The filter subjects of [`ContractRecord::consumer`] when it was recorded (the route's
    /// subject); `None` in a record written before they were recorded
    /// ([`ContractRecord::with_live_subjects`] reads them from the consumer). Two teams with
    /// default deployment names, one stream and one route name share the consumer name: the
    /// subjects tell them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subjects: Option<Vec<String>>,
}

impl ContractRecord {
    /// A record of `contract` for `route` of `config`, written by `by` now: this config's
    /// deployment, the route's consumer and its filter subjects.
    pub fn new(contract: RouteContract, by: &str, config: &Config, route: &RouteConfig) -> Self {
        ContractRecord {
            contract,
            recorded_by: by.to_string(),
            recorded_ms: crate::claim::record::now_ms(),
            deployment: Some(config.deployment_name()),
            consumer: Some(crate::consumers::route_consumer_name(config, &route.name)),
            subjects: Some(vec![route.subject.clone()]),
        }
    }

    /// The deployment that recorded this contract of `route`, when it is another than
    /// `config`'s. Names compare exactly, with one exception: when both are default (`auto-`)
    /// names, the record names the consumer `config` gives the route AND that consumer takes
    /// the subject `config` gives the route, it is this deployment under a former default
    /// name (same consumer, same claim keys): a rolling restart or `setup` with a config that
    /// adds a source subject (or, with `[source] subjects` unset, a route) renames it while
    /// hosts of the old config still serve. Another team with a default name, the default
    /// stream and the same route name has the same consumer name but its own subject.
    /// A record without subjects (older) is judged by the consumer name alone: callers that
    /// can reach the server fill them first ([`ContractRecord::with_live_subjects`]).
    pub fn other_owner(&self, config: &Config, route: &str) -> Option<&str> {
        let owner = self.deployment.as_deref()?;
        if !config.is_other_deployment(owner) {
            return None;
        }
        let default = |name: &str| crate::config::DeploymentConfig::is_default(name);
        let consumer = crate::consumers::route_consumer_name(config, route);
        let same_subjects = match (
            &self.subjects,
            config.routes.iter().find(|r| r.name == route),
        ) {
            (Some(recorded), Some(r)) => *recorded == [r.subject.clone()],
            _ => true,
        };
        let former = default(owner)
            && default(&config.deployment_name())
            && self.consumer.as_deref() == Some(consumer.as_str())
            && same_subjects;
        (!former).then_some(owner)
    }

    /// This record with [`ContractRecord::subjects`] read from its live consumer on
    /// `config`'s source stream: they fill a record that predates them, and win over the
    /// recorded ones (a plain `setup` may have changed the route's subject since). Kept as
    /// recorded when the consumer or the stream is gone.
    pub async fn with_live_subjects(mut self, js: &Context, config: &Config) -> Self {
        let Some(consumer) = self.consumer.clone() else {
            return self;
        };
        let Ok(source) = js.get_stream(&config.source.stream).await else {
            return self;
        };
        if let Ok(info) = source.consumer_info(&consumer).await {
            let c = &info.config;
            let mut subjects = c.filter_subjects.clone();
            if !c.filter_subject.is_empty() {
                subjects.insert(0, c.filter_subject.clone());
            }
            self.subjects = Some(subjects);
        }
        self
    }
}

/// The consumer `recorded` was recorded for, when it is not the one `config` gives `route`:
/// another deployment serves this route name on the stream.
pub fn other_consumer(recorded: &ContractRecord, config: &Config, route: &str) -> Option<String> {
    let mine = crate::consumers::route_consumer_name(config, route);
    recorded.consumer.clone().filter(|c| *c != mine)
}

/// Why a route's contract could not be agreed.
#[derive(Debug, Error)]
pub enum ContractError {
    /// The config differs from the recorded contract.
    #[error("route `{route}` differs from its contract on the server (recorded by {recorded_by}; every host must agree on it): {}; make this config match (`copier` and `partition_window` are no config's: this version records them), or change the contract with `dedup-host setup --config <this config> --change-route {route}` once no host serves the route", differences.join("; "))]
    Differs {
        /// The route.
        route: String,
        /// Who recorded the contract.
        recorded_by: String,
        /// One `field: recorded X, this config Y` each.
        differences: Vec<String>,
    },
    /// The route's contract was deleted and this host does not hold the one its config asks.
    #[error("route `{route}`'s contract was deleted from `{bucket}`: hosts keep serving under the contract they hold and never record one, and this host's config differs from what it holds (or it holds none); record the route's contract with `dedup-host setup --config <this config> --change-route {route}` once no host serves the route")]
    Deleted {
        /// The route.
        route: String,
        /// The contract bucket.
        bucket: String,
    },
    /// The contract was recorded by another deployment.
    #[error("route `{route}`'s contract in `{bucket}` belongs to deployment `{owner}`, and this config is deployment `{mine}`: refused to take it as this config's own. If this config is that deployment, set `[deployment] name = \"{owner}\"` in it; otherwise give the route a name of its own (or another `[source] stream`)")]
    Owned {
        /// The route.
        route: String,
        /// The contracts bucket.
        bucket: String,
        /// The deployment that recorded it.
        owner: String,
        /// This config's deployment.
        mine: String,
    },
    /// The contract was recorded for another deployment's consumer of the same route name.
    #[error("route `{route}`'s contract in `{bucket}` was recorded for consumer `{recorded}`, and this config's consumer of the route is `{mine}`: another deployment serves a route of this name on this stream, and the two would share its claim keys (a key one completed would be the other's duplicate, never run); give the route a name of its own, or use another `[source] stream`. If this config is that deployment, set `[source] consumer` back to what it was")]
    OtherConsumer {
        /// The route.
        route: String,
        /// The contracts bucket.
        bucket: String,
        /// The consumer the contract was recorded for.
        recorded: String,
        /// This config's consumer of the route.
        mine: String,
    },
    /// A contract change (`setup --change-route`) is under way: a host does not start the
    /// route until the record it ends with clears the mark.
    #[error("route `{route}`'s contract is being changed (`dedup-host setup --change-route {route}` marked it in `{bucket}` at {since_ms} ms since the epoch and has not finished): this host does not start the route now and starts it by itself once the change ends. If no change is running (it stopped part-way), finish it with `dedup-host setup --config <the new config> --change-route {route}`, or call it off with the same command and a config that matches the recorded contract")]
    Changing {
        /// The route.
        route: String,
        /// The contracts bucket.
        bucket: String,
        /// When the change began, in Unix milliseconds.
        since_ms: u64,
    },
    /// The contract bucket did not answer or holds something unreadable.
    #[error("route `{route}`: cannot read or record its contract in `{bucket}`: {reason}")]
    Store {
        /// The route.
        route: String,
        /// The contract bucket.
        bucket: String,
        /// What went wrong.
        reason: String,
    },
}

/// The contract bucket of a deployment: one per source stream.
pub fn bucket_name(config: &Config) -> String {
    format!("dedup-contracts-{}", config.source.stream)
}

/// The contract `config` asks for `route`.
pub fn of(config: &Config, route: &RouteConfig) -> RouteContract {
    let claims = match config.fenced_stream(route) {
        Some(stream) => format!("stream {}", stream.name),
        None => format!("bucket {}", config.claims.bucket),
    };
    RouteContract {
        claims,
        effects: route.effects,
        claim: route.claim,
        key: route.key.clone(),
        missing_key: route.missing_key,
        forever: config.source.dedup == DedupMode::Forever,
        exclusive_by: route.exclusive_by.clone(),
        coalesce: route.coalesce,
        partitions: route.exclusive_by.as_ref().map(|_| route.partitions()),
        copier: route.exclusive_by.is_some(),
        partition_window: (route.exclusive_by.as_ref()).map(|_| crate::exclusive::PARTITION_WINDOW),
    }
}

/// Each field where `recorded` and `wanted` differ, as `field: recorded X, this config Y`.
pub fn differences(recorded: &RouteContract, wanted: &RouteContract) -> Vec<String> {
    let (serde_json::Value::Object(a), serde_json::Value::Object(b)) = (
        serde_json::to_value(recorded).expect("contract serializes"),
        serde_json::to_value(wanted).expect("contract serializes"),
    ) else {
        unreachable!("a contract is an object");
    };
    // A field left out of one (a default value skipped) differs too.
    let fields = a.keys().chain(b.keys().filter(|f| !a.contains_key(*f)));
    let null = serde_json::Value::Null;
    fields
        .filter(|field| a.get(*field) != b.get(*field))
        .map(|field| {
            let (recorded, mine) = (a.get(field).unwrap_or(&null), b.get(field).unwrap_or(&null));
            format!("{field}: recorded {recorded}, this config {mine}")
        })
        .collect()
}

/// Opens the contract bucket, creating it when missing.
pub async fn open(js: &Context, config: &Config) -> anyhow::Result<Store> {
    let bucket = bucket_name(config);
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: bucket.clone(),
        description: "dedup-host route contracts (DESIGN.md rule 19)".into(),
        history: 8,
        num_replicas: config.claims.replicas,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create the route contract bucket `{bucket}`"))
}

/// What the contract bucket holds for a route.
#[derive(Debug)]
// Read once per lookup of a route, never stored in bulk: boxing the record buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Lookup {
    /// A contract, with its revision.
    Recorded(ContractRecord, u64),
    /// Nothing ever: the route was never set up.
    Never,
    /// A contract was recorded, then deleted or purged (the marker's revision). Hosts keep
    /// serving under the contract they hold and never record one; only set-up does.
    Deleted(u64),
    /// A record that does not parse: its revision and why.
    Unreadable(u64, String),
}

/// What the contract bucket holds for `route`.
pub async fn lookup(store: &Store, route: &str) -> Result<Lookup, ContractError> {
    Ok(lookup_marked(store, route).await?.0)
}

/// The recorded contract of `route` with its revision, if any (`None` also when it was
/// deleted).
pub async fn read(
    store: &Store,
    route: &str,
) -> Result<Option<(ContractRecord, u64)>, ContractError> {
    match lookup(store, route).await? {
        Lookup::Recorded(record, revision) => Ok(Some((record, revision))),
        Lookup::Never | Lookup::Deleted(_) => Ok(None),
        Lookup::Unreadable(_, reason) => Err(unreadable(store, route, &reason)),
    }
}

/// A record that does not parse: the fix is recording it anew, which only set-up does.
fn unreadable(store: &Store, route: &str, reason: &str) -> ContractError {
    ContractError::Store {
        route: route.to_string(),
        bucket: store.name.clone(),
        reason: format!(
            "unreadable record ({reason}); record the route's contract anew with `dedup-host setup --config <config> --change-route {route}`"
        ),
    }
}

/// Checks `route` of `config` against its recorded contract, recording it first when the
/// route has none, was deleted or holds an unreadable record: for set-up commands, `by`
/// names the writer. Hosts use [`agree_serving`].
pub async fn agree(
    store: &Store,
    config: &Config,
    route: &RouteConfig,
    by: &str,
) -> Result<RouteContract, ContractError> {
    settle(store, config, route, by, None).await
}

/// [`agree`] for a serving host `by`, which records a contract only at the set-up of a
/// route that never had one. When the route's contract was deleted, the host keeps serving
/// under `held` (the contract it last agreed on) if its config still asks for it, and is
/// refused otherwise ([`ContractError::Deleted`]): a host refused for its config must not
/// win a race to record it.
pub async fn agree_serving(
    store: &Store,
    config: &Config,
    route: &RouteConfig,
    by: &str,
    held: Option<&RouteContract>,
) -> Result<RouteContract, ContractError> {
    settle(store, config, route, by, Some(held)).await
}

/// Reads or records the contract ([`dedup_delivery::contract::settle`]) and judges a
/// recorded one: `host` is `None` for a set-up command, else the contract the host holds.
async fn settle(
    store: &Store,
    config: &Config,
    route: &RouteConfig,
    by: &str,
    host: Option<Option<&RouteContract>>,
) -> Result<RouteContract, ContractError> {
    let wanted = of(config, route);
    let writer = match host {
        None => Writer::Setup,
        Some(held) => Writer::Host {
            holds_wanted: held == Some(&wanted),
        },
    };
    let new = || ContractRecord::new(wanted.clone(), by, config, route);
    let settled = contract::settle(&Bucket(store), &route.name, writer, new).await?;
    let bucket = || store.name.clone();
    match settled.verdict(|recorded| judge(&store.name, config, route, recorded, &wanted)) {
        Verdict::Agrees => Ok(wanted),
        Verdict::Refused(e) => Err(e),
        Verdict::Changing(since_ms) => Err(ContractError::Changing {
            route: route.name.clone(),
            bucket: bucket(),
            since_ms,
        }),
        Verdict::Deleted => Err(ContractError::Deleted {
            route: route.name.clone(),
            bucket: bucket(),
        }),
        Verdict::Unreadable(reason) => Err(unreadable(store, &route.name, &reason)),
        Verdict::Exhausted => Err(ContractError::Store {
            route: route.name.clone(),
            bucket: bucket(),
            reason: "the record neither exists nor can be created".into(),
        }),
    }
}

/// Whether `config` may serve `route` under the contract `recorded` (in contract bucket
/// `bucket`), asking for `wanted`: another deployment's record is never taken as this
/// config's own (owner first, then consumer), then the contracts compare.
pub fn judge(
    bucket: &str,
    config: &Config,
    route: &RouteConfig,
    recorded: &ContractRecord,
    wanted: &RouteContract,
) -> Result<(), ContractError> {
    if let Some(owner) = recorded.other_owner(config, &route.name) {
        return Err(ContractError::Owned {
            route: route.name.clone(),
            bucket: bucket.to_string(),
            owner: owner.to_string(),
            mine: config.deployment_name(),
        });
    }
    if let Some(other) = other_consumer(recorded, config, &route.name) {
        return Err(ContractError::OtherConsumer {
            route: route.name.clone(),
            bucket: bucket.to_string(),
            recorded: other,
            mine: crate::consumers::route_consumer_name(config, &route.name),
        });
    }
    if dedup_delivery::revert::reverted(dedup_delivery::revert::Fix::ContractCheck) {
        return Ok(());
    }
    compare(&route.name, recorded, wanted.clone()).map(drop)
}

/// The contract bucket as the delivery logic's [`ContractStore`].
struct Bucket<'a>(&'a Store);

impl ContractStore for Bucket<'_> {
    type Record = ContractRecord;
    type Error = ContractError;

    async fn get(&self, route: &str) -> Result<Found<ContractRecord>, ContractError> {
        Ok(match lookup_marked(self.0, route).await? {
            (Lookup::Never, _) => Found::Never,
            (Lookup::Deleted(revision), _) => Found::Deleted(revision),
            (Lookup::Recorded(record, revision), changing) => Found::Recorded {
                record,
                revision,
                changing: changing.map(|c| c.since_ms),
            },
            (Lookup::Unreadable(revision, reason), _) => Found::Unreadable { revision, reason },
        })
    }

    async fn update(
        &self,
        route: &str,
        record: &ContractRecord,
        revision: u64,
    ) -> Result<Written, ContractError> {
        let bytes = serde_json::to_vec(record).expect("record serializes");
        match self.0.update(route, bytes.into(), revision).await {
            Ok(_) => Ok(Written::Written),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(Written::Raced),
            Err(e) => Err(ContractError::Store {
                route: route.to_string(),
                bucket: self.0.name.clone(),
                reason: e.to_string(),
            }),
        }
    }
}

impl ContractError {
    /// How the config compared with the contract, when this error is a comparison (the
    /// host decides on it, [`dedup_delivery::agreement::decide`]); `None` when the store
    /// did not answer or holds something unreadable.
    pub fn comparison(&self) -> Option<Comparison> {
        match self {
            ContractError::Differs { .. } => Some(Comparison::Differs),
            ContractError::Deleted { .. } => Some(Comparison::Deleted),
            ContractError::Owned { .. } => Some(Comparison::Owned),
            ContractError::OtherConsumer { .. } => Some(Comparison::OtherConsumer),
            ContractError::Changing { .. } => Some(Comparison::Changing),
            ContractError::Store { .. } => None,
        }
    }
}

/// `Ok(wanted)` when `recorded` holds it, else the differences.
pub fn compare(
    route: &str,
    recorded: &ContractRecord,
    wanted: RouteContract,
) -> Result<RouteContract, ContractError> {
    if recorded.contract == wanted {
        return Ok(wanted);
    }
    Err(ContractError::Differs {
        route: route.to_string(),
        recorded_by: recorded.recorded_by.clone(),
        differences: differences(&recorded.contract, &wanted),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(route_extra: &str, outputs: &str) -> Config {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[host]\nconcurrency = 4\n[source]\nsubjects = [\"in.>\"]\n{outputs}\n[[routes]]\nname = \"r\"\nsubject = \"in.r.*\"\n{route_extra}\n"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn partitions_come_from_the_route_not_the_host_size() {
        let small = config("exclusive_by = { subject_token = 2 }", "");
        let mut big = small.clone();
        big.host.concurrency = 64;
        big.host.max_in_flight = 256;
        let (a, b) = (of(&small, &small.routes[0]), of(&big, &big.routes[0]));
        assert_eq!(a, b, "hosts of different sizes agree");
        assert_eq!(a.partitions, Some(crate::config::DEFAULT_PARTITIONS));
        let eight = config("exclusive_by = { subject_token = 2 }\npartitions = 8", "");
        let d = differences(&a, &of(&eight, &eight.routes[0]));
        assert_eq!(d, ["partitions: recorded 16, this config 8"]);
    }

    #[test]
    fn an_exclusive_record_from_before_the_copier_differs_and_names_the_change() {
        let exclusive = config("exclusive_by = { subject_token = 2 }", "");
        let wanted = of(&exclusive, &exclusive.routes[0]);
        assert!(wanted.copier);
        let mut json = serde_json::to_value(&wanted).unwrap();
        json.as_object_mut().unwrap().remove("copier");
        json.as_object_mut().unwrap().remove("partition_window");
        let older: RouteContract = serde_json::from_value(json).unwrap();
        let window = crate::exclusive::PARTITION_WINDOW;
        assert_eq!(
            differences(&older, &wanted),
            [
                "copier: recorded null, this config true".to_string(),
                format!("partition_window: recorded null, this config {window}")
            ]
        );
        let record = ContractRecord {
            contract: older,
            recorded_by: "h1".into(),
            recorded_ms: 0,
            deployment: None,
            consumer: None,
            subjects: None,
        };
        let e = compare("r", &record, wanted).unwrap_err().to_string();
        assert!(e.contains("--change-route r"), "{e}");
        // A route that is not exclusive records neither: its older records still agree.
        let plain = config("", "");
        let text = serde_json::to_string(&of(&plain, &plain.routes[0])).unwrap();
        assert!(
            !text.contains("copier") && !text.contains("partition_window"),
            "{text}"
        );
    }

    #[test]
    fn a_fenced_route_names_its_stream_and_a_window_route_the_bucket() {
        let out =
            "[[output_streams]]\nname = \"OUT\"\nsubjects = [\"out.>\"]\neffects = \"fenced\"\n";
        let fenced = config("allowed_outputs = [\"out.r\"]\neffects = \"fenced\"", out);
        let window = config("allowed_outputs = [\"out.r\"]", out);
        let (f, w) = (
            of(&fenced, &fenced.routes[0]),
            of(&window, &window.routes[0]),
        );
        assert_eq!(f.claims, "stream OUT");
        assert_eq!(w.claims, "bucket dedup-claims");
        let record = ContractRecord {
            contract: f,
            recorded_by: "h1".into(),
            recorded_ms: 0,
            deployment: None,
            consumer: None,
            subjects: None,
        };
        let e = compare("r", &record, w).unwrap_err().to_string();
        assert!(
            e.contains("claims: recorded \"stream OUT\", this config \"bucket dedup-claims\""),
            "{e}"
        );
        assert!(
            e.contains("effects: recorded \"fenced\", this config \"window\""),
            "{e}"
        );
        assert!(e.contains("--change-route r"), "{e}");
    }
}
