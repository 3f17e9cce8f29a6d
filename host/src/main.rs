//! The `dedup-host` binary: parse flags, hand over to the library (which sets up logging).

use std::process::ExitCode;

use clap::Parser;
use dedup_host::cli::Cli;

/// mimalloc, not glibc's malloc: each message's work is a few boxed futures of kilobytes,
/// and glibc served them from its slow paths (consolidating and unlinking chunks) at about a
/// tenth of the host's CPU per message (BENCHMARKS.md, issue 30).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
