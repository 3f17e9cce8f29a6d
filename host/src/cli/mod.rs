//! The `dedup-host` command line: flag definitions and dispatch to each subcommand.

mod author;
mod candidate;
mod compile;
mod console;
mod demo_calls;
mod demo_console;
mod demo_modes;
mod demo_shadow;
mod deploy;
mod dev;
mod docs;
mod foreign;
mod invoke;
mod ops;
mod payload;
mod permissions;
mod publish;
mod reload;
mod run;
mod setup;
mod subject_arg;
mod tail;
mod wait;
mod watch;

use clap::{Parser, Subcommand};

/// A WebAssembly plugin host for dedup-guarded NATS JetStream message handlers.
#[derive(Debug, Parser)]
#[command(name = "dedup-host", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// The name the activity log records for the changes this command makes (deploy,
    /// promote, abort, replay, purge); default: `$USER`.
    #[arg(long = "as", global = true, value_name = "NAME", env = "DEDUP_HOST_AS")]
    pub actor: Option<String>,
}

impl Cli {
    /// Whether this command serves until stopped (`run`, `dev` but its demo, `console`)
    /// rather than printing a result and exiting.
    pub fn serves(&self) -> bool {
        match &self.command {
            Command::Run(_) | Command::Console(_) => true,
            Command::Dev(dev) => dev.serves(),
            _ => false,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one event through a guest with no NATS and print the outcome as JSON.
    Invoke(invoke::InvokeArgs),
    /// Create a handler project (WIT, handler, build files, cases, README) from a template.
    New(author::NewArgs),
    /// Build a handler project into a component with its language's toolchain.
    Build(author::BuildArgs),
    /// Write the `dedup:handler` WIT package this binary serves.
    Wit(author::WitArgs),
    /// Run a handler's cases (`cases.toml`) through the runtime; exit 1 on any failure.
    Test(author::TestArgs),
    /// Consume and process messages as configured, until SIGINT/SIGTERM.
    Run(run::RunArgs),
    /// Like `run`, but starts a local nats-server when the config names none; `--demo` runs
    /// the end-to-end example and exits; `--watch` builds, tests and deploys a handler
    /// project on every save.
    Dev(dev::DevArgs),
    /// Publish one event with a `Nats-Msg-Id`.
    Publish(publish::PublishArgs),
    /// Print messages as they are stored on a subject, or a route's outputs and dead letters.
    Tail(tail::TailArgs),
    /// Upload a route's component to the object store; every host picks it up.
    Deploy(deploy::DeployArgs),
    /// Withdraw a route's component; hosts stop consuming its subjects (messages wait).
    Undeploy(deploy::UndeployArgs),
    /// List routes with the version deployed and the version each live host serves.
    Routes(deploy::RoutesArgs),
    /// Make a route's candidate its live version on every host.
    Promote(candidate::RouteArgs),
    /// Drop a route's candidate on every host; the live version runs every key.
    Abort(candidate::RouteArgs),
    /// Show how a route's shadow candidate differs from the live version.
    Diff(candidate::DiffArgs),
    /// Create or verify every stream, bucket and consumer the config needs, then exit.
    Setup(setup::SetupArgs),
    /// Ask every host to re-read its config and apply route changes (also: SIGHUP).
    Reload(reload::ReloadArgs),
    /// Print one key's story: claim record, outputs, dead letters, source messages.
    Inspect(ops::InspectArgs),
    /// List, replay or purge dead letters.
    DeadLetters(ops::LettersArgs),
    /// Reconcile source, claims, outputs and dead letters; exit 1 on any anomaly.
    Audit(ops::AuditArgs),
    /// Serve the web console of the config's deployment (every host of its source stream).
    Console(console::ConsoleArgs),
    /// Print the least-privilege NATS permissions of a role (host, operator, console) of
    /// the config's deployment, as nats-server configuration or JSON.
    Permissions(permissions::PermissionsArgs),
    /// Print the JSON Schema of the config file, for editors (Taplo, Even Better TOML) and
    /// validators.
    Schema(docs::SchemaArgs),
    /// Write the book's generated reference pages (command line, configuration, metrics,
    /// schema) into a folder, or check them with `--check`.
    #[command(hide = true)]
    Reference(docs::ReferenceArgs),
}

impl Cli {
    /// Runs the chosen subcommand; the returned code is the process's exit code.
    pub async fn run(self) -> anyhow::Result<std::process::ExitCode> {
        // `run` and `dev` choose their log format from their config; the rest log as text.
        let _log = match &self.command {
            Command::Run(_) | Command::Dev(_) => None,
            _ => Some(crate::logging::init(crate::config::LogFormat::Text)),
        };
        let started = std::time::Instant::now();
        crate::activity::act_as(self.actor.as_deref());
        let result = match self.command {
            Command::Invoke(args) => invoke::run(args).await,
            Command::New(args) => author::new(args),
            Command::Build(args) => author::build(args),
            Command::Wit(args) => author::wit(args),
            Command::Test(args) => author::test(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Publish(args) => publish::run(args).await,
            Command::Tail(args) => tail::run(args).await,
            Command::Deploy(args) => deploy::deploy(args).await,
            Command::Undeploy(args) => deploy::undeploy(args).await,
            Command::Routes(args) => deploy::routes(args).await,
            Command::Promote(args) => candidate::promote(args).await,
            Command::Abort(args) => candidate::abort(args).await,
            Command::Diff(args) => candidate::diff(args).await,
            Command::Setup(args) => setup::run(args).await,
            Command::Reload(args) => reload::run(args).await,
            Command::Inspect(args) => ops::inspect(args).await,
            Command::DeadLetters(args) => ops::dead_letters(args).await,
            Command::Audit(args) => ops::audit(args).await,
            Command::Console(args) => console::console(args).await,
            Command::Permissions(args) => permissions::run(args),
            Command::Schema(args) => docs::schema(args),
            Command::Reference(args) => docs::reference(args),
        };
        // A command that timed out waiting on a refused subject says which one.
        let result = result.map_err(|e| crate::refusals::explain(e, started));
        // Exit codes: 0 done; 1 refused after checking the server (nothing changed) or found
        // what it reports (a difference, an anomaly, a failed case); 2 could not run as asked
        // (flags, the config, NATS). `main` turns every other error into 2.
        match result {
            Err(e) if refused(&e) => {
                eprint!("{}", refusal_text(&crate::text::error_chain(&e)));
                Ok(std::process::ExitCode::from(1))
            }
            other => other,
        }
    }
}

/// Whether `error` is a refusal: a check against what the server holds declined the command
/// before it changed anything (another deployment's item, a route still served, keys not
/// settled, letters that are not this deployment's, a canary on a claim-after route).
fn refused(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.is::<crate::ops::letters::LetterError>()
            || cause.is::<crate::contract_change::ChangeError>()
            || cause.is::<crate::ownership::Conflict>()
            || cause.is::<crate::ownership::Conflicts>()
            || cause.is::<crate::ownership::ComponentOwned>()
            || cause.is::<crate::rename::RenameRefused>()
            || cause.is::<crate::contract_change::NotDeadLettered>()
            || cause.is::<crate::candidate::ClaimAfterCanary>()
    })
}

/// A refusal as printed: every line of it (a refusal may list several conflicts, one a
/// line) starts with `dedup-host: refused: `, so each reads on its own and greps as one.
fn refusal_text(text: &str) -> String {
    text.lines()
        .map(|line| format!("dedup-host: refused: {line}\n"))
        .collect()
}

/// Parses a `KEY=VALUE` flag value.
pub(crate) fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!(
            "`{s}` is not KEY=VALUE (example: --header Content-Type=text/plain)"
        )),
    }
}

