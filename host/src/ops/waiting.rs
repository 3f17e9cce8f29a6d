//! Where a route's unsettled source messages begin. Its consumer acknowledges a message only
//! once it is settled (an exclusive route's once queued: the queued ones still wait), so
//! every message at or below the floor is settled: `audit` calls the ones above it pending,
//! and `inspect` reads only those instead of the whole source subject.

use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::Context;

use crate::config::{Config, RouteConfig};

/// The highest source sequence at or below which every message of `route` is settled: its
/// consumer's ack floor, lowered to just before the first queued copy on an exclusive route;
/// 0 when the consumer was never created (nothing was acknowledged). `source` is the
/// config's source stream.
pub async fn settled_floor(
    js: &Context,
    config: &Config,
    source: &Stream,
    route: &RouteConfig,
) -> anyhow::Result<u64> {
    let name = crate::setup::route_consumer_name(config, &route.name);
    let mut floor = match source.consumer_info(&name).await {
        Ok(info) => info.ack_floor.stream_sequence,
        Err(_) => 0,
    };
    if route.exclusive_by.is_some() {
        if let Some(first) = first_queued(js, config, &route.name).await? {
            floor = floor.min(first - 1);
        }
    }
    Ok(floor)
}

/// The source sequence of the first message an exclusive route's queue still holds (the
/// queue keeps each route's messages in source order, and only until they are run).
async fn first_queued(js: &Context, config: &Config, route: &str) -> anyhow::Result<Option<u64>> {
    let filter = format!("{}.>", crate::exclusive::route_subjects(config, route));
    let Ok(queue) = js.get_stream(crate::exclusive::stream_name(config)).await else {
        return Ok(None);
    };
    let Ok(first) = queue.get_first_raw_message_by_subject(&filter, 1).await else {
        return Ok(None); // nothing queued
    };
    Ok(first
        .headers
        .get(crate::exclusive::headers::SEQUENCE)
        .and_then(|v| v.as_str().parse().ok()))
}
