//! Components in a NATS Object Store bucket: object `<route>` is the route's current version.
//! `deploy` uploads, `undeploy` deletes, and every host's watcher follows the bucket.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::object_store::{self, ObjectInfo, ObjectMetadata, ObjectStore};
use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::install;
use crate::candidate::{self, Action};
use crate::config::Config;
use crate::routes::{Route, Routes};
use crate::runtime::Runtime;

/// The object metadata key holding the component's `sha256:` digest.
pub const DIGEST_METADATA: &str = "dedup-digest";

/// How long to wait before watching again after the watch failed.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Opens the `components.bucket` object store, creating it when missing.
pub async fn open(
    js: &async_nats::jetstream::Context,
    config: &Config,
) -> anyhow::Result<ObjectStore> {
    let bucket = &config.components.bucket;
    if let Ok(store) = js.get_object_store(bucket).await {
        return Ok(store);
    }
    js.create_object_store(object_store::Config {
        bucket: bucket.clone(),
        description: Some("dedup-host components, one object per route".into()),
        num_replicas: config.components.replicas,
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create object store `{bucket}` (`components.bucket`)"))
}

/// Offers `route` the version the store holds now, or records that it holds none (a route
/// added by a reload; later versions arrive through [`watch`]).
pub async fn offer_current(
    js: &async_nats::jetstream::Context,
    bucket: &str,
    runtime: &Runtime,
    route: &Route,
) {
    let Ok(store) = js.get_object_store(bucket).await else {
        route.decide();
        return;
    };
    if deployed(&store, &route.name).await.is_none() {
        route.decide();
        return;
    }
    match crate::objects::read(&store, &route.name).await {
        Ok(bytes) => {
            let origin = format!("{bucket}/{}", route.name);
            install::offer(runtime, route, &origin, bytes).await;
        }
        Err(e) => tracing::warn!(route = %route.name, "cannot fetch its component: {e:#}"),
    }
}

/// The object metadata key holding the durable consumer of the route that deployed the
/// component (`<source.consumer>-<route>`): the object is keyed by route name, which two
/// deployments on one stream may share.
pub const CONSUMER_METADATA: &str = "dedup-consumer";

/// The object metadata key holding the deployment that deployed the component.
pub const DEPLOYMENT_METADATA: &str = "dedup-deployment";

/// Who deployed a route's component, as its object records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deployer {
    /// The route's durable consumer; `None` for an object deployed before it was recorded.
    pub consumer: Option<String>,
    /// The deployment's name; `None` for an object deployed before it was recorded.
    pub deployment: Option<String>,
}

impl Deployer {
    /// Route `route` of `config`.
    pub fn of(config: &Config, route: &str) -> Self {
        Deployer {
            consumer: Some(crate::consumers::route_consumer_name(config, route)),
            deployment: Some(config.deployment_name()),
        }
    }
}

/// Uploads `bytes` as route `route`'s component; every host serving the route picks it up.
/// Returns the version's digest.
pub async fn deploy(store: &ObjectStore, route: &str, bytes: &[u8]) -> anyhow::Result<String> {
    deploy_by(store, route, bytes, &Deployer::default()).await
}

/// [`deploy`], recording who deployed it (checked by the next deploy, [`deployer`]).
pub async fn deploy_by(
    store: &ObjectStore,
    route: &str,
    bytes: &[u8],
    by: &Deployer,
) -> anyhow::Result<String> {
    let digest = crate::runtime::digest(bytes);
    let mut metadata: std::collections::HashMap<String, String> =
        [(DIGEST_METADATA.to_string(), digest.clone())].into();
    if let Some(consumer) = &by.consumer {
        metadata.insert(CONSUMER_METADATA.to_string(), consumer.clone());
    }
    if let Some(deployment) = &by.deployment {
        metadata.insert(DEPLOYMENT_METADATA.to_string(), deployment.clone());
    }
    let meta = ObjectMetadata {
        name: route.to_string(),
        description: Some(format!("component of route `{route}`")),
        metadata,
        ..Default::default()
    };
    store
        .put(meta, &mut &bytes[..])
        .await
        .with_context(|| format!("cannot upload the component of route `{route}`"))?;
    Ok(digest)
}

/// Deletes route `route`'s component: hosts stop consuming its subjects; its messages wait.
pub async fn undeploy(store: &ObjectStore, route: &str) -> anyhow::Result<()> {
    store
        .delete(route)
        .await
        .with_context(|| format!("cannot delete the component of route `{route}`"))
}

/// Who deployed route `route`'s current component, if one is deployed.
pub async fn deployer(store: &ObjectStore, route: &str) -> Option<Deployer> {
    let info = store.info(route).await.ok()?;
    if info.deleted {
        return None;
    }
    Some(Deployer {
        consumer: info.metadata.get(CONSUMER_METADATA).cloned(),
        deployment: info.metadata.get(DEPLOYMENT_METADATA).cloned(),
    })
}

/// The digest of route `route`'s deployed component, if one is deployed.
pub async fn deployed(store: &ObjectStore, route: &str) -> Option<String> {
    live_version(store, route).await.map(|(digest, _)| digest)
}

/// The digest of route `route`'s deployed component and when it was uploaded (Unix
/// milliseconds, when the server says), if one is deployed.
pub async fn live_version(store: &ObjectStore, route: &str) -> Option<(String, Option<u64>)> {
    let info = store.info(route).await.ok()?;
    if info.deleted {
        return None;
    }
    let digest = info
        .metadata
        .get(DIGEST_METADATA)
        .cloned()
        .unwrap_or_default();
    let since = info
        .modified
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as u64);
    Some((digest, since))
}

