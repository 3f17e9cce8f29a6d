//! `dedup-host setup --config FILE [--dry-run] [--json]`: create or verify every stream,
//! bucket and consumer the config needs, print what was created, what matched and what
//! differs, and exit 1 on a difference it will not change. With `--plan` / `--apply`: show or
//! make the changes an existing deployment needs ([`crate::plan`]). With `--change-route R`:
//! change a route's contract ([`crate::contract_change`]). With `--rename-route OLD NEW`:
//! rename a route ([`crate::rename`]).

use std::process::ExitCode;

use clap::Args;

use super::run::ConfigArgs;
use crate::plan::Change;
use crate::provision::{self, Found};

/// Flags of `dedup-host setup`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("route_change").args(["change_route", "rename_route"]))]
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
    /// Show what an existing deployment needs changed to match the config (stream subjects,
    /// duplicate windows, replicas, the claim bucket's history and max age), each with its
    /// risk; change nothing.
    #[arg(long, conflicts_with_all = ["dry_run", "apply", "change_route"])]
    plan: bool,
    /// Make the plan's safe changes in place (the server keeps every message); refuse the
    /// ones that would lose or weaken something, saying what to do instead.
    #[arg(long, conflicts_with_all = ["dry_run", "change_route"])]
    apply: bool,
    /// With `--plan` / `--apply`: allow changes to stream S although another deployment uses
    /// it (both deployments mean to share it); without it such a change is refused.
    #[arg(long, value_name = "S")]
    share_stream: Vec<String>,
    /// With `--apply`: let existing stream S take rollups (fenced commits need them). Any
    /// client allowed to publish to S can then purge it with `Nats-Rollup: all`, outputs and
    /// fenced claim records alike: allow publishing there only to the hosts. Without it the
    /// change is refused.
    #[arg(long, value_name = "S")]
    allow_rollup: Vec<String>,
    /// Rename route OLD to NEW (the config names NEW): carry its claims, contract and
    /// consumer position over instead of running its retained messages again, once no host
    /// serves OLD.
    #[arg(long, num_args = 2, value_names = ["OLD", "NEW"], conflicts_with_all = ["dry_run", "plan", "apply", "change_route"])]
    rename_route: Option<Vec<String>>,
    /// With `--change-route` / `--rename-route`: accept claim key K (as a refusal lists it),
    /// dead-lettered after its outputs may have been stored, as settled: it can never
    /// complete, so it moves as it is (still dead-lettered, marked as accepted: `dead-letters
    /// replay` refuses its letter unless `--force`). Repeatable.
    #[arg(long, value_name = "K", requires = "route_change")]
    accept_dead: Vec<String>,
}

