//! A host's life, top to bottom: connect, set up streams and buckets, start the component
//! sources and one consumer loop per route, then drain and stop. The only module that knows
//! both the pipeline (which processes deliveries) and the component sources (which find and
//! install versions); both work on the routing table in [`crate::routes`].
//!
//! - [`live`]: the route set as it changes: per-route loops and watchers, config reloads.
//! - [`drain`]: the drain at shutdown, bounded by `host.drain_timeout`.

mod drain;
mod live;

use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim::host::HostClaimStore;
use crate::claim::kv::KvClaimStore;
use crate::claim::Claimer;
use crate::config::Config;
use crate::health::Health;
use crate::metrics::{Metrics, StatsSnapshot};
use crate::pipeline::{self, Shared};
use crate::routes::Routes;
use crate::runtime::Runtime;

/// Guests run on their own threads so that CPU-bound guests cannot starve NATS I/O,
/// heartbeats and acks, which stay on the caller's runtime.
/// Candidates' shadow runs have a thread of their own at the lowest CPU priority.
struct GuestThreads([Option<tokio::runtime::Runtime>; 2]);

impl GuestThreads {
    fn new() -> anyhow::Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("guest")
            .enable_time()
            // A guest's outbound HTTP calls (`wasi:http`) connect from the thread it runs on.
            .enable_io()
            .build()?;
        let shadow = crate::candidate::shadow::low_priority_runtime()?;
        Ok(Self([Some(rt), Some(shadow)]))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.runtime(0)
    }

    fn shadow_handle(&self) -> tokio::runtime::Handle {
        self.runtime(1)
    }

    fn runtime(&self, i: usize) -> tokio::runtime::Handle {
        self.0[i]
            .as_ref()
            .expect("guest runtime alive")
            .handle()
            .clone()
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        for rt in self.0.iter_mut().filter_map(Option::take) {
            rt.shutdown_background();
        }
    }
}

pub use drain::DrainError;
pub use live::ReloadReport;

/// A `dedup-host reload` request that reached this host, to be answered with
/// [`RunningHost::answer`].
#[derive(Debug)]
pub struct ReloadRequest {
    reply: Option<async_nats::Subject>,
}

/// A host that is consuming. Stop it with [`RunningHost::shutdown`].
pub struct RunningHost {
    live: Arc<live::Live>,
    reload_requests: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ReloadRequest>>,
    instance_id: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    metrics_addr: Option<std::net::SocketAddr>,
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
    client: async_nats::Client,
    drain_timeout: std::time::Duration,
}

impl RunningHost {
    /// This process's instance id, as written into claim records.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The counters so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.metrics.snapshot()
    }

    /// This host's series.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served, if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Applies a new config's route changes, or, when it is refused, logs and reports every
    /// problem and changes nothing (see [`live`]). A route of the applied config that this
    /// host does not serve because its config differs from the route's contract is a problem
    /// of the report too: the reload is refused for that route here.
    pub async fn reload(&self, config: Result<Config, crate::config::ConfigError>) -> ReloadReport {
        let mut report = self.live.reload(config).await;
        if report.applied {
            let refused = self.live.routes.iter().filter_map(|r| r.contract_refused());
            report.problems.extend(refused);
        }
        report
    }

    /// The next `dedup-host reload` request sent to every host through NATS.
    pub async fn reload_requested(&self) -> Option<ReloadRequest> {
        self.reload_requests.lock().await.recv().await
    }

    /// Answers a reload request with what this host did.
    pub async fn answer(&self, request: ReloadRequest, report: &ReloadReport) {
        if let Some(reply) = request.reply {
            let body = serde_json::to_vec(report).expect("report serializes");
            if let Err(e) = self.client.publish(reply, body.into()).await {
                tracing::warn!("cannot answer the reload request: {e}");
            }
        }
    }

    /// Turns `/readyz` to 503, stops pulling, waits up to `host.shutdown_grace` for in-flight
    /// messages, flushes; all of it within `host.drain_timeout`, past which it gives up and
    /// says how many deliveries it could not ack ([`DrainError::TimedOut`]).
    pub async fn shutdown(self) -> Result<StatsSnapshot, DrainError> {
        self.health.drain();
        let _ = self.stop.send(true);
        let (task, client) = (self.task, &self.client);
        let drain = async move {
            task.await.context("host task panicked")??;
            client.flush().await.context("flushing NATS connection")?;
            Ok(())
        };
        drain::bounded(self.drain_timeout, drain, &self.live.routes, client).await?;
        Ok(self.metrics.snapshot())
    }
}

