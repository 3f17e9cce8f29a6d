//! The demo's safe-deploy part: the ledger route is served from the object store with
//! `ledger-next` beside it in shadow (as `dedup-host deploy --shadow` does), and the demo prints
//! what every host found comparing the two (as `dedup-host diff` does).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::Context as JetStream;

use crate::candidate::spec::{Margins, Mode, Spec, State};
use crate::candidate::{record, store as candidates};
use crate::components::store;
use crate::config::Config;

/// The route shadowed, and how many of its messages the live version runs in the demo.
const ROUTE: &str = "ledger";
const LIVE_RUNS: u64 = 4;
/// How long the demo waits for the shadow counts (written once more as the host stops).
const WAIT: Duration = Duration::from_secs(3);

/// Serves the ledger route from the object store (its file deployed as the live version)
/// with `ledger-next.wasm`, found beside it, as a shadow candidate. Returns its digest.
pub(super) async fn prepare(js: &JetStream, config: &mut Config) -> anyhow::Result<Option<String>> {
    let route = config.routes.iter_mut().find(|r| r.name == ROUTE);
    let Some(file) = route.and_then(|r| r.component.take()) else {
        return Ok(None);
    };
    let live = config.resolve(&file);
    let next = live.with_file_name("ledger-next.wasm");
    let read = |p: &std::path::Path| {
        std::fs::read(p)
            .with_context(|| format!("cannot read `{}`: run guests/build.sh rust", p.display()))
    };
    let (live, next) = (read(&live)?, read(&next)?);
    let bucket = store::open(js, config).await?;
    store::deploy(&bucket, ROUTE, &live).await?;
    let spec = Spec {
        digest: crate::runtime::digest(&next),
        mode: Mode::Shadow { secondary: false },
        ignore: vec!["/ran_ms".into()],
        margins: Margins::default(),
        auto_promote: None,
        since_ms: crate::claim::record::now_ms(),
        state: State::Running,
    };
    candidates::put(&bucket, ROUTE, &next, &spec).await?;
    Ok(Some(spec.digest))
}

/// Waits until the host runs the candidate `digest` (compiled beside the live version).
pub(super) async fn wait_running(
    js: &JetStream,
    config: &Config,
    digest: Option<String>,
) -> anyhow::Result<()> {
    let Some(digest) = digest else {
        return Ok(());
    };
    let what = format!("candidate {digest}");
    let all = super::wait::every_host(js, config, ROUTE, Duration::from_secs(30), &what, |s| {
        s.candidate
            .as_deref()
            .is_some_and(|c| c.starts_with(&digest))
    })
    .await?;
    println!("{all}");
    Ok(())
}

/// Prints the shadow comparisons every host made, once they cover the live runs.
pub(super) async fn print(js: &JetStream, config: &Config) -> anyhow::Result<()> {
    let bucket = store::open(js, config).await?;
    let Some(spec) = candidates::current(&bucket, ROUTE).await? else {
        return Ok(());
    };
    let findings = record::open(js, config).await?;
    let started = Instant::now();
    let report = loop {
        let report = record::read(&findings, ROUTE, &spec.digest).await?;
        let c = &report.counts;
        if c.compared + c.skipped >= LIVE_RUNS || started.elapsed() > WAIT {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c = &report.counts;
    println!("\nChanging a handler safely (`dedup-host deploy --route {ROUTE} --shadow ledger-next.wasm`, then `dedup-host diff`):");
    println!(
        "  ledger-next ran in shadow beside the live ledger: {} compared, {} matches, {} differences, {} skipped (no spare shadow slot); none of its outputs stored",
        c.compared, c.matches, c.differences, c.skipped
    );
    if let Some(sample) = report.first.values().next() {
        println!(
            "  key {} differs at {}",
            sample.key,
            sample.differences.join(", ")
        );
        for (who, run) in [("live", &sample.live), ("candidate", &sample.candidate)] {
            let payload = run.outputs.first().map_or("", |o| o.payload.as_str());
            println!("    {who:<9} {} {payload}", run.outcome);
        }
    }
    println!("  next: `--canary 20%` runs it on a fifth of keys with real effects, `promote` makes it live (README, Changing a handler safely)");
    Ok(())
}
