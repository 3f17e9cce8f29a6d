//! The `--payload STR | --payload-file F` pair shared by `invoke` and `publish`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// A message body given inline or from a file (exactly one is required).
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct PayloadArgs {
    /// The payload, as a string.
    #[arg(long, value_name = "STR")]
    payload: Option<String>,
    /// Read the payload from this file.
    #[arg(long, value_name = "F")]
    payload_file: Option<PathBuf>,
}

impl PayloadArgs {
    /// The payload bytes.
    pub fn read(&self) -> anyhow::Result<Vec<u8>> {
        match (&self.payload, &self.payload_file) {
            (Some(p), _) => Ok(p.clone().into_bytes()),
            (None, Some(f)) => std::fs::read(f)
                .with_context(|| format!("--payload-file `{}`: cannot read it", f.display())),
            (None, None) => anyhow::bail!("give --payload or --payload-file"),
        }
    }
}
