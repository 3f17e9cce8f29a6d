//! Scaling out: the aggregate throughput of 1, 2 and 3 `dedup-host run` processes sharing
//! one route (`uppercase`, one output), against one nats-server and against a 3-node cluster
//! at three replicas, all on this one machine.
//!
//! Each round pre-publishes its messages, starts the processes, and times the drain from the
//! moment the route's ack floor passes a warm-up share (every process is up and has compiled
//! or loaded the guest) to the last message, read from the consumer's ack floor.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};

use super::publish_many;
use crate::guests::{guest, host_binary};
use crate::nats::{NatsCluster, NatsServer};

/// Messages of each round drained before the clock starts.
const WARM_UP: u64 = 1_000;

/// Host process counts measured in every topology.
const HOSTS: [usize; 3] = [1, 2, 3];

/// Rounds of each host count per topology; the median is reported.
const REPEATS: usize = 3;

/// Runs both topologies with `messages` per round and prints the table.
pub async fn run(messages: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let single = {
        let server = NatsServer::start();
        let js = jetstream::new(server.connect().await);
        medians(&js, dir.path(), &[server.url()], 1, "one", messages).await?
    };
    let clustered = {
        let cluster = NatsCluster::start(3);
        let js = jetstream::new(cluster.connect().await);
        medians(&js, dir.path(), &cluster.urls(), 3, "three", messages).await?
    };
    println!("scaling out: `dedup-host run` processes sharing one route (uppercase, concurrency 64, max_in_flight 256, {messages} messages per round, median of {REPEATS} rounds, file storage):");
    println!("  hosts   one server (R1)   ratio to 1 host   3-node cluster (R3)   ratio to 1 host   cluster / one server");
    for (i, hosts) in HOSTS.iter().enumerate() {
        println!(
            "  {hosts:>5}   {:>10.0} msg/s   {:>15.2}   {:>14.0} msg/s   {:>15.2}   {:>20.2}",
            single[i],
            single[i] / single[0],
            clustered[i],
            clustered[i] / clustered[0],
            clustered[i] / single[i]
        );
    }
    Ok(())
}

/// The median rate of each host count over [`REPEATS`] rounds, the counts in a rotated order
/// each time so that a drift over the run (the server's state grows) falls on all of them.
async fn medians(
    js: &Context,
    dir: &std::path::Path,
    urls: &[String],
    replicas: usize,
    topology: &str,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut rates = vec![Vec::new(); HOSTS.len()];
    for repeat in 0..REPEATS {
        for k in 0..HOSTS.len() {
            let i = (k + repeat) % HOSTS.len();
            let name = format!("{topology}{repeat}h{}", HOSTS[i]);
            rates[i].push(round(js, dir, urls, replicas, &name, HOSTS[i], n).await?);
        }
    }
    Ok(rates
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect())
}

/// One round: `n` messages drained by `hosts` processes connected to `urls`, every stream
/// and the bucket at `replicas`; returns messages per second.
async fn round(
    js: &Context,
    dir: &std::path::Path,
    urls: &[String],
    replicas: usize,
    name: &str,
    hosts: usize,
    n: usize,
) -> anyhow::Result<f64> {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config_text(urls, replicas, name, dir))?;
    // The first process creates the streams; the messages wait in the source stream.
    let mut processes = vec![Host::start(&path)?];
    let stream = format!("S_{name}");
    let consumer = format!("c{name}-bench");
    let deadline = Instant::now() + Duration::from_secs(60);
    while ack_floor(js, &stream, &consumer).await.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "the host process did not set up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(processes.pop());
    publish_many(js, &format!("{name}.in.x"), name, n, &[b'a'; 1024]).await?;
    for _ in 0..hosts {
        processes.push(Host::start(&path)?);
    }
    let started = wait_acked(js, &stream, &consumer, WARM_UP).await?;
    let first = ack_floor(js, &stream, &consumer).await.unwrap_or(WARM_UP);
    let ended = wait_acked(js, &stream, &consumer, n as u64).await?;
    Ok((n as u64 - first) as f64 / (ended - started).as_secs_f64())
}

/// Waits until the consumer's ack floor reaches `target`; returns when it did.
async fn wait_acked(
    js: &Context,
    stream: &str,
    consumer: &str,
    target: u64,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while ack_floor(js, stream, consumer).await.unwrap_or(0) < target {
        anyhow::ensure!(Instant::now() < deadline, "the hosts did not drain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Instant::now())
}

/// The route consumer's ack floor (stream sequence), once it exists.
async fn ack_floor(js: &Context, stream: &str, consumer: &str) -> Option<u64> {
    let stream = js.get_stream(stream).await.ok()?;
    let info = stream.consumer_info(consumer).await.ok()?;
    Some(info.ack_floor.stream_sequence)
}

/// A host config: one `uppercase` route on `<name>.in.*`, everything at `replicas`, the
/// compile cache shared by the round's processes.
fn config_text(urls: &[String], replicas: usize, name: &str, dir: &std::path::Path) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        r#"
[nats]
urls = [{urls}]
[host]
concurrency = 64
[components]
cache_dir = "{cache}"
[source]
stream = "S_{name}"
subjects = ["{name}.in.*"]
consumer = "c{name}"
max_ack_pending = 10000
replicas = {replicas}
[claims]
bucket = "claims-{name}"
replicas = {replicas}
[dead_letter]
subject = "dead.{name}"
stream = "DEAD_{name}"
replicas = {replicas}
[[output_streams]]
name = "OUT_{name}"
subjects = ["{name}.in.*.done"]
replicas = {replicas}
[[routes]]
name = "bench"
subject = "{name}.in.*"
component = "{guest}"
allowed_outputs = ["{name}.in.*.done"]
"#,
        urls = urls.join(", "),
        cache = dir.join("cache").display(),
        guest = guest("uppercase").display(),
    )
}

/// A `dedup-host run` process, killed when dropped.
struct Host(Child);

impl Host {
    fn start(config: &std::path::Path) -> anyhow::Result<Self> {
        let child = Command::new(host_binary())
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Self(child))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