/// A new instance id: unique per process start.
pub fn new_instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Connects, sets up streams, consumer and bucket, loads every route's component and starts
/// consuming.
pub async fn start(config: Config) -> anyhow::Result<RunningHost> {
    let runtime = crate::components::check::runtime(&config)?;
    let routes = Routes::unloaded(&config)?;
    let started = std::time::Instant::now();
    start_with_routes(config, routes, Some(runtime))
        .await
        .map_err(|e| crate::refusals::explain(e, started))
}

/// Like [`start`], with routes built by the caller (benchmarks use [`crate::routes::Guest::Noop`]). With a
/// `runtime`, component files and the object store are watched for new versions; without
/// one, the routes keep the guests they were given.
pub async fn start_with_routes(
    config: Config,
    routes: Routes,
    runtime: Option<Runtime>,
) -> anyhow::Result<RunningHost> {
    for fix in dedup_delivery::revert::active() {
        tracing::error!(
            fix = fix.name(),
            "test-only switch {} is set: this host runs WITHOUT the fix \"{}\"; unset it outside tests",
            dedup_delivery::revert::ENV,
            fix.reverted_means()
        );
    }
    let instance_id = config
        .host
        .instance_id
        .clone()
        .unwrap_or_else(new_instance_id);
    let routes = Arc::new(routes);
    let metrics = routes.metrics().clone();
    let health = Arc::new(Health::default());
    let (stop, stopped) = watch::channel(false);
    // The endpoints outlive the drain, so `/readyz` answers 503 until the host is gone.
    let (endpoints_stop, endpoints_stopped) = watch::channel(false);
    let mut endpoints = None;
    if let Some(addr) = config.host.metrics_addr {
        let served =
            crate::ops::endpoints::serve(addr, routes.clone(), health.clone(), endpoints_stopped)
                .await?;
        endpoints = Some(served);
    }
    let client = crate::connect::connect(&config, &format!("dedup-host {instance_id}")).await?;
    health.connected(client.clone());
    let js = async_nats::jetstream::new(client.clone());
    let setup = crate::setup::ensure_patiently(&js, &config).await?;
    let claimer = Claimer::new(
        Arc::new(HostClaimStore::new(
            KvClaimStore::new(setup.claims.clone()),
            js.clone(),
        )),
        instance_id.clone(),
        config.claims.lease,
        config.claims.clock_skew,
    );
    let guest_threads = GuestThreads::new()?;
    let unrouted =
        crate::setup::patiently(|| crate::setup::unrouted_consumer(&setup.source, &config)).await?;
    let loaders = match &runtime {
        Some(runtime) => {
            crate::components::spawn(
                &js,
                runtime.clone(),
                &config,
                routes.clone(),
                &instance_id,
                stopped.clone(),
            )
            .await?
        }
        None => Vec::new(),
    };
    let config = Arc::new(config);
    let metrics_addr = endpoints.as_ref().map(|(addr, _)| *addr);
    let mut tasks: Vec<JoinHandle<()>> = endpoints.into_iter().map(|(_, task)| task).collect();
    // Pending counts feed `/metrics` and the console alike.
    tasks.push(crate::ops::endpoints::poll_consumers(
        js.clone(),
        config.clone(),
        routes.clone(),
        stopped.clone(),
    ));
    tasks.push(tokio::spawn(crate::feed::run(
        client.clone(),
        config.clone(),
        instance_id.clone(),
        routes.clone(),
        health.clone(),
        stopped.clone(),
    )));
    let telemetry = crate::telemetry::Telemetry::start(
        &config.telemetry,
        &instance_id,
        metrics.spans_dropped(),
    )?;
    let (found, finding) = tokio::sync::mpsc::channel(1024);
    tasks.push(tokio::spawn(crate::candidate::record::run(
        js.clone(),
        config.clone(),
        instance_id.clone(),
        finding,
        stopped.clone(),
    )));
    let shadows = crate::candidate::shadow::Shadows::new(guest_threads.shadow_handle(), found);
    let shared = Arc::new(Shared::new(
        js.clone(),
        config.clone(),
        routes.clone(),
        claimer,
        setup.claims,
        (guest_threads.handle(), shadows),
        telemetry.as_ref().map(|t| t.tracer()),
    ));
    let contracts = crate::setup::patiently(|| crate::contract::open(&js, &config)).await?;
    let live = Arc::new(live::Live::new(
        config.clone(),
        js,
        shared.clone(),
        runtime,
        routes.clone(),
        instance_id.clone(),
        contracts,
    )?);
    for route in routes.iter() {
        live.start(route, false).await?;
    }
    tasks.push(live::follow_contracts(live.clone(), stopped.clone()));
    health.set_up(routes.clone());
    let loops = pipeline::spawn_common(shared, unrouted, &client, &stopped);
    let (requests, reload_requests) = tokio::sync::mpsc::channel(4);
    tasks.push(follow_reload_requests(&client, &config, requests, stopped.clone()).await?);
    let task = {
        let (live, mut stopped) = (live.clone(), stopped.clone());
        tokio::spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
            live.stop_all().await;
            let finished = finish(loops, loaders, endpoints_stop, tasks, guest_threads).await;
            if let Some(telemetry) = telemetry {
                telemetry.shutdown().await;
            }
            finished
        })
    };
    tracing::info!(instance_id, "host started");
    Ok(RunningHost {
        live,
        reload_requests: tokio::sync::Mutex::new(reload_requests),
        instance_id,
        metrics,
        health,
        metrics_addr,
        stop,
        task,
        client,
        drain_timeout: config.host.drain_timeout,
    })
}