/// The component file route `route` is served from (its `component`, or its file in
/// `components.dir`), or `None` when it is served from the object store; the route must exist.
pub(crate) fn route_file(
    config: &crate::config::Config,
    route: &str,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(r) = config.routes.iter().find(|r| r.name == route) else {
        let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
        anyhow::bail!("no route `{route}` in the config (routes: {names:?}); add a [[routes]] entry without `component` first");
    };
    Ok(config.component_file(r))
}

/// The route must exist and take its component from the store.
pub(crate) fn store_route(config: &crate::config::Config, route: &str) -> anyhow::Result<()> {
    route_file(config, route)?;
    let r = config
        .routes
        .iter()
        .find(|r| r.name == route)
        .expect("found above");
    if let Some(file) = &r.component {
        anyhow::bail!("route `{route}` is served from the file `{}`: replace that file instead, or remove `component` from the route to serve it from the object store", file.display());
    }
    if let Some(dir) = &config.components.dir {
        let file = config.resolve(dir).join(format!("{route}.wasm"));
        anyhow::bail!("route `{route}` is served from the component directory (`components.dir`): copy the component to `{}` instead (hosts take it once it stops changing), or remove `components.dir` to serve routes from the object store", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_a_refusal_is_prefixed() {
        assert_eq!(
            refusal_text("route `a`: first conflict\nsecond conflict"),
            "dedup-host: refused: route `a`: first conflict\ndedup-host: refused: second conflict\n"
        );
    }

    #[test]
    fn typed_refusals_are_refusals() {
        let conflicts = crate::ownership::refuse(vec![crate::ownership::Conflict::Owned {
            kind: "consumer",
            name: "c".into(),
            owner: "other".into(),
            mine: "mine".into(),
            would: "rebind it".into(),
            route: Some("r".into()),
        }])
        .unwrap_err()
        .context("route `r`: its component was not changed");
        assert!(refused(&conflicts));
        let canary =
            crate::candidate::refusal("r", true, &crate::candidate::Mode::Canary { percent: 10 })
                .expect("refused");
        assert!(refused(&anyhow::Error::new(canary)));
        assert!(!refused(&anyhow::anyhow!("cannot connect to NATS")));
    }
}
