//! A KV bucket's keys, listed from one answer of its stream's leader.
//!
//! `Store::keys()` reads the bucket through an ordered consumer that ends at the first entry
//! it is told has nothing pending after it. While keys are being rewritten (every host
//! rewrites its status on each change; a history of one drops the old revision), that
//! listing misses keys: measured against nats-server 2.15, 235 of 600 listings of two keys
//! rewritten in a loop returned one. `deploy --wait` then took a host for gone and answered
//! "all 1 live host(s)" with two running. STREAM.INFO with a subjects filter answers from one
//! snapshot of the stream's state, so every key that holds a message is in it.

use anyhow::Context as _;
use async_nats::jetstream::kv::Store;
use futures::StreamExt;

/// The keys of `store` that begin with `under` (`""`: every key), each holding a message: a
/// deleted or purged key's marker too, which `Store::get` then reads as absent.
pub async fn list(store: &Store, under: &str) -> anyhow::Result<Vec<String>> {
    let filter = format!("{}{under}>", store.prefix);
    let mut info = (store.stream)
        .info_with_subjects(&filter)
        .await
        .with_context(|| format!("cannot list the keys of KV bucket `{}`", store.name))?;
    let mut keys = Vec::new();
    while let Some(entry) = info.next().await {
        let (subject, _) =
            entry.with_context(|| format!("cannot list the keys of KV bucket `{}`", store.name))?;
        if let Some(key) = subject.strip_prefix(store.prefix.as_str()) {
            keys.push(key.to_string());
        }
    }
    keys.sort();
    Ok(keys)
}
