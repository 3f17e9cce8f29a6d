//! Reading a whole object from a JetStream object store, without hanging on one whose chunks
//! went away while it was read.
//!
//! A reader follows the chunks of the version it looked up. When another writer replaces the
//! object meanwhile (two hosts promoting the same candidate at once), the store purges those
//! chunks and the reader would wait for them forever; a watcher stuck there never served the
//! next version. A read that gets nothing for [`STALL`] fails instead, and the caller moves on
//! to the newer version, which its watch reports next.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::object_store::ObjectStore;
use tokio::io::AsyncReadExt;

/// How long a read may wait for the next chunk.
pub const STALL: Duration = Duration::from_secs(5);

/// The bytes of object `name` in `store`.
pub async fn read(store: &ObjectStore, name: &str) -> anyhow::Result<Vec<u8>> {
    let mut object = tokio::time::timeout(STALL, store.get(name))
        .await
        .map_err(|_| anyhow::anyhow!("looking up `{name}` took over {STALL:?}"))?
        .with_context(|| format!("cannot fetch `{name}`"))?;
    let mut bytes = Vec::new();
    let mut chunk = vec![0; 128 << 10];
    loop {
        let read = tokio::time::timeout(STALL, object.read(&mut chunk))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "reading `{name}` stalled for {STALL:?} after {} bytes (replaced meanwhile?)",
                    bytes.len()
                )
            })?
            .with_context(|| format!("cannot read `{name}`"))?;
        if read == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..read]);
    }
}
