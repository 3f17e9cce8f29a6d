//! Following the contract records of named routes only. The contracts bucket is one per
//! source stream, shared by every deployment on it, and a host's permissions name its own
//! routes' keys (`dedup-host permissions`): so instead of one watch over the whole bucket, a
//! host follows each route through an ordered consumer it names and filters to the route's
//! key, a request (`CONSUMER.CREATE.<stream>.<name>.<key subject>`) the server checks against
//! both the grant and the filter.

use async_nats::jetstream::consumer::push::OrderedConfig;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::kv::Store;
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt as _;
use thiserror::Error;

/// The latest value of one route's record, or a change of it.
#[derive(Debug, Clone)]
pub struct Update {
    /// The route (the record's key).
    pub route: String,
    /// The record as stored (empty for a delete or purge marker).
    pub value: bytes::Bytes,
}

/// Why following a route's contract failed.
#[derive(Debug, Error)]
pub enum WatchError {
    /// The server refused or did not answer the consumer that follows the record.
    #[error("cannot follow the contract of route `{route}` in bucket `{bucket}`: {reason} (a host's NATS user needs `$JS.API.CONSUMER.CREATE.KV_{bucket}.*.$KV.{bucket}.{route}`: re-print the host's set with `dedup-host permissions --role host` and reload the server's config; a reload that added the route needs it)")]
    Follow {
        /// The route.
        route: String,
        /// The contracts bucket.
        bucket: String,
        /// What the server said.
        reason: String,
    },
}

/// One route's stream of updates.
type Updates = BoxStream<'static, Result<Update, WatchError>>;

/// The records of a host's routes, each followed on its own: a route whose consumer the server
/// refuses (a reload added it before the host's permissions were re-printed) is tried again
/// later, and the other routes are followed meanwhile.
#[derive(Default)]
pub struct Following {
    updates: SelectAll<Updates>,
    refused: Vec<String>,
}

impl Following {
    /// Follows each of `routes`' records in `store` (those that exist, as they are now, then
    /// every change), deliveries going to `client`'s inbox. Returns why each route it could
    /// not follow was refused; those are tried again by [`Following::retry`].
    pub async fn add(
        &mut self,
        client: &async_nats::Client,
        store: &Store,
        routes: &[String],
    ) -> Vec<WatchError> {
        let mut errors = Vec::new();
        for route in routes {
            match follow_route(client, store, route).await {
                Ok(updates) => self.updates.push(updates),
                Err(e) => {
                    self.refused.push(route.clone());
                    errors.push(e);
                }
            }
        }
        errors
    }

    /// Tries the refused routes again; returns why those still refused are.
    pub async fn retry(&mut self, client: &async_nats::Client, store: &Store) -> Vec<WatchError> {
        let refused = std::mem::take(&mut self.refused);
        self.add(client, store, &refused).await
    }

    /// Whether a route waits to be tried again.
    pub fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    /// Whether no route is followed (every one was refused, or every watch ended).
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty()
    }

    /// The next update of any followed route; `None` once every followed route's watch ended.
    pub async fn next(&mut self) -> Option<Result<Update, WatchError>> {
        self.updates.next().await
    }
}

/// `route`'s record in `store` as it is now (if it exists), then every change; deliveries go
/// to `client`'s inbox.
async fn follow_route(
    client: &async_nats::Client,
    store: &Store,
    route: &str,
) -> Result<Updates, WatchError> {
    let error = |reason: String| WatchError::Follow {
        route: route.to_string(),
        bucket: store.name.clone(),
        reason,
    };
    let consumer = store
        .stream
        .create_consumer(OrderedConfig {
            name: Some(format!("dedup-contract-{:016x}", rand::random::<u64>())),
            deliver_subject: client.new_inbox(),
            description: Some(format!("dedup-host: contract of route {route}")),
            filter_subject: format!("{}{route}", store.prefix),
            replay_policy: ReplayPolicy::Instant,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| error(e.to_string()))?;
    let messages = consumer
        .messages()
        .await
        .map_err(|e| error(e.to_string()))?;
    let (prefix, route, bucket) = (store.prefix.clone(), route.to_string(), store.name.clone());
    Ok(messages
        .map(move |m| match m {
            Ok(m) => Ok(Update {
                route: m
                    .subject
                    .strip_prefix(prefix.as_str())
                    .unwrap_or(&route)
                    .to_string(),
                value: m.payload.clone(),
            }),
            Err(e) => Err(WatchError::Follow {
                route: route.clone(),
                bucket: bucket.clone(),
                reason: e.to_string(),
            }),
        })
        .boxed())
}
