//! Whose given-up messages a deployment takes. Deployments that share a source stream (and
//! its exclusive queue) and a claim bucket each dead-letter only what their own consumers
//! gave up, under their own routes: a marker names its consumer, and so does a
//! `MAX_DELIVERIES` advisory. A consumer is judged by its name, not by the deployment's name
//! (a default name changes with the source subjects): one this config names (a route's, an
//! exclusive route's partition's, the unrouted subjects') is this deployment's; any other of
//! a name this deployment could give (`<source.consumer>` or `<source.consumer>-…`) is only
//! when the server records no other deployment as its owner (a route a reload removed) or no
//! longer has it, so a given-up message is never left to no one; a consumer of another name
//! (another application's) never is. What the server said is asked once per [`Consumers`]
//! (one sweep, one advisory).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::Context;

use crate::config::Config;
use crate::consumers::{route_consumer_name, uncovered_subjects};
use crate::exclusive::{partition_consumer_name, stream_name};
use crate::stranded::Marker;

/// The consumers a deployment names, and its two streams.
pub struct Consumers {
    /// Those it names on its source stream: its routes' and the unrouted subjects'.
    named: BTreeSet<String>,
    /// Those it names on its exclusive routes' queue: their partitions'.
    partitions: BTreeSet<String>,
    source: String,
    queue: String,
    /// Its consumers' names start with this (`source.consumer`).
    prefix: String,
    /// The deployment's name, as the owner the server records on its consumers.
    deployment: String,
    /// What the server said of consumers it does not name (by route consumer): asked once.
    asked: Mutex<BTreeMap<String, bool>>,
}

impl Consumers {
    /// The consumers of `config` with `routes` as its routes: each route's name and, for an
    /// exclusive route, its partitions (a host's routes after a reload differ from the
    /// config it started with).
    pub fn named<'a>(
        config: &Config,
        routes: impl IntoIterator<Item = (&'a str, Option<usize>)>,
    ) -> Self {
        let (mut named, mut queue) = (BTreeSet::new(), BTreeSet::new());
        for (route, partitions) in routes {
            named.insert(route_consumer_name(config, route));
            for p in 0..partitions.unwrap_or(0) {
                queue.insert(partition_consumer_name(config, route, p));
            }
        }
        // The consumer of unrouted subjects, when the config has one.
        if !uncovered_subjects(config).is_empty() {
            named.insert(config.source.consumer.clone());
        }
        Self {
            named,
            partitions: queue,
            source: config.source.stream.clone(),
            queue: stream_name(config),
            prefix: config.source.consumer.clone(),
            deployment: config.deployment_name(),
            asked: Mutex::default(),
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

    /// The markers of `markers` this deployment takes ([`Consumers::take`]), and those whose
    /// consumer cannot be judged now when `undecided` (counted by a check, left to the next
    /// sweep by a sweep).
    pub async fn keep(
        &self,
        js: &Context,
        markers: Vec<(Marker, u64)>,
        undecided: bool,
    ) -> Vec<(Marker, u64)> {
        let mut ours = Vec::new();
        for (marker, revision) in markers {
            let take = self
                .take(js, &marker.stream, marker.consumer.as_deref())
                .await;
            if take.unwrap_or(undecided) {
                ours.push((marker, revision));
            }
        }
        ours
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
        let queued = stream == self.queue;
        if (queued && self.partitions.contains(consumer))
            || (!queued && self.named.contains(consumer))
        {
            return Ok(true);
        }
        // A partition's consumer is judged by the route consumer that queues for it.
        let route_consumer = match queued {
            true => match consumer.rsplit_once("-p") {
                Some((route, n)) if n.parse::<usize>().is_ok() => route,
                _ => return Ok(false),
            },
            false => consumer,
        };
        if queued && self.named.contains(route_consumer) {
            return Ok(true);
        }
        // Not a name this host's kind gives (another application's consumer on the stream).
        let ours = format!("{}-", self.prefix);
        if route_consumer != self.prefix && !route_consumer.starts_with(&ours) {
            return Ok(false);
        }
        if let Some(known) = self.asked.lock().expect("not poisoned").get(route_consumer) {
            return Ok(*known);
        }
        let source = (js.get_stream_no_info(&self.source).await).map_err(|e| e.to_string())?;
        let verdict = match source.consumer_info(route_consumer).await {
            Ok(info) => crate::ownership::owner(&info.config.metadata)
                .is_none_or(|owner| owner == self.deployment),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => true,
            Err(e) => {
                return Err(format!(
                    "cannot read consumer `{route_consumer}` of `{}` to tell whose it is: {e}",
                    self.source
                ))
            }
        };
        let mut asked = self.asked.lock().expect("not poisoned");
        asked.insert(route_consumer.to_string(), verdict);
        Ok(verdict)
    }
}
