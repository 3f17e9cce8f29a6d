//! Instantiate + call of the `uppercase` guest on a 1 KiB payload, one invocation at a time.

use std::time::Instant;

use dedup_host::bindings::Event;
use dedup_host::runtime::{EngineSettings, InvokeOptions, Outcome, Runtime};

use super::{percentiles, us};
use crate::guests::guest;

/// Runs `iterations` invocations (after a warm-up) and prints median and p99.
pub async fn run(iterations: usize) -> anyhow::Result<()> {
    let runtime = Runtime::new(&EngineSettings::default())?;
    let handler = runtime.load_file(&guest("uppercase"))?;
    let options = InvokeOptions::default();
    let payload = vec![b'a'; 1024];
    let event = |i: usize| Event {
        subject: "bench.in".into(),
        payload: payload.clone(),
        headers: Vec::new(),
        key: format!("k{i}"),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: i as u64,
        route: "bench".into(),
    };
    for i in 0..iterations / 10 {
        handler.invoke(event(i), &options).await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let ev = event(i);
        let started = Instant::now();
        let inv = handler.invoke(ev, &options).await;
        samples.push(started.elapsed());
        anyhow::ensure!(
            matches!(inv.outcome, Outcome::Success(_)),
            "unexpected {:?}",
            inv.outcome
        );
    }
    let p = percentiles(&mut samples);
    println!("invoke uppercase (1 KiB payload, instantiate + call, fresh store each):");
    println!(
        "  iterations {iterations}: median {} us, p99 {} us",
        us(p.p50),
        us(p.p99)
    );
    Ok(())
}
