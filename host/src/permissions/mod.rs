//! The least-privilege NATS permissions of each role of a deployment (`dedup-host permissions`):
//! the subjects a host, an operator running the CLI, and the console publish and subscribe to,
//! derived from the config's streams, consumers, buckets and subjects. Everything is scoped
//! to this deployment's names, so one NATS account can hold several deployments, and another
//! service's streams stay out of reach.
//!
//! - [`grants`]: the JetStream API subjects of each kind of access to one stream.
//! - [`render`]: the nats-server configuration block and the JSON form.

pub mod grants;
pub mod render;

use std::collections::BTreeSet;

use serde::Serialize;

use crate::config::{Config, EffectsMode};
use grants::Access;

/// Who connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A `dedup-host run` process: consumes, claims, publishes outputs and dead letters,
    /// reports its status; creates nothing (set-up is the operator's).
    Host,
    /// A person or CI job running the CLI: `setup`, `deploy`, `reload`, `inspect`, `audit`,
    /// `dead-letters`, change runs.
    Operator,
    /// `dedup-host console`: reads everything of the deployment and runs the operations its
    /// pages offer (dead-letter replays and purges, promote/abort/rollback).
    Console,
}

impl Role {
    /// The role's name as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Host => "host",
            Role::Operator => "operator",
            Role::Console => "console",
        }
    }
}

/// One role's allow lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Permissions {
    /// The role.
    pub role: Role,
    /// The deployment they were derived for.
    pub deployment: String,
    /// Subjects the role may publish to (requests to the JetStream API included).
    pub publish: Vec<String>,
    /// Subjects the role may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether the role may answer requests it received (on their reply subjects only):
    /// hosts answer `dedup-host reload` and serving probes without any right on `_INBOX.>`.
    pub allow_responses: bool,
}

/// The streams of a deployment (KV buckets and object stores by their streams' names).
struct Streams {
    source: String,
    dead: String,
    outputs: Vec<String>,
    /// The exclusive routes' queue, when a route is exclusive.
    queue: Option<String>,
    claims: String,
    contracts: String,
    status: String,
    diffs: String,
    components: String,
    feed: String,
    activity: String,
}

impl Streams {
    fn of(config: &Config) -> Self {
        let exclusive = config.routes.iter().any(|r| r.exclusive_by.is_some());
        Self {
            source: config.source.stream.clone(),
            dead: config.dead_letter.stream.clone(),
            outputs: config
                .output_streams
                .iter()
                .map(|o| o.name.clone())
                .collect(),
            queue: exclusive.then(|| crate::exclusive::stream_name(config)),
            claims: format!("KV_{}", config.claims.bucket),
            contracts: format!("KV_{}", crate::contract::bucket_name(config)),
            status: format!("KV_{}", config.components.status_bucket),
            diffs: format!(
                "KV_{}",
                crate::candidate::record::bucket_name(&config.components.bucket)
            ),
            components: format!("OBJ_{}", config.components.bucket),
            feed: crate::feed::stream_name(config),
            activity: crate::activity::stream_name(config),
        }
    }

    /// Every stream, for roles that read them all.
    fn all(&self) -> Vec<&str> {
        let mut all = vec![self.source.as_str(), &self.dead];
        all.extend(self.outputs.iter().map(String::as_str));
        all.extend(self.queue.as_deref());
        all.extend([
            self.claims.as_str(),
            &self.contracts,
            &self.status,
            &self.diffs,
            &self.components,
            &self.feed,
            &self.activity,
        ]);
        all
    }
}

/// Allow lists under construction (sorted, without repeats).
#[derive(Default)]
struct Lists {
    publish: BTreeSet<String>,
    subscribe: BTreeSet<String>,
}

impl Lists {
    fn stream(&mut self, stream: &str, access: &Access) {
        self.publish.extend(grants::publish(stream, access));
        self.subscribe.extend(grants::subscribe(stream, access));
    }

    fn publish<S: Into<String>>(&mut self, subjects: impl IntoIterator<Item = S>) {
        self.publish.extend(subjects.into_iter().map(Into::into));
    }
}

