//! `dedup-host deploy | undeploy | routes`: ship a route's component through the object store,
//! withdraw it, and list what every host serves.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::run::ConfigArgs;
use crate::components::{status, store};
use crate::config::Config;

/// Flags of `dedup-host deploy`.
#[derive(Debug, Args)]
pub struct DeployArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route (a `[[routes]]` entry without a `component` file).
    #[arg(long, value_name = "NAME")]
    route: String,
    /// The component to upload as the live version (or see `--shadow` and `--canary`).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["shadow", "canary"])]
    component: Option<PathBuf>,
    #[command(flatten)]
    candidate: super::candidate::CandidateArgs,
    /// Upload without checking the component here first (hosts still refuse a broken one).
    #[arg(long)]
    skip_check: bool,
    /// Then wait (at most this long, e.g. `60s`) until every live host runs the new version
    /// or candidate; exits 1 naming the hosts that do not.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<std::time::Duration>,
}

/// Flags of `dedup-host undeploy`.
#[derive(Debug, Args)]
pub struct UndeployArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route whose component to withdraw; hosts stop consuming its subjects.
    #[arg(long, value_name = "NAME")]
    route: String,
}

/// Flags of `dedup-host routes`.
#[derive(Debug, Args)]
pub struct RoutesArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Print JSON instead of a table: per route its source, candidate and each live host's
    /// status (digest served, `refused`, `contract_refused`, candidate).
    #[arg(long)]
    json: bool,
}

