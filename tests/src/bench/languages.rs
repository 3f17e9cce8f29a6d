//! Per language: the conformance guest's size, first load (compile), cached load (restart),
//! and per-invocation median and p99 on the same 1 KiB payload, as ratios to the Rust guest.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_host::runtime::{Compiled, EngineSettings, InvokeOptions, Runtime};

use super::{percentiles, time_invocations, us};
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
}

/// Measures every language with `iterations` invocations each and prints a table.
pub async fn run(iterations: usize) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for lang in LANGUAGES {
        rows.push(measure(lang, iterations).await?);
    }
    let base = &rows[0];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("conformance guest per language (mode upper, 1 KiB payload, {iterations} invocations each; ratios to Rust):");
    println!(
        "  {:<11} {:>11} {:>13} {:>13} {:>12} {:>12}   ratios: size compile cached p50 p99",
        "language", "bytes", "compile ms", "cached ms", "p50 us", "p99 us"
    );
    for r in &rows {
        println!(
            "  {:<11} {:>11} {:>13.1} {:>13.2} {:>12} {:>12}   {:.0} {:.0} {:.1} {:.0} {:.0}",
            r.lang,
            r.size,
            r.compile.as_secs_f64() * 1e3,
            r.cached.as_secs_f64() * 1e3,
            us(r.p50),
            us(r.p99),
            r.size as f64 / base.size as f64,
            ratio(r.compile, base.compile),
            ratio(r.cached, base.cached),
            ratio(r.p50, base.p50),
            ratio(r.p99, base.p99),
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
    let handler = runtime.load_file(&path)?;
    let options = InvokeOptions {
        config: Arc::new([("mode".to_string(), "upper".to_string())].into()),
        ..InvokeOptions::default()
    };
    let mut samples = time_invocations(&handler, &options, iterations).await?;
    let p = percentiles(&mut samples);
    Ok(Row {
        lang,
        size,
        compile,
        cached,
        p50: p.p50,
        p99: p.p99,
    })
}