impl Permissions {
    /// The least-privilege set of `role` for the deployment `config` describes.
    pub fn for_role(config: &Config, role: Role) -> Self {
        let streams = Streams::of(config);
        let mut lists = Lists::default();
        // Account-wide reads every command makes: the server's JetStream limits, and the
        // stream list (which streams capture an output subject, their duplicate windows).
        lists.publish([
            "$JS.API.INFO",
            "$JS.API.STREAM.LIST",
            "$JS.API.STREAM.NAMES",
        ]);
        lists.subscribe.insert(format!("{}.>", config.nats.inbox()));
        match role {
            Role::Host => host(config, &streams, &mut lists),
            Role::Operator => operator(config, &streams, &mut lists),
            Role::Console => console(config, &streams, &mut lists),
        }
        Self {
            role,
            deployment: config.deployment_name(),
            publish: lists.publish.into_iter().collect(),
            subscribe: lists.subscribe.into_iter().collect(),
            allow_responses: role != Role::Operator,
        }
    }

    /// This set without `subject` (tests and drills: what a host says when one is missing).
    pub fn without(mut self, subject: &str) -> Self {
        self.publish.retain(|s| s != subject);
        self.subscribe.retain(|s| s != subject);
        self
    }
}

/// The data subjects a host publishes to: outputs, fenced claims, dead letters, the
/// exclusive queue.
fn host_data(config: &Config) -> Vec<String> {
    let mut out: Vec<String> = config
        .routes
        .iter()
        .flat_map(|r| r.allowed_outputs.iter().cloned())
        .collect();
    for o in &config.output_streams {
        if o.effects == EffectsMode::Fenced {
            out.push(crate::fenced::claim_subjects(&o.name));
        }
    }
    out.push(config.dead_letter.subject.clone());
    if config.routes.iter().any(|r| r.exclusive_by.is_some()) {
        out.push(crate::exclusive::stream_subjects(config));
    }
    out
}

fn host(config: &Config, s: &Streams, lists: &mut Lists) {
    // The route consumers, and the catch-all consumer only where `setup` makes one (source
    // subjects that no route covers: `crate::consumers::consumer_specs`).
    let durables = crate::consumers::consumer_specs(config)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    lists.stream(&s.source, &Access::Consume(durables));
    // The watch for messages out of deliveries follows the exclusive queue's advisories
    // whether or not a route is exclusive yet (a reload may add one).
    let queue = crate::exclusive::stream_name(config);
    lists
        .subscribe
        .extend(grants::subscribe(&queue, &Access::Consume(Vec::new())));
    if let Some(queue) = &s.queue {
        let partitions = config
            .routes
            .iter()
            .filter(|r| r.exclusive_by.is_some())
            .flat_map(|r| {
                (0..r.partitions())
                    .map(|p| crate::exclusive::partition_consumer_name(config, &r.name, p))
            })
            .collect();
        lists.stream(queue, &Access::Consume(partitions));
        // A queued copy that is settled elsewhere is deleted: the queue keeps only work.
        lists.publish([format!("$JS.API.STREAM.MSG.DELETE.{queue}")]);
    }
    for stream in [&s.dead, &s.status, &s.diffs]
        .into_iter()
        .chain(&s.outputs)
        .chain([&s.feed])
    {
        lists.stream(stream, &Access::Read);
    }
    // Ephemeral consumers only where a host needs them: the markers of stranded messages
    // among the claims, the component store's watch and object reads.
    for stream in [&s.claims, &s.components] {
        lists.stream(stream, &Access::Watch);
    }
    // The contracts bucket is one per source stream, shared by the deployments on it: a host
    // reads and follows its own routes' records only.
    lists.stream(&s.contracts, &Access::Keys(contract_keys(config)));
    lists.publish(host_data(config));
    // A replay resets claims in the bucket and clears the key's PENDING call records by a
    // deletion marker on their own subjects (`KeyCalls::discard`): no purge of the bucket.
    lists.publish([
        format!("$KV.{}.>", config.claims.bucket),
        format!("$KV.{}.>", config.components.status_bucket),
        format!(
            "$KV.{}.>",
            crate::candidate::record::bucket_name(&config.components.bucket)
        ),
        format!(
            "{}{}.*",
            crate::subject::FEED_PREFIX,
            config.components.status_bucket
        ),
    ]);
    lists.subscribe.extend([
        config.reload_subject(),
        crate::presence::serving_subject(config, "*"),
    ]);
}

