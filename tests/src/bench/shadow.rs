//! The cost of a shadow candidate (issue 27): the full pipeline (`uppercase` served from the
//! object store, claim before) with no candidate, and with a shadow candidate that loops until
//! its deadline on every message (`hostile` on the payload `loop`), in alternating rounds on
//! one nats-server. Shadow runs take spare guest slots only, at the lowest CPU priority, and
//! are skipped when none is free: the live route's throughput must stay near the baseline.
//! Reports throughput, host CPU per message and the shadow runs made and skipped.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use dedup_host::candidate::spec::{Margins, Mode, Spec, State};
use dedup_host::components::store;
use dedup_host::config::Config;
use dedup_host::serve::{self, RunningHost};

use super::{bench_config, publish_many, us};
use crate::guests::guest;
use crate::nats::NatsServer;

/// Guests of the route running at once.
const CONCURRENCY: usize = 64;
/// The candidate's deadline: each shadow run loops this long before it is ended.
const DEADLINE: &str = "200ms";

/// One round's figures.
struct Round {
    rate: f64,
    cpu: Duration,
    /// `dedup_shadow_results_total` by result, summed: (ran, skipped).
    shadow: (u64, u64),
}

/// Runs `rounds` alternating rounds of `messages` each, without and with the candidate.
pub async fn run(messages: usize, rounds: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let (mut plain, mut shadowed) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        plain.push(one(&server, &js, &format!("plain{round}"), messages, false).await?);
        shadowed.push(one(&server, &js, &format!("shadow{round}"), messages, true).await?);
    }
    let (rate_plain, cpu_plain) = medians(&plain);
    let (rate_shadow, cpu_shadow) = medians(&shadowed);
    let ran: u64 = shadowed.iter().map(|r| r.shadow.0).sum();
    let skipped: u64 = shadowed.iter().map(|r| r.shadow.1).sum();
    println!("shadow candidate looping to its {DEADLINE} deadline vs none ({messages} messages, {rounds} alternating rounds, medians):");
    println!(
        "  no candidate                {rate_plain:>9.0} msg/s   cpu {:>6} us/msg",
        us(cpu_plain)
    );
    println!(
        "  looping shadow candidate    {rate_shadow:>9.0} msg/s   cpu {:>6} us/msg   shadow runs {ran}, skipped {skipped}",
        us(cpu_shadow)
    );
    println!(
        "  throughput ratio shadow/none {:.2}",
        rate_shadow / rate_plain
    );
    println!(
        "  cpu ratio shadow/none        {:.2}",
        cpu_shadow.as_secs_f64() / cpu_plain.as_secs_f64()
    );
    Ok(())
}

fn config(server: &NatsServer, name: &str) -> anyhow::Result<Config> {
    let routes = format!(
        "[[routes]]\nname = \"bench\"\nsubject = \"s{name}.in.*\"\nallowed_outputs = [\"s{name}.in.*.done\"]\nlimits = {{ deadline = \"{DEADLINE}\" }}"
    );
    bench_config(
        server,
        name,
        &format!("s{name}.in.*"),
        &format!("s{name}.in.*.done"),
        &format!("concurrency = {CONCURRENCY}"),
        &routes,
    )
}

async fn one(
    server: &NatsServer,
    js: &Context,
    name: &str,
    n: usize,
    candidate: bool,
) -> anyhow::Result<Round> {
    let config = config(server, name)?;
    let bucket = store::open(js, &config).await?;
    store::deploy(&bucket, "bench", &std::fs::read(guest("uppercase"))?).await?;
    if candidate {
        let bytes = std::fs::read(guest("hostile"))?;
        let spec = Spec {
            digest: dedup_host::runtime::digest(&bytes),
            mode: Mode::Shadow { secondary: false },
            ignore: Vec::new(),
            margins: Margins::default(),
            auto_promote: None,
            since_ms: 0,
            state: State::Running,
        };
        dedup_host::candidate::store::put(&bucket, "bench", &bytes, &spec).await?;
    }
    let host = serve::start(config).await?;
    let subject = format!("s{name}.in.x");
    publish_many(js, &subject, &format!("{name}-warm"), 200, b"loop").await?;
    settle(&host, 200).await?;
    if candidate {
        // The candidate is compiled beside the live version: wait until it shadows.
        let started = Instant::now();
        while shadow_results(&host) == (0, 0) {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "the candidate never ran"
            );
            publish_many(
                js,
                &subject,
                &format!("{name}-wait{:?}", started.elapsed()),
                1,
                b"loop",
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let before = host.stats().processed;
    let shadow_before = shadow_results(&host);
    publish_many(js, &subject, name, n, b"loop").await?;
    let started = Instant::now();
    let cpu = super::process_cpu();
    settle(&host, before + n as u64).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu = (super::process_cpu() - cpu) / n as u32;
    let shadow_after = shadow_results(&host);
    host.shutdown().await?;
    Ok(Round {
        rate,
        cpu,
        shadow: (
            shadow_after.0 - shadow_before.0,
            shadow_after.1 - shadow_before.1,
        ),
    })
}

async fn settle(host: &RunningHost, target: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    while host.stats().processed < target {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "messages did not settle: {:?}",
            host.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The host's shadow comparisons made (any result but `skipped`) and skipped.
fn shadow_results(host: &RunningHost) -> (u64, u64) {
    let (mut ran, mut skipped) = (0, 0);
    for line in host.metrics().encode().lines() {
        let Some(rest) = line.strip_prefix("dedup_shadow_results_total{") else {
            continue;
        };
        let n: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        match rest.contains("result=\"skipped\"") {
            true => skipped += n,
            false => ran += n,
        }
    }
    (ran, skipped)
}

/// The median throughput and CPU per message of `rounds`.
fn medians(rounds: &[Round]) -> (f64, Duration) {
    let mut rates: Vec<f64> = rounds.iter().map(|r| r.rate).collect();
    rates.sort_by(f64::total_cmp);
    let mut cpus: Vec<Duration> = rounds.iter().map(|r| r.cpu).collect();
    cpus.sort();
    (rates[rates.len() / 2], cpus[cpus.len() / 2])
}
