//! Whose given-up messages a deployment takes. Deployments that share a source stream (and
//! its exclusive queue) and a claim bucket each dead-letter only what their own consumers
//! gave up, under their own routes: a marker names its consumer, and so does a
//! `MAX_DELIVERIES` advisory. A consumer is judged by its name, not by the deployment's name
//! (a default name changes with the source subjects): one this config names (a route's, an
//! exclusive route's partition's, the unrouted subjects') is this deployment's; any other is
//! only when the server records no other deployment as its owner (a route a reload removed)
//! or no longer has it, so a given-up message is never left to no one.

use std::collections::BTreeSet;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::Context;

use crate::config::Config;
use crate::consumers::{consumer_specs, route_consumer_name};
use crate::exclusive::{partition_consumer_name, stream_name};

/// The consumers a deployment names, and its two streams.
pub struct Consumers {
    named: BTreeSet<String>,
    source: String,
    queue: String,
    /// The deployment's name, as the owner the server records on its consumers.
    deployment: String,
}

impl Consumers {
    /// The consumers of `config` with `routes` as its routes: each route's name and, for an
    /// exclusive route, its partitions (a host's routes after a reload differ from the
    /// config it started with).
    pub fn named<'a>(
        config: &Config,
        routes: impl IntoIterator<Item = (&'a str, Option<usize>)>,
    ) -> Self {
        let mut named: BTreeSet<String> = BTreeSet::new();
        for (route, partitions) in routes {
            named.insert(route_consumer_name(config, route));
            for p in 0..partitions.unwrap_or(0) {
                named.insert(partition_consumer_name(config, route, p));
            }
        }
        // The consumer of unrouted subjects, when the config has one.
        let unrouted = consumer_specs(config).into_iter().map(|(name, _, _)| name);
        named.extend(unrouted.filter(|n| *n == config.source.consumer));
        Self {
            named,
            source: config.source.stream.clone(),
            queue: stream_name(config),
            deployment: config.deployment_name(),
        }
    }

    /// The consumers of `config` as written.
    pub fn of(config: &Config) -> Self {
        let routes = config.routes.iter().map(|r| {
            let partitions = r
                .exclusive_by
                .as_ref()
                .map(|_| crate::exclusive::partitions(config, r));
            (r.name.as_str(), partitions)
        });
        Self::named(config, routes)
    }

    /// Whether what `consumer` of `stream` gave up is this deployment's to dead-letter
    /// (`consumer` `None`: a marker written before markers named it, taken on this
    /// deployment's streams). `Err`: the server could not be asked; decide later.
    pub async fn take(
        &self,
        js: &Context,
        stream: &str,
        consumer: Option<&str>,
    ) -> Result<bool, String> {
        use dedup_delivery::revert::{reverted, Fix};
        if reverted(Fix::MarkersPerDeployment) {
            return Ok(true);
        }
        if stream != self.source && stream != self.queue {
            return Ok(false);
        }
        let Some(consumer) = consumer else {
            return Ok(true);
        };
        if self.named.contains(consumer) {
            return Ok(true);
        }
        // A partition's consumer is judged by the route consumer that queues for it.
        let route_consumer = match stream == self.queue {
            true => match consumer.rsplit_once("-p") {
                Some((route, n)) if n.parse::<usize>().is_ok() => route,
                _ => return Ok(false),
            },
            false => consumer,
        };
        if self.named.contains(route_consumer) {
            return Ok(true);
        }
        let source = (js.get_stream_no_info(&self.source).await).map_err(|e| e.to_string())?;
        match source.consumer_info(route_consumer).await {
            Ok(info) => Ok(crate::ownership::owner(&info.config.metadata)
                .is_none_or(|owner| owner == self.deployment)),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Ok(true),
            Err(e) => Err(format!(
                "cannot read consumer `{route_consumer}` of `{}` to tell whose it is: {e}",
                self.source
            )),
        }
    }
}
