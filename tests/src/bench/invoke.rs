//! Instantiate + call of the `uppercase` guest on a 1 KiB payload, one invocation at a time,
//! with the limits armed (as the host runs) and, as the baseline, with none (no epoch
//! deadline, no fuel, no memory limiter) to show what the limits cost.

use std::time::Instant;

use dedup_host::bindings::Event;
use dedup_host::runtime::{EngineSettings, InvokeOptions, Outcome, Runtime};

use super::{percentiles, us};
use crate::guests::guest;

/// Runs `iterations` invocations (after a warm-up) with and without limits, alternating in
/// rounds so drift in the machine's speed hits both alike; prints medians, p99s and ratios.
pub async fn run(iterations: usize) -> anyhow::Result<()> {
    const ROUNDS: usize = 5;
    let (mut limited, mut free) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        limited.extend(sample(true, iterations / ROUNDS).await?);
        free.extend(sample(false, iterations / ROUNDS).await?);
    }
    let (l, f) = (percentiles(&mut limited), percentiles(&mut free));
    println!("invoke uppercase (1 KiB payload, instantiate + call, fresh store each):");
    println!(
        "  with limits (host default)   {iterations} iterations: median {} us, p99 {} us",
        us(l.p50),
        us(l.p99)
    );
    println!(
        "  no limits (baseline)         {iterations} iterations: median {} us, p99 {} us",
        us(f.p50),
        us(f.p99)
    );
    println!(
        "  cost of limits: median ratio {:.3}, p99 ratio {:.3}",
        l.p50.as_secs_f64() / f.p50.as_secs_f64(),
        l.p99.as_secs_f64() / f.p99.as_secs_f64()
    );
    Ok(())
}

/// Timed invocations on a runtime with limits armed (`metered`) or not.
async fn sample(metered: bool, iterations: usize) -> anyhow::Result<Vec<std::time::Duration>> {
    let runtime = Runtime::new(&EngineSettings {
        metered,
        ..EngineSettings::default()
    })?;
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
    Ok(samples)
}
