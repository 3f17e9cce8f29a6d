//! `dedup-host tail --config FILE (SUBJECT | --route R)`: print messages as they are stored
//! on a subject, or a route's outputs and dead letters, read from the streams that capture them
//! (ordered consumers: nothing is acknowledged or removed).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use async_nats::jetstream::consumer::{push, DeliverPolicy};
use async_nats::jetstream::{self, Context};
use clap::Args;
use futures::StreamExt;

use super::run::ConfigArgs;
use crate::pipeline::effects::headers;

/// Flags of `dedup-host tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The subject (wildcards allowed: `*` one whole token, `>` the rest) to follow.
    #[arg(
        value_name = "SUBJECT",
        required_unless_present = "route",
        conflicts_with = "route",
        value_parser = super::subject_arg::filter
    )]
    subject: Option<String>,
    /// Follow route R's outputs (its `allowed_outputs`) and its dead letters.
    #[arg(long, value_name = "R")]
    route: Option<String>,
    /// Start from the oldest message each stream holds, not from now.
    #[arg(long)]
    all: bool,
    /// Start from the messages stored at or after this time (`2026-11-27T09:30:00Z`, as
    /// `date -u +%FT%TZ` prints it) or this long ago (`10m`), not from now: a script that
    /// checks what it caused counts nothing an earlier run left.
    #[arg(long, value_name = "TIME", conflicts_with = "all", value_parser = since)]
    since: Option<SystemTime>,
    /// Exit after N messages.
    #[arg(long, short = 'n', value_name = "N")]
    count: Option<usize>,
    /// Exit after this long, e.g. `30s` (exit 1 if `--count` messages did not arrive by
    /// then, saying on stderr how many did).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// One JSON object per message instead of a line.
    #[arg(long)]
    json: bool,
}

/// Follows and prints.
pub async fn run(args: TailArgs) -> anyhow::Result<ExitCode> {
    let config = args.config.load()?;
    let (filters, route) = match (&args.subject, &args.route) {
        (Some(subject), _) => (vec![subject.clone()], None),
        (None, Some(route)) => {
            let r = config
                .routes
                .iter()
                .find(|r| &r.name == route)
                .with_context(|| {
                    let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
                    format!("route `{route}` is not in this config (it has {names:?})")
                })?;
            let mut filters = r.allowed_outputs.clone();
            filters.push(config.dead_letter.subject.clone());
            (filters, Some(route.clone()))
        }
        (None, None) => anyhow::bail!("name a SUBJECT or --route R"),
    };
    let client = crate::connect::connect(&config, "dedup-host tail").await?;
    let js = jetstream::new(client.clone());
    // A filter may reach several streams (`mk.>` over `mk.a` in one and `mk.b` in another):
    // each is followed, and one that cannot be is named.
    let streams = crate::capture::Streams::held(&js).await?;
    let mut followed = Vec::new();
    for filter in &filters {
        let capturing = streams.capturing(filter);
        if capturing.is_empty() {
            anyhow::bail!("no stream captures `{filter}`: run `dedup-host setup --config FILE` (or publish to a subject a stream captures)");
        }
        for stream in &capturing {
            match follow(&js, &client, stream, filter, args.start()).await {
                Ok(messages) => followed.push(messages),
                Err(e) => eprintln!(
                    "dedup-host tail: not following stream `{stream}`, which captures part of `{filter}`: {e:#}"
                ),
            }
        }
    }
    anyhow::ensure!(
        !followed.is_empty(),
        "no stream that captures {filters:?} could be followed (each is named above)"
    );
    let mut messages = futures::stream::select_all(followed);
    let deadline = args.wait.map(|w| tokio::time::Instant::now() + w);
    let mut shown = 0;
    while args.count.is_none_or(|n| shown < n) {
        let waited = async {
            match deadline {
                Some(at) => tokio::time::timeout_at(at, messages.next()).await.ok(),
                None => Some(messages.next().await),
            }
        };
        let next = tokio::select! {
            waited = waited => match waited {
                Some(next) => next,
                None => break,
            },
            () = reader_gone() => {
                // SAFETY: raises a signal in this process; a printing command has SIGPIPE's
                // default disposition (main.rs), so it ends as `head`'s other writers do.
                unsafe { libc::raise(libc::SIGPIPE) };
                break;
            }
        };
        let Some(message) = next else { break };
        let m = message.map_err(|e| anyhow::anyhow!("following the stream failed: {e}"))?;
        let letter_route = m.headers.as_ref().and_then(|h| h.get(headers::ROUTE));
        let is_letter = m.subject.as_str() == config.dead_letter.subject;
        if let (Some(route), true) = (&route, is_letter) {
            if letter_route.map(|v| v.as_str()) != Some(route.as_str()) {
                continue; // another route's dead letter
            }
        }
        print(&m, is_letter, args.json);
        shown += 1;
    }
    client.flush().await?;
    Ok(match args.count {
        Some(n) if shown < n => {
            eprintln!("dedup-host tail: {}", short_of(shown, n, args.wait));
            ExitCode::from(1)
        }
        _ => ExitCode::SUCCESS,
    })
}

