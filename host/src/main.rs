//! The `dedup-host` binary: parse flags, set up logging, hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use dedup_host::cli::Cli;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dedup-host: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
