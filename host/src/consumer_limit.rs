//! The server's limit of consumers per stream, checked before set-up: nats-server refuses a
//! stream's 1,001st consumer by default (`maximum consumers limit reached`, error 10026), and
//! every route has its own durable consumer on the source stream (plus one for unrouted
//! subjects), and every partition of an exclusive route its own on the queue stream. A config
//! that would pass the limit is named by `setup --dry-run` (and refused by `setup`) with the
//! count and how to go past it, instead of failing half-way through creating consumers.

use std::collections::BTreeSet;

use async_nats::jetstream::Context;
use futures::StreamExt;
use serde::Serialize;

use crate::config::Config;

/// The consumers per stream nats-server allows when neither the stream nor the account
/// sets a limit (nats-server 2.15).
pub const SERVER_DEFAULT_MAX_CONSUMERS: u64 = 1000;

/// A stream whose consumers would pass the server's limit under this config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverLimit {
    /// The stream.
    pub stream: String,
    /// Consumers it would hold: the config's, plus the others already on it.
    pub consumers: u64,
    /// Of those, consumers already on the stream that this config does not name.
    pub others: u64,
    /// The most consumers the server allows on it.
    pub limit: u64,
    /// Where the limit comes from (the stream's `max_consumers`, the account, the default).
    pub source: &'static str,
}

impl OverLimit {
    /// The operator's message: the stream, the counts and how to go past the limit.
    pub fn message(&self) -> String {
        format!(
            "stream `{}` would hold {} consumers ({} for this config's routes and partitions, {} already there for others), past the server's limit of {} ({}; error 10026 `maximum consumers limit reached`): split the routes over several source streams (one config per stream), or raise the account's JetStream `max_consumers` on the server (a stream's own `max_consumers` can only lower it)",
            self.stream,
            self.consumers,
            self.consumers - self.others,
            self.others,
            self.limit,
            self.source
        )
    }
}

/// The durable consumers the config needs, by stream: its routes' (and the unrouted
/// subjects') on the source stream, and exclusive routes' partitions' on the queue stream.
pub fn wanted(config: &Config) -> Vec<(String, BTreeSet<String>)> {
    let source: BTreeSet<String> = crate::consumers::consumer_specs(config)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    let queue: BTreeSet<String> = config
        .routes
        .iter()
        .filter(|r| r.exclusive_by.is_some())
        .flat_map(|r| {
            (0..r.partitions())
                .map(|p| crate::exclusive::partition_consumer_name(config, &r.name, p))
        })
        .collect();
    let mut wanted = vec![(config.source.stream.clone(), source)];
    if !queue.is_empty() {
        wanted.push((crate::exclusive::stream_name(config), queue));
    }
    wanted
}

/// The streams whose consumers would pass the server's limit under `config`, counting the
/// consumers already on each stream. Reads only.
pub async fn check(js: &Context, config: &Config) -> anyhow::Result<Vec<OverLimit>> {
    let account = js.query_account().await.ok();
    let (account_limit, account_source) = match account.and_then(|a| a.limits.max_consumers) {
        Some(n) if n > 0 => (n as u64, "the account's max_consumers"),
        _ => (
            SERVER_DEFAULT_MAX_CONSUMERS,
            "nats-server's default per stream",
        ),
    };
    let mut over = Vec::new();
    for (stream_name, names) in wanted(config) {
        let (mut limit, mut source) = (account_limit, account_source);
        let mut others = 0u64;
        if let Ok(mut stream) = js.get_stream(&stream_name).await {
            let own = stream.info().await?.config.max_consumers;
            if own > 0 && (own as u64) < limit {
                (limit, source) = (own as u64, "the stream's max_consumers");
            }
            let mut existing = stream.consumer_names();
            while let Some(name) = existing.next().await {
                if !names.contains(&name?) {
                    others += 1;
                }
            }
        }
        let consumers = names.len() as u64 + others;
        if consumers > limit {
            over.push(OverLimit {
                stream: stream_name,
                consumers,
                others,
                limit,
                source,
            });
        }
    }
    Ok(over)
}
