//! `dedup-host reload --config FILE`: checks the config here, then asks every host of the
//! deployment, through NATS, to re-read its own config file and apply the route changes;
//! prints what each host did.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::StreamExt;

use super::run::{summary, ConfigArgs};
use crate::components::status;
use crate::serve::ReloadReport;

/// Flags of `dedup-host reload`.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// How long to wait for the hosts' answers.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Print the hosts' answers as JSON.
    #[arg(long)]
    json: bool,
}

/// Sends the reload and reports the answers; exits 1 when a host refused it (whole, or a
/// route of it: by contract, or not started) or no host answered. A config that does not
/// load here is not sent, and the command cannot run: exit 2, as for every other command.
pub async fn run(args: ReloadArgs) -> anyhow::Result<ExitCode> {
    let config = args
        .config
        .load()
        .context("the reload was not sent to any host: the config does not load")?;
    let client = crate::connect::connect(&config, "dedup-host reload").await?;
    let js = async_nats::jetstream::new(client.clone());
    let live = match status::open(&js, &config).await {
        Ok(store) => status::read_all(&store).await.map_or(0, |h| h.len()),
        Err(_) => 0,
    };
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await?;
    let subject = config.reload_subject();
    client
        .publish_with_reply(subject, inbox, bytes::Bytes::new())
        .await?;
    client.flush().await?;
    let deadline = Instant::now() + args.wait;
    let mut reports: Vec<ReloadReport> = Vec::new();
    while live == 0 || reports.len() < live {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, answers.next()).await {
            Ok(Some(m)) => match serde_json::from_slice(&m.payload) {
                Ok(report) => reports.push(report),
                Err(e) => eprintln!("dedup-host reload: unreadable answer: {e}"),
            },
            _ => break,
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        for r in &reports {
            println!("{}: {}", r.instance_id, summary(r));
        }
    }
    // A host that applied the config but refused a route of it (its config differs from the
    // route's contract, or the route did not start) refused the reload for that route.
    let refused: Vec<&ReloadReport> = reports
        .iter()
        .filter(|r| !r.applied || !r.problems.is_empty())
        .collect();
    for r in &refused {
        eprintln!(
            "dedup-host reload: host `{}` refused: {}",
            r.instance_id,
            r.problems.join("; ")
        );
    }
    eprintln!(
        "dedup-host reload: {} host(s) answered of {live} live; {} refused",
        reports.len(),
        refused.len()
    );
    Ok(if reports.is_empty() || !refused.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