/// How often [`reader_gone`] looks at stdout.
const READER_CHECK: Duration = Duration::from_millis(200);

/// Resolves once stdout is a pipe whose reader has gone (`tail … | head -1`, after its line):
/// nothing is written until the next message, which may be long in coming, so the pipe is
/// polled for the error a write would meet. Never resolves for a terminal or a file that
/// stays open.
async fn reader_gone() {
    loop {
        let mut out = libc::pollfd {
            fd: libc::STDOUT_FILENO,
            events: 0,
            revents: 0,
        };
        // SAFETY: polls one descriptor of this process, without waiting.
        let ready = unsafe { libc::poll(&mut out, 1, 0) };
        if ready > 0 && out.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return;
        }
        tokio::time::sleep(READER_CHECK).await;
    }
}

/// Why `tail --count N` exits 1: `shown` of `n` messages arrived within `wait` (none: the
/// streams' consumers ended first).
fn short_of(shown: usize, n: usize, wait: Option<Duration>) -> String {
    match wait {
        Some(wait) => format!(
            "{shown} of {n} message(s) arrived within {}; wait longer with --wait DURATION",
            humantime::format_duration(wait)
        ),
        None => format!("{shown} of {n} message(s) arrived before the streams stopped delivering"),
    }
}

impl TailArgs {
    /// Where in each stream to start: `--all`, `--since`, or now.
    fn start(&self) -> DeliverPolicy {
        match (self.all, self.since) {
            (true, _) => DeliverPolicy::All,
            (false, Some(since)) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from(since),
            },
            (false, None) => DeliverPolicy::New,
        }
    }
}

/// Parses `--since`: an RFC 3339 time, or a duration meaning that long ago.
fn since(s: &str) -> Result<SystemTime, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(s) {
        return Ok(at);
    }
    match humantime::parse_duration(s) {
        Ok(ago) => SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("`{s}` ago is before the clock's start")),
        Err(_) => Err(format!(
            "`{s}` is neither a time (`2026-11-27T09:30:00Z`, as `date -u +%FT%TZ` prints it) nor how long ago (`10m`, `1h`)"
        )),
    }
}

/// An ordered consumer of `stream` on `filter`, from `start`.
async fn follow(
    js: &Context,
    client: &async_nats::Client,
    stream: &str,
    filter: &str,
    start: DeliverPolicy,
) -> anyhow::Result<push::Ordered> {
    let stream = js.get_stream_no_info(stream).await?;
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            filter_subject: filter.to_string(),
            deliver_policy: start,
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot follow `{filter}`"))?;
    Ok(consumer.messages().await?)
}

fn print(m: &jetstream::Message, is_letter: bool, json: bool) {
    let info = m.info().ok();
    let (stream, sequence) = info
        .as_ref()
        .map_or(("?", 0), |i| (i.stream, i.stream_sequence));
    let header = |name: &str| {
        m.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let payload = crate::text::reason(&String::from_utf8_lossy(&m.payload));
    if json {
        let line = serde_json::json!({
            "stream": stream,
            "sequence": sequence,
            "subject": m.subject.as_str(),
            "dead_letter": is_letter,
            "reason": header(headers::REASON),
            "key": header(headers::KEY),
            "msg_id": header("Nats-Msg-Id"),
            "payload": payload,
        });
        println!("{line}");
    } else if is_letter {
        println!(
            "{stream} #{sequence} dead letter of `{}` key `{}`: {} | {payload}",
            header(headers::ROUTE).unwrap_or_default(),
            header(headers::KEY).unwrap_or_default(),
            header(headers::REASON).unwrap_or_default()
        );
    } else {
        println!("{stream} #{sequence} {}: {payload}", m.subject);
    }
}
