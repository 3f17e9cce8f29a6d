//! The candidate object: `<route>.candidate` in the components bucket, its [`Spec`] as JSON in
//! the object's metadata. A rollback rewrites the object with the spec's state changed, so
//! every host's watch of the bucket sees it.

use anyhow::Context as _;
use async_nats::jetstream::object_store::{ObjectInfo, ObjectMetadata, ObjectStore};

use super::spec::{Spec, State};

/// The object name suffix of a route's candidate.
pub const SUFFIX: &str = ".candidate";

/// The object metadata key holding the candidate's [`Spec`] as JSON.
pub const SPEC_METADATA: &str = "dedup-candidate";

/// The object name of `route`'s candidate.
pub fn object_name(route: &str) -> String {
    format!("{route}{SUFFIX}")
}

/// The route whose candidate object is `name`, if it is one.
pub fn route_of(name: &str) -> Option<&str> {
    name.strip_suffix(SUFFIX).filter(|r| !r.is_empty())
}

/// The spec stored with a candidate object.
pub fn spec_of(info: &ObjectInfo) -> anyhow::Result<Spec> {
    let json = info
        .metadata
        .get(SPEC_METADATA)
        .with_context(|| format!("object `{}` has no `{SPEC_METADATA}` metadata: deploy the candidate again with `dedup-host deploy --shadow` or `--canary`", info.name))?;
    serde_json::from_str(json).with_context(|| {
        format!(
            "object `{}` holds an unreadable candidate spec: deploy it again",
            info.name
        )
    })
}

/// Stores `bytes` as `route`'s candidate with `spec`.
pub async fn put(
    store: &ObjectStore,
    route: &str,
    bytes: &[u8],
    spec: &Spec,
) -> anyhow::Result<()> {
    let name = object_name(route);
    let meta = ObjectMetadata {
        name: name.clone(),
        description: Some(format!("candidate of route `{route}`")),
        metadata: [(SPEC_METADATA.to_string(), serde_json::to_string(spec)?)].into(),
        ..Default::default()
    };
    store
        .put(meta, &mut &bytes[..])
        .await
        .with_context(|| format!("cannot upload the candidate of route `{route}`"))?;
    Ok(())
}

/// `route`'s candidate spec, if one is stored.
pub async fn current(store: &ObjectStore, route: &str) -> anyhow::Result<Option<Spec>> {
    match store.info(&object_name(route)).await {
        Ok(info) if !info.deleted => spec_of(&info).map(Some),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == async_nats::jetstream::object_store::InfoErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read the candidate of route `{route}`")),
    }
}

/// `route`'s candidate bytes.
pub async fn fetch(store: &ObjectStore, route: &str) -> anyhow::Result<Vec<u8>> {
    crate::objects::read(store, &object_name(route)).await
}

/// Deletes `route`'s candidate (abort, or after a promotion).
pub async fn delete(store: &ObjectStore, route: &str) -> anyhow::Result<()> {
    store
        .delete(object_name(route))
        .await
        .with_context(|| format!("cannot delete the candidate of route `{route}`"))
}

/// Marks `route`'s candidate `digest` rolled back (a newer candidate is left alone).
pub async fn roll_back(
    store: &ObjectStore,
    route: &str,
    digest: &str,
    reason: &str,
    by: &str,
) -> anyhow::Result<bool> {
    let Some(mut spec) = current(store, route).await? else {
        return Ok(false);
    };
    if spec.digest != digest || !spec.running() {
        return Ok(false);
    }
    let bytes = fetch(store, route).await?;
    spec.state = State::RolledBack {
        reason: reason.to_string(),
        by: by.to_string(),
        at_ms: crate::claim::record::now_ms(),
    };
    put(store, route, &bytes, &spec).await?;
    Ok(true)
}
