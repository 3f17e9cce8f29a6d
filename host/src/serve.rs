//! A host's life, top to bottom: connect, set up streams and buckets, start the component
//! sources and one consumer loop per route, then drain and stop. The only module that knows
//! both the pipeline (which processes deliveries) and the component sources (which find and
//! install versions); both work on the routing table in [`crate::routes`].

use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::claim::kv::KvClaimStore;
use crate::claim::Claimer;
use crate::config::Config;
use crate::health::Health;
use crate::metrics::{Metrics, StatsSnapshot};
use crate::pipeline::{self, Shared};
use crate::routes::Routes;
use crate::runtime::{EngineSettings, Runtime};

/// Guests run on their own threads so that CPU-bound guests cannot starve NATS I/O,
/// heartbeats and acks, which stay on the caller's runtime.
struct GuestThreads(Option<tokio::runtime::Runtime>);

impl GuestThreads {
    fn new() -> anyhow::Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("guest")
            .enable_time()
            .build()?;
        Ok(Self(Some(rt)))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("guest runtime alive")
            .handle()
            .clone()
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A host that is consuming. Stop it with [`RunningHost::shutdown`].
pub struct RunningHost {
    instance_id: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    metrics_addr: Option<std::net::SocketAddr>,
    stop: watch::Sender<bool>,
    task: JoinHandle<anyhow::Result<()>>,
    client: async_nats::Client,
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

    /// Turns `/readyz` to 503, stops pulling, waits up to `host.shutdown_grace` for in-flight
    /// messages, flushes.
    pub async fn shutdown(self) -> anyhow::Result<StatsSnapshot> {
        self.health.drain();
        let _ = self.stop.send(true);
        self.task.await.context("host task panicked")??;
        self.client
            .flush()
            .await
            .context("flushing NATS connection")?;
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
    let mut runtime = Runtime::new(&EngineSettings {
        pool: config.pool(),
        long_running_lanes: config.lanes(),
        ..EngineSettings::default()
    })?;
    if let Some(dir) = &config.components.cache_dir {
        let dir = config.resolve(dir);
        runtime = runtime.with_cache(&dir).with_context(|| {
            format!(
                "cannot use `{}` as the compile cache (`components.cache_dir`)",
                dir.display()
            )
        })?;
    }
    let routes = Routes::unloaded(&config);
    start_with_routes(config, routes, Some(runtime)).await
}

/// Like [`start`], with routes built by the caller (benchmarks use [`crate::routes::Guest::Noop`]). With a
/// `runtime`, component files and the object store are watched for new versions; without
/// one, the routes keep the guests they were given.
pub async fn start_with_routes(
    config: Config,
    routes: Routes,
    runtime: Option<Runtime>,
) -> anyhow::Result<RunningHost> {
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
        Arc::new(KvClaimStore::new(setup.claims)),
        instance_id.clone(),
        config.claims.lease,
        config.claims.clock_skew,
    );
    let guest_threads = GuestThreads::new()?;
    let mut consumers = Vec::new();
    for route in routes.iter() {
        let consumer = crate::setup::patiently(|| {
            crate::setup::route_consumer(&setup.source, &config, &route.name, &route.subject)
        })
        .await?;
        consumers.push((consumer, Some(route.clone())));
    }
    let unrouted =
        crate::setup::patiently(|| crate::setup::unrouted_consumer(&setup.source, &config)).await?;
    if let Some(consumer) = unrouted {
        consumers.push((consumer, None));
    }
    let loaders = match runtime {
        Some(runtime) => {
            crate::components::spawn(
                &js,
                runtime,
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
    if metrics_addr.is_some() {
        tasks.push(crate::ops::endpoints::poll_consumers(
            js.clone(),
            config.clone(),
            routes.clone(),
            stopped.clone(),
        ));
    }
    health.set_up(routes.clone());
    let shared = Shared::new(js, config, routes, claimer, guest_threads.handle());
    let loops = pipeline::spawn(Arc::new(shared), consumers, &client, &stopped);
    let task = tokio::spawn(async move {
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
    });
    tracing::info!(instance_id, "host started");
    Ok(RunningHost {
        instance_id,
        metrics,
        health,
        metrics_addr,
        stop,
        task,
        client,
    })
}
