//! `dedup-host setup --config FILE [--dry-run] [--json]`: create or verify every stream,
//! bucket and consumer the config needs, print what was created, what matched and what
//! differs, and exit 1 on a difference it will not change. With `--change-route R`: change a
//! route's contract ([`crate::contract_change`]).

use std::process::ExitCode;

use clap::Args;

use super::run::ConfigArgs;
use crate::provision::{self, Found};

/// Flags of `dedup-host setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Create nothing; only say what would be created and what differs.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Change route R's contract (what every host must agree on: claim store, effects and
    /// claim modes, key source, forever, entity source, partitions) to what this config says,
    /// once no host serves the route: reload the hosts with this config first.
    #[arg(long, value_name = "R")]
    change_route: Option<String>,
}

/// Provisions and reports.
pub async fn run(args: SetupArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let client = crate::connect::connect(&config, "dedup-host setup").await?;
    let js = async_nats::jetstream::new(client.clone());
    if let Some(route) = &args.change_route {
        let changed = crate::contract_change::change(&js, &config, route).await?;
        client.flush().await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&changed)?);
        } else {
            println!(
                "route `{route}`: contract {} ({} settled claim(s) moved, {} queued message(s) moved){}",
                changed.action,
                changed.claims_moved,
                changed.queued_moved,
                changed
                    .differences
                    .iter()
                    .map(|d| format!("\n  {d}"))
                    .collect::<String>()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let items = provision::provision(&js, &config, args.dry_run).await?;
    client.flush().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&items)?);
    } else {
        for item in &items {
            let (state, detail) = match &item.found {
                Found::Created => ("created", String::new()),
                Found::WouldCreate => ("would create", String::new()),
                Found::Matches => ("matches", String::new()),
                Found::Updated => ("updated", String::new()),
                Found::Differs(d) => ("DIFFERS", format!(": {}", d.join("; "))),
            };
            println!(
                "{state:<13} {:<13} {:<24} ({}){detail}",
                item.kind, item.name, item.field
            );
        }
    }
    let differs = items
        .iter()
        .filter(|i| matches!(i.found, Found::Differs(_)))
        .count();
    if differs > 0 {
        eprintln!("dedup-host setup: {differs} item(s) differ from the config; setup changes no existing stream or bucket: fix them on the server or in the config");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