/// Follows the bucket (current objects first, then changes) and offers each new version to
/// its route, until `stopped`. Objects no route of this host serves from the store are ignored.
///
/// Objects `<route>.candidate` are candidates ([`crate::candidate`]): offered to their route
/// as such, and what a host decides about one (roll back, promote) is done on the object here
/// and recorded in the deployment's activity stream ([`crate::activity`]).
pub async fn watch(
    store: ObjectStore,
    runtime: Runtime,
    routes: Arc<Routes>,
    (instance_id, js, config): (
        String,
        async_nats::jetstream::Context,
        crate::config::Config,
    ),
    mut stopped: watch::Receiver<bool>,
) {
    let (actions, decided) = mpsc::unbounded_channel();
    tokio::spawn(execute(store.clone(), (instance_id, js, config), decided));
    // A route with nothing deployed is deliberately not served: that is settled, not loading.
    for route in routes.iter().filter(|r| r.component_file.is_none()) {
        if deployed(&store, &route.name).await.is_none() {
            route.decide();
        }
    }
    loop {
        let mut changes = match store.watch_with_history().await {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!("cannot watch the component store, retrying: {e}");
                tokio::select! { _ = tokio::time::sleep(WATCH_RETRY) => continue, _ = stopped.changed() => return }
            }
        };
        let mut generation = routes.subscribe();
        loop {
            let change = tokio::select! {
                c = changes.next() => c,
                _ = generation.changed() => {
                    offer_stored_candidates(&store, &runtime, &routes, &actions).await;
                    continue;
                }
                _ = stopped.changed() => return,
            };
            let info = match change {
                Some(Ok(info)) => info,
                Some(Err(e)) => {
                    tracing::warn!("component store watch error: {e}");
                    continue;
                }
                None => break,
            };
            if let Some(name) = candidate::store::route_of(&info.name) {
                if let Some(route) = routes.get(name).filter(|r| r.component_file.is_none()) {
                    offer_candidate(&store, &runtime, &route, &info, &actions).await;
                }
                continue;
            }
            let Some(route) = routes
                .iter()
                .find(|r| r.name == info.name && r.component_file.is_none())
            else {
                continue;
            };
            let origin = format!("{}/{}", info.bucket, info.name);
            if info.deleted {
                install::remove(&route, &origin);
                continue;
            }
            match crate::objects::read(&store, &info.name).await {
                Ok(bytes) => {
                    install::offer(&runtime, &route, &origin, bytes).await;
                }
                Err(e) => {
                    tracing::warn!(route = %route.name, "cannot fetch component `{origin}`: {e:#}")
                }
            }
        }
    }
}

