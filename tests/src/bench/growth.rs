//! How cost grows (issue 44; BENCHMARKS.md, "How cost grows"), each part on a nats-server of
//! its own with an in-process host:
//! - `routes`: host CPU per message with 1, 10, 100 and 500 `uppercase` routes, the messages
//!   spread evenly over them;
//! - `inflight`: one `uppercase` route kept at 64, 512 and 4,096 messages in flight (closed
//!   loop: a message is published when an output comes back), CPU per message and latency
//!   from publish to output;
//! - `claims`: a no-op route after 10^4, 10^5 and 10^6 settled keys: claim latency (a KV
//!   create on the claim bucket, and the host's sequential probe), `audit` and `inspect` time.
//!
//! CPU is this process's (host and load generator together); the generator's own cost per
//! message is measured first in the same run (publish and receive with no host) and taken off.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use dedup_host::config::Config;
use dedup_host::ops;
use dedup_host::routes::{Guest, Routes};
use dedup_host::serve::{self, RunningHost};
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::{bench_config_text, percentiles, process_cpu, publish_spread, us};
use crate::guests::guest;
use crate::nats::NatsServer;

/// Route counts of the `routes` part.
const ROUTES: [usize; 4] = [1, 10, 100, 500];
/// Messages in flight in the `inflight` part.
const IN_FLIGHT: [usize; 3] = [64, 512, 4096];
/// Settled keys in the `claims` part (those above the run's `messages` are left out).
const SETTLED: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Sequential claim probes per size.
const PROBES: usize = 1000;

/// Runs one part (`routes`, `inflight` or `claims`) with `messages` (for `claims`: the largest
/// claim store).
pub async fn run(which: &str, messages: usize) -> anyhow::Result<()> {
    match which {
        "routes" => routes(messages).await,
        "inflight" => in_flight(messages).await,
        "claims" => claims(messages).await,
        other => {
            anyhow::bail!("unknown growth benchmark `{other}`; choose: routes, inflight, claims")
        }
    }
}

/// A config named `name` with `routes` `uppercase` routes `r<i>` on `<name>.r<i>.*`, and `host`
/// settings (TOML lines).
fn config(server: &NatsServer, name: &str, routes: usize, host: &str) -> anyhow::Result<Config> {
    let mut text = String::new();
    for i in 0..routes {
        text += &format!(
            "[[routes]]\nname = \"r{i}\"\nsubject = \"{name}.r{i}.*\"\ncomponent = \"{}\"\nallowed_outputs = [\"{name}.r{i}.*.done\"]\n",
            guest("uppercase").display()
        );
    }
    let text = bench_config_text(
        server,
        name,
        &format!("{name}.*.*"),
        &format!("{name}.*.*.done"),
        host,
        &text,
    );
    Ok(Config::parse(
        &text,
        std::path::Path::new("bench.toml"),
        std::env::temp_dir(),
    )?)
}

