//! Installing a new version of a route's component: compile on a blocking thread (off the
//! message path), validate against the host's contract and the route's limits, then swap.

use std::path::Path;

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::candidate::{Action, Candidate, Spec};
use crate::routes::{Guest, Route};
use crate::runtime::{Compiled, Handler, Runtime};

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
    let handler = match check(runtime, route, origin, bytes).await {
        Ok(handler) => handler,
        Err(reason) => return refuse(route, current.as_ref(), reason),
    };
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

/// Compiles `bytes` (from `origin`) for `route` off the message path and checks it against the
/// route's limits; says why not, naming the source and the fix.
pub async fn check(
    runtime: &Runtime,
    route: &Route,
    origin: &str,
    bytes: Vec<u8>,
) -> Result<Handler, String> {
    let digest = crate::runtime::digest(&bytes);
    if bytes.len() > route.max_component_bytes {
        let reason = format!(
            "component `{origin}` is {} bytes, over route `{}`'s max_component_bytes of {}: raise `routes[].max_component_bytes` or ship a smaller component",
            bytes.len(),
            route.name,
            route.max_component_bytes
        );
        return Err(reason);
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
    // time, not its CPU time, so a starved compile is waited for (with a warning), and only
    // one that stays starved far past the bound is refused, as retried later.
    let handler = match bounded(compile, route.compile_timeout, crate::cpu::process_cpu).await {
        Ok(Ok(Ok(handler))) => handler,
        Ok(Ok(Err(e))) => return Err(e.to_string()),
        Ok(Err(e)) => return Err(format!("`{origin}`: compiler task failed: {e}")),
        Err(spent) => {
            let reason = match spent.over_cpu {
                true => format!(
                    "component `{origin}` took more than route `{}`'s compile_timeout of {:?} of CPU time to compile ({spent}): raise `routes[].compile_timeout` or ship a smaller component",
                    route.name, route.compile_timeout
                ),
                false => format!(
                    "component `{origin}` did not finish compiling in {spent} although it stayed within route `{}`'s compile_timeout of {:?} of CPU time: the machine is too busy; deploy it again once it is quieter",
                    route.name, route.compile_timeout
                ),
            };
            return Err(reason);
        }
    };
    // A log line an operator (and the compile-once test) reads: a host compiles a version
    // once per machine, and not at all when `test` or `deploy` compiled it here already.
    match handler.compiled() {
        Compiled::Fresh => tracing::info!("route `{}`: compiled `{origin}`", route.name),
        Compiled::Cached => tracing::info!(
            "route `{}`: `{origin}` loaded from the compile cache (this version was compiled earlier on this machine), nothing compiled now",
            route.name
        ),
    }
    if handler.imports_http() && route.options.http.is_none() {
        let reason = format!(
            "component `{origin}` imports `wasi:http/outgoing-handler`, which route `{}` does not grant: add `[routes.http]` with an `allow` list to the route, or ship a component that makes no HTTP calls",
            route.name
        );
        return Err(reason);
    }
    if let Err(trap) = handler.probe(&route.options).await {
        let reason = format!(
            "component `{origin}`: cannot be instantiated within route `{}`'s limits: {trap}; raise the limit it names in `routes[].limits` (`memory_bytes`, say) or ship a component that fits",
            route.name
        );
        return Err(reason);
    }
    Ok(handler)
}

/// Offers `bytes` to `route` as its candidate per `spec` (a rolled-back spec, or `None`,
/// drops the candidate). A candidate that does not compile is refused and logged; the live
/// version is never touched.
pub async fn offer_candidate(
    runtime: &Runtime,
    route: &Route,
    origin: &str,
    candidate: Option<(Vec<u8>, Spec)>,
    actions: &mpsc::UnboundedSender<Action>,
) {
    let Some((bytes, spec)) = candidate.filter(|(_, spec)| spec.running()) else {
        if let Some(previous) = route.candidate() {
            tracing::warn!(route = %route.name, candidate = previous.digest(), origin, "candidate dropped");
            route.set_candidate(None);
        }
        return;
    };
    if route.candidate().is_some_and(|c| c.spec == spec) {
        return;
    }
    if let Some(reason) = crate::candidate::refusal(&route.name, route.claim_after, &spec.mode) {
        tracing::error!(route = %route.name, origin, "refused a candidate: {reason}");
        return route.set_candidate(None);
    }
    match check(runtime, route, origin, bytes).await {
        Ok(handler) => {
            tracing::info!(route = %route.name, candidate = handler.digest(), mode = spec.mode.label(), origin, "running a candidate beside the live version");
            let candidate = Candidate::new(&route.name, spec, handler, actions.clone());
            route.set_candidate(Some(Arc::new(candidate)));
        }
        Err(reason) => {
            tracing::error!(route = %route.name, origin, "refused a candidate: {reason}");
            route.set_candidate(None);
        }
    }
}

/// Compiles run one at a time (see [`offer`]).
static COMPILES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// How many times `compile_timeout` a compile may take in wall time before the host warns
/// that the machine starves it; it is refused after [`WALL_ROUNDS`] such warnings.
const WALL_FACTOR: u32 = 10;

/// How many rounds of [`WALL_FACTOR`] × `compile_timeout` a starved compile is waited for.
const WALL_ROUNDS: u32 = 4;

/// What a compile had spent when it was stopped.
#[derive(Debug)]
struct Spent {
    cpu: std::time::Duration,
    wall: std::time::Duration,
    /// Stopped for its CPU time (its own fault), not for a starved machine's wall time.
    over_cpu: bool,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} of CPU time in {:?}", self.cpu, self.wall)
    }
}

