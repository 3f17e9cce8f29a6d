//! The durable consumers of the source stream: created or updated by `setup`, bound by
//! hosts, and who decides their settings. Hosts of one deployment may run different
//! configs side by side (a rolling restart, a bigger host), and each binds the shared durable
//! consumers: if every bind wrote its own `ack_wait`, `max_deliver`, `max_ack_pending` and
//! filters, they would flip to whichever host bound last. So a host's bind creates a missing
//! consumer with its config, but keeps an existing one's settings as the server has them
//! (and says where they differ from its config); only what the route's contract decides is
//! enforced (an exclusive route's queue consumer is pinned to its copier). `setup`
//! and `setup --apply` write the config's settings.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer::{self, pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::stream;

use crate::config::Config;
use crate::consumers::{route_consumer_name, uncovered_subjects};

/// Who is writing a consumer's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// `setup` (or `--apply`, `--rename-route`): the config's settings are written.
    Setup,
    /// A host binding or re-binding: an existing consumer keeps its settings, except those
    /// the route's contract decides.
    Host,
}

/// The settings of a source consumer that configs may disagree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// How long the server waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// The server's delivery bound.
    pub max_deliver: i64,
    /// How many deliveries may be pending at once.
    pub max_ack_pending: i64,
    /// The subjects it delivers.
    pub filter_subjects: Vec<String>,
    /// Whether it hands its messages to one pinned host (an exclusive route's copier).
    pub pinned: bool,
}

impl Settings {
    /// What `config` asks of a consumer with `filter_subjects` (`queue`: it feeds an
    /// exclusive route's queue: pinned to its copier, a window of `exclusive::COPY_WINDOW`).
    pub fn wanted(config: &Config, filter_subjects: Vec<String>, queue: bool) -> Self {
        let (ack_wait, max_ack_pending) = if queue {
            (
                crate::exclusive::ORDER_ACK_WAIT,
                crate::exclusive::COPY_WINDOW,
            )
        } else {
            (config.source.ack_wait, config.source.max_ack_pending)
        };
        Self {
            ack_wait,
            max_deliver: config.source.server_max_deliver,
            max_ack_pending,
            filter_subjects,
            pinned: queue,
        }
    }

    /// The settings of an existing consumer, as the server has them.
    pub fn of(c: &consumer::Config) -> Self {
        let mut filter_subjects = c.filter_subjects.clone();
        if !c.filter_subject.is_empty() {
            filter_subjects.push(c.filter_subject.clone());
        }
        Self {
            ack_wait: c.ack_wait,
            max_deliver: c.max_deliver,
            max_ack_pending: c.max_ack_pending,
            filter_subjects,
            pinned: c.priority_policy == consumer::PriorityPolicy::PinnedClient,
        }
    }

    /// Whether these are an exclusive route's queue consumer's settings (pinned to its
    /// copier, or one at a time as before the copier).
    fn feeds_queue(&self) -> bool {
        self.pinned
            || (self.max_ack_pending == 1 && self.ack_wait == crate::exclusive::ORDER_ACK_WAIT)
    }

    /// One `setting: server X, this config Y` for each setting that differs from `wanted`.
    pub fn differences(&self, wanted: &Settings) -> Vec<String> {
        let mut d = Vec::new();
        if self.ack_wait != wanted.ack_wait {
            d.push(format!(
                "ack_wait: server {:?}, this config {:?}",
                self.ack_wait, wanted.ack_wait
            ));
        }
        if self.max_deliver != wanted.max_deliver {
            d.push(format!(
                "max_deliver: server {}, this config {}",
                self.max_deliver, wanted.max_deliver
            ));
        }
        if self.max_ack_pending != wanted.max_ack_pending {
            d.push(format!(
                "max_ack_pending: server {}, this config {}",
                self.max_ack_pending, wanted.max_ack_pending
            ));
        }
        if self.filter_subjects != wanted.filter_subjects {
            d.push(format!(
                "filter subjects: server {:?}, this config {:?}",
                self.filter_subjects, wanted.filter_subjects
            ));
        }
        if self.pinned != wanted.pinned {
            d.push(format!(
                "pinned to one host: server {}, this config {}",
                self.pinned, wanted.pinned
            ));
        }
        d
    }
}

/// The settings `writer` gives a consumer that has `have` (`None`: it does not exist yet)
/// when `wanted` are the config's. A host keeps what exists, except that the contract
/// decides whether the route is exclusive (a queue consumer is pinned to its copier, and a
/// consumer left pinned or one at a time by a route no longer exclusive gets the config's
/// values),
/// and the filter is the route's subject as served: a consumer left on an old subject after
/// a reload would leave the new subject's messages to the unrouted consumer, which finds the
/// route and acks them without a run. Another deployment's consumer is never re-filtered
/// (checked before this, [`crate::ownership`]).
pub fn to_write(
    writer: Writer,
    have: Option<&Settings>,
    wanted: &Settings,
    queue: bool,
) -> Settings {
    let (Writer::Host, Some(have)) = (writer, have) else {
        return wanted.clone();
    };
    let mut bound = have.clone();
    bound.filter_subjects = wanted.filter_subjects.clone();
    if queue || have.feeds_queue() {
        bound.ack_wait = wanted.ack_wait;
        bound.max_ack_pending = wanted.max_ack_pending;
        bound.pinned = wanted.pinned;
    }
    bound
}

