//! `dedup-host publish`: publish one event with a `Nats-Msg-Id`.

use std::process::ExitCode;

use anyhow::Context;
use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use clap::Args;

/// Flags of `dedup-host publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Server URL.
    #[arg(
        long,
        value_name = "URL",
        env = "DEDUP_HOST_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    server: String,
    /// Subject to publish on (a stream must capture it).
    #[arg(long, value_name = "S")]
    subject: String,
    /// The message id (`Nats-Msg-Id`), the default idempotency key.
    #[arg(long, value_name = "K")]
    key: String,
    /// The message body.
    #[command(flatten)]
    payload: super::payload::PayloadArgs,
    /// An extra header; repeat for more.
    #[arg(long = "header", value_name = "K=V", value_parser = super::parse_key_value)]
    headers: Vec<(String, String)>,
}

/// Publishes and prints the stream's acknowledgement as JSON.
pub async fn run(args: PublishArgs) -> anyhow::Result<ExitCode> {
    let payload = args.payload.read()?;
    let mut headers = HeaderMap::new();
    for (k, v) in &args.headers {
        let name = HeaderName::from_str(k).map_err(|_| {
            anyhow::anyhow!("--header `{k}={v}`: `{k}` is not a header name (printable ASCII, no spaces or `:`)")
        })?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| anyhow::anyhow!("--header `{k}`: the value cannot hold line breaks"))?;
        headers.append(name, value);
    }
    let client = async_nats::connect(&args.server)
        .await
        .with_context(|| format!("cannot connect to NATS at `{}` (--server)", args.server))?;
    let js = async_nats::jetstream::new(client);
    let key = HeaderValue::from_str(&args.key)
        .map_err(|_| anyhow::anyhow!("--key cannot hold line breaks"))?;
    headers.insert("Nats-Msg-Id", key);
    let ack = js
        .publish_with_headers(args.subject.clone(), headers, payload.into())
        .await?
        .await
        .with_context(|| {
            format!(
                "publish on `{}` not stored; does a stream capture this subject?",
                args.subject
            )
        })?;
    println!(
        "{}",
        serde_json::json!({"stream": ack.stream, "sequence": ack.sequence, "duplicate": ack.duplicate})
    );
    Ok(ExitCode::SUCCESS)
}
