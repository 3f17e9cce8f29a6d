//! `dedup-host run --config FILE`: consume until SIGINT/SIGTERM, then shut down gracefully.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::serve;

/// The configuration flags shared by the commands that talk to a deployment.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// The TOML configuration file.
    #[arg(long, value_name = "FILE", env = "DEDUP_HOST_CONFIG")]
    config: PathBuf,
    /// Override `nats.urls` (comma-separated).
    #[arg(long, value_name = "URLS", env = "DEDUP_HOST_NATS_URL")]
    nats_url: Option<String>,
}

impl ConfigArgs {
    /// Loads and validates the configuration, with the URL override applied.
    pub fn load(&self) -> anyhow::Result<Config> {
        let mut config = Config::load(&self.config)?;
        if let Some(urls) = &self.nats_url {
            config.nats.urls = urls.split(',').map(str::to_string).collect();
        }
        Ok(config)
    }
}

/// Flags of `dedup-host run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
}

/// Runs the host until a shutdown signal; prints the final counters as JSON.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    serve(args.config.load()?).await?;
    Ok(ExitCode::SUCCESS)
}

/// Starts a host, waits for SIGINT/SIGTERM, shuts down and prints the counters.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let host = serve::start(config).await?;
    eprintln!(
        "dedup-host: running as `{}`; Ctrl-C to stop",
        host.instance_id()
    );
    shutdown_signal().await;
    eprintln!("dedup-host: shutting down");
    let stats = host.shutdown().await?;
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
