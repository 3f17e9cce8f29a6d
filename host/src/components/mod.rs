//! Hot loading: where each route's component comes from, and swapping versions while the
//! host runs.
//!
//! - [`file`]: a route with a `component` file is served from it; the file is polled and a
//!   new version swapped in.
//! - [`store`]: a route without one is served from object `<route>` of the `components.bucket`
//!   NATS Object Store, so hosts on many machines load the same versions (`dedup-host deploy`).
//! - [`dir`]: with `components.dir`, `<route>.wasm` files there, watched by file events.
//! - [`install`]: compile off the message path, validate, swap atomically, or refuse.
//! - [`check`]: what `run` and `setup` check of component files before they act.
//! - [`status`]: each host reports the version it serves per route (`dedup-host routes`).

pub mod check;
pub mod dir;
pub mod file;
pub mod install;
pub mod status;
pub mod store;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::routes::{Route, Routes};
use crate::runtime::Runtime;

/// Starts watching the object store for the routes served from it (when there is no
/// `components.dir`) and reporting this host's versions. Component files are watched per
/// route ([`watch_route`]), as routes come and go. The tasks end when `stopped` turns true.
pub async fn spawn(
    js: &async_nats::jetstream::Context,
    runtime: Runtime,
    config: &Config,
    routes: Arc<Routes>,
    instance_id: &str,
    stopped: watch::Receiver<bool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    if config.components.dir.is_none() {
        let bucket = store::open(js, config).await?;
        tasks.push(tokio::spawn(store::watch(
            bucket,
            runtime,
            routes.clone(),
            (instance_id.to_string(), js.clone(), config.clone()),
            stopped.clone(),
        )));
    }
    let reporter = status::Reporter::open(js, config, instance_id).await?;
    tasks.push(tokio::spawn(reporter.run(routes, stopped)));
    Ok(tasks)
}

/// Starts serving one route from its source until `stopped`: its file (or
/// `components.dir/<route>.wasm`) is watched. A route served from the object store follows
/// [`store::watch`]; one added by a reload (`added`) is first offered the object stored now.
/// A file-served route also takes the candidate file beside its file
/// ([`crate::candidate::files`]); this host (`instance_id`) carries out its decisions on it.
pub fn watch_route(
    (js, instance_id): (&async_nats::jetstream::Context, &str),
    runtime: Runtime,
    config: &Config,
    route: Arc<Route>,
    added: bool,
    poke: Option<Arc<tokio::sync::Notify>>,
    stopped: watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    match route.component_file.clone() {
        Some(path) => {
            let interval = config.components.poll_interval;
            // The candidate beside the file, and what this host decides about it.
            let (actions, decided) = tokio::sync::mpsc::unbounded_channel();
            let by = instance_id.to_string();
            tokio::spawn(crate::candidate::files::execute(path.clone(), by, decided));
            let candidate = file::Slot::Candidate {
                live: path.clone(),
                actions,
            };
            let candidate_path = crate::candidate::files::candidate_path(&path);
            let (r, rt, p, s) = (
                route.clone(),
                runtime.clone(),
                poke.clone(),
                stopped.clone(),
            );
            tokio::spawn(file::watch(
                rt,
                r,
                (candidate_path, candidate),
                interval,
                p,
                s,
            ));
            let watcher = file::watch(
                runtime,
                route,
                (path, file::Slot::Live),
                interval,
                poke,
                stopped,
            );
            Some(tokio::spawn(watcher))
        }
        None if added => {
            let (js, bucket) = (js.clone(), config.components.bucket.clone());
            Some(tokio::spawn(async move {
                store::offer_current(&js, &bucket, &runtime, &route).await
            }))
        }
        None => None,
    }
}