/// Whether a host's re-bind of route `route`'s consumer makes it an exclusive route's (one
/// message at a time): the route as served decides (`served`: it is exclusive now), never
/// `started`, the config the host started with (frozen in `pipeline::Shared`): a reload may
/// have added the route or made it exclusive since (issue 42, finding 2).
pub fn binds_exclusive(started: &Config, route: &str, served: bool) -> bool {
    if dedup_delivery::revert::reverted(dedup_delivery::revert::Fix::RebindLiveConfig) {
        // Test-only: the old re-bind, which read the route from the start-up config.
        let at_start = started.routes.iter().find(|r| r.name == route);
        return at_start.is_some_and(|r| r.exclusive_by.is_some());
    }
    served
}

/// Creates or updates the durable consumer of one route: it sees only the route's subject,
/// so a slow route never holds back another, and a route that is not served leaves its
/// messages waiting in the stream. `exclusive` comes from the route as it is served now (a
/// reload may have added it or changed it), never from the config the host started with:
/// a re-bind with the start-up config rewrote a reloaded exclusive route's consumer to many
/// in flight, for every host.
pub async fn route_consumer(
    source: &stream::Stream,
    config: &Config,
    route: &str,
    filter: &str,
    exclusive: bool,
) -> anyhow::Result<PullConsumer> {
    let name = route_consumer_name(config, route);
    write_consumer(
        source,
        config,
        &name,
        vec![filter.to_string()],
        exclusive,
        HOST,
    )
    .await
}

/// A host's bind: an existing consumer keeps its settings ([`crate::source_consumer`]).
const HOST: Binding = Binding {
    start: None,
    writer: Writer::Host,
};

/// The consumer for source subjects no route covers, named `source.consumer`: it
/// dead-letters what no route takes. It filters on the source subjects that no single route
/// covers whole, so a subject one route takes entirely is never delivered to it (only a
/// subject routes cover in part is delivered twice: to its route and here, where it is
/// acked). `None` when the routes cover every source subject (a leftover consumer of that
/// name is then deleted).
pub async fn unrouted_consumer(
    source: &stream::Stream,
    config: &Config,
) -> anyhow::Result<Option<PullConsumer>> {
    let name = &config.source.consumer;
    let uncovered = uncovered_subjects(config);
    if uncovered.is_empty() {
        if source.consumer_info(name).await.is_ok() {
            source
                .delete_consumer(name)
                .await
                .with_context(|| format!("cannot delete unused consumer `{name}`"))?;
        }
        return Ok(None);
    }
    let consumer = write_consumer(source, config, name, uncovered, false, HOST).await?;
    Ok(Some(consumer))
}

/// Creates or updates a durable consumer of the source stream with the config's settings
/// (`setup`). An exclusive route's (`queue`) hands its messages to one pinned host, the
/// copier, which queues them per entity in order (`crate::exclusive`).
pub(crate) async fn create_consumer(
    source: &stream::Stream,
    config: &Config,
    name: &str,
    filter_subjects: Vec<String>,
    queue: bool,
) -> anyhow::Result<PullConsumer> {
    create_consumer_at(source, config, name, filter_subjects, queue, None).await
}

/// [`create_consumer`], delivering from stream sequence `start` when given (a renamed
/// route's consumer starts where the old one stopped) instead of from the first message.
pub(crate) async fn create_consumer_at(
    source: &stream::Stream,
    config: &Config,
    name: &str,
    filter_subjects: Vec<String>,
    queue: bool,
    start: Option<u64>,
) -> anyhow::Result<PullConsumer> {
    let at = Binding {
        start,
        writer: Writer::Setup,
    };
    write_consumer(source, config, name, filter_subjects, queue, at).await
}

/// Where a consumer starts and who writes its settings ([`crate::source_consumer`]).
#[derive(Debug, Clone, Copy)]
struct Binding {
    /// The stream sequence a new consumer delivers from (a renamed route's starts where the
    /// old one stopped); `None`: from the first message.
    start: Option<u64>,
    /// `setup` writes the config's settings; a host keeps an existing consumer's.
    writer: Writer,
}

