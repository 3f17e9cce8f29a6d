//! The demo's outbound-call part (issue 45): route `notify` sends each notification to a
//! provider over HTTP, here a local endpoint the demo starts that counts requests by
//! idempotency key. A host process (`dedup-host run` on the demo's config) makes the calls
//! and is killed with -9 while its guests write their receipts: every answer is journaled,
//! no message is acknowledged. A restarted host re-runs the keys, gets the journaled answers
//! instead of calling again, and the provider has seen each notification once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::Context as JetStream;
use async_nats::HeaderMap;
use axum::http::{HeaderMap as HttpHeaders, StatusCode};

use crate::claim::ClaimState;
use crate::config::Config;
use crate::ops::story::{self, Story, Target};

/// The route that calls out.
const ROUTE: &str = "notify";
/// The notifications: message id (the key), user, text.
const NOTIFICATIONS: &[(&str, &str, &str)] = &[
    ("n-1", "ada", "your report is ready"),
    ("n-2", "grace", "build 142 passed"),
    ("n-3", "linus", "a review is waiting"),
];
/// How long each step may take (a host starting, a lease running out, a redelivery).
const WAIT: Duration = Duration::from_secs(60);

/// Runs the part on the demo's server at `url`, with `config` (read from `config_file`, which
/// the killed host process reads too). Returns the lines to print, or none when the config
/// has no `notify` route with `[routes.http]`.
pub(super) async fn run(
    js: &JetStream,
    config: &Config,
    config_file: &Path,
    url: &str,
) -> anyhow::Result<Vec<String>> {
    let Some(http) = config
        .routes
        .iter()
        .find(|r| r.name == ROUTE)
        .and_then(|r| r.http.as_ref())
    else {
        return Ok(Vec::new());
    };
    let provider = Provider::start(&http.idempotency_header).await?;
    let mut lines = vec![format!(
        "route `{ROUTE}` may call {:?} ([routes.http]); its provider, a local endpoint counting requests by {}, is at {}",
        http.allow.iter().map(allow_url).collect::<Vec<_>>(),
        http.idempotency_header,
        provider.base()
    )];

    let mut first = HostProcess::start(config_file, url)?;
    for (id, user, text) in NOTIFICATIONS {
        let payload = serde_json::json!({
            "user": user,
            "text": text,
            "provider": format!("{}/hooks/notify", provider.base()),
        });
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", *id);
        js.publish_with_headers(
            format!("demo.{ROUTE}.{user}"),
            h,
            payload.to_string().into(),
        )
        .await?
        .await?;
    }
    // Every call answered and journaled, no key completed: the guests write their receipts.
    until(&mut first, "every notification's answer journaled", || async {
        let mut answered = 0;
        for (id, ..) in NOTIFICATIONS {
            let s = tell(js, config, id).await?;
            anyhow::ensure!(
                !completed(&s),
                "`{ROUTE}` key {id} completed before the demo could kill its host: give the route's `work_ms` more time"
            );
            answered += usize::from(s.calls.first().is_some_and(|c| c.status.is_some()));
        }
        Ok(answered == NOTIFICATIONS.len())
    })
    .await?;
    let pid = first.kill()?;
    lines.push(format!(
        "a host process (`dedup-host run`, pid {pid}) sent {} notifications; each answer was journaled before its guest saw it",
        NOTIFICATIONS.len()
    ));
    lines.push(format!(
        "kill -9 {pid} while the guests wrote their receipts (work_ms): nothing acknowledged, no receipt published"
    ));

    let killed = Instant::now();
    let host = crate::serve::start(config.clone()).await?;
    let mut stories = Vec::new();
    for (id, ..) in NOTIFICATIONS {
        let started = Instant::now();
        let s = loop {
            let s = tell(js, config, id).await?;
            if completed(&s) {
                break s;
            }
            anyhow::ensure!(
                started.elapsed() < WAIT,
                "`{ROUTE}` key {id} did not complete on the restarted host within {WAIT:?}: {}",
                s.verdict
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        stories.push(s);
    }
    host.shutdown().await?;
    lines.push(format!(
        "a restarted host re-ran the {} keys once their lease ran out ({:.1} s later): each call answered from the journal, none sent again",
        NOTIFICATIONS.len(),
        killed.elapsed().as_secs_f64()
    ));

    let seen = provider.seen();
    let mut per_key = Vec::new();
    for s in &stories {
        let call = s
            .calls
            .first()
            .context("a completed key has its call journaled")?;
        let n = seen.get(&call.idempotency_key).copied().unwrap_or(0);
        anyhow::ensure!(
            n == 1 && call.how == "replayed",
            "`{ROUTE}` key {}: the provider saw {} {n} time(s), the journal says `{}` (expected once, replayed)",
            s.key,
            call.idempotency_key,
            call.how
        );
        per_key.push(format!("{} once", call.idempotency_key));
    }
    anyhow::ensure!(
        seen.len() == stories.len(),
        "the provider saw other keys: {seen:?}"
    );
    lines.push(format!(
        "the provider saw {} ({} request(s) in all): each notification once",
        per_key.join(", "),
        seen.values().sum::<u32>()
    ));
    lines.push(format!(
        "`dedup-host inspect --route {ROUTE} --key {}` (the receipt in DEMO_OUTPUTS has the first run's answer):",
        NOTIFICATIONS[0].0
    ));
    lines.extend(inspect(config_file, url, NOTIFICATIONS[0].0)?);
    Ok(lines)
}

/// The key's story on the route.
async fn tell(js: &JetStream, config: &Config, id: &str) -> anyhow::Result<Story> {
    story::tell(js, config, ROUTE, Target::Key(id.to_string())).await
}

fn completed(s: &Story) -> bool {
    s.claim
        .as_ref()
        .is_some_and(|c| c.state == ClaimState::Completed)
}

/// An allow entry's URL.
fn allow_url(entry: &crate::runtime::http::AllowEntry) -> &str {
    match entry {
        crate::runtime::http::AllowEntry::Url(url) => url,
        crate::runtime::http::AllowEntry::WithMethods { url, .. } => url,
    }
}

/// Polls `check` until it says yes, while `host` runs, for at most [`WAIT`].
async fn until<F, Fut>(host: &mut HostProcess, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    while !check().await? {
        host.running()?;
        anyhow::ensure!(
            started.elapsed() < WAIT,
            "timed out after {WAIT:?} waiting for {what} (the host's log: {})",
            host.log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// `dedup-host inspect` run as a user would, its lines indented.
fn inspect(config_file: &Path, url: &str, key: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new(std::env::current_exe()?)
        .args(["inspect", "--route", ROUTE, "--key", key, "--config"])
        .arg(config_file)
        .args(["--nats-url", url])
        .output()
        .context("running `dedup-host inspect`")?;
    anyhow::ensure!(
        out.status.success(),
        "`dedup-host inspect` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| format!("  {l}"))
        .collect())
}

/// `dedup-host run` on the demo's config, as a child process killed when dropped or when
/// the demo ends.
struct HostProcess {
    child: Child,
    log: PathBuf,
}

impl HostProcess {
    fn start(config_file: &Path, url: &str) -> anyhow::Result<Self> {
        let log = crate::dev::data_dir().join("demo-killed-host.log");
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create `{}`", log.display()))?;
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("run")
            .arg("--config")
            .arg(config_file)
            .args(["--nats-url", url])
            .stdout(Stdio::null())
            .stderr(file);
        crate::dev::dies_with_this_process(&mut command);
        let child = command
            .spawn()
            .context("starting `dedup-host run` for the demo's outbound calls")?;
        Ok(Self { child, log })
    }

    /// An error naming the log when the process has ended.
    fn running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => anyhow::bail!(
                "the demo's host process exited ({status}) before it was killed; its log: {}",
                self.log.display()
            ),
            None => Ok(()),
        }
    }

    /// SIGKILL (`kill -9`); returns the pid.
    fn kill(&mut self) -> anyhow::Result<u32> {
        let pid = self.child.id();
        self.child.kill()?;
        self.child.wait()?;
        Ok(pid)
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The notification provider: answers every POST to `/hooks/...` with 201 and the
/// notification's number, counting requests by idempotency key.
struct Provider {
    addr: SocketAddr,
    seen: Arc<Mutex<BTreeMap<String, u32>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Provider {
    async fn start(header: &str) -> anyhow::Result<Self> {
        let seen: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let (counts, header) = (seen.clone(), header.to_string());
        let answer = move |headers: HttpHeaders| {
            let key = headers
                .get(header.as_str())
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(none)")
                .to_string();
            let mut counts = counts.lock().expect("not poisoned");
            *counts.entry(key).or_default() += 1;
            let n: u32 = counts.values().sum();
            std::future::ready((StatusCode::CREATED, format!("notification #{n} queued")))
        };
        let app = axum::Router::new().route("/hooks/{*rest}", axum::routing::post(answer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!("demo provider: {e}");
            }
        });
        Ok(Self { addr, seen, task })
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests so far, by idempotency key.
    fn seen(&self) -> BTreeMap<String, u32> {
        self.seen.lock().expect("not poisoned").clone()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}
