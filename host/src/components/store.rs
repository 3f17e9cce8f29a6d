//! Components in a NATS Object Store bucket: object `<route>` is the route's current version.
//! `deploy` uploads, `undeploy` deletes, and every host's watcher follows the bucket.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::install;
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
    match fetch(&store, &route.name).await {
        Ok(bytes) => {
            let origin = format!("{bucket}/{}", route.name);
            install::offer(runtime, route, &origin, bytes).await;
        }
        Err(e) => tracing::warn!(route = %route.name, "cannot fetch its component: {e:#}"),
    }
}

/// Uploads `bytes` as route `route`'s component; every host serving the route picks it up.
/// Returns the version's digest.
pub async fn deploy(store: &ObjectStore, route: &str, bytes: &[u8]) -> anyhow::Result<String> {
    let digest = crate::runtime::digest(bytes);
    let meta = ObjectMetadata {
        name: route.to_string(),
        description: Some(format!("component of route `{route}`")),
        metadata: [(DIGEST_METADATA.to_string(), digest.clone())].into(),
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

/// The digest of route `route`'s deployed component, if one is deployed.
pub async fn deployed(store: &ObjectStore, route: &str) -> Option<String> {
    let info = store.info(route).await.ok()?;
    (!info.deleted).then(|| {
        info.metadata
            .get(DIGEST_METADATA)
            .cloned()
            .unwrap_or_default()
    })
}

/// Follows the bucket (current objects first, then changes) and offers each new version to
/// its route, until `stopped`. Objects no route of this host serves from the store are ignored.
pub async fn watch(
    store: ObjectStore,
    runtime: Runtime,
    routes: Arc<Routes>,
    mut stopped: watch::Receiver<bool>,
) {
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
        loop {
            let change = tokio::select! {
                c = changes.next() => c,
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
            match fetch(&store, &info.name).await {
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

async fn fetch(store: &ObjectStore, name: &str) -> anyhow::Result<Vec<u8>> {
    let mut object = store.get(name).await?;
    let mut bytes = Vec::new();
    object.read_to_end(&mut bytes).await?;
    Ok(bytes)
}
