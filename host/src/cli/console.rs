//! `dedup-host console`: serves the web console of the config's deployment.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;

use super::run::ConfigArgs;
use crate::console::auth::Access;

/// Where the console listens when neither `--addr` nor `console.addr` says.
const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// Flags of `dedup-host console`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Where to listen (default `console.addr`, else 127.0.0.1:8080; port 0 picks a free
    /// one). An address other than loopback needs a token: `console.token` or
    /// DEDUP_CONSOLE_TOKEN. It answers only requests for a loopback name or address, the
    /// address it listens on, and the host names in DEDUP_CONSOLE_HOSTS (comma separated).
    #[arg(long, value_name = "ADDR")]
    addr: Option<SocketAddr>,
}

/// Serves the console until SIGINT.
pub async fn console(args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let addr = args
        .addr
        .or(config.console.addr)
        .unwrap_or_else(|| DEFAULT_ADDR.parse().expect("a valid address"));
    let access = Access::new(&config.console, |k| std::env::var(k).ok(), addr)?;
    crate::console::serve(config, addr, access, |bound, access| {
        match access.made_up_token() {
            Some(token) => eprintln!(
                "console: http://{bound}/ (reading is open on loopback; to change anything, log in at http://{bound}/login with the token {token})"
            ),
            None => eprintln!("console: http://{bound}/ (log in with the configured token)"),
        }
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