fn operator(config: &Config, s: &Streams, lists: &mut Lists) {
    for stream in s.all() {
        lists.stream(stream, &Access::Admin);
    }
    lists.publish(host_data(config));
    lists.publish(config.source_subjects());
    lists.publish(buckets(config));
    lists.publish([
        format!("$O.{}.>", config.components.bucket),
        config.reload_subject(),
        crate::presence::serving_subject(config, "*"),
        crate::presence::previous_serving_subject(config, "*"),
        activity_subject(config),
    ]);
}

fn console(config: &Config, s: &Streams, lists: &mut Lists) {
    // The console's time windows pull from ordered consumers the server names.
    for stream in s.all() {
        lists.stream(stream, &Access::Scan);
    }
    // The writes its pages make and no other (the operator role holds the rest): dead-letter
    // replays republish to the source subjects and reset claims (and their call journals) in
    // the claim bucket; purges delete letters; promote and abort rewrite the component
    // store; each is logged as activity. No page writes a contract, a host status or a
    // finding, or sends a reload.
    lists.publish(config.source_subjects());
    // A replay resets claims in the bucket and clears the key's PENDING call records by a
    // deletion marker on their own subjects (`KeyCalls::discard`): no purge of the bucket.
    lists.publish([
        format!("$KV.{}.>", config.claims.bucket),
        format!("$JS.API.STREAM.MSG.DELETE.{}", s.dead),
        format!("$O.{}.>", config.components.bucket),
        activity_subject(config),
        // Promote and abort replace or delete a component object: the object store purges
        // the old chunks.
        format!("$JS.API.STREAM.PURGE.{}", s.components),
    ]);
    // A fenced route's claims (and call records) live in its fenced output stream: a replay
    // resets the claim there and clears the key's PENDING call records by a marker on their
    // own subjects (`KeyCalls::discard`). No purge: a purge grant cannot be limited to one
    // subject, and would let the console purge the route's outputs.
    for o in &config.output_streams {
        if o.effects == EffectsMode::Fenced {
            lists.publish([crate::fenced::claim_subjects(&o.name)]);
        }
    }
}

/// The subjects of this deployment's routes' records in the contracts bucket.
fn contract_keys(config: &Config) -> Vec<String> {
    let bucket = crate::contract::bucket_name(config);
    config
        .routes
        .iter()
        .map(|r| format!("$KV.{bucket}.{}", r.name))
        .collect()
}

/// Every KV bucket's write subjects.
fn buckets(config: &Config) -> Vec<String> {
    [
        config.claims.bucket.clone(),
        crate::contract::bucket_name(config),
        config.components.status_bucket.clone(),
        crate::candidate::record::bucket_name(&config.components.bucket),
    ]
    .iter()
    .map(|b| format!("$KV.{b}.>"))
    .collect()
}

