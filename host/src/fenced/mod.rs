//! Fenced effects (docs/src/how/fenced.md): a fenced route's claim records live in the output stream
//! that captures its outputs, under `_dedup.claims.<stream>.<claim key>`, and success is one
//! atomic batch (nats-server 2.12+, ADR-50): the outputs, then the completed record expecting
//! the owner's revision. The server checks that expectation at commit, under the stream's
//! lock, and stores all of the batch or none of it, so a stale owner's outputs are refused
//! however long it was paused, and no duplicate window plays a part.
//!
//! - this module: where fenced claims live;
//! - [`commit`]: sending the batch;
//! - [`group`]: the commits of several messages sent as one batch.

pub mod commit;
pub mod group;

/// On a fenced route's outputs (which carry no `Nats-Msg-Id`): `<claim key>#<index>`, as a
/// message id would be, so `audit` and `inspect` can tell whose output it is.
pub const OUTPUT_ID: &str = "Dedup-Output-Id";

use crate::config::{Config, RouteConfig};
use crate::subject::FENCED_CLAIMS_PREFIX;

/// The subjects of a fenced stream that hold claim records: `_dedup.claims.<stream>.>`.
pub fn claim_subjects(stream: &str) -> String {
    format!("{FENCED_CLAIMS_PREFIX}{stream}.>")
}

/// The subject of one claim in fenced stream `stream` (`claim_key` from
/// [`crate::claim::key::encode`]).
pub fn claim_subject(stream: &str, claim_key: &str) -> String {
    format!("{FENCED_CLAIMS_PREFIX}{stream}.{claim_key}")
}

/// The claim key back from a claim subject of `stream`, if `subject` is one.
pub fn claim_key_of<'a>(stream: &str, subject: &'a str) -> Option<&'a str> {
    subject
        .strip_prefix(FENCED_CLAIMS_PREFIX)?
        .strip_prefix(stream)?
        .strip_prefix('.')
}

/// The key the host's claim store ([`crate::claim::host::HostClaimStore`]) knows claim key
/// `claim_key` of route `route` by: its claim subject when the route is fenced, else itself.
pub fn store_key(config: &Config, route: &str, claim_key: &str) -> String {
    let fenced = config.routes.iter().find(|r| r.name == route);
    match fenced.and_then(|r| config.fenced_stream(r)) {
        Some(o) => claim_subject(&o.name, claim_key),
        None => claim_key.to_string(),
    }
}

/// The claim store of the host's claims, for the operations commands: the bucket of
/// `claims.bucket`, and the fenced output streams.
pub async fn host_store(
    js: &async_nats::jetstream::Context,
    config: &Config,
) -> anyhow::Result<crate::claim::host::HostClaimStore> {
    let kv = js
        .get_key_value(&config.claims.bucket)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open claim bucket `{}`: {e}", config.claims.bucket))?;
    Ok(crate::claim::host::HostClaimStore::new(
        crate::claim::kv::KvClaimStore::new(kv),
        js.clone(),
    ))
}

/// Where the claim of route `route`'s idempotency key `key` is kept: a key of the claim
/// bucket, or (for a fenced route) a subject of its fenced output stream.
pub fn claim_location(config: &Config, route: &RouteConfig, key: &str) -> ClaimLocation {
    let claim_key = crate::claim::key::encode(&route.name, key);
    match config.fenced_stream(route) {
        Some(o) => ClaimLocation::Stream {
            subject: claim_subject(&o.name, &claim_key),
            stream: o.name.clone(),
        },
        None => ClaimLocation::Bucket(claim_key),
    }
}

/// Where one claim record is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimLocation {
    /// A key of the claim bucket (`claims.bucket`).
    Bucket(String),
    /// A subject of a fenced output stream.
    Stream {
        /// The stream.
        stream: String,
        /// The claim subject.
        subject: String,
    },
}

impl ClaimLocation {
    /// The key the host's claim store knows it by ([`crate::claim::host::HostClaimStore`]).
    pub fn store_key(&self) -> &str {
        match self {
            ClaimLocation::Bucket(key) => key,
            ClaimLocation::Stream { subject, .. } => subject,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_subjects_round_trip_and_name_their_stream() {
        let s = claim_subject("OUT", "orders.k.a-1");
        assert_eq!(s, "_dedup.claims.OUT.orders.k.a-1");
        assert!(crate::subject::matches(&claim_subjects("OUT"), &s));
        assert_eq!(claim_key_of("OUT", &s), Some("orders.k.a-1"));
        assert_eq!(claim_key_of("OUTX", &s), None);
        assert_eq!(crate::claim::stream::stream_of(&s), Some("OUT"));
    }
}
