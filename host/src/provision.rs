//! `dedup-host setup`: create or verify everything a config needs on the server (streams,
//! the claim bucket, the component store and status bucket, every route's consumer), with the
//! configured replicas, and say per item what was created, what matched and what differs.
//! Existing streams and buckets are never changed: a difference is reported for the operator.

use async_nats::jetstream::{self, Context};
use serde::Serialize;

use crate::config::Config;
use crate::setup::{self, StreamSpec};

/// What became of one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "differences")]
pub enum Found {
    /// It did not exist and was created.
    Created,
    /// It does not exist (a dry run changes nothing).
    WouldCreate,
    /// It exists as the config needs it.
    Matches,
    /// A consumer that existed with other settings and was updated (consumers are the host's
    /// own; every host start updates them the same way).
    Updated,
    /// It exists with other settings, which `setup` does not change.
    Differs(Vec<String>),
}

/// One stream, bucket or consumer.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// `stream`, `kv bucket`, `object store` or `consumer`.
    pub kind: &'static str,
    /// Its name on the server.
    pub name: String,
    /// The config field it comes from.
    pub field: String,
    /// What was found or done.
    pub found: Found,
}

/// Creates what is missing (unless `dry_run`) and compares what exists. Everything is checked
/// first: when anything differs or belongs to another deployment ([`crate::ownership`]),
/// nothing is created or updated and the check's items are returned (DESIGN.md rule 23).
pub async fn provision(js: &Context, config: &Config, dry_run: bool) -> anyhow::Result<Vec<Item>> {
    let mut checked = survey(js, config, true).await?;
    for conflict in crate::ownership::check(js, config).await? {
        let (kind, name, field) = match &conflict {
            crate::ownership::Conflict::Owned {
                kind, name, route, ..
            } => (*kind, name.clone(), route.clone()),
            crate::ownership::Conflict::Consumer { name, route, .. } => {
                ("contract", name.clone(), Some(route.clone()))
            }
            crate::ownership::Conflict::Rename { route, .. } => (
                "consumer",
                setup::route_consumer_name(config, route),
                Some(route.clone()),
            ),
        };
        let found = Found::Differs(vec![conflict.to_string()]);
        match checked
            .iter_mut()
            .find(|i| i.kind == kind && i.name == name)
        {
            Some(item) => item.found = found,
            None => checked.push(Item {
                kind,
                name,
                field: field.map(|r| format!("routes.{r}")).unwrap_or_default(),
                found,
            }),
        }
    }
    if dry_run || checked.iter().any(blocks) {
        return Ok(checked);
    }
    survey(js, config, false).await
}

/// Whether a checked item stops `setup` from changing anything: a difference it will not
/// change (a consumer whose settings differ is the host's own and updated, unless it belongs
/// to another deployment or would rename a route).
fn blocks(item: &Item) -> bool {
    match &item.found {
        Found::Differs(d) if item.kind == "consumer" => d.iter().any(|d| d != CONSUMER_UPDATE),
        Found::Differs(_) => true,
        _ => false,
    }
}

/// What a dry run says of a consumer whose settings differ (a real run updates it).
const CONSUMER_UPDATE: &str = "settings differ; a host start updates them";