/// Subscribes to the reload subject of this deployment and forwards each request.
async fn follow_reload_requests(
    client: &async_nats::Client,
    config: &Config,
    requests: tokio::sync::mpsc::Sender<ReloadRequest>,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<JoinHandle<()>> {
    use futures::StreamExt as _;
    let subject = config.reload_subject();
    let mut subscription = client.subscribe(subject).await?;
    // Or on this deployment's own inbox prefix (`nats.inbox_prefix`), which its CLI uses.
    let inbox = format!("{}.", config.nats.inbox());
    Ok(tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                m = subscription.next() => m,
                _ = stopped.wait_for(|s| *s) => return,
            };
            let Some(message) = message else { return };
            let request = ReloadRequest {
                // Answered only on a request inbox (see `subject::is_request_inbox`).
                reply: message.reply.filter(|r| {
                    crate::subject::is_request_inbox(r)
                        || (r.starts_with(&inbox) && !r.contains(['*', '>']))
                }),
            };
            if requests.send(request).await.is_err() {
                return;
            }
        }
    }))
}

/// Waits for the rest of a stopping host, in order: the shared loops, the component
/// sources, then the endpoints (which answer until the drain is over).
async fn finish(
    loops: Vec<JoinHandle<()>>,
    loaders: Vec<JoinHandle<()>>,
    endpoints_stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    guest_threads: GuestThreads,
) -> anyhow::Result<()> {
    {
        for result in futures::future::join_all(loops).await {
            result.context("consumer loop panicked")?;
        }
        for result in futures::future::join_all(loaders).await {
            result.context("component watcher panicked")?;
        }
        let _ = endpoints_stop.send(true);
        for result in futures::future::join_all(tasks).await {
            result.context("metrics endpoint panicked")?;
        }
        drop(guest_threads);
        Ok(())
    }
}
