//! What `exclusive_by` costs: throughput of an exclusive `uppercase` route with 1, 10 and
//! 1,000 distinct entities, against the same route without `exclusive_by`, each in rounds
//! alternating in one run on one nats-server (an in-process host, 16 guest slots, 16
//! partitions unless told otherwise). Two more settings publish the messages straight onto the route's partitions
//! of the work queue, as the queueing step would copy them: what the partitions run when
//! queueing costs nothing, the ceiling of any faster queueing step.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use dedup_host::config::Config;
use dedup_host::{exclusive, serve};

use super::{bench_config_text, publish_spread};
use crate::guests::guest;
use crate::nats::NatsServer;

/// The settings compared: a label, the entities (`None`: not exclusive, 1,000 entities),
/// and how the messages arrive.
const SETTINGS: [(&str, Option<usize>, Arrival); 6] = [
    ("not exclusive (1,000 entities)", None, Arrival::Source),
    ("exclusive, 1,000 entities", Some(1000), Arrival::Source),
    ("exclusive, 10 entities", Some(10), Arrival::Source),
    ("exclusive, 1 entity", Some(1), Arrival::Source),
    (
        "partitions alone, 1,000 entities",
        Some(1000),
        Arrival::Queued,
    ),
    ("partitions alone, 10 entities", Some(10), Arrival::Queued),
];

/// Where a setting's messages are published.
#[derive(Clone, Copy)]
enum Arrival {
    /// On the route's subject in the source stream (what producers do).
    Source,
    /// Straight onto the route's partitions of the work queue, with the headers the queueing
    /// step gives its copies (the queueing step then has nothing to do).
    Queued,
}

/// Runs `rounds` rounds of every setting with `messages` messages each, exclusive routes with
/// `partitions` partitions.
pub async fn run(messages: usize, rounds: usize, partitions: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let mut rates = vec![Vec::new(); SETTINGS.len()];
    let mut queueing = vec![Vec::new(); SETTINGS.len()];
    for round in 0..rounds {
        // Alternate the order so that a drift over the run falls on every setting alike.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..SETTINGS.len()).collect()
        } else {
            (0..SETTINGS.len()).rev().collect()
        };
        for i in order.into_iter().filter(|i| chosen(*i)) {
            let name = format!("x{round}s{i}");
            let (_, entities, arrival) = SETTINGS[i];
            let (rate, queued) = throughput(
                &server,
                &js,
                &name,
                (entities, partitions),
                arrival,
                messages,
            )
            .await?;
            rates[i].push(rate);
            queueing[i].extend(queued);
        }
    }
    println!("exclusive routes (uppercase, {messages} messages per round, {rounds} rounds, 16 guest slots, {partitions} partitions, in-process host):");
    let median = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = match rates[0].is_empty() {
        true => f64::NAN,
        false => median(&rates[0]),
    };
    for (i, (label, _, _)) in SETTINGS.iter().enumerate() {
        if rates[i].is_empty() {
            continue;
        }
        let rate = median(&rates[i]);
        let queue = match queueing[i].is_empty() {
            true => String::new(),
            false => {
                let q = median(&queueing[i]);
                format!(
                    "   queueing alone {q:>6.0} msg/s ({:.0} us a message)",
                    1e6 / q
                )
            }
        };
        println!(
            "  {label:<32} {rate:>8.0} msg/s   ratio to not exclusive {:.2}   (rounds {:.0?}){queue}",
            rate / base,
            rates[i]
        );
    }
    Ok(())
}

/// Whether setting `i` (its index in [`SETTINGS`]) runs: all of them, unless
/// `DEDUP_BENCH_SETTINGS` lists some (comma-separated indices, e.g. `0,4` for the plain route
/// and the partitions alone with 1,000 entities).
fn chosen(i: usize) -> bool {
    match std::env::var("DEDUP_BENCH_SETTINGS") {
        Ok(list) => list.split(',').any(|s| s.trim().parse() == Ok(i)),
        Err(_) => true,
    }
}