/// Offers every store-served route without a candidate the one stored for it, if any (routes
/// added by a reload; the watch only reports objects as they change).
async fn offer_stored_candidates(
    store: &ObjectStore,
    runtime: &Runtime,
    routes: &Routes,
    actions: &mpsc::UnboundedSender<Action>,
) {
    let waiting = routes
        .iter()
        .filter(|r| r.component_file.is_none() && r.candidate().is_none());
    for route in waiting {
        let name = candidate::store::object_name(&route.name);
        if let Ok(info) = store.info(&name).await {
            if !info.deleted {
                offer_candidate(store, runtime, &route, &info, actions).await;
            }
        }
    }
}

/// Offers a changed candidate object to its route (a deleted one drops the candidate).
async fn offer_candidate(
    store: &ObjectStore,
    runtime: &Runtime,
    route: &Route,
    info: &ObjectInfo,
    actions: &mpsc::UnboundedSender<Action>,
) {
    let origin = format!("{}/{}", info.bucket, info.name);
    if info.deleted {
        return install::offer_candidate(runtime, route, &origin, None, actions).await;
    }
    let spec = match candidate::store::spec_of(info) {
        Ok(spec) => spec,
        Err(e) => {
            return tracing::error!(route = %route.name, "ignoring candidate `{origin}`: {e:#}")
        }
    };
    let bytes = match spec.running() {
        true => match crate::objects::read(store, &info.name).await {
            Ok(bytes) => bytes,
            Err(e) => {
                return tracing::warn!(route = %route.name, "cannot fetch candidate `{origin}`: {e:#}")
            }
        },
        false => Vec::new(),
    };
    install::offer_candidate(runtime, route, &origin, Some((bytes, spec)), actions).await
}

/// Carries out what this host decided about candidates, on the objects every host watches.
async fn execute(
    store: ObjectStore,
    (by, js, config): (
        String,
        async_nats::jetstream::Context,
        crate::config::Config,
    ),
    mut decided: mpsc::UnboundedReceiver<Action>,
) {
    while let Some(action) = decided.recv().await {
        let done = match &action {
            Action::RollBack {
                route,
                digest,
                reason,
            } => candidate::store::roll_back(&store, route, digest, reason, &by)
                .await
                .map(|_| ()),
            Action::Promote { route, digest } => {
                promote(&store, route, Some(digest)).await.map(|_| ())
            }
        };
        let (verb, route, digest, why) = match &action {
            Action::RollBack {
                route,
                digest,
                reason,
            } => ("rollback", route, digest, reason.as_str()),
            Action::Promote { route, digest } => ("promote", route, digest, "auto-promoted"),
        };
        let mut entry =
            crate::activity::Entry::now(&format!("host {by}"), verb, route, digest.clone());
        entry.count = 1;
        match done {
            Ok(()) => {
                tracing::warn!(?action, "candidate decision stored for every host");
                entry.result = why.to_string();
                crate::activity::record(&js, &config, &entry).await;
            }
            Err(e) => tracing::error!(?action, "cannot store a candidate decision: {e:#}"),
        }
    }
}

/// Makes `route`'s candidate (`digest`, when given: only that one) its live version on every
/// host, then removes the candidate. Returns the promoted digest.
pub async fn promote(
    store: &ObjectStore,
    route: &str,
    digest: Option<&str>,
) -> anyhow::Result<String> {
    let Some(spec) = candidate::store::current(store, route).await? else {
        anyhow::bail!("route `{route}` has no candidate: deploy one with `dedup-host deploy --route {route} --shadow FILE` (or `--canary P% FILE`) first");
    };
    if digest.is_some_and(|d| d != spec.digest) {
        anyhow::bail!(
            "route `{route}`'s candidate changed to {} meanwhile; not promoted",
            spec.digest
        );
    }
    if !spec.running() {
        anyhow::bail!("route `{route}`'s candidate {} was rolled back; deploy a fixed candidate, or `dedup-host abort --route {route}` to drop it", spec.digest);
    }
    // Two hosts may decide to promote at once: the second finds it done and writes nothing
    // (a second upload would purge the chunks the watchers are reading).
    if deployed(store, route).await.as_deref() == Some(spec.digest.as_str()) {
        candidate::store::delete(store, route).await.ok();
        return Ok(spec.digest);
    }
    let bytes = candidate::store::fetch(store, route).await?;
    let live = deploy(store, route, &bytes).await?;
    candidate::store::delete(store, route).await?;
    Ok(live)
}
