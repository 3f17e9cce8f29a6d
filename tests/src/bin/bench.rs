//! `dedup-bench`: runs dedup-host's benchmarks:
//! `dedup-bench invoke [ITERATIONS]`, `dedup-bench floor [ITERATIONS]`, `dedup-bench counts BENCH [UNITS]`, `dedup-bench pipeline [MESSAGES] [LATENCY_SAMPLES]`, `dedup-bench fairness [MESSAGES]`,
//! `dedup-bench deploy [DEPLOYS]`, `dedup-bench load [GUEST...]`,
//! `dedup-bench languages [ITERATIONS] [LANGUAGE...]`, `dedup-bench ops [MESSAGES] [ROUNDS] [AUDITED]`,
//! `dedup-bench exclusive [MESSAGES] [ROUNDS] [PARTITIONS]`, `dedup-bench scale [MESSAGES]`,
//! `dedup-bench growth routes|inflight|claims [MESSAGES]`,
//! `dedup-bench tracing|shadow|console [MESSAGES] [ROUNDS]`, `dedup-bench http [MESSAGES] [ROUNDS]`.

use std::process::ExitCode;

use dedup_host_tests::bench;

/// What `dedup-bench --help` (and a missing or unknown benchmark) prints.
const USAGE: &str = "\
dedup-bench: runs dedup-host's benchmarks (BENCHMARKS.md has their results)

Usage: dedup-bench BENCHMARK [ARGUMENTS...]

  invoke [ITERATIONS]                      one guest call, in process
  floor [ITERATIONS]                       wasmtime's floor beside the guest call
  counts BENCH [UNITS]                     instruction counts of one benchmark
  pipeline [MESSAGES] [LATENCY_SAMPLES]    the whole host against a nats-server
  fenced [MESSAGES] [LATENCY_SAMPLES]      fenced effects
  fairness [MESSAGES]                      a slow route beside a fast one
  deploy [DEPLOYS]                         deploy to first run on the new version
  load [GUEST...]                          component load times
  languages [ITERATIONS] [LANGUAGE...]     one guest per language
  ops [MESSAGES] [ROUNDS] [AUDITED]        inspect, audit and dead-letter commands
  exclusive [MESSAGES] [ROUNDS] [PARTITIONS]  exclusive routes
  scale [MESSAGES]                         many routes
  growth routes|inflight|claims [MESSAGES] how cost grows
  tracing|shadow|console [MESSAGES] [ROUNDS]
  http [MESSAGES] [ROUNDS]                 one outbound call per message, host vs hand-written
";

/// The allocator `dedup-host` runs with, so the in-process host (and the hand-written
/// baselines beside it) pay what a deployment pays.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        None => {
            eprint!("dedup-bench: name a benchmark\n\n{USAGE}");
            return ExitCode::from(2);
        }
        Some(_) => {}
    }
    // An error is a line, not a `Debug` dump with a backtrace.
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dedup-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark `args` names.
async fn run(args: &[String]) -> anyhow::Result<()> {
    // The host's own log set-up, as `dedup-host run` installs it (warnings only unless
    // RUST_LOG says otherwise, colours only on a terminal, a background writer), so the
    // per-message cost of its spans is what a deployment pays.
    let _logs = dedup_host::logging::init(dedup_host::config::LogFormat::Text);
    let which = args[0].as_str();
    let number = |i: usize, default: usize| -> anyhow::Result<usize> {
        Ok(args
            .get(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    match which {
        "invoke" => bench::invoke::run(number(1, 20_000)?).await,
        "pipeline" => bench::pipeline::run(number(1, 20_000)?, number(2, 500)?).await,
        "fenced" => bench::fenced::run(number(1, 10_000)?, number(2, 300)?).await,
        "fairness" => bench::fairness::run(number(1, 20_000)?).await,
        "languages" => bench::languages::run(number(1, 1_000)?, args.get(2..).unwrap_or(&[])).await,
        "exclusive" => bench::exclusive::run(number(1, 5_000)?, number(2, 3)?, number(3, 16)?).await,
        "ops" => bench::ops::run(number(1, 20_000)?, number(2, 3)?, number(3, 100_000)?).await,
        "scale" => bench::scale::run(number(1, 20_000)?).await,
        "growth" => {
            let part = args.get(1).map(String::as_str).unwrap_or("");
            bench::growth::run(part, number(2, 20_000)?).await
        }
        "tracing" => bench::tracing::run(number(1, 20_000)?, number(2, 3)?).await,
        "shadow" => bench::shadow::run(number(1, 20_000)?, number(2, 3)?).await,
        "console" => bench::console::run(number(1, 20_000)?, number(2, 3)?).await,
        "http" => bench::httpcall::run(number(1, 3_000)?, number(2, 3)?).await,
        // The local endpoint of the `http` benches, run as a child process of theirs.
        "endpoint" => bench::httpcall::serve_endpoint().await,
        "floor" => bench::floor::run(number(1, 20_000)?).await,
        "counts" => {
            let which = args.get(1).map(String::as_str).unwrap_or("");
            bench::counts::run(which, args.get(2).map(|s| s.parse()).transpose()?).await
        }
        "deploy" => bench::hotload::deploy_latency(number(1, 10)?).await,
        "load" => {
            let guests: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            let guests = if guests.is_empty() {
                vec!["uppercase", "ledger"]
            } else {
                guests
            };
            bench::hotload::load_times(&guests, 5)
        }
        other => anyhow::bail!(
            "unknown benchmark `{other}`; choose: invoke, floor, counts, pipeline, fenced, fairness, deploy, load, languages, ops, exclusive, scale, growth, tracing, shadow, console, http (`dedup-bench --help` says what each takes)"
        ),
    }
}
