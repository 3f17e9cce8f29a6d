//! The operator's read and repair commands: `inspect` (one key's story), `dead-letters`
//! (`list`, `replay`, `purge`) and `audit` (the cross-layer reconciliation).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};

use super::run::ConfigArgs;
use crate::activity::{self, Entry};
use crate::ops::letters::{self, Action, Selection};
use crate::ops::story::{self, Target};
use crate::times;

/// Connects with the config's settings for a one-off command.
async fn jetstream(
    config: &crate::config::Config,
    what: &str,
) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = crate::connect::connect(config, &format!("dedup-host {what}")).await?;
    Ok(async_nats::jetstream::new(client))
}

/// Parses `--since`: a duration back from now (`1h`, `30m`, `7d`).
fn since(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration such as 1h, 30m or 7d: {e}"))
}

fn ago(d: Option<Duration>) -> Option<SystemTime> {
    d.map(|d| SystemTime::now() - d)
}

/// Flags of `dedup-host inspect`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["key", "sequence"]))]
pub struct InspectArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The route.
    #[arg(long)]
    route: String,
    /// The idempotency key.
    #[arg(long)]
    key: Option<String>,
    /// A source stream sequence (its key is derived as the pipeline would).
    #[arg(long)]
    sequence: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Prints one key's story.
pub async fn inspect(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let js = jetstream(&config, "inspect").await?;
    let target = match (args.key, args.sequence) {
        (Some(k), _) => Target::Key(k),
        (None, Some(s)) => Target::Sequence(s),
        (None, None) => unreachable!("clap requires one"),
    };
    let s = story::tell(&js, &config, &args.route, target).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("route             {}", s.route);
    println!("key               {}", s.key);
    println!("claim key         {}", s.claim_key);
    println!("claims in         {}", s.claims.describe());
    println!("verdict           {}", s.verdict);
    if let Some(c) = &s.claim {
        println!("claim record      revision {}", s.revision.unwrap_or(0));
        print_claim(c);
    } else {
        println!("claim record      none");
    }
    for o in &s.outputs {
        let state = if o.present { "present" } else { "MISSING" };
        println!(
            "output            {} in {}:{} {state}",
            o.id, o.stream, o.sequence
        );
    }
    let now = crate::claim::record::now_ms();
    for c in &s.calls {
        let status = c
            .status
            .map_or("no answer recorded".into(), |s| s.to_string());
        println!(
            "call              {} {} {} -> {status}, {} {} (key {})",
            c.index,
            c.method,
            c.url,
            c.how,
            times::when(c.at_ms, now),
            c.idempotency_key
        );
    }
    for l in &s.dead_letters {
        println!(
            "dead letter       {} (attempt {}): {}",
            l.sequence, l.attempt, l.reason
        );
    }
    println!("source sequences  {:?}", s.source_sequences);
    Ok(ExitCode::SUCCESS)
}

/// A claim record's lines, in the terms of its state: only a key in progress has a lease
/// (owner, fencing token, expiry); a completed key says when and with how many outputs, a
/// failed one why and whether it runs again.
fn print_claim(c: &crate::claim::ClaimRecord) {
    use crate::claim::ClaimState;
    let now = crate::claim::record::now_ms();
    let when = |ms| times::when(ms, now);
    match c.state {
        ClaimState::Completed => {
            println!("  state           completed");
            println!("  completed       {}", when(c.updated_ms));
            println!("  outputs         {}", c.outputs.len());
        }
        ClaimState::Failed if c.permanent => {
            println!("  state           failed for good (dead-lettered; `dedup-host dead-letters replay` runs it again)");
            println!("  failed          {}", when(c.updated_ms));
        }
        ClaimState::Failed => {
            println!("  state           failed, to be retried");
            println!("  failed          {}", when(c.updated_ms));
            if let Some(at) = c.retry_at_ms {
                println!("  retry at        {}", when(at));
            }
        }
        ClaimState::InProgress => {
            println!("  state           in progress");
            println!("  owner           {}", c.owner);
            println!(
                "  fencing token   {}",
                c.fencing_token.map_or("-".into(), |t| t.to_string())
            );
            println!("  lease expires   {}", when(c.lease_expires_ms));
            println!("  updated         {}", when(c.updated_ms));
        }
    }
    println!("  attempt         {}", c.attempt);
    println!("  digest          {}", c.digest);
    if let Some(reason) = &c.reason {
        println!("  reason          {reason}");
    }
    println!("  first claimed   {}", when(c.created_ms));
}

/// Flags of `dedup-host dead-letters`.
#[derive(Debug, Args)]
pub struct LettersArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(subcommand)]
    command: LettersCommand,
}