/// Awaits `compile` while this process has used at most `cpu` of CPU time (read from `clock`)
/// since it began (the compile's own threads, mostly). Wall time is only a safeguard: a compile
/// the machine starves is waited for [`WALL_ROUNDS`] times [`WALL_FACTOR`] × `cpu`, with a
/// warning each round; past either, says what was spent.
async fn bounded<T>(
    mut compile: tokio::task::JoinHandle<T>,
    cpu: std::time::Duration,
    clock: fn() -> std::time::Duration,
) -> Result<Result<T, tokio::task::JoinError>, Spent> {
    let (cpu_start, wall_start) = (clock(), std::time::Instant::now());
    let period = (cpu / 4).clamp(
        std::time::Duration::from_millis(1),
        std::time::Duration::from_millis(100),
    );
    let mut tick = tokio::time::interval(period);
    let mut rounds = 0;
    loop {
        tokio::select! {
            done = &mut compile => return Ok(done),
            _ = tick.tick() => {
                let (used, wall) = (clock().saturating_sub(cpu_start), wall_start.elapsed());
                let spent = |over_cpu| Spent { cpu: used, wall, over_cpu };
                if used > cpu {
                    return Err(spent(true));
                }
                if wall > cpu * WALL_FACTOR * (rounds + 1) {
                    rounds += 1;
                    if rounds >= WALL_ROUNDS {
                        return Err(spent(false));
                    }
                    tracing::warn!("a compile is starved by a busy machine ({}), still waiting for it", spent(false));
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
    match current {
        Some(serving) => {
            tracing::error!(route = %route.name, serving = serving.digest(), "refused a new version, still serving the previous one: {reason}")
        }
        None => {
            tracing::error!(route = %route.name, "refused its component; the route is not served (its messages wait in the stream) until a version that loads arrives: {reason}")
        }
    }
    route.refuse(reason.clone());
    Installed::Refused { reason }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn no_cpu() -> Duration {
        Duration::ZERO
    }

    fn burning_cpu() -> Duration {
        // A clock that advances 1 s per read: every check finds the budget spent.
        static READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Duration::from_secs(READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    #[tokio::test]
    async fn a_compile_the_machine_starves_is_waited_for_not_refused() {
        // 2 ms of CPU allowed, 20 ms of wall time per round: a compile that takes 50 ms of wall
        // time and no CPU (a starved one) spans three rounds and still lands.
        let compile = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(50)));
        let done = bounded(compile, Duration::from_millis(2), no_cpu).await;
        assert!(matches!(done, Ok(Ok(()))), "{done:?}");
    }

    #[tokio::test]
    async fn a_compile_starved_past_every_round_is_refused_as_the_machine_s_fault() {
        let compile =
            tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(500)));
        let Err(spent) = bounded(compile, Duration::from_millis(2), no_cpu).await else {
            panic!("a compile starved for 500 ms against 80 ms of rounds must be refused");
        };
        assert!(!spent.over_cpu, "{spent}");
    }

    #[tokio::test]
    async fn a_compile_over_its_cpu_budget_is_refused_as_its_own_fault() {
        let compile =
            tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(500)));
        let Err(spent) = bounded(compile, Duration::from_millis(500), burning_cpu).await else {
            panic!("a compile over its CPU budget must be refused");
        };
        assert!(spent.over_cpu, "{spent}");
    }
}
