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
    #[error("cannot follow the contract of route `{route}` in bucket `{bucket}`: {reason} (a host's NATS user needs `$JS.API.CONSUMER.CREATE.KV_{bucket}.*.$KV.{bucket}.{route}`: print the set with `dedup-host permissions --role host`)")]
    Follow {
        /// The route.
        route: String,
        /// The contracts bucket.
        bucket: String,
        /// What the server said.
        reason: String,
    },
}

/// Each of `routes`' records in `store` as it is now (those that exist), then every change,
/// merged; deliveries go to `client`'s inbox.
pub async fn follow(
    client: &async_nats::Client,
    store: &Store,
    routes: &[String],
) -> Result<BoxStream<'static, Result<Update, WatchError>>, WatchError> {
    let mut all = SelectAll::new();
    for route in routes {
        let error = |reason: String| WatchError::Follow {
            route: route.clone(),
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
        let (prefix, route, bucket) = (store.prefix.clone(), route.clone(), store.name.clone());
        all.push(
            messages
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
                .boxed(),
        );
    }
    Ok(all.boxed())
}
