//! What operating costs: (1) pipeline throughput of a `dedup-host run` process with metrics
//! served and scraped plus JSON logs, against the same process with both off, alternating
//! rounds in one run; (2) `dedup-host audit` over 100,000 processed messages, against a bare
//! read of the same streams.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use dedup_host::{ops, scan};

use dedup_host::config::Config;

use super::{bench_config_text, publish_many};
use crate::guests::{guest, host_binary};
use crate::nats::NatsServer;

const ROUTE: &str = "[[routes]]\nname = \"bench\"\nsubject = \"{name}.in.*\"\ncomponent = \"{guest}\"\nallowed_outputs = [\"{name}.in.*.done\"]";

/// A benchmark host's config: one `uppercase` route on `<name>.in.*`, 64 guest slots.
fn config_text(server: &NatsServer, name: &str) -> String {
    let routes = ROUTE
        .replace("{name}", name)
        .replace("{guest}", &guest("uppercase").display().to_string());
    let (source, outputs) = (format!("{name}.in.*"), format!("{name}.in.*.done"));
    bench_config_text(server, name, &source, &outputs, "concurrency = 64", &routes)
}

/// Runs both measurements: `messages` per throughput round, `rounds` rounds of each setting,
/// and `audited` messages for the audit.
pub async fn run(messages: usize, rounds: usize, audited: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let dir = tempfile::tempdir()?;

    let (mut off, mut on) = (Vec::new(), Vec::new());
    // Alternating, in the order off-on, on-off, ...: a drift over the run (the server's
    // state grows) falls on both settings alike.
    for round in 0..rounds {
        for observed in [round % 2 == 1, round % 2 == 0] {
            let name = format!("{}{round}", if observed { "on" } else { "off" });
            let rate = throughput(&server, &js, dir.path(), &name, messages, observed).await?;
            if observed {
                on.push(rate);
            } else {
                off.push(rate);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (off_rate, on_rate) = (median(&mut off), median(&mut on));
    println!("operations overhead (`dedup-host run` process, uppercase, {messages} messages per round, {rounds} rounds each, alternating):");
    println!(
        "  metrics and JSON logs off           {off_rate:>9.0} msg/s (median; rounds {off:.0?})"
    );
    println!(
        "  metrics served+scraped, JSON logs   {on_rate:>9.0} msg/s (median; rounds {on:.0?})"
    );
    println!(
        "  ratio on/off                        {:.2}",
        on_rate / off_rate
    );

    audit(&server, &js, audited).await
}

/// One `dedup-host run` process draining `n` messages; returns messages per second.
async fn throughput(
    server: &NatsServer,
    js: &Context,
    dir: &std::path::Path,
    name: &str,
    n: usize,
    observed: bool,
) -> anyhow::Result<f64> {
    let text = config_text(server, name);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text)?;
    let mut cmd = Command::new(host_binary());
    cmd.args(["run", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let addr = free_addr();
    if observed {
        cmd.args(["--metrics-addr", &addr.to_string(), "--log-format", "json"]);
    }
    let child = Host(cmd.spawn()?);
    let consumer = format!("c{name}-bench");
    let acked = |js: Context, stream: String, consumer: String| async move {
        let stream = js.get_stream(&stream).await.ok()?;
        let info = stream.consumer_info(&consumer).await.ok()?;
        Some(info.ack_floor.stream_sequence)
    };
    let stream = format!("S_{name}");
    let wait_acked = |target: u64| {
        let (js, stream, consumer) = (js.clone(), stream.clone(), consumer.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(300);
            while acked(js.clone(), stream.clone(), consumer.clone())
                .await
                .unwrap_or(0)
                < target
            {
                anyhow::ensure!(Instant::now() < deadline, "host did not drain");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked(js.clone(), stream.clone(), consumer.clone())
        .await
        .is_none()
    {
        anyhow::ensure!(Instant::now() < deadline, "the host process did not set up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Warm up: the consumer exists and the guest is compiled.
    publish_many(
        js,
        &format!("{name}.in.warm"),
        &format!("{name}-warm"),
        200,
        b"warm",
    )
    .await?;
    wait_acked(200).await?;
    let scraping = Arc::new(AtomicBool::new(observed));
    let scraper = {
        let scraping = scraping.clone();
        std::thread::spawn(move || {
            let mut scrapes = 0;
            while scraping.load(Ordering::Relaxed) {
                if scrape(addr).is_some() {
                    scrapes += 1;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            scrapes
        })
    };
    publish_many(js, &format!("{name}.in.x"), name, n, &[b'a'; 1024]).await?;
    let started = Instant::now();
    wait_acked(200 + n as u64).await?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    scraping.store(false, Ordering::Relaxed);
    let scrapes = scraper.join().expect("scraper");
    anyhow::ensure!(
        !observed || scrapes > 0,
        "the metrics endpoint never answered"
    );
    drop(child);
    Ok(rate)
}

/// Kills the host process when dropped.
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn scrape(addr: SocketAddr) -> Option<usize> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).ok()?;
    Some(body.len())
}

/// Processes `n` messages, then times the audit over them against one bare pass over the
/// same streams.
async fn audit(server: &NatsServer, js: &Context, n: usize) -> anyhow::Result<()> {
    let name = "audit";
    let text = config_text(server, name);
    let config = Config::parse(
        &text,
        std::path::Path::new("bench.toml"),
        std::env::temp_dir(),
    )?;
    let host = dedup_host::serve::start(config.clone()).await?;
    publish_many(js, &format!("{name}.in.x"), name, n, b"audited").await?;
    while host.stats().processed < n as u64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.shutdown().await?;

    let started = Instant::now();
    let source = scan::stream(js, &config.source.stream, "", None).await?;
    let claims = scan::claims(js, &config.claims.bucket).await?;
    let outputs = scan::message_ids(js, &config.output_streams[0].name).await?;
    let bare = started.elapsed();
    anyhow::ensure!(
        source.len() == n && claims.len() == n && outputs.len() == n,
        "bare read incomplete"
    );

    let started = Instant::now();
    let report = ops::audit::run(js, &config, None).await?;
    let audit = started.elapsed();
    anyhow::ensure!(
        report.anomalies.is_empty() && report.completed == n as u64,
        "audit: {report:?}"
    );
    println!("audit of {n} processed messages (source, claims, outputs, dead letters):");
    println!(
        "  bare read of the three streams      {:>7.2} s",
        bare.as_secs_f64()
    );
    println!(
        "  dedup-host audit                    {:>7.2} s ({:.0} messages/s)",
        audit.as_secs_f64(),
        n as f64 / audit.as_secs_f64()
    );
    println!(
        "  ratio audit/bare read               {:.2}",
        audit.as_secs_f64() / bare.as_secs_f64()
    );
    Ok(())
}
