//! Fairness: the throughput of a well-behaved route (`uppercase`) while a looping guest on
//! another route of the same host saturates its limits, as a ratio to its throughput alone.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use dedup_host::config::Config;
use dedup_host::serve::{self, RunningHost};

use super::{bench_config, publish_many};
use crate::guests::guest;
use crate::nats::NatsServer;

/// Looping messages queued for the loop route: far more than it can get through during a
/// measurement, so it stays saturated throughout.
const LOOP_MESSAGES: usize = 10_000;
/// Good messages processed before timing starts.
const WARM_UP: usize = 200;
/// Measurements of each kind, alternated so drift hits both alike.
const ROUNDS: usize = 3;

/// Runs `ROUNDS` pairs of (alone, beside a loop), `messages` good messages each.
pub async fn run(messages: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let (mut alone, mut beside, mut no_lanes) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        alone.push(measure(&server, &js, &format!("a{round}"), messages, false, None).await?);
        beside.push(measure(&server, &js, &format!("b{round}"), messages, true, None).await?);
        // For comparison: every guest may run at once (lanes as many as guest slots).
        // Fewer messages: it is slow, and the loop route must not run dry meanwhile.
        no_lanes.push(
            measure(
                &server,
                &js,
                &format!("c{round}"),
                messages / 10,
                true,
                Some(64),
            )
            .await?,
        );
    }
    let mean = |v: &[Measured]| v.iter().map(|m| m.rate).sum::<f64>() / v.len() as f64;
    println!("fairness: uppercase route throughput ({messages} messages, {ROUNDS} rounds each), one host:");
    for ((a, b), c) in alone.iter().zip(&beside).zip(&no_lanes) {
        println!(
            "  alone {:>8.0} msg/s   beside a looping route {:>8.0} msg/s (loop route: {} timeouts in the window, {} still queued)   same without lanes {:>8.0} msg/s ({} still queued)",
            a.rate, b.rate, b.loop_timeouts, b.loop_queued, c.rate, c.loop_queued
        );
    }
    println!(
        "  ratio beside/alone (means)                  {:.2}",
        mean(&beside) / mean(&alone)
    );
    println!(
        "  ratio beside/alone without lanes (means)    {:.2}",
        mean(&no_lanes) / mean(&alone)
    );
    Ok(())
}

struct Measured {
    rate: f64,
    loop_timeouts: u64,
    loop_queued: u64,
}

async fn measure(
    server: &NatsServer,
    js: &Context,
    name: &str,
    n: usize,
    with_loop: bool,
    lanes: Option<usize>,
) -> anyhow::Result<Measured> {
    let mut config = config(server, name)?;
    config.host.long_running_lanes = lanes;
    dedup_host::setup::ensure(js, &config).await?;
    if with_loop {
        publish_many(
            js,
            &format!("f{name}.loop.x"),
            "loop",
            LOOP_MESSAGES,
            b"loop",
        )
        .await?;
    }
    publish_many(
        js,
        &format!("f{name}.good.warm"),
        "warm",
        WARM_UP,
        &[b'a'; 1024],
    )
    .await?;
    let host = serve::start(config).await?;
    settle(&host, WARM_UP as u64).await;
    let failed_before = host.stats().dead_lettered;
    let started = Instant::now();
    publish_many(js, &format!("f{name}.good.x"), "good", n, &[b'a'; 1024]).await?;
    settle(&host, (WARM_UP + n) as u64).await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let loop_timeouts = host.stats().dead_lettered - failed_before;
    let loop_queued = queued(js, name).await?;
    host.shutdown().await?;
    anyhow::ensure!(
        !with_loop || loop_queued > 0,
        "the loop route ran dry during the measurement; queue more than {LOOP_MESSAGES}"
    );
    Ok(Measured {
        rate,
        loop_timeouts,
        loop_queued,
    })
}

/// Messages of the loop route not yet taken.
async fn queued(js: &Context, name: &str) -> anyhow::Result<u64> {
    let stream = js.get_stream(format!("S_{name}")).await?;
    let info = stream.consumer_info(format!("c{name}-loop")).await?;
    Ok(info.num_pending)
}

async fn settle(host: &RunningHost, target: u64) {
    while host.stats().processed < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn config(server: &NatsServer, name: &str) -> anyhow::Result<Config> {
    let routes = format!(
        r#"
[[routes]]
name = "good"
subject = "f{name}.good.*"
component = "{upper}"
allowed_outputs = ["f{name}.good.*.done"]

[[routes]]
name = "loop"
subject = "f{name}.loop.*"
component = "{hostile}"
limits = {{ deadline = "100ms" }}
permanent_traps = ["timeout"]
"#,
        upper = guest("uppercase").display(),
        hostile = guest("hostile").display(),
    );
    bench_config(
        server,
        name,
        &format!("f{name}.*.*"),
        &format!("f{name}.*.*.done"),
        "concurrency = 64",
        &routes,
    )
}