/// Provisions and reports.
pub async fn run(args: SetupArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let client = crate::connect::connect(&config, "dedup-host setup").await?;
    let js = async_nats::jetstream::new(client.clone());
    if let Some([old, new]) = args.rename_route.as_deref() {
        let accepted = crate::contract_change::AcceptedDead::new(&args.accept_dead);
        let renamed = crate::rename::rename(&js, &config, old, new, &accepted).await?;
        client.flush().await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&renamed)?);
        } else {
            println!(
                "route `{old}` renamed to `{new}`: {} claim record(s) carried over (with {} outbound-call record(s)); its consumer starts at stream sequence {}; {}",
                renamed.claims_copied,
                renamed.calls_copied,
                renamed.starts_at,
                match &renamed.component {
                    Some(digest) => format!("its component {digest} was copied to `{new}`"),
                    None => format!("no component copied (`{old}` had none, or `{new}` has one): `dedup-host routes` shows what `{new}` runs"),
                }
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(route) = &args.change_route {
        let accepted = crate::contract_change::AcceptedDead::new(&args.accept_dead);
        let changed = crate::contract_change::change(&js, &config, route, &accepted).await?;
        client.flush().await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&changed)?);
        } else {
            println!(
                "route `{route}`: contract {} ({} claim record(s) moved with {} outbound-call record(s), {} queued message(s) moved){}",
                changed.action,
                changed.claims_moved,
                changed.calls_moved,
                changed.queued_moved,
                changed
                    .differences
                    .iter()
                    .map(|d| format!("\n  {d}"))
                    .collect::<String>()
            );
            for key in &changed.accepted_dead {
                println!("  accepted as settled (dead-lettered; its letter is not replayed without --force): {key}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.plan || args.apply {
        let consent = crate::plan::Consent {
            shared: args.share_stream.clone(),
            rollups: args.allow_rollup.clone(),
        };
        let changes = if args.apply {
            crate::plan::apply(&js, &config, &consent).await?
        } else {
            crate::plan::plan(&js, &config, &consent).await?
        };
        return print_plan(&changes, args.json);
    }
    // Check everything first, then act: a component that can never be served stops here.
    if let Err(unservable) = crate::components::check::component_files(&config).await? {
        eprintln!("dedup-host setup: nothing set up: {unservable}");
        return Ok(ExitCode::from(1));
    }
    // An output subject that no stream captures (on the server, or in this config) is a
    // config error, as a host start finds it: exit 2, as for a config that does not validate.
    // One the server's streams could not show (this user may not list them) is a warning.
    match crate::capture::check(&js, &config).await {
        crate::capture::OutputCheck::Captured => {}
        crate::capture::OutputCheck::Unchecked(warnings) => {
            for warning in &warnings {
                eprintln!("dedup-host setup: warning: {warning}");
            }
        }
        crate::capture::OutputCheck::Refused(uncaptured) => {
            for line in uncaptured.to_string().lines() {
                eprintln!("dedup-host setup: {line}");
            }
            eprintln!("dedup-host setup: nothing set up");
            return Ok(ExitCode::from(2));
        }
    }
    // The server's consumer limit per stream, named before anything is created.
    let over_limit = crate::consumer_limit::check(&js, &config).await?;
    for over in &over_limit {
        eprintln!("dedup-host setup: consumer limit: {}", over.message());
    }
    if !over_limit.is_empty() && !args.dry_run {
        eprintln!("dedup-host setup: nothing set up");
        return Ok(ExitCode::from(1));
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
    if differs == 0 && !args.dry_run {
        for moved in crate::ownership::migrate(&js, &config).await? {
            println!("moved         {moved} (this deployment's former default name)");
        }
        client.flush().await?;
    }
    if differs > 0 {
        let conflicts = crate::ownership::check(&js, &config).await?;
        let conflicts: Vec<String> = conflicts.iter().map(ToString::to_string).collect();
        eprintln!("{}", closing_line(&items, &conflicts, args.dry_run));
        return Ok(ExitCode::from(1));
    }
    if !over_limit.is_empty() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// What a refused `setup` says last: how many items differ, and per kind of difference what
/// actually fixes it. `conflicts` are the texts of the ownership conflicts
/// ([`crate::ownership::check`]) that some items' differences are: `--plan`/`--apply` change
/// streams and the claim bucket only, never what another deployment owns. `dry_run` says
/// whether this was `--dry-run`: a real run updates this deployment's consumers itself, unless
/// another difference blocks it.
fn closing_line(items: &[provision::Item], conflicts: &[String], dry_run: bool) -> String {
    let mut owned = 0;
    let mut contracts = Vec::new();
    let mut planned = 0;
    let mut consumers = 0;
    let mut other = 0;
    for item in items {
        let Found::Differs(differences) = &item.found else {
            continue;
        };
        if differences.iter().any(|d| conflicts.contains(d)) {
            owned += 1;
        } else if item.kind == "contract" {
            contracts.push(item.field.trim_start_matches("routes.").to_string());
        } else if item.kind == "stream" || item.field == "claims.bucket" {
            planned += 1;
        } else if item.kind == "consumer" {
            consumers += 1;
        } else {
            other += 1;
        }
    }
    let total = owned + contracts.len() + planned + consumers + other;
    let mut fixes = Vec::new();
    if owned > 0 {
        fixes.push(format!("{owned} belong(s) to another deployment or would rename a route, which `--plan`/`--apply` cannot change: if this config is that deployment, set its `[deployment] name` to the owner named above; otherwise give this config its own `[source] stream` or route names (a rename is `dedup-host setup --rename-route OLD NEW`)"));
    }
    if planned > 0 {
        fixes.push(format!("{planned} stream/bucket difference(s): `dedup-host setup --plan` shows the changes and `--apply` makes the safe ones (a stream another deployment uses also needs `--share-stream S`, an output stream that must take rollups for fenced commits `--allow-rollup S`), or make the config match the server"));
    }
    if !contracts.is_empty() {
        let routes: Vec<String> = contracts
            .iter()
            .map(|r| format!("`dedup-host setup --change-route {r}`"))
            .collect();
        fixes.push(format!(
            "{} contract difference(s): change the contract with {} once no host serves the route, or keep the recorded settings in the config",
            contracts.len(),
            routes.join(", ")
        ));
    }
    let blocked = total > consumers;
    if consumers > 0 && dry_run && !blocked {
        fixes.push(format!("{consumers} consumer(s) of this deployment with other settings: a `setup` without `--dry-run` (or a host start) updates them"));
    } else if consumers > 0 {
        fixes.push(format!("{consumers} consumer(s) of this deployment with other settings: not updated while the other items differ; once those are fixed, `dedup-host setup` updates them"));
    }
    if other > 0 {
        fixes.push(format!("{other} other difference(s): make the config match the server (`setup` never changes an existing bucket)"));
    }
    format!(
        "dedup-host setup: {total} item(s) differ from the config or belong to another deployment, so nothing was created or changed; {}",
        fixes.join("; ")
    )
}

/// Prints a plan (or what `--apply` made of it); exit 1 when a change was refused or failed.
fn print_plan(changes: &[Change], json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(changes)?);
    } else if changes.is_empty() {
        println!("nothing to change: every existing stream and bucket matches the config");
    }
    let mut blocked = 0;
    for c in changes {
        if (!c.safe && !c.by_change_route) || matches!(c.applied, Some(Err(_))) {
            blocked += 1;
        }
        if !json {
            println!("{}", c.render());
        }
    }
    if blocked > 0 {
        eprintln!("dedup-host setup: {blocked} change(s) not made; each says what to do instead");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
