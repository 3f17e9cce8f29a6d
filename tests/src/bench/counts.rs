//! Instruction-count benches: `dedup-bench counts BENCH [N]`, run under
//! `valgrind --tool=callgrind` by `tests/instructions.sh`, which compares the counts with
//! `tests/instructions.baseline`. Each bench warms up, then marks its measured part with
//! callgrind dumps ([`super::callgrind`]): the dump named `work` holds the instructions of
//! exactly `N` units of work, across every thread of the process (the host runs in it; the
//! nats-server is another process, not counted). Where the work includes publishing the
//! messages (the host benches), a dump named `base` holds the same client publishing alone,
//! and the script subtracts it, so the figure is the host side per message.
//!
//! Outside valgrind the benches still run (the dumps do nothing), which checks they work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, Context};
use dedup_host::routes::{Guest, Routes};
use dedup_host::runtime::engine::PoolTotals;
use dedup_host::runtime::{CompileCache, EngineSettings, Handler, InvokeOptions, Outcome, Runtime};
use dedup_host::serve;

use super::callgrind::{dump, running_on_valgrind};
use super::floor::{event, Floor, FloorCode};
use super::handguard::{self, Ack, Guard};
use super::pipeline::{guarded_config, Effects};
use super::publish_many;
use crate::guests::guest;
use crate::nats::NatsServer;

/// Every bench, with its default unit count under callgrind (kept small: callgrind runs
/// code about 50 times slower; an interpreter's invocation is a few million instructions).
/// Python and JavaScript compile for a named target ([`PORTABLE_TARGET`]), so
/// `tests/instructions.sh` compiles them outside valgrind first ([`PRECOMPILED`]).
pub const BENCHES: &[(&str, usize)] = &[
    ("invoke-rust", 200),
    ("invoke-c", 200),
    ("invoke-python", 20),
    ("invoke-js", 20),
    ("invoke-uppercase", 200),
    ("floor-rust", 200),
    ("floor-c", 200),
    ("floor-armed-rust", 200),
    ("floor-armed-c", 200),
    ("guard", 300),
    ("pipeline", 300),
    ("fenced", 300),
    ("hand-2b", 300),
    ("hand-2c", 300),
    ("http-host", 200),
    ("http-hand", 200),
    ("http-nocall", 200),
];

/// Messages (or invocations) each bench runs before its measured part.
pub(super) const WARM_UP: usize = 100;

/// The conformance guests' options: mode `upper` (what the language benches run).
pub fn upper() -> InvokeOptions {
    InvokeOptions {
        config: Arc::new([("mode".to_string(), "upper".to_string())].into()),
        ..InvokeOptions::default()
    }
}

/// The host's engine with a pool of 16 instances: valgrind lets a process reserve far less
/// address space than the default pool's 144 GiB. Slot size and code settings are the
/// default's, so the instructions per invocation are the same.
fn engine_settings() -> EngineSettings {
    EngineSettings {
        pool: PoolTotals::for_instances(16),
        ..EngineSettings::default()
    }
}

/// The benches whose guests are too big to compile under callgrind (18 MB of Python, 9 MB of
/// JavaScript: over ten minutes). Their engine compiles for [`PORTABLE_TARGET`], whose
/// features do not depend on what the CPU reports (valgrind reports fewer than the CPU has),
/// so a run outside valgrind (`dedup-bench counts invoke-python 1`) leaves the compile-cache
/// entry that the run under callgrind loads.
pub const PRECOMPILED: &[&str] = &["invoke-python", "invoke-js"];

