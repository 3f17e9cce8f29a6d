//! Hot loading: deploy-to-first-message latency through the object store, and loading a
//! component cold (compiling) against loading it from the compile cache (a restart).

use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use dedup_host::components::store;
use dedup_host::config::Config;
use dedup_host::runtime::{Compiled, EngineSettings, Runtime};
use dedup_host::serve;
use futures::StreamExt;

use super::{bench_config, ms, percentiles, us};
use crate::guests::guest;
use crate::nats::NatsServer;

/// Deploys alternating versions `deploys` times while probes flow; prints the latency from
/// the deploy call to the first output made by the new version.
pub async fn deploy_latency(deploys: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let client = server.connect().await;
    let js = jetstream::new(client.clone());
    let mut config = config(&server)?;
    // A fresh compile cache: every deploy below must be compiled.
    let cache = tempfile::tempdir()?;
    config.components.cache_dir = Some(cache.path().to_path_buf());
    let bucket = store::open(&js, &config).await?;
    let upper = std::fs::read(guest("uppercase"))?;
    let echo = std::fs::read(guest("hostile"))?;
    store::deploy(&bucket, "swap", &upper).await?;
    let host = serve::start(config).await?;
    let mut outputs = client.subscribe("hl.in.*.done").await?;

    let mut samples = Vec::new();
    for i in 0..deploys {
        // Echo (payload unchanged) and uppercase alternate; each probe's payload is `p<n>`.
        let (bytes, first_letter) = if i % 2 == 0 {
            (&echo, b'p')
        } else {
            (&upper, b'P')
        };
        let new_style = |p: &[u8]| p.first() == Some(&first_letter);
        // A custom section makes every deploy a new version that must be compiled.
        let bytes = with_custom_section(bytes, i);
        let started = Instant::now();
        store::deploy(&bucket, "swap", &bytes).await?;
        let mut n = 0u64;
        let latency = loop {
            let id = format!("d{i}-{n}");
            n += 1;
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", id.as_str());
            js.publish_with_headers(format!("hl.in.{id}"), h, format!("p{id}").into())
                .await?;
            let deadline = tokio::time::sleep(Duration::from_millis(2));
            tokio::pin!(deadline);
            let mut found = None;
            loop {
                tokio::select! {
                    m = outputs.next() => {
                        let m = m.expect("subscription open");
                        if new_style(&m.payload) {
                            found = Some(started.elapsed());
                            break;
                        }
                    }
                    _ = &mut deadline => break,
                }
            }
            if let Some(latency) = found {
                break latency;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the new version never served"
            );
        };
        samples.push(latency);
        // Let the probes still in flight drain before the next deploy.
        tokio::time::sleep(Duration::from_millis(300)).await;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(50), outputs.next()).await
        {}
    }
    host.shutdown().await?;
    let p = percentiles(&mut samples);
    println!("deploy to first message on the new version (object store, {deploys} deploys of never-seen versions of uppercase/hostile, compiled on arrival):");
    println!(
        "  median {} ms, max {} ms",
        ms(p.p50),
        ms(*samples.last().expect("samples"))
    );
    Ok(())
}

/// `component` plus a custom section holding `n`: the same code under a new digest.
pub fn with_custom_section(component: &[u8], n: usize) -> Vec<u8> {
    let name = b"bench-version";
    let payload = n.to_le_bytes();
    let size = 1 + name.len() + payload.len();
    assert!(size < 128, "one-byte LEB128 sizes");
    let mut out = component.to_vec();
    out.extend([0, size as u8, name.len() as u8]);
    out.extend(name);
    out.extend(payload);
    out
}

/// Loads each guest cold (empty cache: compiles) and warm (from the cache, as after a
/// restart), `rounds` times alternating; prints size, times and the ratio.
pub fn load_times(guests: &[&str], rounds: usize) -> anyhow::Result<()> {
    println!(
        "component load: cold (compile) vs restart with the compile cache, {rounds} rounds each:"
    );
    for name in guests {
        let path = guest(name);
        let size = std::fs::metadata(&path)?.len();
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let dir = tempfile::tempdir()?;
            cold.push(load(&path, dir.path(), Compiled::Fresh)?);
            warm.push(load(&path, dir.path(), Compiled::Cached)?);
        }
        let (c, w) = (percentiles(&mut cold), percentiles(&mut warm));
        println!(
            "  {name:<10} {:>9} bytes   cold median {:>9} us   cached median {:>9} us   cached/cold {:.3}",
            size,
            us(c.p50),
            us(w.p50),
            w.p50.as_secs_f64() / c.p50.as_secs_f64()
        );
    }
    Ok(())
}

/// Times building a runtime on `cache` and loading `path`, checking where it came from.
fn load(path: &Path, cache: &Path, expected: Compiled) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let runtime = Runtime::new(&EngineSettings::default())?.with_cache(cache)?;
    let handler = runtime.load_file(path)?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        handler.compiled() == expected,
        "expected a {expected:?} load"
    );
    Ok(elapsed)
}

fn config(server: &NatsServer) -> anyhow::Result<Config> {
    let routes =
        "[[routes]]\nname = \"swap\"\nsubject = \"hl.in.*\"\nallowed_outputs = [\"hl.in.*.done\"]";
    bench_config(server, "hl", "hl.in.*", "hl.in.*.done", "", routes)
}