/// Checks and uploads a component; prints its digest.
pub async fn deploy(args: DeployArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let candidate = args.candidate.candidate()?;
    if let Some((_, mode)) = &candidate {
        let after = crate::config::ClaimMode::After;
        let after = (config.routes.iter()).any(|r| r.name == args.route && r.claim == after);
        if let Some(refused) = crate::candidate::refusal(&args.route, after, mode) {
            return Err(refused.into());
        }
    }
    if let (Some(_), Some(live)) = (&candidate, super::route_file(&config, &args.route)?) {
        let files = crate::candidate::files::candidate_path(&live);
        let settings = crate::candidate::files::settings_path(&live);
        anyhow::bail!("route `{}` is served from the file `{}`: copy the candidate to `{}` instead, with its settings in `{}` (`mode = \"canary\"`, `percent = 20`; a shadow without it); every host reading that directory runs it", args.route, live.display(), files.display(), settings.display());
    }
    super::store_route(&config, &args.route)?;
    let (file, flag) = match (&candidate, &args.component) {
        (Some((file, _)), _) => (file.clone(), "the candidate"),
        (None, Some(file)) => (file.clone(), "--component"),
        (None, None) => anyhow::bail!("give --component FILE, --shadow FILE or --canary P% FILE"),
    };
    let bytes = std::fs::read(&file)
        .with_context(|| format!("cannot read `{}` ({flag})", file.display()))?;
    if !args.skip_check {
        // The engine and cache the hosts of this config use (`test` in its folder filled the
        // cache): what compiles here is what they load, compiled once per machine.
        let runtime = crate::components::check::runtime(&config)?;
        super::compile::load(&runtime, &file, &bytes)?;
    }
    let js = connect(&config, "deploy").await?;
    refuse_others(&js, &config, &args.route).await?;
    if let Some((_, mode)) = candidate {
        let label = mode.label();
        let status = mode.status();
        let what = (file.as_path(), mode);
        let digest =
            super::candidate::deploy(&js, &config, &args.route, what, &bytes, &args.candidate)
                .await?;
        let result = format!("{label} candidate");
        crate::activity::record_cli(&js, &config, "deploy", &args.route, &digest, result).await;
        if let Some(wait) = args.wait {
            let candidate = format!("{digest} {status}");
            super::candidate::wait_candidate(&js, &config, &args.route, wait, Some(&candidate))
                .await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let digest = ship(&js, &config, &args.route, &bytes).await?;
    println!(
        "deployed {} to route `{}`: {digest}",
        file.display(),
        args.route
    );
    if let Some(wait) = args.wait {
        let what = format!("version {digest}");
        let all = super::wait::every_host(&js, &config, &args.route, wait, &what, |s| {
            s.digest.as_deref() == Some(digest.as_str())
        })
        .await?;
        println!("{all}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Uploads `bytes` as route `route`'s live version and records it in the activity log;
/// returns its digest. The caller has checked the component and run [`refuse_others`].
pub(super) async fn ship(
    js: &async_nats::jetstream::Context,
    config: &Config,
    route: &str,
    bytes: &[u8],
) -> anyhow::Result<String> {
    let bucket = store::open(js, config).await?;
    let by = store::Deployer::of(config, route);
    let digest = store::deploy_by(&bucket, route, bytes, &by).await?;
    let result = "live version".to_string();
    crate::activity::record_cli(js, config, "deploy", route, &digest, result).await;
    Ok(digest)
}

/// Deletes a route's component from the object store.
pub async fn undeploy(args: UndeployArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    super::store_route(&config, &args.route)?;
    let js = connect(&config, "undeploy").await?;
    refuse_others(&js, &config, &args.route).await?;
    let bucket = store::open(&js, &config).await?;
    store::undeploy(&bucket, &args.route).await?;
    let result = "withdrawn".to_string();
    crate::activity::record_cli(&js, &config, "undeploy", &args.route, "", result).await;
    println!("withdrew the component of route `{}`", args.route);
    Ok(ExitCode::SUCCESS)
}

/// Prints every route with the version deployed and the version each live host serves, or
/// why a host does not serve it (a refused version, a config that differs from the route's
/// contract), and when the route on the server is another deployment's. Exits non-zero,
/// naming each, when a host refuses to serve a route or refused the last config reload, or a
/// route is another deployment's.
pub async fn routes(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let js = connect(&config, "routes").await?;
    let bucket = store::open(&js, &config).await?;
    let hosts = status::read_all(&status::open(&js, &config).await?).await?;
    let mut listing = Vec::new();
    let mut refusals = refusals(&config, &hosts);
    // A route another deployment holds: the hosts listed for it are that deployment's. A
    // check that cannot be made (no permission to list consumers, a timeout) is a warning:
    // the listing is still worth having.
    let foreign = match super::foreign::routes(&js, &config).await {
        Ok(foreign) => foreign,
        Err(e) => {
            eprintln!("dedup-host routes: warning: cannot check whether another deployment holds these routes ({e:#}), so the hosts listed may be another deployment's; give this user permission to list the source stream's consumers and read the contracts, then run `dedup-host routes` again");
            Default::default()
        }
    };
    refusals.extend(foreign.values().map(super::foreign::Foreign::message));
    for r in &config.routes {
        let dir = config.components.dir.as_ref().map(|d| config.resolve(d));
        let source = match (&r.component, dir) {
            (Some(file), _) => format!("file {}", config.resolve(file).display()),
            (None, Some(dir)) => {
                let file = dir.join(format!("{}.wasm", r.name));
                let state = if file.is_file() {
                    ""
                } else {
                    " (no such file yet)"
                };
                format!("directory file {}{state}", file.display())
            }
            (None, None) => match store::deployed(&bucket, &r.name).await {
                Some(digest) => format!("store {}/{} {digest}", config.components.bucket, r.name),
                None => format!(
                    "store {}/{} (nothing deployed)",
                    config.components.bucket, r.name
                ),
            },
        };
        let candidate = crate::candidate::store::current(&bucket, &r.name).await?;
        let candidate = candidate.as_ref().map(candidate_line);
        if args.json {
            let served: std::collections::BTreeMap<&str, &status::RouteStatus> = hosts
                .iter()
                .filter_map(|h| Some((h.instance_id.as_str(), h.routes.get(&r.name)?)))
                .collect();
            listing.push(serde_json::json!({
                "name": r.name,
                "subject": r.subject,
                "source": source,
                "candidate": candidate,
                "hosts": served,
                "other_deployment": foreign.get(&r.name),
            }));
            continue;
        }
        println!("{}  {}  <- {source}", r.name, r.subject);
        if let Some(foreign) = foreign.get(&r.name) {
            println!("  ANOTHER DEPLOYMENT'S: {}", foreign.message());
        }
        if let Some(candidate) = candidate {
            println!("  candidate {candidate}");
        }
        for h in &hosts {
            let Some(s) = h.routes.get(&r.name) else {
                continue;
            };
            if let Some(reason) = &s.contract_refused {
                println!(
                    "    {}  NOT SERVED (contract refused): {reason}",
                    h.instance_id
                );
                continue;
            }
            let serving = s.digest.as_deref().unwrap_or("not serving");
            let candidate = s
                .candidate
                .as_ref()
                .map(|c| format!("  candidate {c}"))
                .unwrap_or_default();
            match (&s.refused, &s.digest) {
                (Some(reason), Some(_)) => println!(
                    "    {}  {serving}{candidate}  (refused a newer version: {reason})",
                    h.instance_id
                ),
                (Some(reason), None) => println!(
                    "    {}  {serving}{candidate}  (refused its component: {reason})",
                    h.instance_id
                ),
                (None, _) => println!("    {}  {serving}{candidate}", h.instance_id),
            }
        }
    }
    if args.json {
        let config_refused: std::collections::BTreeMap<&str, &str> = hosts
            .iter()
            .filter_map(|h| Some((h.instance_id.as_str(), h.config_refused.as_deref()?)))
            .collect();
        let out = serde_json::json!({
            "routes": listing,
            "config_refused": config_refused,
            "refused": refusals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(refused_exit(&refusals));
    }
    for h in &hosts {
        if let Some(problems) = &h.config_refused {
            println!(
                "host {} refused the last config reload (serving the previous one): {problems}",
                h.instance_id
            );
        }
    }
    Ok(refused_exit(&refusals))
}

/// Every refusal a live host reports: a route of `config` it will not serve (its contract
/// refused, or its component refused with no version serving), or its last config reload.
fn refusals(config: &Config, hosts: &[status::HostStatus]) -> Vec<String> {
    let mut out = Vec::new();
    for h in hosts {
        let host = &h.instance_id;
        for r in &config.routes {
            let Some(s) = h.routes.get(&r.name) else {
                continue;
            };
            let route = &r.name;
            if let Some(reason) = &s.contract_refused {
                out.push(format!(
                    "host `{host}` refuses route `{route}` by contract: {reason}"
                ));
            } else if let (Some(reason), None) = (&s.refused, &s.digest) {
                out.push(format!(
                    "host `{host}` refused route `{route}`'s component: {reason}"
                ));
            }
        }
        if let Some(problems) = &h.config_refused {
            out.push(format!(
                "host `{host}` refused the last config reload: {problems}"
            ));
        }
    }
    out
}

/// Success when nothing was refused; else names each refusal on stderr and fails.
fn refused_exit(refusals: &[String]) -> ExitCode {
    if refusals.is_empty() {
        return ExitCode::SUCCESS;
    }
    for r in refusals {
        eprintln!("refused: {r}");
    }
    eprintln!(
        "{} refused: each line above names the host, the route and the reason to fix",
        refusals.len()
    );
    ExitCode::FAILURE
}

/// How `routes` shows a candidate: digest, mode, since when, state.
fn candidate_line(spec: &crate::candidate::Spec) -> String {
    use crate::candidate::spec::{Mode, State};
    let mode = match spec.mode {
        Mode::Shadow { .. } => "shadow".to_string(),
        Mode::Canary { percent } => format!("canary {percent}%"),
    };
    let now = crate::claim::record::now_ms();
    let since = crate::times::when(spec.since_ms, now);
    match &spec.state {
        State::Running => format!("{} {mode} since {since}, running", spec.digest),
        State::RolledBack { reason, by, at_ms } => format!(
            "{} {mode} since {since}, ROLLED BACK at {} by {by}: {reason}",
            spec.digest,
            crate::times::when(*at_ms, now)
        ),
    }
}

/// Refuses to touch `route`'s component when its consumer, contract or component object
/// belongs to another deployment ([`crate::ownership`]): the component store is shared by
/// name, so another config's deploy would replace what that deployment's hosts run.
pub(super) async fn refuse_others(
    js: &async_nats::jetstream::Context,
    config: &Config,
    route: &str,
) -> anyhow::Result<()> {
    let conflicts = crate::ownership::check(js, config).await?;
    let theirs = conflicts
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                crate::ownership::Conflict::Owned { .. }
                    | crate::ownership::Conflict::Consumer { .. }
            )
        })
        .filter(|c| c.route() == Some(route))
        .collect();
    crate::ownership::refuse(theirs)
        .with_context(|| format!("route `{route}`: its component was not changed"))?;
    // The object itself records who deployed it: a deployment that has not set up (no
    // consumer, no contract yet) still owns the component it deployed.
    let bucket = &config.components.bucket;
    let Ok(objects) = js.get_object_store(bucket).await else {
        return Ok(());
    };
    let Some(by) = store::deployer(&objects, route).await else {
        return Ok(());
    };
    let (consumer, deployment) = (by.consumer.as_deref(), by.deployment.as_deref());
    let conflict =
        crate::ownership::component_conflict(js, config, (bucket, route), consumer, deployment)
            .await?;
    match conflict {
        Some(owned) => Err(anyhow::Error::new(owned))
            .with_context(|| format!("route `{route}`: its component was not changed")),
        None => Ok(()),
    }
}

async fn connect(config: &Config, what: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = crate::connect::connect(config, &format!("dedup-host {what}")).await?;
    Ok(async_nats::jetstream::new(client))
}