/// Creates or updates a durable consumer of the source stream as `at` says: from which
/// sequence, and whether an existing consumer's settings are rewritten.
async fn write_consumer(
    source: &stream::Stream,
    config: &Config,
    name: &str,
    filter_subjects: Vec<String>,
    queue: bool,
    at: Binding,
) -> anyhow::Result<PullConsumer> {
    // The owner stays whoever it is (a consumer another deployment owns with these very
    // filters is only read, `crate::ownership`); one without an owner is adopted.
    let existing = source.consumer_info(name).await.ok();
    if let Some(info) = &existing {
        // A reload or a re-bind reaches here without `ensure`'s checks: never re-filter
        // another deployment's consumer (its messages would be skipped for good).
        let filters = &filter_subjects;
        let conflict =
            crate::ownership::consumer_conflict(source, config, name, &info.config, filters);
        if let Some(conflict) = conflict.await? {
            return Err(conflict.into());
        }
    }
    let mut metadata = std::collections::HashMap::new();
    match existing
        .as_ref()
        .and_then(|i| crate::ownership::owner(&i.config.metadata))
    {
        Some(owner) => {
            metadata.insert(crate::ownership::OWNER_KEY.to_string(), owner.to_string());
        }
        None => crate::ownership::stamp(&mut metadata, config),
    }
    // The server refuses to change where an existing consumer starts (a renamed route's).
    let deliver_policy = match (at.start, &existing) {
        (Some(start_sequence), _) => DeliverPolicy::ByStartSequence { start_sequence },
        (None, Some(info)) => info.config.deliver_policy,
        (None, None) => DeliverPolicy::All,
    };
    let wanted = Settings::wanted(config, filter_subjects, queue);
    let have = existing.as_ref().map(|i| Settings::of(&i.config));
    let s = crate::source_consumer::to_write(at.writer, have.as_ref(), &wanted, queue);
    let kept = s.differences(&wanted);
    if !kept.is_empty() {
        tracing::warn!(
            consumer = name,
            "serving consumer `{name}` with the settings it has on the server, not this config's ({}): only `dedup-host setup --apply` changes them",
            kept.join("; ")
        );
    }
    source
        .create_consumer(pull::Config {
            durable_name: Some(name.to_string()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: s.ack_wait,
            // Far above the host's own attempt count (it counts per key and dead-letters by
            // itself); bounded only so that a message the client cannot parse stops coming
            // back. The server then advises, and `pipeline::undeliverable` dead-letters it.
            max_deliver: s.max_deliver,
            max_ack_pending: s.max_ack_pending,
            filter_subjects: s.filter_subjects,
            metadata,
            deliver_policy,
            // An exclusive route's messages go to one host at a time, its copier.
            priority_policy: match s.pinned {
                true => consumer::PriorityPolicy::PinnedClient,
                false => consumer::PriorityPolicy::None,
            },
            priority_groups: match s.pinned {
                true => vec![crate::exclusive::COPIER_GROUP.to_string()],
                false => Vec::new(),
            },
            priority_timeout: match s.pinned {
                true => crate::exclusive::COPIER_PIN_TTL,
                false => Duration::ZERO,
            },
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "cannot create or update consumer `{name}` on stream `{}` (`source.consumer`)",
                config.source.stream
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ack_wait: u64, max_ack_pending: i64, filter: &str) -> Settings {
        Settings {
            ack_wait: Duration::from_secs(ack_wait),
            max_deliver: 100,
            max_ack_pending,
            filter_subjects: vec![filter.into()],
            pinned: false,
        }
    }

    #[test]
    fn a_host_keeps_an_existing_consumers_settings_but_setup_writes_its_own() {
        let have = settings(30, 1000, "in.a.*");
        let mut wanted = settings(7, 50, "in.b.*");
        wanted.max_deliver = 9;
        // The tuning stays as setup recorded it; the filter follows the route as served.
        let kept = Settings {
            filter_subjects: wanted.filter_subjects.clone(),
            ..have.clone()
        };
        assert_eq!(to_write(Writer::Host, Some(&have), &wanted, false), kept);
        assert_eq!(to_write(Writer::Setup, Some(&have), &wanted, false), wanted);
        assert_eq!(to_write(Writer::Host, None, &wanted, false), wanted);
        assert_eq!(have.differences(&wanted).len(), 4);
    }

    #[test]
    fn the_contract_decides_one_at_a_time_whoever_binds() {
        let order = crate::exclusive::ORDER_ACK_WAIT.as_secs();
        let have = settings(30, 1000, "in.a.*");
        let queue = Settings {
            pinned: true,
            ..settings(order, crate::exclusive::COPY_WINDOW, "in.a.*")
        };
        assert_eq!(to_write(Writer::Host, Some(&have), &queue, true), queue);
        // No longer exclusive (a reload): the config's values, not one at a time.
        let plain = settings(30, 1000, "in.a.*");
        assert_eq!(to_write(Writer::Host, Some(&queue), &plain, false), plain);
    }
}
