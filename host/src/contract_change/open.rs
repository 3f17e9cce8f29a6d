//! What a change from claim after to claim before waits for
//! ([`dedup_delivery::change::open_refuses`]): the old contract's messages that may have
//! published their outputs before any record of their key. Read once no host serves the
//! route, when nothing delivers the route's messages any more: the route's consumers'
//! deliveries not acknowledged (`num_ack_pending`; an exclusive route's partition consumers
//! too, which run its messages), and the messages the server gave up on whose letter is not
//! stored yet (their stranded-message markers, [`crate::stranded`]).

use anyhow::Context as _;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::Context;
use dedup_delivery::change;
use futures::StreamExt as _;

use super::ChangeError;
use crate::config::{ClaimMode, Config, RouteConfig};
use crate::contract::RouteContract;
use crate::stranded::owner::Consumers;
use crate::stranded::Marker;

/// The old contract's messages not settled, as read.
#[derive(Debug, Default)]
struct Open {
    /// Each consumer read, with its deliveries not acknowledged.
    pending: Vec<(String, u64)>,
    /// Messages given up on by the server and not dead-lettered yet.
    stranded: u64,
}

/// Refuses a change of `route` from contract `old` to `new` while the old contract's messages
/// are open ([`change::open_refuses`], [`ChangeError::OpenDeliveries`]); reads them only when
/// the old contract claims after running.
pub(super) async fn refuse_open(
    js: &Context,
    config: &Config,
    route: &RouteConfig,
    (old, new): (&RouteContract, &RouteContract),
) -> anyhow::Result<()> {
    if old.claim != ClaimMode::After {
        return Ok(());
    }
    let open = read(js, config, route, old).await?;
    let pending: u64 = open.pending.iter().map(|(_, n)| n).sum();
    let to_after = new.claim == ClaimMode::After;
    if !change::open_refuses(true, to_after, pending + open.stranded) {
        return Ok(());
    }
    Err(ChangeError::OpenDeliveries {
        route: route.name.clone(),
        stream: config.source.stream.clone(),
        consumer: crate::consumers::route_consumer_name(config, &route.name),
        consumers: (open.pending.iter())
            .map(|(name, n)| format!("`{name}` ({n})"))
            .collect::<Vec<_>>()
            .join(", "),
        pending,
        stranded: open.stranded,
    }
    .into())
}

/// The open messages of `route` under its recorded contract `old`.
async fn read(
    js: &Context,
    config: &Config,
    route: &RouteConfig,
    old: &RouteContract,
) -> anyhow::Result<Open> {
    let mut open = Open::default();
    let source_name = &config.source.stream;
    let source = (js.get_stream(source_name).await)
        .with_context(|| format!("cannot open source stream `{source_name}`"))?;
    let consumer = crate::consumers::route_consumer_name(config, &route.name);
    let mut filters = Vec::new();
    match source.consumer_info(&consumer).await {
        Ok(info) => {
            filters.extend(info.config.filter_subjects.iter().cloned());
            if !info.config.filter_subject.is_empty() {
                filters.push(info.config.filter_subject.clone());
            }
            open.pending.push((consumer, info.num_ack_pending as u64));
        }
        // Not there (deleted by the operator, or never made): it delivers nothing, and the
        // change makes it again. Its markers still count.
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
        Err(e) => {
            return Err(anyhow::Error::new(e)).with_context(|| {
                format!(
                    "cannot read consumer `{consumer}` of route `{}`",
                    route.name
                )
            })
        }
    }
    if filters.is_empty() {
        filters.push(route.subject.clone());
    }
    let queue_name = crate::exclusive::stream_name(config);
    let queue = match old.exclusive_by {
        Some(_) => Some(js.get_stream(&queue_name).await.with_context(|| {
            format!(
                "cannot open queue stream `{queue_name}` of route `{}`",
                route.name
            )
        })?),
        None => None,
    };
    if let Some(queue) = &queue {
        // Every partition consumer of the route there is, whatever count made it (an
        // earlier run of a change of `partitions` may have left both counts'): listed by
        // name, `<consumer>-<route>-p<n>`.
        let prefix = crate::exclusive::partition_consumer_name(config, &route.name, 0);
        let prefix = prefix.trim_end_matches('0');
        let mut names = queue.consumer_names();
        let mut partitions = Vec::new();
        while let Some(name) = names.next().await {
            let name = name.with_context(|| {
                format!("cannot list the consumers of queue stream `{queue_name}`")
            })?;
            let number = name.strip_prefix(prefix).unwrap_or_default();
            if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
                partitions.push(name);
            }
        }
        for name in partitions {
            match queue.consumer_info(&name).await {
                Ok(info) => open.pending.push((name, info.num_ack_pending as u64)),
                // Deleted since the listing: nothing open.
                Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
                Err(e) => {
                    return Err(anyhow::Error::new(e)).with_context(|| {
                        format!("cannot read consumer `{name}` of route `{}`", route.name)
                    })
                }
            }
        }
    }
    let source_filters =
        |subject: &str| filters.iter().any(|f| crate::subject::matches(f, subject));
    let markers = markers(js, config).await?;
    open.stranded += marked_in(&markers, &source, &source_filters).await?.len() as u64;
    if let Some(queue) = &queue {
        let queued = format!("{}.", crate::exclusive::route_subjects(config, &route.name));
        let ours = |subject: &str| subject.starts_with(&queued);
        open.stranded += marked_in(&markers, queue, &ours).await?.len() as u64;
    }
    Ok(open)
}

/// The sequences of the messages of `stream` whose subject `takes` that a stranded-message
/// marker stands for ([`crate::stranded`]): the server gave up on them and their letters are
/// not stored yet. A marker whose message is gone names nothing.
pub(crate) async fn stranded_of(
    js: &Context,
    config: &Config,
    stream: &Stream,
    takes: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<u64>> {
    marked_in(&markers(js, config).await?, stream, takes).await
}

/// Every stranded-message marker of `config`'s deployment in the claim bucket.
async fn markers(js: &Context, config: &Config) -> anyhow::Result<Vec<Marker>> {
    let bucket = &config.claims.bucket;
    let markers = crate::stranded::list(js, bucket).await.with_context(|| {
        format!("cannot read the stranded-message markers in claim bucket `{bucket}`")
    })?;
    // Another deployment's markers stand for its own consumers' deliveries (one whose
    // consumer cannot be judged now counts).
    let ours = Consumers::of(config).keep(js, markers, true).await;
    Ok(ours.into_iter().map(|(marker, _)| marker).collect())
}

/// The sequences of the messages of `stream` whose subject `takes` that one of `markers`
/// stands for ([`stranded_of`]).
async fn marked_in(
    markers: &[Marker],
    stream: &Stream,
    takes: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<u64>> {
    let name = &stream.cached_info().config.name;
    let mut marked = Vec::new();
    for marker in markers.iter().filter(|m| m.stream == *name) {
        match stream.get_raw_message(marker.sequence).await {
            Ok(m) if takes(&m.subject) => marked.push(marker.sequence),
            Ok(_) => {}
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(e) => {
                return Err(anyhow::Error::new(e)).with_context(|| {
                    format!(
                        "cannot read message {} of stream `{name}`, which stranded-message marker `{}` names, to tell whether the route takes it",
                        marker.sequence,
                        marker.key()
                    )
                })
            }
        }
    }
    Ok(marked)
}
