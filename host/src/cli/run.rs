//! `dedup-host run --config FILE`: consume until SIGINT/SIGTERM, then shut down gracefully.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use tracing_appender::non_blocking::WorkerGuard;

use crate::config::{Config, ConfigError, LogFormat};
use crate::serve::{self, ReloadReport};

/// The configuration flags shared by the commands that talk to a deployment.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// The TOML configuration file (before or after a subcommand).
    #[arg(long, value_name = "FILE", env = "DEDUP_HOST_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Override `nats.urls` (comma-separated), as the `nats` CLI's `-s`.
    #[arg(
        long,
        short = 's',
        value_name = "URLS",
        env = "DEDUP_HOST_NATS_URL",
        global = true
    )]
    nats_url: Option<String>,
}

impl ConfigArgs {
    /// Loads and validates the configuration, with the URL override applied; a config that
    /// names no server gets the one a `dedup-host dev` running beside it started.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let path = self.config.as_ref().ok_or(ConfigError::Missing)?;
        let mut config = Config::load(path)?;
        if let Some(urls) = &self.nats_url {
            config.nats.urls = urls.split(',').map(str::to_string).collect();
            config.nats.urls_origin = Some("--nats-url or DEDUP_HOST_NATS_URL".into());
        } else if config.nats.urls.is_empty() {
            let dev = crate::dev::running_url(&config.base_dir)
                .or_else(|| crate::dev::running_url(std::path::Path::new(".")));
            if dev.is_some() {
                config.nats.urls_origin = Some("the `dedup-host dev` running here".into());
            }
            config.nats.urls.extend(dev);
        }
        Ok(config)
    }
}

/// Flags of the commands that run a host (`run`, `dev`), overriding the config.
#[derive(Debug, Args)]
pub struct ServeFlags {
    /// Serve `/metrics`, `/healthz` and `/readyz` here (overrides `host.metrics_addr`).
    #[arg(long, value_name = "ADDR", env = "DEDUP_HOST_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// `text` or `json` log lines on stderr (overrides `host.log_format`).
    #[arg(long, value_name = "FORMAT", env = "DEDUP_HOST_LOG_FORMAT")]
    log_format: Option<LogFormat>,
}

impl ServeFlags {
    /// Applies the overrides and installs the log subscriber; keep the guard to the end.
    pub fn apply(&self, config: &mut Config) -> WorkerGuard {
        self.overrides(config);
        crate::logging::init(config.host.log_format)
    }

    /// Applies the overrides only (to a reloaded config, so they do not count as changes).
    pub fn overrides(&self, config: &mut Config) {
        if let Some(addr) = self.metrics_addr {
            config.host.metrics_addr = Some(addr);
        }
        if let Some(format) = self.log_format {
            config.host.log_format = format;
        }
    }
}

/// Flags of `dedup-host run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    serve: ServeFlags,
}

/// Runs the host until a shutdown signal; prints the final counters as JSON. Exits 1 at once,
/// before connecting, when a route's component file can never be served.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let mut config = args.config.load()?;
    let _log = args.serve.apply(&mut config);
    if let Err(unservable) = crate::components::check::component_files(&config).await? {
        eprintln!("dedup-host run: not started: {unservable}");
        return Ok(ExitCode::from(1));
    }
    serve(config, || {
        let mut config = args.config.load()?;
        args.serve.overrides(&mut config);
        Ok(config)
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Starts a host and serves until SIGINT/SIGTERM, then shuts down and prints the counters.
/// On SIGHUP, or a `dedup-host reload` reaching it through NATS, it re-reads the config with
/// `reload` and applies the route changes.
pub async fn serve(
    config: Config,
    reload: impl Fn() -> Result<Config, ConfigError>,
) -> anyhow::Result<()> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    // Installed before the host says it runs: a SIGTERM sent right after that line is a
    // graceful stop, never the default action that kills the process.
    let shutdown = shutdown_signal();
    let host = serve::start(config).await?;
    eprintln!(
        "dedup-host: running as `{}`; Ctrl-C to stop",
        host.instance_id()
    );
    if let Some(addr) = host.metrics_addr() {
        eprintln!(
            "dedup-host: metrics, health and readiness on http://{addr}/metrics /healthz /readyz"
        );
    }
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = hangup.recv() => {
                let report = host.reload(reload()).await;
                eprintln!("dedup-host: SIGHUP: {}", summary(&report));
            }
            Some(request) = host.reload_requested() => {
                let report = host.reload(reload()).await;
                eprintln!("dedup-host: reload requested: {}", summary(&report));
                host.answer(request, &report).await;
            }
        }
    }
    eprintln!("dedup-host: shutting down");
    let stats = host.shutdown().await?;
    // The stats line; a reader gone by now (`dev --watch | head`) is not an error of the host.
    let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string(&stats)?);
    Ok(())
}

/// One line saying what a reload did.
pub fn summary(report: &ReloadReport) -> String {
    let d = &report.diff;
    if !report.applied {
        return format!(
            "config refused, nothing changed: {}",
            report.problems.join("; ")
        );
    }
    let mut line = format!(
        "routes added {:?}, removed {:?}, changed {:?}",
        d.added, d.removed, d.changed
    );
    if !d.restart_needed.is_empty() {
        line += &format!(
            "; needs a restart to apply: {}",
            d.restart_needed.join(", ")
        );
        let streams = ["[source]", "[claims]", "[dead_letter]", "[output_streams]"];
        if d.restart_needed
            .iter()
            .any(|s| streams.contains(&s.as_str()))
        {
            line += " (streams and buckets first: `dedup-host setup --plan` shows what an \
                     existing deployment needs and `dedup-host setup --apply` makes it, then \
                     restart the hosts one at a time)";
        }
    }
    if !report.problems.is_empty() {
        line += &format!("; problems: {}", report.problems.join("; "));
    }
    line
}

/// Installs the SIGINT and SIGTERM handlers at once (not when first polled) and returns a
/// future that resolves on either. Call it inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::diff::ConfigDiff;

    fn report(restart_needed: &[&str]) -> ReloadReport {
        ReloadReport {
            instance_id: "h1".into(),
            applied: true,
            diff: ConfigDiff {
                restart_needed: restart_needed.iter().map(|s| s.to_string()).collect(),
                ..ConfigDiff::default()
            },
            problems: Vec::new(),
        }
    }

    #[test]
    fn a_reload_that_changes_streams_names_the_commands_that_change_them() {
        let line = summary(&report(&["[source]"]));
        assert!(
            line.contains("needs a restart to apply: [source]"),
            "{line}"
        );
        assert!(line.contains("`dedup-host setup --plan`"), "{line}");
        assert!(line.contains("`dedup-host setup --apply`"), "{line}");
        let line = summary(&report(&["[host]"]));
        assert!(!line.contains("setup --plan"), "{line}");
    }
}
