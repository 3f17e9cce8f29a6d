//! Throughput and added latency of the dedup guard against raw JetStream consumption, all on
//! one nats-server in one run:
//! (1) raw pull + ack, (2) the guard with a no-op handler, (3) the full pipeline with
//! `uppercase`, (4) raw KV create at the same concurrency (the server's write ceiling), (5) the
//! full pipeline with fenced effects (outputs and completion as one atomic batch), (6) claim
//! after; and what a user would write instead (`handguard`): (2a)/(2b) the hand-written guard
//! with a confirmed or a plain ack, (2c) the same with one output, (5a)/(5b) the hand-written
//! fenced commit (claim, then one atomic batch of the output and the record) on a file or a
//! memory stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::stream::StorageType;
use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use dedup_host::config::{ClaimMode, Config, EffectsMode};
use dedup_host::routes::{Guest, Routes};
use dedup_host::serve::{self, RunningHost};
use futures::StreamExt;

use super::handguard::{self, Ack, Guard};
use super::{percentiles, us, Percentiles};
use crate::guests::guest;
use crate::nats::NatsServer;

/// Messages (and KV creates) in flight at once, in every scenario.
const CONCURRENCY: usize = 64;
/// Messages in the hand-written scenario of one atomic batch per message on one replica of file storage, which the
/// server commits in milliseconds each (a file store per batch): enough for a steady rate.
const FILE_BATCH_MESSAGES: usize = 2000;
/// Stream writes per guarded message with one output: claim create, output, completed.
const WRITES_PER_MESSAGE: f64 = 3.0;

/// What one scenario measured.
pub(super) struct Figures {
    pub(super) rate: f64,
    pub(super) latency: Percentiles,
    /// The host process's CPU time per message while draining (none for raw consumption).
    pub(super) cpu_per_message: Option<std::time::Duration>,
}

/// The scenarios `run` measures, by label, in the order they run.
const SCENARIOS: [&str; 11] = ["1", "2a", "2", "2b", "3", "2c", "4", "5", "5a", "5b", "6"];

