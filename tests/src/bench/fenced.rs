//! The three modes on a 3-node cluster at three replicas, in one run: the full pipeline with
//! `uppercase` and one output, claimed before with outputs deduplicated by the window
//! (the default), claimed before with outputs and completion as one atomic batch (fenced),
//! and claimed after running (one create, no lease). (On one server at one
//! replica with file storage, nats-server stages every atomic batch in a file store of its
//! own, which costs milliseconds per batch: `pipeline` shows that case as scenario (5).)

use async_nats::jetstream;

use super::pipeline::{guarded_config, guarded_run, Effects, Figures};
use super::us;
use crate::nats::NatsCluster;

/// Runs the three modes with `messages` each and `samples` sequential probes.
pub async fn run(messages: usize, samples: usize) -> anyhow::Result<()> {
    let cluster = NatsCluster::start(3);
    let js = jetstream::new(cluster.connect().await);
    let mut figures = Vec::new();
    let modes = [
        ("window", Effects::Window),
        ("fenced", Effects::Fenced),
        ("after", Effects::ClaimAfter),
    ];
    for (name, effects) in modes {
        let mut config = guarded_config(&cluster.nodes[0], name, Some(effects))?;
        config.nats.urls = cluster.urls();
        config.source.replicas = 3;
        config.claims.replicas = 3;
        config.dead_letter.replicas = 3;
        config.output_streams[0].replicas = 3;
        figures.push((
            name,
            guarded_run(config, &js, name, messages, samples, true).await?,
        ));
    }
    println!("claim before (window effects), fenced effects and claim after ({messages} messages each, 3-node cluster, replicas 3, file storage):");
    let row = |name: &str, writes: u32, f: &Figures| {
        println!(
            "  {name:<22} {:>8.0} msg/s   writes per message {writes}   host cpu {:>6} us/msg   sequential p50 {:>8} us  p99 {:>8} us",
            f.rate,
            f.cpu_per_message.map_or("-".into(), us),
            us(f.latency.p50),
            us(f.latency.p99)
        )
    };
    row("claim before, window", 3, &figures[0].1);
    row("claim before, fenced", 2, &figures[1].1);
    row("claim after, window", 2, &figures[2].1);
    let base = figures[0].1.rate;
    println!(
        "  ratio fenced / claim before        {:.2}",
        figures[1].1.rate / base
    );
    println!(
        "  ratio claim after / claim before   {:.2}",
        figures[2].1.rate / base
    );
    Ok(())
}