/// Waits until `host` has processed `target` messages, polling every millisecond.
async fn processed(host: &RunningHost, target: u64) {
    while host.stats().processed < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The load generator's CPU per message: `n` 1 KiB messages published (1,024 acks
/// outstanding) to a stream nobody consumes.
async fn publish_cost(js: &Context, n: usize) -> anyhow::Result<Duration> {
    js.create_stream(jetstream::stream::Config {
        name: "PUBCOST".into(),
        subjects: vec!["pubcost.>".into()],
        ..Default::default()
    })
    .await?;
    let cpu = process_cpu();
    publish_spread(js, |_| "pubcost.x".into(), "c", n, &[b'a'; 1024]).await?;
    Ok((process_cpu() - cpu) / n as u32)
}

/// Host CPU per message with 1 to 500 routes.
async fn routes(n: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let generator = publish_cost(&js, n).await?;
    println!("how cost grows with routes (uppercase, {n} messages of 1 KiB spread evenly over the routes, pre-published while the host drains, defaults; load {}):", load());
    println!(
        "  the load generator's CPU per message, taken off below: {} us",
        us(generator)
    );
    for count in ROUTES {
        let name = format!("routes{count}");
        let host = serve::start(config(&server, &name, count, "")?).await?;
        let subject = move |i: usize| format!("{name}.r{}.x", i % count);
        // Warm up: one message per route (each route's consumer bound, the guest in use).
        publish_spread(&js, &subject, "warm", count, &[b'a'; 1024]).await?;
        processed(&host, count as u64).await;
        let cpu = process_cpu();
        let started = Instant::now();
        publish_spread(&js, &subject, "m", n, &[b'a'; 1024]).await?;
        processed(&host, (count + n) as u64).await;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let per_message = ((process_cpu() - cpu) / n as u32).saturating_sub(generator);
        host.shutdown().await?;
        println!(
            "  {count:>4} routes   {rate:>7.0} msg/s   host cpu {:>6} us/msg",
            us(per_message)
        );
    }
    Ok(())
}

/// Closed loop at 64 to 4,096 messages in flight.
async fn in_flight(n: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = server.connect().await;
    let js = jetstream::new(client.clone());
    let generator = publish_cost(&js, n).await?;
    println!("how cost grows with messages in flight (one uppercase route, concurrency 64, max_in_flight = the window, closed loop, {n} messages after 1,000 of warm-up; load {}):", load());
    println!(
        "  the load generator's CPU per message (publish only), taken off below: {} us",
        us(generator)
    );
    for window in IN_FLIGHT {
        let name = format!("flight{window}");
        let settings = format!("concurrency = 64\nmax_in_flight = {window}");
        let host = serve::start(config(&server, &name, 1, &settings)?).await?;
        let f = closed_loop(&client, &js, &name, window, 1000, n).await?;
        host.shutdown().await?;
        let p = percentiles(&mut f.latencies.clone());
        println!(
            "  in flight {window:>5}   {:>7.0} msg/s   host cpu {:>6} us/msg   publish to output p50 {:>9} us  p99 {:>9} us   (window / rate: {:.0} us)",
            f.rate,
            us(f.cpu.saturating_sub(generator)),
            us(p.p50),
            us(p.p99),
            window as f64 / f.rate * 1e6
        );
    }
    Ok(())
}

/// What a closed-loop run measured after its warm-up.
struct Looped {
    rate: f64,
    cpu: Duration,
    latencies: Vec<Duration>,
}

/// Keeps `window` messages in flight on route `r0` of deployment `name` until `warm + n`
/// outputs came back; each message's payload starts with its index, which its output keeps
/// (upper-cased).
async fn closed_loop(
    client: &async_nats::Client,
    js: &Context,
    name: &str,
    window: usize,
    warm: usize,
    n: usize,
) -> anyhow::Result<Looped> {
    let total = warm + n;
    let base = Instant::now();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let permits = Arc::new(Semaphore::new(window));
    let mut outputs = client.subscribe(format!("{name}.r0.*.done")).await?;
    client.flush().await?;
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let received = Arc::new(AtomicUsize::new(0));
    let warm_mark: Arc<Mutex<Option<(Instant, Duration)>>> = Arc::default();
    let receiver = {
        let (sent, permits, latencies, received, warm_mark) = (
            sent.clone(),
            permits.clone(),
            latencies.clone(),
            received.clone(),
            warm_mark.clone(),
        );
        tokio::spawn(async move {
            while let Some(m) = outputs.next().await {
                let now = base.elapsed().as_nanos() as u64;
                let Some(i) = std::str::from_utf8(&m.payload[1..9])
                    .ok()
                    .and_then(|s| s.parse::<usize>().ok())
                else {
                    continue;
                };
                let at = sent[i].load(Ordering::Relaxed);
                let count = received.fetch_add(1, Ordering::Relaxed) + 1;
                if i >= warm {
                    let latency = Duration::from_nanos(now.saturating_sub(at));
                    latencies.lock().expect("latencies").push(latency);
                }
                if count == warm {
                    *warm_mark.lock().expect("mark") = Some((Instant::now(), process_cpu()));
                }
                permits.add_permits(1);
                if count == total {
                    return Ok(Instant::now());
                }
            }
            anyhow::bail!("the output subscription ended")
        })
    };
    for i in 0..total {
        permits.acquire().await?.forget();
        let mut payload = format!("m{i:08}").into_bytes();
        payload.resize(1024, b'a');
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{name}-{i}").as_str());
        sent[i].store(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let ack = js
            .publish_with_headers(format!("{name}.r0.x"), h, payload.into())
            .await?;
        tokio::spawn(async move {
            let _ = ack.await;
        });
    }
    let ended = tokio::time::timeout(Duration::from_secs(600), receiver).await???;
    let cpu_end = process_cpu();
    let (started, cpu_start) = warm_mark
        .lock()
        .expect("mark")
        .ok_or_else(|| anyhow::anyhow!("no warm-up mark"))?;
    let latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    Ok(Looped {
        rate: n as f64 / (ended - started).as_secs_f64(),
        cpu: (cpu_end - cpu_start) / n as u32,
        latencies,
    })
}

/// Claim latency, `audit` and `inspect` after 10^4 to `largest` settled keys.
async fn claims(largest: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = server.connect().await;
    let js = jetstream::new(client.clone());
    println!("how cost grows with the claim store (a no-op route, messages of 16 bytes, every key settled; {PROBES} sequential probes each; load at start {}):", load());
    for size in SETTLED.into_iter().filter(|s| *s <= largest) {
        let name = format!("claims{size}");
        let config = config(&server, &name, 1, "concurrency = 64")?;
        let host = {
            let routes = Routes::with_guest(&config, Guest::Noop);
            serve::start_with_routes(config.clone(), routes, None).await?
        };
        let fill = Instant::now();
        publish_spread(
            &js,
            |_| format!("{name}.r0.x"),
            "k",
            size,
            b"settled key 16 b",
        )
        .await?;
        processed(&host, size as u64).await;
        let fill = fill.elapsed();

        // The claim write alone: a create of a new key in the same bucket, one at a time.
        let kv = js.get_key_value(&config.claims.bucket).await?;
        let mut creates = Vec::with_capacity(PROBES);
        for i in 0..PROBES {
            let started = Instant::now();
            kv.create(format!("probe.k{i}"), vec![b'v'; 200].into())
                .await?;
            creates.push(started.elapsed());
        }
        let creates = percentiles(&mut creates);

        // The whole guarded message, one at a time: publish until the host settled it.
        let mut probes = Vec::with_capacity(PROBES);
        for i in 0..PROBES {
            let done = host.stats().processed;
            let started = Instant::now();
            let mut h = HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("probe-{i}").as_str());
            js.publish_with_headers(format!("{name}.r0.probe"), h, b"probe".to_vec().into())
                .await?
                .await?;
            let metrics = host.metrics().clone();
            super::wait_until(move || metrics.snapshot().processed > done).await;
            probes.push(started.elapsed());
        }
        let probes = percentiles(&mut probes);
        host.shutdown().await?;

        let started = Instant::now();
        let report = ops::audit::run(&js, &config, None).await?;
        let audit = started.elapsed();
        anyhow::ensure!(
            report.completed >= size as u64,
            "audit: {} completed of {size}",
            report.completed
        );
        let started = Instant::now();
        let target = ops::story::Target::Sequence(size as u64 / 2);
        ops::story::tell(&js, &config, "r0", target).await?;
        let inspect = started.elapsed();
        println!(
            "  {size:>9} keys (filled in {:>5.1} s; load {})   claim create p50 {:>6} us  p99 {:>6} us   guarded message p50 {:>6} us  p99 {:>6} us   audit {:>6.2} s   inspect {:>6.2} s",
            fill.as_secs_f64(),
            load(),
            us(creates.p50),
            us(creates.p99),
            us(probes.p50),
            us(probes.p99),
            audit.as_secs_f64(),
            inspect.as_secs_f64(),
        );
    }
    Ok(())
}

/// The machine's one-minute load average (other engineers' builds share it).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
