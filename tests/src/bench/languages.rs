//! Per language: the conformance guest's size, first load (compile), cached load (restart),
//! and per-invocation median and p99 on the same 1 KiB payload, as ratios to the Rust guest;
//! each invocation split into instantiation (store set-up included) and the call. Measured
//! with the engine's default (freed pool slots keep the pages the last instance wrote, reset in
//! place: `EngineSettings::keep_resident_bytes`) and, in the same run, with every page given
//! back to the kernel (the engine before that setting), so the lever shows as a ratio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_host::runtime::{Compiled, EngineSettings, InvokeOptions, Runtime};

use super::{percentiles, time_invocation_parts, us};
use crate::guests::guest;

/// The languages measured; the first is the baseline.
pub const LANGUAGES: &[&str] = &["rust", "python", "javascript", "c"];

struct Row {
    lang: &'static str,
    size: u64,
    compile: Duration,
    cached: Duration,
    p50: Duration,
    p99: Duration,
    instantiate: Duration,
    call: Duration,
    /// Median of the whole invocation with every page given back (`keep_resident_bytes = 0`).
    p50_released: Duration,
    instantiate_released: Duration,
}

/// Measures every language with `iterations` invocations each and prints a table.
///
/// Only the languages in `only` when it is not empty (ratios are then to the first of them).
pub async fn run(iterations: usize, only: &[String]) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for lang in LANGUAGES {
        if only.is_empty() || only.iter().any(|o| o == lang) {
            rows.push(measure(lang, iterations).await?);
        }
    }
    anyhow::ensure!(
        !rows.is_empty(),
        "no such language; choose from {LANGUAGES:?}"
    );
    let base = &rows[0];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("conformance guest per language (mode upper, 1 KiB payload, {iterations} invocations each; ratios to Rust):");
    println!(
        "  {:<11} {:>11} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9}   ratios: size compile cached p50 p99",
        "language", "bytes", "compile ms", "cached ms", "inst us", "call us", "p50 us", "p99 us"
    );
    for r in &rows {
        println!(
            "  {:<11} {:>11} {:>11.1} {:>10.2} {:>9} {:>9} {:>9} {:>9}   {:.0} {:.0} {:.1} {:.0} {:.0}",
            r.lang,
            r.size,
            r.compile.as_secs_f64() * 1e3,
            r.cached.as_secs_f64() * 1e3,
            us(r.instantiate),
            us(r.call),
            us(r.p50),
            us(r.p99),
            r.size as f64 / base.size as f64,
            ratio(r.compile, base.compile),
            ratio(r.cached, base.cached),
            ratio(r.p50, base.p50),
            ratio(r.p99, base.p99),
        );
    }
    println!("every page given back to the kernel after each invocation (keep_resident_bytes = 0), same run:");
    println!(
        "  {:<11} {:>9} {:>9}   ratio p50 kept/given back",
        "language", "inst us", "p50 us"
    );
    for r in &rows {
        println!(
            "  {:<11} {:>9} {:>9}   {:.2}",
            r.lang,
            us(r.instantiate_released),
            us(r.p50_released),
            ratio(r.p50, r.p50_released)
        );
    }
    Ok(())
}

async fn measure(lang: &'static str, iterations: usize) -> anyhow::Result<Row> {
    let path = guest(&format!("conformance-{lang}"));
    let size = std::fs::metadata(&path)?.len();
    let cache = tempfile::tempdir()?;
    let load = |expected: Compiled| -> anyhow::Result<(Runtime, Duration)> {
        let runtime = Runtime::new(&EngineSettings::default())?.with_cache(cache.path())?;
        let started = Instant::now();
        let handler = runtime.load_file(&path)?;
        let elapsed = started.elapsed();
        anyhow::ensure!(
            handler.compiled() == expected,
            "{lang}: expected a {expected:?} load"
        );
        Ok((runtime, elapsed))
    };
    let (_, compile) = load(Compiled::Fresh)?;
    let (runtime, cached) = load(Compiled::Cached)?;
    let options = InvokeOptions {
        config: Arc::new([("mode".to_string(), "upper".to_string())].into()),
        ..InvokeOptions::default()
    };
    let handler = runtime.load_file(&path)?;
    let kept = sample(&handler, &options, iterations).await?;
    drop((handler, runtime));
    let runtime = Runtime::new(&EngineSettings {
        keep_resident_bytes: 0,
        ..EngineSettings::default()
    })?
    .with_cache(cache.path())?;
    let handler = runtime.load_file(&path)?;
    let released = sample(&handler, &options, iterations).await?;
    Ok(Row {
        lang,
        size,
        compile,
        cached,
        p50: kept.total.p50,
        p99: kept.total.p99,
        instantiate: kept.instantiate,
        call: kept.call,
        p50_released: released.total.p50,
        instantiate_released: released.instantiate,
    })
}

/// An invocation sample's percentiles, and the medians of its two parts.
struct Sample {
    total: super::Percentiles,
    instantiate: Duration,
    call: Duration,
}

async fn sample(
    handler: &dedup_host::runtime::Handler,
    options: &InvokeOptions,
    iterations: usize,
) -> anyhow::Result<Sample> {
    let parts = time_invocation_parts(handler, options, iterations).await?;
    let mut total: Vec<Duration> = parts.iter().map(|p| p.0).collect();
    let mut instantiate: Vec<Duration> = parts.iter().map(|p| p.1).collect();
    let mut call: Vec<Duration> = parts.iter().map(|p| p.0.saturating_sub(p.1)).collect();
    Ok(Sample {
        total: percentiles(&mut total),
        instantiate: percentiles(&mut instantiate).p50,
        call: percentiles(&mut call).p50,
    })
}
