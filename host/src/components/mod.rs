//! Hot loading: where each route's component comes from, and swapping versions while the
//! host runs.
//!
//! - [`file`]: a route with a `component` file is served from it; the file is polled and a
//!   new version swapped in.
//! - [`store`]: a route without one is served from object `<route>` of the `components.bucket`
//!   NATS Object Store, so hosts on many machines load the same versions (`dedup-host deploy`).
//! - [`install`]: compile off the message path, validate, swap atomically, or refuse.
//! - [`status`]: each host reports the version it serves per route (`dedup-host routes`).

pub mod file;
pub mod install;
pub mod status;
pub mod store;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::routes::Routes;
use crate::runtime::Runtime;

/// Starts watching every route's component source and reporting this host's versions.
/// The tasks end when `stopped` turns true.
pub async fn spawn(
    js: &async_nats::jetstream::Context,
    runtime: Runtime,
    config: &Config,
    routes: Arc<Routes>,
    instance_id: &str,
    stopped: watch::Receiver<bool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for route in routes.iter() {
        if let Some(path) = &route.component_file {
            let watcher = file::watch(
                runtime.clone(),
                route.clone(),
                path.clone(),
                config.components.poll_interval,
                stopped.clone(),
            );
            tasks.push(tokio::spawn(watcher));
        }
    }
    if routes.iter().any(|r| r.component_file.is_none()) {
        let bucket = store::open(js, config).await?;
        tasks.push(tokio::spawn(store::watch(
            bucket,
            runtime,
            routes.clone(),
            stopped.clone(),
        )));
    }
    let reporter = status::Reporter::open(js, config, instance_id).await?;
    tasks.push(tokio::spawn(reporter.run(routes, stopped)));
    Ok(tasks)
}
