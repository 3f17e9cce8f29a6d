//! `dedup-host dev [--config FILE] [--demo | --watch [DIR]]`: the embedded default. Starts a
//! local nats-server when the config names none, and with `--demo` publishes a batch of
//! example events, waits for them to settle, prints what happened and exits. With `--watch`
//! it also rebuilds, tests and deploys a handler project on every save (`watch.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::Context as JetStream;
use async_nats::HeaderMap;
use clap::Args;

use crate::config::Config;
use crate::dev::{data_dir, LocalServer, Port};
use crate::inspect::stream_messages;
use crate::ops::story::Target;
use crate::pipeline::effects::headers;
use crate::serve;

/// The configuration used when `--config` is not given.
const DEMO_CONFIG: &str = include_str!("../../demo.toml");
/// Its file, which the demo's host processes read.
const DEMO_CONFIG_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo.toml");
/// How long the demo waits for its events to settle.
const DEMO_TIMEOUT: Duration = Duration::from_secs(60);

/// Flags of `dedup-host dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// The TOML configuration (default: the built-in demo config, `host/demo.toml`).
    #[arg(long, value_name = "FILE", env = "DEDUP_HOST_CONFIG")]
    config: Option<PathBuf>,
    /// Publish example events (duplicates, a retry, a rejection), print the outcome, exit.
    #[arg(long)]
    demo: bool,
    /// The port of the local nats-server, when the config names no server (default 4222;
    /// refused when taken; 0: any free port, as `--any-port`). `--demo` takes any free port
    /// unless this is given.
    #[arg(long, value_name = "N", conflicts_with = "any_port")]
    port: Option<u16>,
    /// Start the local nats-server on any free port (its URL is printed, and commands run
    /// beside it find it).
    #[arg(long)]
    any_port: bool,
    /// Watch the handler project in DIR (default: this folder): every save builds it, runs
    /// its `cases.toml` and, when every case passes, deploys it to `--route` and prints the
    /// first outputs of live traffic. A failed build or case deploys nothing.
    #[arg(
        long,
        value_name = "DIR",
        num_args = 0..=1,
        default_missing_value = ".",
        conflicts_with = "demo"
    )]
    watch: Option<PathBuf>,
    /// The route `--watch` deploys to, served from the object store (default: the route
    /// named like the project; any other route must be named).
    #[arg(long, value_name = "NAME", requires = "watch")]
    route: Option<String>,
    #[command(flatten)]
    serve: super::run::ServeFlags,
}

/// Runs the host against a local server (started when the config names none).
pub async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let mut config = load(args.config.as_deref())?;
    // Checked before anything starts: a project to watch and a route to deploy it to.
    let watch = (args.watch.as_deref())
        .map(|dir| {
            let (route, file) = (args.route.as_deref(), args.config.as_deref());
            super::watch::Watch::new(dir, route, &config, file)
        })
        .transpose()?;
    let _log = if args.demo {
        args.serve.apply(&mut config)
    } else {
        // The dev loop shows problems and version swaps; `RUST_LOG` still wins.
        args.serve.overrides(&mut config);
        crate::logging::init_with_default(config.host.log_format, crate::logging::DEV_FILTER)
    };
    let store = data_dir().join(if args.demo { "demo" } else { "nats" });
    if args.demo {
        // A fresh store, so every demo run shows first-time processing.
        let _ = std::fs::remove_dir_all(&store);
    }
    let _server = if config.nats.urls.is_empty() {
        let server = LocalServer::start(&store, args.local_port())?;
        eprintln!(
            "dedup-host dev: started nats-server at {} (data in {})",
            server.url(),
            store.display()
        );
        if !args.demo {
            // Commands run beside it find it: by this file (with a config that names no
            // server) or by the environment variable every command reads.
            let _ = std::fs::write(crate::dev::url_file(), server.url());
            eprintln!(
                "dedup-host dev: in another shell: export DEDUP_HOST_NATS_URL={}",
                server.url()
            );
        }
        config.nats.urls = vec![server.url().to_string()];
        Some(UrlFileGuard(server))
    } else {
        None
    };
    if args.demo {
        let file =
            (args.config.clone()).unwrap_or_else(|| Path::new(DEMO_CONFIG_FILE).to_path_buf());
        demo(config, &file).await?;
    } else {
        let urls = config.nats.urls.clone();
        let watching = watch.map(|w| w.start(urls.clone()));
        let served = super::run::serve(config, || {
            let mut config = load(args.config.as_deref())?;
            config.nats.urls = urls.clone();
            args.serve.overrides(&mut config);
            Ok(config)
        })
        .await;
        if let Some(task) = watching {
            task.abort();
            // A build in progress runs on a blocking thread that abort cannot stop, and the
            // runtime would wait for it on return: with the host stopped, the local server is
            // stopped and the process ends at once.
            drop(_server);
            let code = match served {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("dedup-host: error: {}", crate::text::error_chain(&e));
                    2
                }
            };
            drop(_log);
            std::process::exit(code);
        }
        served?;
    }
    Ok(ExitCode::SUCCESS)
}

