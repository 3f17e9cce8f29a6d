//! `dedup-host deploy --shadow | --canary`, `promote`, `abort` and `diff`: changing a route's
//! handler safely, through a candidate every host runs beside the live version.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::run::ConfigArgs;
use crate::candidate::spec::{parse_share, Margins, Mode, Spec, State};
use crate::candidate::{files, record, store as candidates};
use crate::components::store;
use crate::config::Config;

/// How a candidate is deployed (flags of `dedup-host deploy` besides `--component`).
#[derive(Debug, Args)]
pub struct CandidateArgs {
    /// Run FILE in shadow: on every message the live version handles, outputs compared and
    /// thrown away (`dedup-host diff` shows what differs).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["component", "canary"])]
    pub shadow: Option<PathBuf>,
    /// Run FILE on P% of keys with real effects (`--canary 20% FILE`), rolled back on every
    /// host when it does worse than the live version.
    #[arg(long, num_args = 2, value_names = ["P%", "FILE"], conflicts_with_all = ["component", "shadow"])]
    pub canary: Option<Vec<String>>,
    /// Shadow: also run the live version a second time, so nondeterministic outputs (ids,
    /// times) are reported as noise, apart from the candidate's own differences.
    #[arg(long, requires = "shadow")]
    pub secondary: bool,
    /// A JSON pointer left out of payload comparisons (`/ran_ms`, `/items/*/id`); repeatable.
    #[arg(long, value_name = "POINTER")]
    pub ignore: Vec<String>,
    /// Promote automatically after N runs with no difference (shadow) or no regression
    /// (canary), counted on one host.
    #[arg(long, value_name = "N")]
    pub auto_promote: Option<u64>,
    /// Canary: largest accepted rise of the reject rate, in points (default 5).
    #[arg(long, value_name = "POINTS")]
    pub max_reject_rise: Option<f64>,
    /// Canary: largest accepted rise of the trap rate, in points (default 5).
    #[arg(long, value_name = "POINTS")]
    pub max_trap_rise: Option<f64>,
    /// Canary: largest accepted rise of the retry rate, in points (default 10).
    #[arg(long, value_name = "POINTS")]
    pub max_retry_rise: Option<f64>,
    /// Canary: largest accepted ratio of p99 guest times (default 3).
    #[arg(long, value_name = "RATIO")]
    pub max_p99_ratio: Option<f64>,
    /// Canary: runs of each version compared (default 200).
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Canary: candidate runs before any decision (default 20).
    #[arg(long, value_name = "N")]
    pub min_runs: Option<usize>,
}

impl CandidateArgs {
    /// The candidate's file and mode, if a candidate is deployed.
    pub fn candidate(&self) -> anyhow::Result<Option<(PathBuf, Mode)>> {
        if let Some(file) = &self.shadow {
            let secondary = self.secondary;
            return Ok(Some((file.clone(), Mode::Shadow { secondary })));
        }
        let Some(canary) = &self.canary else {
            return Ok(None);
        };
        let percent = parse_share(&canary[0]).map_err(|e| anyhow::anyhow!("--canary: {e}"))?;
        Ok(Some((PathBuf::from(&canary[1]), Mode::Canary { percent })))
    }

    fn margins(&self) -> Margins {
        let d = Margins::default();
        let points = |v: Option<f64>, default: f64| v.map_or(default, |p| p / 100.0);
        Margins {
            window: self.window.unwrap_or(d.window),
            min_runs: self.min_runs.unwrap_or(d.min_runs),
            rejects: points(self.max_reject_rise, d.rejects),
            traps: points(self.max_trap_rise, d.traps),
            retries: points(self.max_retry_rise, d.retries),
            p99_ratio: self.max_p99_ratio.unwrap_or(d.p99_ratio),
        }
    }
}

