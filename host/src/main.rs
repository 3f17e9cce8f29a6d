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
    if !cli.serves() {
        // A command that prints and exits behaves in a pipe as every Unix tool does: when
        // the reader goes away (`dedup-host routes --json | head -1`), it ends quietly on
        // SIGPIPE instead of panicking in `println!`. Serving commands keep Rust's default
        // (ignored), so a write to a closed socket is an error they handle, never a kill.
        // SAFETY: restores the default disposition of one signal, process-wide; nothing in
        // this process installs a SIGPIPE handler of its own.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A test-only switch undoes a guarantee: every command says so, not only `run` (an
    // operator command such as `setup --rename-route` acts on it too).
    for fix in dedup_delivery::revert::active() {
        eprintln!(
            "dedup-host: warning: test-only switch {}={} is set: this command runs WITHOUT the fix \"{}\"; unset it outside tests",
            dedup_delivery::revert::ENV,
            fix.name(),
            fix.reverted_means()
        );
    }
    match cli.run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dedup-host: error: {}", dedup_host::text::error_chain(&e));
            ExitCode::from(2)
        }
    }
}