/// Runs every scenario (or those named in `DEDUP_BENCH_ONLY`, e.g. `2,2b`) with `messages`
/// each and `samples` sequential latency probes, then prints the ratios inside this run.
pub async fn run(messages: usize, samples: usize) -> anyhow::Result<()> {
    let only = std::env::var("DEDUP_BENCH_ONLY").ok();
    let selected = |label: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s.trim() == label))
    };
    let server = NatsServer::start();
    let client = server.connect().await;
    let js = jetstream::new(client.clone());
    let batches = messages.min(FILE_BATCH_MESSAGES);
    let mut figures = std::collections::HashMap::new();
    let mut kv = None;
    for label in SCENARIOS.into_iter().filter(|l| selected(l)) {
        let hand = |name: &'static str, guard: Guard, n: usize| {
            handguard::run(&js, name, guard, Ack::Plain, n, samples)
        };
        let f = match label {
            "1" => raw_pull_ack(&js, messages, samples).await?,
            "2a" => {
                handguard::run(
                    &js,
                    "hand",
                    Guard::Record,
                    Ack::Confirmed,
                    messages,
                    samples,
                )
                .await?
            }
            "2" => guarded(&server, &js, "noop", messages, samples, None).await?,
            "2b" => hand("handplain", Guard::Record, messages).await?,
            "3" => {
                guarded(
                    &server,
                    &js,
                    "wasm",
                    messages,
                    samples,
                    Some(Effects::Window),
                )
                .await?
            }
            "2c" => hand("handout", Guard::Output, messages).await?,
            "4" => {
                kv = Some(kv_create(&js, messages).await?);
                continue;
            }
            "5" => {
                guarded(
                    &server,
                    &js,
                    "fenced",
                    messages,
                    samples,
                    Some(Effects::Fenced),
                )
                .await?
            }
            "5a" => hand("handbatch", Guard::Fenced(StorageType::File), batches).await?,
            "5b" => hand("handmem", Guard::Fenced(StorageType::Memory), messages).await?,
            _ => {
                guarded(
                    &server,
                    &js,
                    "after",
                    messages,
                    samples,
                    Some(Effects::ClaimAfter),
                )
                .await?
            }
        };
        figures.insert(label, f);
    }

    println!("dedup guard vs raw JetStream ({messages} messages each, {batches} for (5a), {CONCURRENCY} in flight, file storage, one nats-server):");
    let raw_latency = figures.get("1").map(|f| f.latency);
    let row = |label: &str, name: &str| {
        let Some(f) = figures.get(label) else { return };
        let added = |p: fn(&Percentiles) -> std::time::Duration, f: &Figures| {
            raw_latency
                .as_ref()
                .map_or("-".into(), |r| us(p(&f.latency).saturating_sub(p(r))))
        };
        println!(
            "  {:<44} {:>9.0} msg/s   cpu {:>6} us/msg   sequential p50 {:>7} us  p99 {:>7} us   added p50 {:>7} us  p99 {:>7} us",
            format!("({label}) {name}"), f.rate, f.cpu_per_message.map_or("-".into(), us), us(f.latency.p50), us(f.latency.p99),
            added(|p| p.p50, f), added(|p| p.p99, f)
        )
    };
    row("1", "raw pull + ack");
    row("2", "guard, no-op handler");
    row("2a", "hand-written guard, double_ack");
    row("2b", "hand-written guard, plain ack");
    row("2c", "hand-written guard + one output, plain");
    row("3", "full pipeline, uppercase");
    if let Some(kv) = kv {
        println!("  {:<44} {:>9.0} creates/s", "(4) raw KV create", kv);
    }
    row("5", "full pipeline, fenced effects");
    row("5a", "hand-written fenced batch, file");
    row("5b", "hand-written fenced batch, memory");
    row("6", "full pipeline, claim after");
    println!("  writes per message: (3) 3 (claim create, output, completed); (5) 2 (claim create, one batch of output + completed record); (6) 2 (output, completed create)");
    let ratios = [
        ("2", "1"),
        ("2", "2a"),
        ("2", "2b"),
        ("3", "1"),
        ("3", "2c"),
        ("5", "3"),
        ("5", "5a"),
        ("5a", "5b"),
        ("6", "3"),
    ];
    println!("  {:<12} {:>10} {:>10}", "ratio", "msg/s", "cpu/msg");
    for (a, b) in ratios {
        let (Some(fa), Some(fb)) = (figures.get(a), figures.get(b)) else {
            continue;
        };
        let cpu = match (fa.cpu_per_message, fb.cpu_per_message) {
            (Some(x), Some(y)) if !y.is_zero() => {
                format!("{:.2}", x.as_secs_f64() / y.as_secs_f64())
            }
            _ => "-".into(),
        };
        let name = format!("({a})/({b})");
        println!("  {name:<12} {:>10.2} {cpu:>10}", fa.rate / fb.rate);
    }
    if let (Some(full), Some(kv)) = (figures.get("3"), kv) {
        println!(
            "  ratio (3) x {WRITES_PER_MESSAGE} writes / (4)          {:.2}",
            full.rate * WRITES_PER_MESSAGE / kv
        );
    }
    Ok(())
}

async fn publish_batch(js: &Context, subject: &str, prefix: &str, n: usize) -> anyhow::Result<()> {
    super::publish_many(js, subject, prefix, n, &[b'a'; 1024]).await
}