/// Uploads `file` as `route`'s candidate in `mode`; `bytes` were checked by the caller.
/// Returns the candidate's digest.
pub async fn deploy(
    js: &async_nats::jetstream::Context,
    config: &Config,
    route: &str,
    (file, mode): (&Path, Mode),
    bytes: &[u8],
    args: &CandidateArgs,
) -> anyhow::Result<String> {
    let spec = Spec {
        digest: crate::runtime::digest(bytes),
        mode,
        ignore: args.ignore.clone(),
        margins: args.margins(),
        auto_promote: args.auto_promote,
        since_ms: crate::claim::record::now_ms(),
        state: State::Running,
    };
    spec.validate()?;
    let bucket = store::open(js, config).await?;
    let Some(live) = store::deployed(&bucket, route).await else {
        anyhow::bail!("route `{route}` has no live version to compare a candidate with: deploy one first with `dedup-host deploy --route {route} --component FILE`");
    };
    if live == spec.digest && matches!(spec.mode, Mode::Canary { .. }) {
        anyhow::bail!("`{}` is the version route `{route}` serves already ({live}): a canary of it changes nothing", file.display());
    }
    candidates::put(&bucket, route, bytes, &spec).await?;
    println!(
        "deployed {} to route `{route}` as a {} candidate beside {live}: {}",
        file.display(),
        describe(&spec.mode),
        spec.digest
    );
    Ok(spec.digest)
}

/// Waits at most `wait` until every live host runs `candidate` (`<digest> <mode>`, as
/// [`Mode::status`] words it) as `route`'s candidate, in that mode (`None`: runs none). The
/// mode counts: a host still running the same digest in shadow has not taken a canary.
pub async fn wait_candidate(
    js: &async_nats::jetstream::Context,
    config: &Config,
    route: &str,
    wait: std::time::Duration,
    candidate: Option<&str>,
) -> anyhow::Result<()> {
    let what = candidate.map_or("no candidate".to_string(), |c| format!("candidate {c}"));
    let all = super::wait::every_host(js, config, route, wait, &what, |s| {
        s.candidate.as_deref() == candidate
    })
    .await?;
    println!("{all}");
    Ok(())
}

fn describe(mode: &Mode) -> String {
    match mode {
        Mode::Shadow { secondary: true } => "shadow (with a secondary live run)".into(),
        Mode::Shadow { secondary: false } => "shadow".into(),
        Mode::Canary { percent } => format!("canary {percent}%"),
    }
}

/// Flags of `dedup-host promote` and `dedup-host abort`.
#[derive(Debug, Args)]
pub struct RouteArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route whose candidate to promote or drop.
    #[arg(long, value_name = "NAME")]
    route: String,
    /// Then wait (at most this long, e.g. `60s`) until every live host has taken the change;
    /// exits 1 naming the hosts that have not.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<std::time::Duration>,
}