/// Creates what is missing (unless `dry_run`) and compares what exists, item by item.
async fn survey(js: &Context, config: &Config, dry_run: bool) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for spec in setup::stream_specs(config) {
        let found = stream(js, config, &spec, dry_run).await?;
        items.push(Item {
            kind: "stream",
            name: spec.name,
            field: spec.field,
            found,
        });
    }
    items.push(Item {
        kind: "kv bucket",
        name: config.claims.bucket.clone(),
        field: "claims.bucket".into(),
        found: claim_bucket(js, config, dry_run).await?,
    });
    let c = &config.components;
    let store_exists = js.get_object_store(&c.bucket).await.is_ok();
    let status_exists = js.get_key_value(&c.status_bucket).await.is_ok();
    for (kind, name, field, exists) in [
        ("object store", &c.bucket, "components.bucket", store_exists),
        (
            "kv bucket",
            &c.status_bucket,
            "components.status_bucket",
            status_exists,
        ),
    ] {
        let backing = match kind {
            "object store" => format!("OBJ_{name}"),
            _ => format!("KV_{name}"),
        };
        let found = if exists {
            replicas_differ(js, &backing, c.replicas).await?
        } else if dry_run {
            Found::WouldCreate
        } else {
            if kind == "object store" {
                crate::components::store::open(js, config).await?;
            } else {
                crate::components::status::open(js, config).await?;
            }
            Found::Created
        };
        items.push(Item {
            kind,
            name: name.clone(),
            field: field.into(),
            found,
        });
    }
    items.extend(host_streams(js, config, dry_run).await?);
    items.extend(contracts(js, config, dry_run).await?);
    let source = js.get_stream(&config.source.stream).await.ok();
    for (name, filters, queue) in setup::consumer_specs(config) {
        let found = match &source {
            None => Found::WouldCreate,
            Some(source) => consumer(source, config, &name, filters, queue, dry_run).await?,
        };
        items.push(Item {
            kind: "consumer",
            name,
            field: "source.consumer".into(),
            found,
        });
    }
    Ok(items)
}

/// What hosts and the console would otherwise create on first use (the console's feed, the
/// activity log, shadow findings): created here, so that neither needs the right to create
/// streams (`dedup-host permissions`).
async fn host_streams(js: &Context, config: &Config, dry_run: bool) -> anyhow::Result<Vec<Item>> {
    let diffs = crate::candidate::record::bucket_name(&config.components.bucket);
    let wanted = [
        (
            "stream",
            crate::feed::stream_name(config),
            "components.status_bucket",
        ),
        (
            "stream",
            crate::activity::stream_name(config),
            "components.status_bucket",
        ),
        ("kv bucket", diffs.clone(), "components.bucket"),
    ];
    let mut items = Vec::new();
    for (i, (kind, name, field)) in wanted.into_iter().enumerate() {
        let backing = if kind == "kv bucket" {
            format!("KV_{name}")
        } else {
            name.clone()
        };
        let found = if js.get_stream(&backing).await.is_ok() {
            Found::Matches
        } else if dry_run {
            Found::WouldCreate
        } else {
            match i {
                0 => drop(crate::feed::open(js, config).await?),
                1 => drop(crate::activity::open(js, config).await?),
                _ => drop(crate::candidate::record::open(js, config).await?),
            }
            Found::Created
        };
        items.push(Item {
            kind,
            name,
            field: field.into(),
            found,
        });
    }
    Ok(items)
}

/// Each route's contract ([`crate::contract`]): recorded when missing, compared when present.
async fn contracts(js: &Context, config: &Config, dry_run: bool) -> anyhow::Result<Vec<Item>> {
    let bucket = crate::contract::bucket_name(config);
    let store = match js.get_key_value(&bucket).await {
        Ok(store) => Some(store),
        Err(_) if dry_run => None,
        Err(_) => Some(crate::contract::open(js, config).await?),
    };
    let mut items = Vec::new();
    for r in &config.routes {
        let recorded = match &store {
            Some(store) => crate::contract::lookup(store, &r.name).await?,
            None => crate::contract::Lookup::Never,
        };
        let found = match (recorded, &store) {
            (crate::contract::Lookup::Recorded(recorded, _), _) => {
                match crate::contract::compare(&r.name, &recorded, crate::contract::of(config, r)) {
                    Ok(_) => Found::Matches,
                    Err(e) => Found::Differs(vec![e.to_string()]),
                }
            }
            // Hosts keep serving under the contract they hold: a plain set-up recording this
            // config's over a deleted one would let a refused config take the route.
            (
                crate::contract::Lookup::Deleted(_) | crate::contract::Lookup::Unreadable(..),
                _,
            ) => Found::Differs(vec![format!(
                "route `{}`'s contract was deleted or cannot be read: hosts keep serving under the contract they hold; record one with `dedup-host setup --config <this config> --change-route {}` (it checks that no host still serves the route)",
                r.name, r.name
            )]),
            (crate::contract::Lookup::Never, Some(store)) if !dry_run => {
                crate::contract::agree(store, config, r, "setup").await?;
                Found::Created
            }
            (crate::contract::Lookup::Never, _) => Found::WouldCreate,
        };
        items.push(Item {
            kind: "contract",
            name: format!("{bucket}/{}", r.name),
            field: format!("routes.{}", r.name),
            found,
        });
    }
    Ok(items)
}

