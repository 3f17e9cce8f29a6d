//! `dedup-host publish`: publish one event with a `Nats-Msg-Id`, and say plainly whether the
//! stream stored it or refused it as a duplicate (inside its window, or forever), with an
//! exit code per outcome that producer scripts can rely on.

use std::process::ExitCode;

use anyhow::Context;
use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use clap::Args;

/// Flags of `dedup-host publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Server URL (`--server` is an older spelling); default: the config's `nats.urls` with
    /// `--config`, else nats://127.0.0.1:4222.
    #[arg(
        long = "nats-url",
        short = 's',
        alias = "server",
        value_name = "URL",
        env = "DEDUP_HOST_NATS_URL"
    )]
    nats_url: Option<String>,
    /// A host config: publish to its server, with its credentials.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Subject to publish on (a stream must capture it; the server's `$JS.`, `$KV.`, `$SYS.`,
    /// `_INBOX.` and the hosts' own namespaces are refused).
    #[arg(long, value_name = "S", value_parser = super::subject_arg::publishable)]
    subject: String,
    /// The message id (`Nats-Msg-Id`): the stream drops a repeat of it, and a route with
    /// the default key (`key = { header = "Nats-Msg-Id" }`) takes it as the idempotency key.
    /// Default: derived from the message (subject, headers, body) and printed, so a retried
    /// command is a duplicate, never a second message; give another id to send the same
    /// content as a new message. (`--key` is an older spelling.)
    #[arg(
        long = "msg-id",
        visible_alias = "id",
        alias = "key",
        value_name = "ID"
    )]
    msg_id: Option<String>,
    /// The message body.
    #[command(flatten)]
    payload: super::payload::PayloadArgs,
    /// An extra header; repeat for more.
    #[arg(long = "header", value_name = "K=V", value_parser = super::parse_key_value)]
    headers: Vec<(String, String)>,
    /// Print the outcome as JSON (`outcome`, `stream`, `sequence`) instead of a sentence.
    #[arg(long)]
    json: bool,
}

/// Exit code: the stream refused the message id inside its duplicate window.
pub const EXIT_DUPLICATE_WINDOW: u8 = 3;
/// Exit code: a forever stream already holds a message on the subject.
pub const EXIT_DUPLICATE_FOREVER: u8 = 4;

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
    let client = match (&args.config, &args.nats_url) {
        (Some(path), url) => {
            let mut config = crate::config::Config::load(path)?;
            if let Some(url) = url {
                config.nats.urls = url.split(',').map(str::to_string).collect();
            } else if config.nats.urls.is_empty() {
                config
                    .nats
                    .urls
                    .extend(crate::dev::running_url(&config.base_dir));
            }
            crate::connect::connect(&config, "dedup-host publish").await?
        }
        (None, url) => {
            let url = url
                .clone()
                .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
            async_nats::connect(&url).await.with_context(|| {
                format!("cannot connect to NATS at `{url}`: start one (`dedup-host dev`), or name another with --nats-url URL")
            })?
        }
    };
    let js = async_nats::jetstream::new(client);
    let derived = args.msg_id.is_none();
    let msg_id =
        (args.msg_id.clone()).unwrap_or_else(|| content_id(&args.subject, &args.headers, &payload));
    let key = HeaderValue::from_str(&msg_id)
        .map_err(|_| anyhow::anyhow!("--msg-id cannot hold line breaks"))?;
    headers.insert("Nats-Msg-Id", key);
    let ack = js
        .publish_with_headers(args.subject.clone(), headers, payload.into())
        .await?
        .await;
    let (outcome, stream, sequence, code) = match ack {
        Ok(ack) if ack.duplicate => (
            "duplicate (window)",
            ack.stream,
            ack.sequence,
            EXIT_DUPLICATE_WINDOW,
        ),
        Ok(ack) => ("stored", ack.stream, ack.sequence, 0),
        Err(e) if crate::forever::refused_as_duplicate(&e) => {
            let stream = js.stream_by_subject(args.subject.clone()).await?;
            let held = js
                .get_stream_no_info(&stream)
                .await?
                .get_last_raw_message_by_subject(&args.subject)
                .await?;
            (
                "duplicate (forever)",
                stream,
                held.sequence,
                EXIT_DUPLICATE_FOREVER,
            )
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "publish on `{}` not stored; does a stream capture this subject?",
                args.subject
            )))
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::json!({"outcome": outcome, "stream": stream, "sequence": sequence, "msg_id": msg_id})
        );
    } else {
        match code {
            0 if derived => println!(
                "stored as sequence {sequence} of stream `{stream}`, message id `{msg_id}` (derived from the message: the same command again is a duplicate; `--msg-id ID` sends it as a new message)"
            ),
            0 => println!("stored as sequence {sequence} of stream `{stream}`"),
            EXIT_DUPLICATE_WINDOW => println!(
                "duplicate (window): stream `{stream}` already holds message id `{msg_id}` as sequence {sequence}; not stored again"
            ),
            _ => println!(
                "duplicate (forever: subject already holds a message): stream `{stream}` keeps `{}` as sequence {sequence}; not stored again",
                args.subject
            ),
        }
    }
    Ok(ExitCode::from(code))
}

/// The message id of a message published without one: a digest of its subject, headers
/// (in the order given) and body, so a publish retried after a lost acknowledgement is the
/// same message to the stream and to the routes.
fn content_id(subject: &str, headers: &[(String, String)], payload: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // Each part is length-prefixed, so no two different messages give the same input.
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(subject.as_bytes());
    for (k, v) in headers {
        part(k.as_bytes());
        part(v.as_bytes());
    }
    part(payload);
    format!("msg-{}", &hex::encode(h.finalize())[..32])
}

#[cfg(test)]
mod tests {
    use super::content_id;

    #[test]
    fn a_message_without_an_id_is_named_by_its_content() {
        let id = content_id("in.a", &[], b"p");
        assert_eq!(id, content_id("in.a", &[], b"p"));
        assert_ne!(id, content_id("in.a", &[], b"q"));
        assert_ne!(id, content_id("in.b", &[], b"p"));
        let h = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert_ne!(content_id("in.a", &h("x", "1"), b"p"), id);
        // Parts are delimited: moving bytes between them changes the id.
        assert_ne!(
            content_id("in.a", &h("x", "1"), b""),
            content_id("in.a", &h("x", ""), b"1")
        );
    }
}