impl DevArgs {
    /// Whether it serves until stopped (the demo prints and exits, so a closed pipe may end
    /// it as it ends any printing command: its nats-server goes with it).
    pub fn serves(&self) -> bool {
        !self.demo
    }

    /// Where the local nats-server listens: `--port`, any free port (`--port 0`,
    /// `--any-port`, or the demo, whose server is its own), else NATS's usual port.
    fn local_port(&self) -> Port {
        match self.port {
            Some(0) => Port::AnyFree,
            Some(port) => Port::Exactly(port),
            None if self.any_port || self.demo => Port::AnyFree,
            None => Port::Exactly(crate::dev::DEFAULT_PORT),
        }
    }
}

/// The local server, and the URL file beside it removed when `dev` ends.
struct UrlFileGuard(LocalServer);

impl Drop for UrlFileGuard {
    fn drop(&mut self) {
        let written = crate::dev::running_url(std::path::Path::new("."));
        if written.as_deref() == Some(self.0.url()) {
            let _ = std::fs::remove_file(crate::dev::url_file());
        }
    }
}

/// The config file, or the built-in demo config.
fn load(path: Option<&Path>) -> Result<Config, crate::config::ConfigError> {
    match path {
        Some(path) => Config::load(path),
        None => Config::parse(
            DEMO_CONFIG,
            Path::new("host/demo.toml"),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ),
    }
}

/// One demo event.
struct DemoEvent {
    subject: &'static str,
    msg_id: &'static str,
    payload: &'static str,
    note: &'static str,
}

const fn ev(
    subject: &'static str,
    msg_id: &'static str,
    payload: &'static str,
    note: &'static str,
) -> DemoEvent {
    DemoEvent {
        subject,
        msg_id,
        payload,
        note,
    }
}

const EVENTS: &[DemoEvent] = &[
    ev(
        "demo.upper.greeting",
        "u-1",
        "hello, exactly-once world",
        "upper-cased",
    ),
    ev(
        "demo.upper.greeting",
        "u-1",
        "hello, exactly-once world",
        "same Nats-Msg-Id again: the stream drops it",
    ),
    ev(
        "demo.upper.note",
        "u-2",
        "wasm guests only compute",
        "upper-cased",
    ),
    ev(
        "demo.ledger.adjust",
        "l-1",
        r#"{"account":"acc-1","amount":2500,"transaction_id":"tx-1"}"#,
        "ledger entry",
    ),
    ev(
        "demo.ledger.adjust",
        "l-2",
        r#"{"account":"acc-2","amount":-700,"transaction_id":"tx-2"}"#,
        "ledger entry",
    ),
    ev(
        "demo.ledger.adjust",
        "l-4",
        r#"{"account":"acc-1","amount":-400,"transaction_id":"tx-4"}"#,
        "same account as tx-1: waits for it",
    ),
    ev(
        "demo.ledger.adjust",
        "l-1-resend",
        r#"{"account":"acc-1","amount":2500,"transaction_id":"tx-1"}"#,
        "new message id, same transaction: the claim skips it",
    ),
    ev(
        "demo.ledger.adjust",
        "l-bad",
        r#"{"account":"acc-3","amount":"lots","transaction_id":"tx-3"}"#,
        "malformed: rejected, dead-lettered",
    ),
    ev(
        "demo.flaky.job",
        "f-1",
        "nightly report",
        "fails on attempt 1, retried, succeeds on attempt 2",
    ),
    ev(
        "demo.sandbox.purge",
        "s-1",
        "emit:demo.sandbox.purge.done\u{1f}Nats-Rollup\u{1f}all",
        "a guest tries to purge the output stream: refused, dead-lettered",
    ),
    ev(
        "demo.unrouted.x",
        "x-1",
        "nobody handles me",
        "no route: dead-lettered",
    ),
];

