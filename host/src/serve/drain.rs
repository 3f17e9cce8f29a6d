//! The end of a host's life, bounded: the drain (in-flight work, acks, the final flush) gets
//! `host.drain_timeout`; past it the host gives up and says what it leaves behind, so a host
//! told to stop while its server is gone still stops, before Kubernetes kills it.

use std::future::Future;
use std::time::Duration;

use thiserror::Error;

use crate::routes::Routes;

/// Why a host did not stop cleanly.
#[derive(Debug, Error)]
pub enum DrainError {
    /// The drain did not finish within `host.drain_timeout`.
    #[error("shutdown: the drain did not finish within `host.drain_timeout` ({timeout:?}){why}; gave up flushing: {unacked} delivery(ies) still in flight were not acked, and acks already queued for a server that did not take them may be lost too; the server redelivers those after the ack wait and their claims answer the redelivery (a completed key is acked without running again); raise `host.drain_timeout` if draining needs longer")]
    TimedOut {
        /// The bound that passed.
        timeout: Duration,
        /// Deliveries still in flight (not acked) when the host gave up.
        unacked: u64,
        /// What stood in the way, when known (` (NATS is not connected: ...)`).
        why: String,
    },
    /// The drain itself failed.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Runs `drain` for at most `timeout`; on timeout, counts the deliveries of `routes` still in
/// flight and logs them.
pub(super) async fn bounded(
    timeout: Duration,
    drain: impl Future<Output = anyhow::Result<()>>,
    routes: &Routes,
    client: &async_nats::Client,
) -> Result<(), DrainError> {
    match tokio::time::timeout(timeout, drain).await {
        Ok(done) => Ok(done?),
        Err(_) => {
            let unacked = unacked(routes);
            let why = match client.connection_state() {
                async_nats::connection::State::Connected => String::new(),
                state => format!(" (NATS is not connected: {state})"),
            };
            let error = DrainError::TimedOut {
                timeout,
                unacked,
                why,
            };
            tracing::error!(unacked, "{error}");
            Err(error)
        }
    }
}

/// Deliveries being handled now, over every route and the consumer of unrouted subjects.
fn unacked(routes: &Routes) -> u64 {
    let unrouted = routes.metrics().route(crate::metrics::UNROUTED).counts();
    routes
        .iter()
        .map(|r| r.metrics.counts().in_flight)
        .sum::<u64>()
        + unrouted.in_flight
}
