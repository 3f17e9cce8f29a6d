//! `dedup-host deploy | undeploy | routes`: ship a route's component through the object store,
//! withdraw it, and list what every host serves.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::run::ConfigArgs;
use crate::components::{status, store};
use crate::config::Config;
use crate::runtime::{EngineSettings, Runtime};

/// Flags of `dedup-host deploy`.
#[derive(Debug, Args)]
pub struct DeployArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route (a `[[routes]]` entry without a `component` file).
    #[arg(long, value_name = "NAME")]
    route: String,
    /// The component to upload.
    #[arg(long, value_name = "FILE")]
    component: PathBuf,
    /// Upload without checking the component here first (hosts still refuse a broken one).
    #[arg(long)]
    skip_check: bool,
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
}

/// Checks and uploads a component; prints its digest.
pub async fn deploy(args: DeployArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    store_route(&config, &args.route)?;
    let bytes = std::fs::read(&args.component)
        .with_context(|| format!("cannot read `{}` (--component)", args.component.display()))?;
    if !args.skip_check {
        let runtime = Runtime::new(&EngineSettings::default())?;
        runtime.load_bytes(&args.component, &bytes)?;
    }
    let js = connect(&config, "deploy").await?;
    let bucket = store::open(&js, &config).await?;
    let digest = store::deploy(&bucket, &args.route, &bytes).await?;
    println!(
        "deployed {} to route `{}`: {digest}",
        args.component.display(),
        args.route
    );
    Ok(ExitCode::SUCCESS)
}

/// Deletes a route's component from the object store.
pub async fn undeploy(args: UndeployArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    store_route(&config, &args.route)?;
    let js = connect(&config, "undeploy").await?;
    let bucket = store::open(&js, &config).await?;
    store::undeploy(&bucket, &args.route).await?;
    println!("withdrew the component of route `{}`", args.route);
    Ok(ExitCode::SUCCESS)
}

/// Prints every route with the version deployed and the version each live host serves.
pub async fn routes(args: RoutesArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let js = connect(&config, "routes").await?;
    let bucket = store::open(&js, &config).await?;
    let hosts = status::read_all(&status::open(&js, &config).await?).await?;
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
        println!("{}  {}  <- {source}", r.name, r.subject);
        for h in &hosts {
            let Some(s) = h.routes.get(&r.name) else {
                continue;
            };
            let serving = s.digest.as_deref().unwrap_or("not serving");
            match &s.refused {
                Some(reason) => println!(
                    "    {}  {serving}  (refused a newer version: {reason})",
                    h.instance_id
                ),
                None => println!("    {}  {serving}", h.instance_id),
            }
        }
    }
    for h in &hosts {
        if let Some(problems) = &h.config_refused {
            println!(
                "host {} refused the last config reload (serving the previous one): {problems}",
                h.instance_id
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The route must exist and take its component from the store.
fn store_route(config: &Config, route: &str) -> anyhow::Result<()> {
    let Some(r) = config.routes.iter().find(|r| r.name == route) else {
        let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
        anyhow::bail!("no route `{route}` in the config (routes: {names:?}); add a [[routes]] entry without `component` first");
    };
    if let Some(file) = &r.component {
        anyhow::bail!("route `{route}` is served from the file `{}`: replace that file instead, or remove `component` from the route to serve it from the object store", file.display());
    }
    if let Some(dir) = &config.components.dir {
        let file = config.resolve(dir).join(format!("{route}.wasm"));
        anyhow::bail!("route `{route}` is served from the component directory (`components.dir`): copy the component to `{}` instead (hosts take it once it stops changing), or remove `components.dir` to serve routes from the object store", file.display());
    }
    Ok(())
}

async fn connect(config: &Config, what: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = crate::connect::connect(config, &format!("dedup-host {what}")).await?;
    Ok(async_nats::jetstream::new(client))
}