/// One host draining `n` messages spread over the entities; returns messages per second, and
/// for an exclusive route the rate at which its queueing step copied them onto the work queue
/// (the step that hands out one message at a time; read from the queue's last sequence).
async fn throughput(
    server: &NatsServer,
    js: &Context,
    name: &str,
    (entities, partitions): (Option<usize>, usize),
    arrival: Arrival,
    n: usize,
) -> anyhow::Result<(f64, Option<f64>)> {
    let exclusive_stream = entities.map(|_| format!("S_{name}_EXCLUSIVE"));
    let exclusive = match entities {
        Some(_) => format!("exclusive_by = {{ subject_token = 2 }}\npartitions = {partitions}"),
        None => String::new(),
    };
    let routes = format!(
        "[[routes]]\nname = \"bench\"\nsubject = \"{name}.in.*\"\ncomponent = \"{}\"\nallowed_outputs = [\"{name}.in.*.done\"]\nconcurrency = 16\n{exclusive}\n",
        guest("uppercase").display()
    );
    let text = bench_config_text(
        server,
        name,
        &format!("{name}.in.*"),
        &format!("{name}.in.*.done"),
        "",
        &routes,
    );
    let config = Config::parse(
        &text,
        std::path::Path::new("bench.toml"),
        std::env::temp_dir(),
    )?;
    let config_copy = config.clone();
    let host = serve::start(config).await?;
    let outputs = format!("OUT_{name}");
    let stored = |js: Context, stream: String| async move {
        let mut s = js.get_stream(&stream).await.ok()?;
        Some(s.info().await.ok()?.state.messages)
    };
    let entities = entities.unwrap_or(1000);
    let publish = |count: usize, prefix: &'static str| {
        let spread = move |i: usize| format!("{name}.in.e{}", i % entities);
        let config = &config_copy;
        async move {
            match arrival {
                Arrival::Source => publish_spread(js, spread, prefix, count, &[b'a'; 1024]).await,
                Arrival::Queued => publish_queued(js, config, prefix, count, spread).await,
            }
        }
    };
    // When the queue's last sequence (every copy ever stored) reached `target`, if it did.
    let queued = |js: Context, target: u64| {
        let stream = exclusive_stream.clone();
        async move {
            let mut s = js.get_stream(stream?).await.ok()?;
            (s.info().await.ok()?.state.last_sequence >= target).then(Instant::now)
        }
    };
    let wait = |target: u64| {
        let (js, outputs) = (js.clone(), outputs.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(600);
            let mut all_queued = None;
            while stored(js.clone(), outputs.clone()).await.unwrap_or(0) < target {
                anyhow::ensure!(Instant::now() < deadline, "the host did not drain");
                if all_queued.is_none() {
                    all_queued = queued(js.clone(), target).await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(all_queued.or(queued(js.clone(), target).await))
        }
    };
    // Warm up: consumers bound, the guest compiled.
    publish(100, "warm").await?;
    wait(100).await?;
    let started = Instant::now();
    publish(n, "m").await?;
    let all_queued = wait(100 + n as u64).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    host.shutdown().await?;
    let queueing = all_queued.map(|t| n as f64 / (t - started).as_secs_f64());
    Ok((rate, queueing))
}

/// Publishes `n` messages onto route `bench`'s partitions of the work queue, each as the
/// queueing step would copy the `i`-th message on subject `subject(i)` (its entity the
/// subject's last token, its source sequence made up: no source stream holds it).
async fn publish_queued(
    js: &Context,
    config: &Config,
    prefix: &str,
    n: usize,
    subject: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    let offset = if prefix == "warm" {
        1_000_000
    } else {
        2_000_000
    };
    let route = config.routes.iter().find(|r| r.name == "bench");
    let partitions = route.map_or(1, |r| exclusive::partitions(config, r));
    let mut acks = Vec::with_capacity(1024);
    for i in 0..n {
        let original = subject(i);
        let entity = original.rsplit('.').next().unwrap_or_default();
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("{prefix}-{i}").as_str());
        let sequence = (offset + i) as u64;
        let headers = exclusive::queued_headers(Some(&h), "bench", &original, sequence);
        let work = exclusive::work_subject(config, "bench", partitions, entity);
        acks.push(
            js.publish_with_headers(work, headers, vec![b'a'; 1024].into())
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