async fn raw_pull_ack(js: &Context, n: usize, samples: usize) -> anyhow::Result<Figures> {
    let consumer = super::pull_consumer(js, "RAW", "raw.>", "raw").await?;
    publish_batch(js, "raw.in", "raw", n).await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(CONCURRENCY)
        .messages()
        .await?;
    let started = Instant::now();
    let cpu = super::process_cpu();
    for _ in 0..n {
        let m = messages
            .next()
            .await
            .expect("message stream open")
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu_per_message = Some((super::process_cpu() - cpu) / n as u32);
    // The probe is settled by a task and seen by the same 20 µs check as the guarded
    // scenarios', so "added" latency compares like with like.
    let settled = Arc::new(AtomicUsize::new(0));
    let acker = {
        let settled = settled.clone();
        tokio::spawn(async move {
            while let Some(Ok(m)) = messages.next().await {
                if m.double_ack().await.is_ok() {
                    settled.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("raw-probe-{i}").as_str());
        js.publish_with_headers("raw.probe", h, vec![b'a'; 1024].into())
            .await?
            .await?;
        let settled = settled.clone();
        super::wait_until(move || settled.load(Ordering::Relaxed) > i).await;
        lat.push(t.elapsed());
    }
    acker.abort();
    Ok(Figures {
        rate,
        latency: percentiles(&mut lat),
        cpu_per_message,
    })
}

/// How the full pipeline's outputs take effect.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Effects {
    /// Outputs deduplicated by the stream's window (the default).
    Window,
    /// Outputs and completion as one atomic batch.
    Fenced,
    /// Run first, publish, then create the key completed (`claim = "after"`).
    ClaimAfter,
}

/// The config text of [`guarded_config`] with window effects (a console reads it too).
pub(super) fn guarded_config_text(server: &NatsServer, name: &str) -> String {
    let routes = format!(
        "[[routes]]\nname = \"bench\"\nsubject = \"g{name}.in.*\"\ncomponent = \"{}\"\nallowed_outputs = [\"g{name}.in.*.done\"]",
        guest("uppercase").display()
    );
    let host = format!("concurrency = {CONCURRENCY}");
    super::bench_config_text(
        server,
        name,
        &format!("g{name}.in.*"),
        &format!("g{name}.in.*.done"),
        &host,
        &routes,
    )
}

pub(super) fn guarded_config(
    server: &NatsServer,
    name: &str,
    effects: Option<Effects>,
) -> anyhow::Result<Config> {
    let text = guarded_config_text(server, name);
    let mut config = Config::parse(
        &text,
        std::path::Path::new("bench.toml"),
        std::env::temp_dir(),
    )?;
    if effects == Some(Effects::Fenced) {
        config.output_streams[0].effects = EffectsMode::Fenced;
        config.routes[0].effects = EffectsMode::Fenced;
    }
    if effects == Some(Effects::ClaimAfter) {
        config.routes[0].claim = ClaimMode::After;
        config.routes[0].limits.deadline = std::time::Duration::from_secs(1);
    }
    Ok(config)
}

/// Waits until the host has processed `target` messages. `probe` checks every 20 µs (for
/// latency probes, one message at a time); otherwise it sleeps 1 ms between polls so the
/// waiting does not steal a core from the host under load.
async fn settle(host: &RunningHost, target: u64, probe: bool) {
    if probe {
        let metrics = host.metrics().clone();
        return super::wait_until(move || metrics.snapshot().processed >= target).await;
    }
    while host.stats().processed < target {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

async fn guarded(
    server: &NatsServer,
    js: &Context,
    name: &str,
    n: usize,
    samples: usize,
    wasm: Option<Effects>,
) -> anyhow::Result<Figures> {
    let config = guarded_config(server, name, wasm)?;
    guarded_run(config, js, name, n, samples, wasm.is_some()).await
}

/// Drains `n` pre-published messages through a host started with `config` (with `uppercase`
/// when `wasm`, else the no-op guest), then probes `samples` one at a time.
pub(super) async fn guarded_run(
    config: Config,
    js: &Context,
    name: &str,
    n: usize,
    samples: usize,
    wasm: bool,
) -> anyhow::Result<Figures> {
    let host = match wasm {
        true => serve::start(config).await?,
        false => {
            let routes = Routes::with_guest(&config, Guest::Noop);
            serve::start_with_routes(config, routes, None).await?
        }
    };
    // Warm up (stream, consumer and guest caches), then publish the batch and time its drain.
    publish_batch(
        js,
        &format!("g{name}.in.warm"),
        &format!("{name}-warm"),
        200,
    )
    .await?;
    settle(&host, 200, false).await;
    publish_batch(js, &format!("g{name}.in.x"), name, n).await?;
    let started = Instant::now();
    let cpu = super::process_cpu();
    settle(&host, 200 + n as u64, false).await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu_per_message = Some((super::process_cpu() - cpu) / n as u32);
    let mut lat = Vec::with_capacity(samples);
    for i in 0..samples {
        let done = host.stats().processed;
        let t = Instant::now();
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{name}-probe-{i}").as_str());
        js.publish_with_headers(format!("g{name}.in.probe"), h, vec![b'a'; 1024].into())
            .await?
            .await?;
        settle(&host, done + 1, true).await;
        lat.push(t.elapsed());
    }
    host.shutdown().await?;
    Ok(Figures {
        rate,
        latency: percentiles(&mut lat),
        cpu_per_message,
    })
}

async fn kv_create(js: &Context, n: usize) -> anyhow::Result<f64> {
    let kv = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "kvbench".into(),
            history: 1,
            ..Default::default()
        })
        .await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (kv, next) = (kv.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(());
                    }
                    kv.create(format!("k{i}"), vec![b'v'; 200].into()).await?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