async fn stream(
    js: &Context,
    config: &Config,
    spec: &StreamSpec,
    dry_run: bool,
) -> anyhow::Result<Found> {
    let Ok(mut existing) = js.get_stream(&spec.name).await else {
        if dry_run {
            return Ok(Found::WouldCreate);
        }
        js.create_stream(spec.owned_config(config)).await?;
        return Ok(Found::Created);
    };
    let have = existing.info().await?.config.clone();
    let mut differences = Vec::new();
    let uncovered = spec.uncovered(&have.subjects);
    if !uncovered.is_empty() {
        differences.push(format!("captures {:?}, not {uncovered:?}", have.subjects));
    }
    compare(
        &mut differences,
        "replicas",
        have.num_replicas,
        spec.replicas,
    );
    compare(
        &mut differences,
        "duplicate window",
        have.duplicate_window,
        spec.duplicate_window,
    );
    compare(&mut differences, "storage", have.storage, spec.storage);
    differences.extend(spec.dedup_difference(&have));
    Ok(differ_or_match(differences))
}

async fn claim_bucket(js: &Context, config: &Config, dry_run: bool) -> anyhow::Result<Found> {
    let want = setup::claim_bucket_config(config);
    let Ok(mut stream) = js.get_stream(format!("KV_{}", want.bucket)).await else {
        if dry_run {
            return Ok(Found::WouldCreate);
        }
        js.create_key_value(want).await?;
        return Ok(Found::Created);
    };
    let have = stream.info().await?.config.clone();
    let mut differences = Vec::new();
    if !setup::claim_history_ok(have.max_messages_per_subject) {
        compare(
            &mut differences,
            "history",
            have.max_messages_per_subject,
            setup::CLAIM_HISTORY,
        );
    }
    compare(
        &mut differences,
        "replicas",
        have.num_replicas,
        want.num_replicas,
    );
    compare(&mut differences, "max age", have.max_age, want.max_age);
    Ok(differ_or_match(differences))
}

async fn replicas_differ(js: &Context, stream: &str, replicas: usize) -> anyhow::Result<Found> {
    let mut s = js.get_stream(stream).await?;
    let mut differences = Vec::new();
    compare(
        &mut differences,
        "replicas",
        s.info().await?.config.num_replicas,
        replicas,
    );
    Ok(differ_or_match(differences))
}

async fn consumer(
    source: &jetstream::stream::Stream,
    config: &Config,
    name: &str,
    filters: Vec<String>,
    queue: bool,
    dry_run: bool,
) -> anyhow::Result<Found> {
    let wanted = crate::source_consumer::Settings::wanted(config, filters.clone(), queue);
    let existing = source.consumer_info(name).await.ok();
    let same = existing.as_ref().is_some_and(|info| {
        crate::source_consumer::Settings::of(&info.config) == wanted
            // One without an owner is adopted (updated with this deployment as its owner).
            && crate::ownership::owner(&info.config.metadata).is_some()
    });
    if same {
        return Ok(Found::Matches);
    }
    if dry_run {
        return Ok(match existing {
            None => Found::WouldCreate,
            Some(_) => Found::Differs(vec![CONSUMER_UPDATE.into()]),
        });
    }
    setup::create_consumer(source, config, name, filters, queue).await?;
    Ok(match existing {
        None => Found::Created,
        Some(_) => Found::Updated,
    })
}

/// Notes `what` when the server's value is not the config's.
fn compare<T: PartialEq + std::fmt::Debug>(
    differences: &mut Vec<String>,
    what: &str,
    have: T,
    want: T,
) {
    if have != want {
        differences.push(format!("{what} {have:?}, the config says {want:?}"));
    }
}

fn differ_or_match(differences: Vec<String>) -> Found {
    if differences.is_empty() {
        Found::Matches
    } else {
        Found::Differs(differences)
    }
}