/// The target the [`PRECOMPILED`] benches compile for: x86-64 with its baseline features.
const PORTABLE_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Runs bench `which` with `units` units of work (its default when `None`), printing
/// `counts: BENCH UNITS` for the script.
pub async fn run(which: &str, units: Option<usize>) -> anyhow::Result<()> {
    let Some(&(_, default)) = BENCHES.iter().find(|(name, _)| *name == which) else {
        let names: Vec<&str> = BENCHES.iter().map(|(name, _)| *name).collect();
        anyhow::bail!("unknown count bench `{which}`; choose one of {names:?}");
    };
    let n = units.unwrap_or(default);
    match which {
        "floor-rust" | "floor-c" => {
            floor(&which.replace("floor", "conformance"), n, FloorCode::Bare).await?
        }
        "floor-armed-rust" | "floor-armed-c" => {
            let name = which.replace("floor-armed", "conformance");
            floor(&name, n, FloorCode::Armed).await?
        }
        "guard" => host(Hosted::Noop, n).await?,
        "pipeline" => host(Hosted::Wasm(Effects::Window), n).await?,
        "fenced" => host(Hosted::Wasm(Effects::Fenced), n).await?,
        "hand-2b" => hand(Guard::Record, n).await?,
        "hand-2c" => hand(Guard::Output, n).await?,
        "http-host" => super::httpcall::counts_host(n, true).await?,
        "http-nocall" => super::httpcall::counts_host(n, false).await?,
        "http-hand" => super::httpcall::counts_hand(n).await?,
        "invoke-uppercase" => invoke("uppercase", n, as_routed(), engine_settings()).await?,
        "invoke-python" | "invoke-js" => {
            let name = which.replace("invoke-js", "invoke-javascript");
            let settings = EngineSettings {
                target: Some(PORTABLE_TARGET.to_string()),
                ..engine_settings()
            };
            invoke(&name.replace("invoke", "conformance"), n, upper(), settings).await?
        }
        _ => {
            let name = which.replace("invoke", "conformance");
            invoke(&name, n, upper(), engine_settings()).await?
        }
    }
    println!("counts: {which} {n}");
    Ok(())
}

/// The options the `pipeline` bench's route gives `uppercase`: default limits, its one
/// output allowed. With them, `invoke-uppercase` is the pipeline's guest call alone.
fn as_routed() -> InvokeOptions {
    InvokeOptions {
        allowed_outputs: Some(Arc::from(["bench.in.done".to_string()])),
        ..InvokeOptions::default()
    }
}

/// `n` host invocations of guest `name` with `options` (limits armed, as the host runs
/// them) on an engine built with `settings`. Compiled components are cached in the temp dir,
/// so only the first run of a language compiles. Under valgrind, a component of a
/// [`PRECOMPILED`] bench must already be in that cache.
async fn invoke(
    name: &str,
    n: usize,
    options: InvokeOptions,
    settings: EngineSettings,
) -> anyhow::Result<()> {
    let cache = std::env::temp_dir().join("dedup-counts-cache");
    std::fs::create_dir_all(&cache)?;
    let runtime = Runtime::new(&settings)?.with_cache(&cache)?;
    let path = guest(name);
    if settings.target.is_some() && running_on_valgrind() {
        let digest = dedup_host::runtime::digest(&std::fs::read(&path)?);
        let entry = CompileCache::open(&cache, runtime.engine())?.entry(&digest);
        anyhow::ensure!(
            entry.exists(),
            "`{name}` is not compiled yet (no `{}`), and compiling it under valgrind takes over ten minutes: run `dedup-bench counts` of this bench once outside valgrind first (tests/instructions.sh does)",
            entry.display()
        );
    }
    let handler = runtime.load_file(&path)?;
    for i in 0..WARM_UP.min(n) {
        invoke_once(&handler, &options, i).await?;
    }
    dump("warm");
    for i in 0..n {
        invoke_once(&handler, &options, i).await?;
    }
    dump("work");
    Ok(())
}

/// One invocation of `handler` on event `i`, which must succeed.
async fn invoke_once(handler: &Handler, options: &InvokeOptions, i: usize) -> anyhow::Result<()> {
    let outcome = handler.invoke(event(i), options).await.outcome;
    anyhow::ensure!(
        matches!(outcome, Outcome::Success(_)),
        "{}: unexpected {outcome:?}",
        handler.name()
    );
    Ok(())
}

