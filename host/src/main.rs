//! The `dedup-host` binary: parse flags, hand over to the library (which sets up logging).

use std::process::ExitCode;

use clap::Parser;
use dedup_host::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dedup-host: error: {}", dedup_host::text::error_chain(&e));
            ExitCode::from(2)
        }
    }
}
