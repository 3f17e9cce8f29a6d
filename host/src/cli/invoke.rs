//! `dedup-host invoke`: the guest author's inner loop, one event through one guest, no NATS.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde_json::json;

use crate::bindings::{Event, Header};
use crate::runtime::{EngineSettings, InvokeOptions, Outcome, Runtime};

/// Flags of `dedup-host invoke`.
#[derive(Debug, Args)]
pub struct InvokeArgs {
    /// The component (.wasm) to run.
    #[arg(long, value_name = "PATH")]
    component: PathBuf,
    /// The event's subject.
    #[arg(long, value_name = "S", value_parser = super::subject_arg::literal)]
    subject: String,
    /// The message body.
    #[command(flatten)]
    payload: super::payload::PayloadArgs,
    /// A message header; repeat for more.
    #[arg(long = "header", value_name = "K=V", value_parser = super::parse_key_value)]
    headers: Vec<(String, String)>,
    /// The idempotency key the guest sees.
    #[arg(long, value_name = "K", default_value = "invoke")]
    key: String,
    /// The attempt number the guest sees (1-based).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    attempt: u32,
    /// A route configuration value the guest can read (the route's `config` table); repeat
    /// for more. (`--config K=V` is an older spelling; elsewhere `--config` names a host file.)
    #[arg(long = "set", alias = "config", value_name = "K=V", value_parser = super::parse_key_value)]
    config: Vec<(String, String)>,
    /// The route name the guest sees.
    #[arg(long, value_name = "NAME", default_value = "invoke")]
    route: String,
}

/// Runs the event and prints the outcome; exit code 1 unless the guest succeeded.
pub async fn run(args: InvokeArgs) -> anyhow::Result<ExitCode> {
    let payload = args.payload.read()?;
    let runtime = Runtime::new(&EngineSettings::default())?;
    let handler = runtime.load_file(&args.component)?;
    let event = Event {
        subject: args.subject,
        payload,
        headers: args
            .headers
            .into_iter()
            .map(|(name, value)| Header { name, value })
            .collect(),
        key: args.key,
        attempt: args.attempt,
        fencing_token: 1,
        stream_sequence: 0,
        route: args.route,
    };
    let options = InvokeOptions {
        config: Arc::new(args.config.into_iter().collect::<BTreeMap<_, _>>()),
        ..InvokeOptions::default()
    };
    let invocation = handler.invoke(event, &options).await;
    let mut report = json!({
        "component": handler.name(),
        "digest": handler.digest(),
        "outcome": invocation.outcome.kind(),
        "elapsed_us": invocation.elapsed.as_micros() as u64,
        "logs": invocation.logs,
    });
    match &invocation.outcome {
        Outcome::Success(outputs) => {
            report["outputs"] = outputs
                .iter()
                .map(|o| {
                    json!({
                        "subject": o.subject,
                        "payload": String::from_utf8_lossy(&o.payload),
                        "headers": o.headers.iter().map(|h| (h.name.clone(), h.value.clone())).collect::<Vec<_>>(),
                    })
                })
                .collect();
        }
        Outcome::Retry { reason, delay } => {
            report["reason"] = reason.clone().into();
            report["delay_ms"] = delay.map(|d| d.as_millis() as u64).into();
        }
        Outcome::Reject { reason } => report["reason"] = reason.clone().into(),
        Outcome::Trap(trap) => {
            report["trap"] = trap.kind.as_str().into();
            report["reason"] = trap.message.clone().into();
        }
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(reason) = invocation.outcome.reason() {
        eprintln!(
            "dedup-host invoke: the guest did not succeed ({}): {reason}",
            invocation.outcome.kind()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