/// The demo on `config`, read from `config_file`.
async fn demo(mut config: Config, config_file: &Path) -> anyhow::Result<()> {
    let outputs_streams: Vec<String> = config
        .output_streams
        .iter()
        .map(|o| o.name.clone())
        .collect();
    let dead_stream = config.dead_letter.stream.clone();
    let client = crate::connect::connect(&config, "dedup-host demo publisher").await?;
    let js = async_nats::jetstream::new(client);
    let candidate = super::demo_shadow::prepare(&js, &mut config).await?;
    let audit_config = config.clone();
    let host = serve::start(config).await?;
    super::demo_shadow::wait_running(&js, &audit_config, candidate).await?;

    println!("Publishing {} events:", EVENTS.len());
    let mut stored = 0;
    for e in EVENTS {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", e.msg_id);
        let ack = js
            .publish_with_headers(e.subject, h, e.payload.into())
            .await?
            .await?;
        stored += usize::from(!ack.duplicate);
        let dup = if ack.duplicate {
            " [stream duplicate]"
        } else {
            ""
        };
        println!("  {:<22} id={:<11} {}{dup}", e.subject, e.msg_id, e.note);
    }

    let started = Instant::now();
    loop {
        let s = host.stats();
        if (s.processed + s.duplicates + s.dead_lettered) as usize >= stored {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < DEMO_TIMEOUT,
            "demo events did not settle within {DEMO_TIMEOUT:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = super::demo_modes::late_rerun(&js, &audit_config).await?;
    let fenced = super::demo_modes::stale_commit(&js, &audit_config).await?;
    let console = super::demo_console::check(&audit_config).await?;
    let scrape = host.metrics().encode();
    let (hits, batches) = (dedup_hits(&scrape), fenced_batches(&scrape));
    let stats = host.shutdown().await?;
    let settled = started.elapsed();
    let urls = audit_config.nats.urls.join(",");
    let calls = super::demo_calls::run(&js, &audit_config, config_file, &urls).await?;

    println!("\nWhat happened ({:.1} s):", settled.as_secs_f64());
    println!("  processed            {}", stats.processed);
    println!(
        "  duplicates skipped   {} by the stream (same Nats-Msg-Id), {} by the claim (same key)",
        EVENTS.len() - stored,
        stats.duplicates
    );
    println!("  retried              {}", stats.retried);
    println!("  dead-lettered        {}", stats.dead_lettered);
    println!("  outputs published    {}", stats.outputs_published);
    println!("  metric dedup_hits    {hits} (scrape it with `dev --metrics-addr 127.0.0.1:9464`)");
    println!("  fenced batches       {batches} (waiting commits share a batch: dedup_fenced_batch_commits)");
    println!("  dashboard and alerts deploy/grafana/dedup-host.json, deploy/prometheus/dedup-host-rules.yml");
    println!("  traces               off; [telemetry] traces = \"otlp\" sends them to a collector (docs/src/operate/traces.md)");
    println!("  web console          {console}");
    for name in &outputs_streams {
        println!("\nOutputs in stream {name}:");
        print_stream(&js, name, show_output).await?;
    }
    println!("\nFenced effects: {fenced}");
    super::demo_modes::print_exclusive(&js, &audit_config).await?;
    super::demo_modes::print_contract(&js, &audit_config).await?;
    super::demo_shadow::print(&js, &audit_config).await?;
    println!("\nForever deduplication: {late}");
    if !calls.is_empty() {
        println!("\nOutbound calls through kill -9:");
        for line in &calls {
            println!("  {line}");
        }
    }
    println!("\nDead letters in stream {dead_stream}:");
    print_stream(&js, &dead_stream, |m| {
        let reason = m
            .headers
            .get(headers::REASON)
            .map(|v| v.to_string())
            .unwrap_or_default();
        let subject = m
            .headers
            .get(headers::SUBJECT)
            .map(|v| v.to_string())
            .unwrap_or_default();
        format!("from {subject}: {reason}")
    })
    .await?;

    let story =
        crate::ops::story::tell(&js, &audit_config, "flaky", Target::Key("f-1".into())).await?;
    println!(
        "\n`dedup-host inspect --route flaky --key f-1`: {}",
        story.verdict
    );
    let report = crate::ops::audit::run(&js, &audit_config, None).await?;
    println!(
        "`dedup-host audit`: {} messages with {} keys; {} completed, {} dead-lettered, {} pending; {} anomalies",
        report.messages,
        report.keys,
        report.completed,
        report.dead_lettered,
        report.pending,
        report.anomalies.len()
    );
    anyhow::ensure!(
        report.anomalies.is_empty(),
        "the audit found anomalies: {:?}",
        report.anomalies
    );
    Ok(())
}

/// An output as the demo shows it; a fenced stream's claim record as its state.
fn show_output(m: &async_nats::jetstream::message::StreamMessage) -> String {
    if !m.subject.starts_with(crate::subject::FENCED_CLAIMS_PREFIX) {
        return String::from_utf8_lossy(&m.payload).to_string();
    }
    match crate::claim::ClaimRecord::from_bytes(&m.payload) {
        Ok(r) => format!(
            "claim record: {:?} by {}, with its {} output(s) in one atomic batch",
            r.state,
            r.owner,
            r.batch_outputs.unwrap_or(0)
        ),
        Err(e) => format!("claim record that does not parse: {e}"),
    }
}

/// The host's `dedup_hits_total` series of a scrape, summed per layer: `claim=.. output=..`
/// (the publisher's stream duplicates are counted above, from its publish acks).
fn dedup_hits(scrape: &str) -> String {
    ["claim", "output", "fence"]
        .iter()
        .map(|layer| {
            let needle = format!("layer=\"{layer}\"}} ");
            let n: u64 = scrape
                .lines()
                .filter(|l| l.starts_with("dedup_hits_total{") && l.contains(&needle))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum();
            format!("{layer}={n}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `<commits> commit(s) in <batches> batch(es)` from the fenced batch series of `scrape`.
fn fenced_batches(scrape: &str) -> String {
    let sum = |series: &str| -> f64 {
        scrape
            .lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let commits = sum("dedup_fenced_batch_commits_sum{");
    let batches = sum("dedup_fenced_batch_commits_count{");
    format!("{commits} commit(s) in {batches} batch(es)")
}

async fn print_stream(
    js: &JetStream,
    stream: &str,
    show: impl Fn(&async_nats::jetstream::message::StreamMessage) -> String,
) -> anyhow::Result<()> {
    let messages = stream_messages(js, stream)
        .await
        .with_context(|| format!("reading stream `{stream}`"))?;
    for m in &messages {
        println!("  {:<24} {}", m.subject.as_str(), show(m));
    }
    if messages.is_empty() {
        println!("  (none)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `bash host/demo.sh` runs on this config: it must pass validation as it stands (a window
    /// shorter than the re-run gap once stopped the demo before it started).
    #[test]
    fn the_built_in_demo_config_is_valid() {
        if let Err(e) = super::load(None) {
            panic!("host/demo.toml: {e}");
        }
    }
}
