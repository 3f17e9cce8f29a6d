//! Benchmarks (not tests): each reports figures and ratios against a baseline measured in the
//! same run, because these machines are noisy.

pub mod callgrind;
pub mod console;
pub mod counts;
pub mod exclusive;
pub mod fairness;
pub mod fenced;
pub mod floor;
pub mod growth;
pub mod handguard;
pub mod handhttp;
pub mod hotload;
pub mod httpcall;
pub mod invoke;
pub mod languages;
pub mod ops;
pub mod pipeline;
pub mod scale;
pub mod shadow;
pub mod tracing;

use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::HeaderMap;

use crate::nats::NatsServer;
use dedup_host::bindings::Event;
use dedup_host::config::Config;
use dedup_host::runtime::{Handler, InvokeOptions, Outcome};

/// Latency summary of a sample.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
}

/// Sorts `samples` and returns the median and the 99th percentile.
pub fn percentiles(samples: &mut [Duration]) -> Percentiles {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// CPU time this process has used so far: with an in-process host, a drain's difference
/// divided by its messages is the host's CPU per message (the benchmark only polls meanwhile).
pub use dedup_host::cpu::process_cpu;

/// Waits until `done()` holds, checking every 20 µs from a blocking thread that sleeps in
/// between: a latency probe must neither wait for the runtime's 1 ms timer nor spin. (A task
/// spinning with `yield_now` holds a core; on two cores the kernel let it run out its slice
/// before the server or the host got the core back, which put every probe's p99 near 4 ms.)
pub async fn wait_until(done: impl Fn() -> bool + Send + 'static) {
    tokio::task::spawn_blocking(move || {
        while !done() {
            std::thread::sleep(Duration::from_micros(20));
        }
    })
    .await
    .expect("waiting thread");
}

/// A stream `name` capturing `subjects` and a durable pull consumer `durable` on it with
/// explicit acks (the raw scenarios' set-up).
pub async fn pull_consumer(
    js: &Context,
    name: &str,
    subjects: &str,
    durable: &str,
) -> anyhow::Result<async_nats::jetstream::consumer::PullConsumer> {
    use async_nats::jetstream::consumer::{pull, AckPolicy};
    let stream = js
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: vec![subjects.into()],
            ..Default::default()
        })
        .await?;
    let config = pull::Config {
        durable_name: Some(durable.into()),
        ack_policy: AckPolicy::Explicit,
        max_ack_pending: 10_000,
        ..Default::default()
    };
    Ok(stream.get_or_create_consumer(durable, config).await?)
}

/// Milliseconds with one decimal.
pub fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Microseconds with one decimal.
pub fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// Publishes `n` copies of `payload` to `subject` with message ids `<prefix>-<i>`, keeping up
/// to 1024 acks outstanding.
pub async fn publish_many(
    js: &Context,
    subject: &str,
    prefix: &str,
    n: usize,
    payload: &[u8],
) -> anyhow::Result<()> {
    publish_spread(js, |_| subject.to_string(), prefix, n, payload).await
}

/// Like [`publish_many`], with message `i` on `subject(i)`.
pub async fn publish_spread(
    js: &Context,
    subject: impl Fn(usize) -> String,
    prefix: &str,
    n: usize,
    payload: &[u8],
) -> anyhow::Result<()> {
    let mut acks = Vec::with_capacity(1024);
    for i in 0..n {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{prefix}-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject(i), h, payload.to_vec().into())
                .await?,
        );
        if acks.len() == 1024 {
            for a in acks.drain(..) {
                a.await?;
            }
        }
    }
    for a in acks {
        a.await?;
    }
    Ok(())
}

/// Times `iterations` invocations of `handler` on a 1 KiB payload, after a warm-up of 10 %;
/// every one must succeed.
pub async fn time_invocations(
    handler: &Handler,
    options: &InvokeOptions,
    iterations: usize,
) -> anyhow::Result<Vec<Duration>> {
    let parts = time_invocation_parts(handler, options, iterations).await?;
    Ok(parts.into_iter().map(|(total, _)| total).collect())
}

/// Like [`time_invocations`], each sample split in (the whole invocation, its store set-up
/// and instantiation).
pub async fn time_invocation_parts(
    handler: &Handler,
    options: &InvokeOptions,
    iterations: usize,
) -> anyhow::Result<Vec<(Duration, Duration)>> {
    let event = |i: usize| Event {
        subject: "bench.in".into(),
        payload: vec![b'a'; 1024],
        headers: Vec::new(),
        key: format!("k{i}"),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: i as u64,
        route: "bench".into(),
    };
    for i in 0..iterations / 10 {
        handler.invoke(event(i), options).await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let ev = event(i);
        let started = Instant::now();
        let inv = handler.invoke(ev, options).await;
        samples.push((started.elapsed(), inv.instantiate));
        anyhow::ensure!(
            matches!(inv.outcome, Outcome::Success(_)),
            "{}: unexpected {:?}",
            handler.name(),
            inv.outcome
        );
    }
    Ok(samples)
}

/// A benchmark host's config on `server`: source stream `S_<name>` capturing `source`,
/// consumer, claim bucket, dead letters and output stream (capturing `outputs`) all named after
/// `name`, with `host` settings (TOML lines) and `routes` (`[[routes]]` TOML).
pub fn bench_config(
    server: &NatsServer,
    name: &str,
    source: &str,
    outputs: &str,
    host: &str,
    routes: &str,
) -> anyhow::Result<Config> {
    let text = bench_config_text(server, name, source, outputs, host, routes);
    Ok(Config::parse(
        &text,
        std::path::Path::new("bench.toml"),
        std::env::temp_dir(),
    )?)
}

/// The text of [`bench_config`], for a host run as a separate process.
pub fn bench_config_text(
    server: &NatsServer,
    name: &str,
    source: &str,
    outputs: &str,
    host: &str,
    routes: &str,
) -> String {
    format!(
        r#"
[nats]
urls = ["{url}"]
[host]
{host}
[source]
stream = "S_{name}"
subjects = ["{source}"]
consumer = "c{name}"
max_ack_pending = 10000
[claims]
bucket = "claims-{name}"
[dead_letter]
subject = "dead.{name}"
stream = "DEAD_{name}"
[[output_streams]]
name = "OUT_{name}"
subjects = ["{outputs}"]
{routes}
"#,
        url = server.url()
    )
}