/// Makes a route's candidate its live version on every host.
pub async fn promote(args: RouteArgs) -> anyhow::Result<ExitCode> {
    let (config, js, file) = open(&args.config, &args.route, "promote").await?;
    let digest = match &file {
        Some(live) => {
            let spec = file_spec(live, &args.route)?;
            files::promote(live)
                .with_context(|| format!("cannot move the candidate over `{}`", live.display()))?;
            spec.digest
        }
        None => {
            let bucket = store::open(&js, &config).await?;
            store::promote(&bucket, &args.route, None).await?
        }
    };
    println!(
        "promoted the candidate of route `{}`: every host now serves {digest}",
        args.route
    );
    let result = "now the live version".to_string();
    crate::activity::record_cli(&js, &config, "promote", &args.route, &digest, result).await;
    if let Some(wait) = args.wait {
        let what = format!("version {digest} and no candidate");
        let all = super::wait::every_host(&js, &config, &args.route, wait, &what, |s| {
            s.digest.as_deref() == Some(digest.as_str()) && s.candidate.is_none()
        })
        .await?;
        println!("{all}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Drops a route's candidate on every host (a rolled-back one too).
pub async fn abort(args: RouteArgs) -> anyhow::Result<ExitCode> {
    let (config, js, file) = open(&args.config, &args.route, "abort").await?;
    let spec = match &file {
        Some(live) => {
            let spec = file_spec(live, &args.route)?;
            let candidate = files::candidate_path(live);
            std::fs::remove_file(&candidate)
                .with_context(|| format!("cannot remove `{}`", candidate.display()))?;
            let _ = std::fs::remove_file(files::settings_path(live));
            spec
        }
        None => {
            let bucket = store::open(&js, &config).await?;
            let Some(spec) = candidates::current(&bucket, &args.route).await? else {
                anyhow::bail!("route `{}` has no candidate to abort", args.route);
            };
            candidates::delete(&bucket, &args.route).await?;
            spec
        }
    };
    println!(
        "dropped the candidate {} of route `{}`; the live version runs every key",
        spec.digest, args.route
    );
    let result = "dropped".to_string();
    crate::activity::record_cli(&js, &config, "abort", &args.route, &spec.digest, result).await;
    if let Some(wait) = args.wait {
        wait_candidate(&js, &config, &args.route, wait, None).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `dedup-host diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route whose candidate's differences to show.
    #[arg(long, value_name = "NAME")]
    route: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// How many recent samples to print (the first of each kind are always printed).
    #[arg(long, default_value_t = 5)]
    samples: usize,
}

/// Prints what every host found comparing a route's candidate with its live version.
pub async fn diff(args: DiffArgs) -> anyhow::Result<ExitCode> {
    let (config, js, file) = open(&args.config, &args.route, "diff").await?;
    let spec = match &file {
        Some(live) => file_spec(live, &args.route)?,
        None => {
            let bucket = store::open(&js, &config).await?;
            let Some(spec) = candidates::current(&bucket, &args.route).await? else {
                anyhow::bail!("route `{}` has no candidate: deploy one with `dedup-host deploy --route {} --shadow FILE`", args.route, args.route);
            };
            spec
        }
    };
    let findings = record::open(&js, &config).await?;
    let mut report = record::read(&findings, &args.route, &spec.digest).await?;
    let skip = report.last.len().saturating_sub(args.samples);
    report.last.drain(..skip);
    if args.json {
        let out = serde_json::json!({ "route": args.route, "candidate": spec, "report": report });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let c = &report.counts;
    println!(
        "route `{}`: candidate {} ({}), {}",
        args.route,
        spec.digest,
        describe(&spec.mode),
        state(&spec.state)
    );
    println!(
        "  compared {}: {} matches, {} differences, {} noise; {} skipped (no spare slot); from {} host(s)",
        c.compared, c.matches, c.differences, c.noise, c.skipped, report.hosts
    );
    for (kind, n) in &c.kinds {
        println!("  {:<13} {n}", kind.label());
    }
    if c.compared > 0 {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        println!(
            "  candidate time {:.2}x live, fuel {:.2}x live",
            ratio(c.candidate_time_us, c.live_time_us),
            ratio(c.candidate_fuel, c.live_fuel)
        );
    }
    for (kind, s) in &report.first {
        print_sample(&format!("first {kind}"), s);
    }
    for s in &report.last {
        print_sample("recent", s);
    }
    Ok(ExitCode::SUCCESS)
}

fn state(state: &State) -> String {
    match state {
        State::Running => "running".into(),
        State::RolledBack { reason, by, .. } => format!("rolled back by {by}: {reason}"),
    }
}

fn print_sample(what: &str, s: &record::Sample) {
    println!(
        "  {what}: sequence {} key {:?} differs at {}",
        s.sequence,
        s.key,
        s.differences.join(", ")
    );
    for (who, run) in [("live", &s.live), ("candidate", &s.candidate)] {
        let outputs: Vec<String> = run
            .outputs
            .iter()
            .map(|o| format!("{} {}", o.subject, o.payload))
            .collect();
        let reason = run
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        println!(
            "    {who:<9} {}{reason} {}",
            run.outcome,
            outputs.join(" | ")
        );
        for (i, call) in run.calls.iter().enumerate() {
            println!("              call {i}: {call}");
        }
    }
}

/// Loads the config (the route must exist) and connects; with the route's live component file
/// when it is served from one.
async fn open(
    args: &ConfigArgs,
    route: &str,
    what: &str,
) -> anyhow::Result<(Config, async_nats::jetstream::Context, Option<PathBuf>)> {
    let config = args.load()?;
    let file = super::route_file(&config, route)?;
    let client = crate::connect::connect(&config, &format!("dedup-host {what}"))
        .await
        .context("cannot connect")?;
    Ok((config, async_nats::jetstream::new(client), file))
}

/// The candidate beside a route's live file `live`, as its hosts read it.
fn file_spec(live: &Path, route: &str) -> anyhow::Result<Spec> {
    let candidate = files::candidate_path(live);
    let bytes = std::fs::read(&candidate).map_err(|_| {
        anyhow::anyhow!(
            "route `{route}` has no candidate: copy the new version to `{}` (settings in `{}`)",
            candidate.display(),
            files::settings_path(live).display()
        )
    })?;
    let modified = std::fs::metadata(&candidate)?.modified()?;
    let since = modified.duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    files::spec(live, &bytes, since).map_err(|e| anyhow::anyhow!(e))
}