fn activity_subject(config: &Config) -> String {
    format!(
        "{}{}",
        crate::subject::ACTIVITY_PREFIX,
        config.components.status_bucket
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!(
            r#"
[source]
stream = "EVENTS"
subjects = ["in.>"]
consumer = "hosts"
[claims]
bucket = "claims"
[[output_streams]]
name = "OUT"
subjects = ["out.>"]
duplicate_window = "1h"
[[routes]]
name = "a"
subject = "in.a"
allowed_outputs = ["out.a.>"]
{extra}
"#
        );
        Config::parse(&text, std::path::Path::new("t.toml"), ".".into()).expect("valid")
    }

    #[test]
    fn a_host_creates_nothing_and_reaches_only_its_own_names() {
        let p = Permissions::for_role(&config(""), Role::Host);
        assert!(p.publish.contains(&"out.a.>".to_string()));
        assert!(p
            .publish
            .contains(&"$JS.API.CONSUMER.CREATE.EVENTS.hosts-a".to_string()));
        assert!(p.publish.contains(&"$KV.claims.>".to_string()));
        assert!(!p
            .publish
            .iter()
            .any(|s| s.contains(".CREATE.") && s.contains("STREAM")));
        assert!(!p
            .publish
            .iter()
            .any(|s| s == ">" || s.starts_with("_INBOX")));
        assert!(p.subscribe.contains(&"_INBOX.>".to_string()));
        assert!(p.allow_responses);
        // Of the contracts bucket the stream's deployments share, its own route's key only.
        let c = "dedup-contracts-EVENTS";
        assert!(p
            .publish
            .contains(&format!("$JS.API.DIRECT.GET.KV_{c}.$KV.{c}.a")));
        assert!(!p
            .publish
            .iter()
            .any(|s| s == &format!("$JS.API.DIRECT.GET.KV_{c}.>")
                || s == &format!("$JS.API.CONSUMER.CREATE.KV_{c}")));
    }

    #[test]
    fn the_operator_sets_up_and_the_console_does_not() {
        let c = config("");
        let op = Permissions::for_role(&c, Role::Operator);
        assert!(op
            .publish
            .contains(&"$JS.API.STREAM.CREATE.KV_claims".to_string()));
        let console = Permissions::for_role(&c, Role::Console);
        assert!(!console.publish.iter().any(|s| s.contains("STREAM.CREATE")));
        // It writes what its pages change (claims reset by a replay), not contracts.
        assert!(console.publish.contains(&"$KV.claims.>".to_string()));
        assert!(!console
            .publish
            .iter()
            .any(|s| s.starts_with("$KV.dedup-contracts") || s.contains("reload")));
        // Promote and abort purge the old chunks of a component object.
        let subject = format!("$JS.API.STREAM.PURGE.OBJ_{}", c.components.bucket);
        assert!(console.publish.contains(&subject), "{subject}");
        // A replay clears a key's PENDING call records by markers on their subjects: no
        // purge of the claim bucket, nor of an output stream.
        assert!(!console
            .publish
            .iter()
            .any(|s| s.ends_with("PURGE.KV_claims")));
        assert!(!console.publish.iter().any(|s| s.ends_with("PURGE.OUT")));
    }

    #[test]
    fn the_console_resets_fenced_claims_and_their_calls() {
        let c = config(
            r#"
[[routes]]
name = "f"
subject = "in.f"
allowed_outputs = ["fout.f"]
effects = "fenced"
[[output_streams]]
name = "FOUT"
subjects = ["fout.>"]
duplicate_window = "1h"
effects = "fenced"
"#,
        );
        let console = Permissions::for_role(&c, Role::Console);
        let claims = crate::fenced::claim_subjects("FOUT");
        assert!(console.publish.contains(&claims), "{claims}");
        // Its PENDING calls are cleared by markers on the claim subjects: the fenced stream,
        // outputs included, is never purged.
        assert!(!console.publish.iter().any(|s| s.contains("PURGE.FOUT")));
    }

    #[test]
    fn the_catch_all_consumer_is_granted_only_where_setup_makes_it() {
        let grants = |p: &Permissions| {
            p.publish
                .iter()
                .any(|s| s.ends_with(".EVENTS.hosts") || s.contains(".EVENTS.hosts."))
        };
        // `in.>` is wider than the route's `in.a`: setup makes `hosts` for the rest.
        let wide = config("");
        assert!(grants(&Permissions::for_role(&wide, Role::Host)));
        let text = r#"
[source]
stream = "EVENTS"
subjects = ["in.a"]
consumer = "hosts"
[claims]
bucket = "claims"
[[output_streams]]
name = "OUT"
subjects = ["out.>"]
duplicate_window = "1h"
[[routes]]
name = "a"
subject = "in.a"
allowed_outputs = ["out.a.>"]
"#;
        let covered =
            Config::parse(text, std::path::Path::new("t.toml"), ".".into()).expect("valid");
        let p = Permissions::for_role(&covered, Role::Host);
        assert!(!grants(&p), "{:?}", p.publish);
        assert!(p.publish.iter().any(|s| s.ends_with(".EVENTS.hosts-a")));
    }

    #[test]
    fn exclusive_routes_add_their_queue_and_partition_consumers() {
        let c = config("exclusive_by = { subject_token = 1 }\npartitions = 2");
        let p = Permissions::for_role(&c, Role::Host);
        assert!(p
            .publish
            .contains(&"$JS.API.CONSUMER.CREATE.EVENTS_EXCLUSIVE.hosts-a-p1".to_string()));
        assert!(p.publish.contains(&"dedup.exclusive.EVENTS.>".to_string()));
    }
}
