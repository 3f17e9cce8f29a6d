//! Installing a new version of a route's component: compile on a blocking thread (off the
//! message path), validate against the host's contract and the route's limits, then swap.

use std::path::Path;

use crate::routes::{Guest, Route};
use crate::runtime::Runtime;

/// What became of a version offered to a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// It serves from now on.
    Swapped {
        /// The new version's digest.
        digest: String,
    },
    /// The route already serves these exact bytes.
    Unchanged,
    /// It was refused; the previous version (if any) keeps serving.
    Refused {
        /// Why, naming the source.
        reason: String,
    },
}

/// Offers `bytes` (from `origin`, a file path or an object name, for messages) to `route`.
pub async fn offer(runtime: &Runtime, route: &Route, origin: &str, bytes: Vec<u8>) -> Installed {
    let digest = crate::runtime::digest(&bytes);
    let current = route.guest();
    if current.as_ref().is_some_and(|g| g.digest() == digest) {
        return Installed::Unchanged;
    }
    if bytes.len() > route.max_component_bytes {
        let reason = format!(
            "component `{origin}` is {} bytes, over route `{}`'s max_component_bytes of {}: raise `routes[].max_component_bytes` or ship a smaller component",
            bytes.len(),
            route.name,
            route.max_component_bytes
        );
        return refuse(route, current.as_ref(), reason);
    }
    // One compile at a time in this process: the CPU time this process uses meanwhile is then
    // the compile's (plus what guests use beside it), and a second route offered the same
    // component finds it in the compile cache instead of compiling it again.
    let _compiling = COMPILES.acquire().await.expect("never closed");
    let loader = runtime.clone();
    let name = origin.to_string();
    let compile =
        tokio::task::spawn_blocking(move || loader.load_digested(Path::new(&name), &bytes, digest));
    // A compile past the bound is refused; its thread finishes in the background. The bound is
    // the CPU time the compile uses (rule 21): a machine busy with other work stretches its wall
    // time, not its CPU time. Wall time is bounded too, far looser, so a starved compile ends.
    let handler = match bounded(compile, route.compile_timeout).await {
        Ok(Ok(Ok(handler))) => handler,
        Ok(Ok(Err(e))) => return refuse(route, current.as_ref(), e.to_string()),
        Ok(Err(e)) => {
            return refuse(
                route,
                current.as_ref(),
                format!("`{origin}`: compiler task failed: {e}"),
            )
        }
        Err(spent) => {
            let reason = format!(
                "component `{origin}` took more than route `{}`'s compile_timeout of {:?} to compile ({spent}): raise `routes[].compile_timeout` or ship a smaller component",
                route.name, route.compile_timeout
            );
            return refuse(route, current.as_ref(), reason);
        }
    };
    if let Err(trap) = handler.probe(&route.options).await {
        let reason = format!(
            "component `{origin}`: cannot be instantiated within route `{}`'s limits: {trap}",
            route.name
        );
        return refuse(route, current.as_ref(), reason);
    }
    let digest = handler.digest().to_string();
    let previous = route.serve(Some(Guest::Wasm(handler)));
    tracing::info!(
        route = %route.name,
        digest,
        previous = previous.as_ref().map(|g| g.digest()).unwrap_or("none"),
        origin,
        "now serving a new version"
    );
    Installed::Swapped { digest }
}

/// Compiles run one at a time (see [`offer`]).
static COMPILES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// How many times `compile_timeout` a compile may take in wall time, on a starved machine.
const WALL_FACTOR: u32 = 10;

/// Awaits `compile` while this process has used at most `cpu` of CPU time since it began (the
/// compile's own threads, mostly) and at most [`WALL_FACTOR`] times that in wall time; past
/// either, says what was spent.
async fn bounded<T>(
    mut compile: tokio::task::JoinHandle<T>,
    cpu: std::time::Duration,
) -> Result<Result<T, tokio::task::JoinError>, String> {
    let (cpu_start, wall_start) = (crate::cpu::process_cpu(), std::time::Instant::now());
    let period = (cpu / 4).clamp(
        std::time::Duration::from_millis(1),
        std::time::Duration::from_millis(100),
    );
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            done = &mut compile => return Ok(done),
            _ = tick.tick() => {
                let (used, wall) = (crate::cpu::process_cpu() - cpu_start, wall_start.elapsed());
                if used > cpu || wall > cpu * WALL_FACTOR {
                    return Err(format!("{used:?} of CPU time in {wall:?}"));
                }
            }
        }
    }
}

/// Stops serving `route` (its component was removed); its messages wait in the stream.
pub fn remove(route: &Route, origin: &str) {
    if let Some(previous) = route.serve(None) {
        tracing::warn!(route = %route.name, previous = previous.digest(), origin, "component removed: no longer consuming the route's subjects");
    }
}

fn refuse(route: &Route, current: Option<&Guest>, reason: String) -> Installed {
    let serving = current.map(|g| g.digest()).unwrap_or("nothing");
    tracing::error!(route = %route.name, serving, "refused a new version, still serving the previous one: {reason}");
    route.refuse(reason.clone());
    Installed::Refused { reason }
}