/// `n` floor calls of guest `name` compiled as `code` says ((2d) when bare).
async fn floor(name: &str, n: usize, code: FloorCode) -> anyhow::Result<()> {
    let floor = Floor::load(name, &engine_settings(), code)?;
    for i in 0..WARM_UP.min(n) {
        floor.call(event(i)).await?;
    }
    dump("warm");
    for i in 0..n {
        floor.call(event(i)).await?;
    }
    dump("work");
    Ok(())
}

/// What guards the messages of a host bench.
enum Hosted {
    /// The host with the no-op guest (scenario (2)).
    Noop,
    /// The host with `uppercase` and one output per message (scenarios (3), (5)).
    Wasm(Effects),
}

/// The payload of the host benches' messages (but `http-host`'s and `http-hand`'s).
const PAYLOAD: [u8; 1024] = [b'a'; 1024];

/// The dump named `base`: `n` messages of `payload` published (as the host benches publish
/// theirs) to a stream nobody consumes, so the script can take the client's side out of
/// `work`.
pub(super) async fn publishing_alone(js: &Context, n: usize, payload: &[u8]) -> anyhow::Result<()> {
    super::pull_consumer(js, "PUBONLY", "pubonly.>", "idle").await?;
    publish_many(js, "pubonly.warm", "pubonly-warm", WARM_UP, payload).await?;
    dump("setup");
    publish_many(js, "pubonly.x", "pubonly", n, payload).await?;
    dump("base");
    Ok(())
}

/// Publishes `n` messages of `payload` on `subject` and waits until `settled()` reaches
/// `target`. Polls every 20 ms, so the waiting costs few instructions however slowly
/// callgrind runs.
pub(super) async fn drain(
    js: &Context,
    (subject, prefix): (&str, &str),
    n: usize,
    payload: &[u8],
    target: u64,
    settled: impl Fn() -> u64,
) -> anyhow::Result<()> {
    publish_many(js, subject, prefix, n, payload).await?;
    while settled() < target {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `n` messages through an in-process host on a fresh nats-server.
async fn host(hosted: Hosted, n: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    publishing_alone(&js, n, &PAYLOAD).await?;
    let (name, effects) = match hosted {
        Hosted::Noop => ("noop", None),
        Hosted::Wasm(Effects::Fenced) => ("fenced", Some(Effects::Fenced)),
        Hosted::Wasm(effects) => ("wasm", Some(effects)),
    };
    let config = guarded_config(&server, name, effects)?;
    let running = match hosted {
        Hosted::Wasm(_) => serve::start(config).await?,
        Hosted::Noop => {
            let routes = Routes::with_guest(&config, Guest::Noop);
            serve::start_with_routes(config, routes, None).await?
        }
    };
    let processed = || running.stats().processed;
    let subject = |part: &str| format!("g{name}.in.{part}");
    let warm = WARM_UP as u64;
    drain(
        &js,
        (&subject("warm"), "warm"),
        WARM_UP,
        &PAYLOAD,
        warm,
        processed,
    )
    .await?;
    dump("warm");
    drain(
        &js,
        (&subject("x"), "x"),
        n,
        &PAYLOAD,
        warm + n as u64,
        processed,
    )
    .await?;
    dump("work");
    running.shutdown().await?;
    Ok(())
}

/// `n` messages through the hand-written guard `guard` with a plain ack ((2b), (2c)).
async fn hand(guard: Guard, n: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    publishing_alone(&js, n, &PAYLOAD).await?;
    let (worker, settled) = handguard::start(&js, "hand", guard, Ack::Plain).await?;
    let count = |settled: &Arc<AtomicU64>| {
        let settled = settled.clone();
        move || settled.load(Ordering::Relaxed)
    };
    let warm = WARM_UP as u64;
    drain(
        &js,
        ("hand.warm", "warm"),
        WARM_UP,
        &PAYLOAD,
        warm,
        count(&settled),
    )
    .await?;
    dump("warm");
    drain(
        &js,
        ("hand.x", "x"),
        n,
        &PAYLOAD,
        warm + n as u64,
        count(&settled),
    )
    .await?;
    dump("work");
    worker.abort();
    Ok(())
}
