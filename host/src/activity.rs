//! What people and hosts changed: every replay, purge, deploy, promotion, abort and automatic
//! rollback, with who, when, what and how many, in a stream `dedup-host` creates
//! (`ACTIVITY_<status bucket>`, subject `_dedup.activity.<status bucket>`). The console's
//! Activity page and a route's deploy history read it back. Recording never fails the action
//! it records: the action has happened; a lost entry is logged.

use std::time::Duration;

use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::Context;
use serde::{Deserialize, Serialize};

use crate::claim::record::now_ms;
use crate::config::Config;
use crate::subject::ACTIVITY_PREFIX;

/// How long entries are kept.
const KEEP: Duration = Duration::from_secs(365 * 24 * 3600);
/// At most this many entries are kept (the oldest go first).
const MAX_ENTRIES: i64 = 100_000;

/// One recorded action.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When, in Unix milliseconds.
    pub at_ms: u64,
    /// Who: `console <user>@<address>`, `cli <user>@<machine>`, or `host <instance id>`.
    pub who: String,
    /// What: `replay`, `purge`, `deploy`, `undeploy`, `promote`, `abort`, `rollback`.
    pub action: String,
    /// The route it touched, when one.
    #[serde(default)]
    pub route: String,
    /// What it was asked to touch, in words (a filter, a file, a digest).
    #[serde(default)]
    pub target: String,
    /// How many items it touched.
    pub count: u64,
    /// The result in one line (`12 replayed, 1 skipped`).
    #[serde(default)]
    pub result: String,
}

impl Entry {
    /// An entry stamped now.
    pub fn now(who: &str, action: &str, route: &str, target: String) -> Self {
        Self {
            at_ms: now_ms(),
            who: who.to_string(),
            action: action.to_string(),
            route: route.to_string(),
            target,
            ..Default::default()
        }
    }

    /// Whether the entry changed which version a route runs.
    pub fn is_deploy(&self) -> bool {
        matches!(
            self.action.as_str(),
            "deploy" | "undeploy" | "promote" | "abort" | "rollback"
        )
    }
}

/// The activity stream of this deployment.
pub fn stream_name(config: &Config) -> String {
    format!("ACTIVITY_{}", config.components.status_bucket)
}

fn subject(config: &Config) -> String {
    format!("{ACTIVITY_PREFIX}{}", config.components.status_bucket)
}

/// The name a command-line process records its changes under (`--as`), set once at start.
static CLI_ACTOR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records the changes this command-line process makes under `name` (the `--as` flag); an
/// empty name is ignored.
pub fn act_as(name: Option<&str>) {
    if let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) {
        let _ = CLI_ACTOR.set(name.to_string());
    }
}

/// Who runs this process, for CLI entries: `cli <name>@<machine>`, the name being `--as`,
/// else `$USER`, else `$LOGNAME`, else the user id (`uid 1000`), so an entry always says who.
pub fn cli_user() -> String {
    let user = CLI_ACTOR.get().cloned().unwrap_or_else(|| {
        let env = |v: &str| std::env::var(v).ok().filter(|u| !u.trim().is_empty());
        env("USER")
            .or_else(|| env("LOGNAME"))
            // SAFETY: getuid has no preconditions and cannot fail.
            .unwrap_or_else(|| format!("uid {}", unsafe { libc::getuid() }))
    });
    match machine() {
        Some(machine) => format!("cli {user}@{machine}"),
        None => format!("cli {user}"),
    }
}

/// This machine's host name, when it has one.
fn machine() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (rc == 0 && !name.is_empty()).then_some(name)
}

/// Opens (or creates) the activity stream.
pub async fn open(js: &Context, config: &Config) -> anyhow::Result<stream::Stream> {
    let name = stream_name(config);
    js.get_or_create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject(config)],
        storage: StorageType::File,
        max_age: KEEP,
        max_messages: MAX_ENTRIES,
        num_replicas: config.components.replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot create the activity stream `{name}`: {e}"))
}

/// Stores `entry`; a failure is logged, never returned (see the module documentation).
pub async fn record(js: &Context, config: &Config, entry: &Entry) {
    let stored = async {
        open(js, config).await?;
        let bytes = serde_json::to_vec(entry)?;
        js.publish(subject(config), bytes.into())
            .await?
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::Ok(())
    };
    if let Err(e) = stored.await {
        tracing::warn!(
            action = entry.action,
            route = entry.route,
            "cannot record activity: {e:#}"
        );
    }
}

/// Records one change to one route made by this command-line process (`cli <user>`).
pub async fn record_cli(
    js: &Context,
    config: &Config,
    action: &str,
    route: &str,
    target: &str,
    result: String,
) {
    let mut entry = Entry::now(&cli_user(), action, route, target.to_string());
    entry.count = 1;
    entry.result = result;
    record(js, config, &entry).await;
}

/// The newest `limit` entries, newest first; none when the stream does not exist yet.
pub async fn list(js: &Context, config: &Config, limit: usize) -> anyhow::Result<Vec<Entry>> {
    let name = stream_name(config);
    if js.get_stream(&name).await.is_err() {
        return Ok(Vec::new());
    }
    let stored = crate::scan::tail(js, &name, limit as u64).await?;
    Ok(stored
        .iter()
        .rev()
        .filter_map(|m| serde_json::from_slice(&m.payload).ok())
        .take(limit)
        .collect())
}
