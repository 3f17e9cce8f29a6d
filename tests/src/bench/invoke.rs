//! Instantiate + call of the `uppercase` guest on a 1 KiB payload, one invocation at a time,
//! with the limits armed (as the host runs) and, as the baseline, with none (no epoch
//! deadline, no fuel, no memory limiter) to show what the limits cost.

use dedup_host::runtime::{EngineSettings, InvokeOptions, Runtime};

use super::{percentiles, time_invocations, us};
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
    time_invocations(&handler, &InvokeOptions::default(), iterations).await
}