/// What to do with dead letters.
#[derive(Debug, Subcommand)]
pub enum LettersCommand {
    /// List dead letters.
    List {
        /// Only this route's.
        #[arg(long)]
        route: Option<String>,
        /// Only letters newer than this (1h, 7d).
        #[arg(long, value_parser = since)]
        since: Option<Duration>,
        /// Only letters whose reason contains this text (in any case).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Put letters back on their original subject, after resetting their key, so they run
    /// once more on the version deployed now.
    Replay {
        #[command(flatten)]
        which: Which,
        /// Only say what would be done.
        #[arg(long)]
        dry_run: bool,
        /// Replay keys accepted as settled by `setup --accept-dead` too (refused without
        /// it: their window outputs may be stored, and the route is now fenced).
        #[arg(long)]
        force: bool,
        /// Discard each key's journal of outbound HTTP calls first, so the new run sends
        /// every call again (by default the calls whose answer was recorded are replayed,
        /// not sent again: see docs/src/handler/http.md).
        #[arg(long)]
        fresh_effects: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete letters whose key has completed since (their replay ran).
    Purge {
        #[command(flatten)]
        which: Which,
        /// Only say what would be done.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Which letters `replay` and `purge` act on.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["sequence", "all"]))]
pub struct Which {
    /// Letter sequences in the dead-letter stream (`--sequence 2 5`, or the flag repeated).
    #[arg(long, num_args = 1..)]
    sequence: Vec<u64>,
    /// Every letter (of `--route`, when given).
    #[arg(long)]
    all: bool,
    /// Only this route's letters.
    #[arg(long)]
    route: Option<String>,
    /// Only letters whose reason contains this text (in any case).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

impl Which {
    fn selection(&self) -> Selection {
        Selection {
            route: self.route.clone(),
            reason: self.reason.clone(),
            sequences: self.sequence.clone(),
            ..Selection::default()
        }
    }
}

/// Lists, replays or purges dead letters.
pub async fn dead_letters(args: LettersArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let js = jetstream(&config, "dead-letters").await?;
    let (actions, json) = match args.command {
        LettersCommand::List {
            route,
            since,
            reason,
            json,
        } => {
            let selection = Selection {
                route,
                since: ago(since),
                reason,
                ..Selection::default()
            };
            let list = letters::list_with_renamed(&js, &config, &selection).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_letters(&list);
            }
            return Ok(ExitCode::SUCCESS);
        }
        LettersCommand::Replay {
            which,
            dry_run,
            force,
            fresh_effects,
            json,
        } => {
            let list = letters::list_with_renamed(&js, &config, &which.selection()).await?;
            let actions = crate::ops::replay::replay_effects(
                &js,
                &config,
                list,
                dry_run,
                force,
                fresh_effects,
            )
            .await?;
            if !dry_run {
                record(&js, &config, "replay", &which, &actions).await;
            }
            (actions, json)
        }
        LettersCommand::Purge {
            which,
            dry_run,
            json,
        } => {
            let list = letters::list(&js, &config, &which.selection()).await?;
            let named = !which.sequence.is_empty();
            let actions = letters::purge(&js, &config, list, named, dry_run).await?;
            if !dry_run {
                record(&js, &config, "purge", &which, &actions).await;
            }
            (actions, json)
        }
    };
    js.client().flush().await?;
    print_actions(&actions, json)?;
    // A letter refused (a key accepted as settled, without `--force`) was asked for and not
    // done: the command says how many and exits 1, as every refusal does.
    let refused = actions.iter().filter(|a| a.action == "refused").count();
    if refused > 0 {
        eprintln!("dedup-host dead-letters: {refused} letter(s) refused, not replayed; each line says why and what to do instead");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The dead-letter table: a header line, then one letter per line, oldest first.
fn print_letters(list: &[letters::Letter]) {
    let now = crate::claim::record::now_ms();
    if !list.is_empty() {
        println!(
            "{:>8}  {:<12} {:<12} {:<24} {:>7}  {:<24} REASON",
            "SEQUENCE", "STORED", "ROUTE", "KEY", "ATTEMPT", "SUBJECT"
        );
    }
    for l in list {
        println!(
            "{:>8}  {:<12} {:<12} {:<24} {:>7}  {:<24} {}",
            l.sequence,
            times::relative(l.time_ms, now),
            or_dash(&l.route),
            or_dash(&l.key),
            l.attempt,
            l.subject,
            l.reason
        );
    }
    eprintln!("{} dead letter(s)", list.len());
}

/// `-` for an empty cell (a letter with no route or no key), so columns stay aligned.
fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Records a replay or purge in the activity stream, as the console does.
async fn record(
    js: &async_nats::jetstream::Context,
    config: &crate::config::Config,
    action: &str,
    which: &Which,
    actions: &[Action],
) {
    let route = which.route.as_deref().unwrap_or_default();
    let mut entry = Entry::now(
        &activity::cli_user(),
        action,
        route,
        which.selection().describe(),
    );
    entry.count = actions.len() as u64;
    entry.result = letters::summary(actions);
    activity::record(js, config, &entry).await;
}

fn print_actions(actions: &[Action], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(actions)?);
        return Ok(());
    }
    if !actions.is_empty() {
        println!(
            "{:>8}  {:<12} {:<12} {:<24} DETAIL",
            "SEQUENCE", "ACTION", "ROUTE", "KEY"
        );
    }
    for a in actions {
        println!(
            "{:>8}  {:<12} {:<12} {:<24} {}",
            a.sequence,
            a.action,
            or_dash(&a.route),
            or_dash(&a.key),
            a.detail
        );
    }
    eprintln!("{} letter(s)", actions.len());
    Ok(())
}

/// Flags of `dedup-host audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Only source messages newer than this (1h, 7d); keep it within the claim bucket's
    /// `max_age`, or aged-out records show up as lost.
    #[arg(long, value_parser = since)]
    since: Option<Duration>,
    /// Print JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

/// Runs the audit; exits 1 on any anomaly.
pub async fn audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let js = jetstream(&config, "audit").await?;
    let started = std::time::Instant::now();
    let report = crate::ops::audit::run(&js, &config, ago(args.since)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("messages        {}", report.messages);
        println!("keys            {}", report.keys);
        println!("completed       {}", report.completed);
        println!("dead-lettered   {}", report.dead_lettered);
        println!("pending         {}", report.pending);
        println!("duplicates      {}", report.duplicates);
        println!("outputs         {}", report.outputs);
        println!("pending calls   {}", report.pending_calls);
        println!("anomalies       {}", report.anomalies.len());
        for a in &report.anomalies {
            println!("  {:<34} {:<24} {}", a.class, a.key, a.detail);
        }
    }
    eprintln!("dedup-host audit: done in {:.2?}", started.elapsed());
    Ok(if report.anomalies.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
