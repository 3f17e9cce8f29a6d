//! `dedup-host permissions`: prints the least-privilege NATS permissions of one role of the
//! config's deployment ([`crate::permissions`]).

use std::process::ExitCode;

use clap::Args;

use super::run::ConfigArgs;
use crate::permissions::{Permissions, Role};

/// Flags of `dedup-host permissions`.
#[derive(Debug, Args)]
pub struct PermissionsArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Whose permissions: `host` (`dedup-host run`), `operator` (the CLI: setup, deploy,
    /// inspect, audit, dead letters) or `console`.
    #[arg(long, value_enum)]
    role: Role,
    /// Print JSON instead of nats-server configuration text.
    #[arg(long)]
    json: bool,
}

/// Prints the permissions; needs no server.
pub fn run(args: PermissionsArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let permissions = Permissions::for_role(&config, args.role);
    if config.nats.inbox_prefix.is_none() {
        eprintln!(
            "dedup-host: warning: `nats.inbox_prefix` is not set, so these permissions let this \
             role read every client's replies in the account (`_INBOX.>`); give each deployment \
             its own prefix (e.g. `inbox_prefix = \"_INBOX_orders\"`) and print them again"
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&permissions.to_json())?);
    } else {
        print!("{}", permissions.to_conf());
    }
    Ok(ExitCode::SUCCESS)
}
