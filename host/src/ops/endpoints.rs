//! `/metrics`, `/healthz` and `/readyz`, served on the I/O runtime with axum, plus the poller
//! of each route consumer's pending counts (bounded to one round per [`POLL_EVERY`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::routes::Routes;

/// How often consumer state is read from the server.
pub const POLL_EVERY: Duration = Duration::from_secs(5);

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct Endpoints {
    metrics: Arc<Metrics>,
    routes: Arc<Routes>,
    health: Arc<Health>,
}

/// Binds `addr` and serves the endpoints until `stopped`. Binding fails loudly (a port in
/// use is a configuration error).
pub async fn serve(
    addr: SocketAddr,
    routes: Arc<Routes>,
    health: Arc<Health>,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot serve metrics on `{addr}` (`host.metrics_addr` / --metrics-addr): {e}"
        )
    })?;
    let bound = listener.local_addr()?;
    let state = Endpoints {
        metrics: routes.metrics().clone(),
        routes,
        health,
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!("metrics endpoint stopped: {e}");
        }
    });
    Ok((bound, task))
}

async fn metrics(State(s): State<Endpoints>) -> impl IntoResponse {
    for route in s.routes.iter() {
        route
            .metrics
            .set_free_slots(route.slots.available_permits());
    }
    s.metrics.set_ready(s.health.readiness().ready);
    ([(header::CONTENT_TYPE, OPENMETRICS)], s.metrics.encode())
}

async fn readyz(State(s): State<Endpoints>) -> impl IntoResponse {
    let readiness = s.health.readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness))
}

/// Reads each route consumer's pending and ack-pending counts every [`POLL_EVERY`] until
/// `stopped`.
pub fn poll_consumers(
    js: async_nats::jetstream::Context,
    config: Arc<Config>,
    routes: Arc<Routes>,
    mut stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(stream) = js.get_stream(&config.source.stream).await {
                for route in routes.iter() {
                    let name = crate::setup::route_consumer_name(&config, &route.name);
                    if let Ok(info) = stream.consumer_info(&name).await {
                        route
                            .metrics
                            .set_consumer(info.num_pending, info.num_ack_pending);
                        let stream = &config.source.stream;
                        routes.metrics().consumer_info(&route.name, stream, &name);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL_EVERY) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    })
}
