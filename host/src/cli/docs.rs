//! `dedup-host schema` (the config file's JSON Schema) and `dedup-host reference` (the book's
//! reference pages, generated from the code).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;

/// Flags of `dedup-host schema`.
#[derive(Debug, clap::Args)]
pub struct SchemaArgs {}

/// Prints the JSON Schema of `host.toml`.
pub fn schema(_: SchemaArgs) -> anyhow::Result<ExitCode> {
    let text = serde_json::to_string_pretty(&crate::config::schema::schema())?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// Flags of `dedup-host reference`.
#[derive(Debug, clap::Args)]
pub struct ReferenceArgs {
    /// The book's reference folder (`docs/src/reference`).
    pub dir: PathBuf,
    /// Write nothing: exit 1 naming every page that differs from what the code generates.
    #[arg(long)]
    pub check: bool,
}

/// Writes (or checks) the generated reference pages in `args.dir`.
pub fn reference(args: ReferenceArgs) -> anyhow::Result<ExitCode> {
    let pages = crate::reference::pages(super::Cli::command());
    if args.check {
        let stale = crate::reference::stale(&pages, &args.dir);
        for name in &stale {
            eprintln!(
                "dedup-host: {} differs from the code; run `dedup-host reference {}` and commit it",
                args.dir.join(name).display(),
                args.dir.display()
            );
        }
        return Ok(if stale.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    for page in &pages {
        let path = args.dir.join(page.name);
        std::fs::write(&path, &page.text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
