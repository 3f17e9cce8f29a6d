//! Safe deploys across `dedup-host run` processes: a shadow candidate compared on every host
//! with nothing of it stored, a canary rolled back automatically on every host, a healthy
//! canary promoted through a host killed with -9, and the commands' refusals
//! ([`workflow`]); candidates where they meet the other modes and changes: fenced, exclusive
//! and claim-after routes, reloads, routes added by a reload, component directories
//! ([`seams`]); candidates seen and decided from the web console ([`console`]); `--wait`
//! waiting for the asked mode on every live host ([`waits`]). This file
//! holds the deployment the tests share.

mod console;
mod seams;
mod waits;
mod workflow;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use dedup_host::components::status;
use dedup_host_tests::guests::{guest, host_binary, workspace_root};
use dedup_host_tests::harness::{
    signal, stop_gracefully, wait_for, TestEnv, Timing, DEAD, OUTPUTS,
};

/// The ledger, served from the object store.
const LEDGER: &str = r#"
[[routes]]
name = "ledger"
subject = "in.ledger.*"
allowed_outputs = ["ledger.entries.>"]
"#;

/// Runs `dedup-host ARGS --config CONFIG`; returns whether it succeeded and what it printed.
fn cli(config: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(host_binary())
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn ok(config: &Path, args: &[&str]) -> String {
    let (success, text) = cli(config, args);
    assert!(success, "dedup-host {args:?} failed: {text}");
    text
}

fn path(name: &str) -> String {
    guest(name).display().to_string()
}

/// The digest a deploy printed last on its line.
fn digest_of(printed: &str) -> String {
    printed.trim().rsplit(' ').next().unwrap().to_string()
}

/// Two (or more) host processes serving the ledger from the store, live version deployed.
struct Deployment {
    env: TestEnv,
    timing: Timing,
    hosts: BTreeMap<String, Child>,
    config: PathBuf,
    live: String,
    routes: &'static str,
}

impl Deployment {
    async fn start(names: &[&str]) -> Self {
        Self::start_with(names, LEDGER, false).await
    }

    /// Hosts `names` serving `routes`, with fenced output streams if `fenced`, the live
    /// version deployed to the store.
    async fn start_with(names: &[&str], routes: &'static str, fenced: bool) -> Self {
        let mut env = TestEnv::start().await;
        env.fenced_outputs = fenced;
        let d = Self::launch(env, names, routes).await;
        let deployed = ok(
            &d.config,
            &[
                "deploy",
                "--route",
                "ledger",
                "--component",
                &path("ledger"),
            ],
        );
        assert_eq!(digest_of(&deployed), d.live);
        d.wait_live().await;
        d
    }

    /// Starts host processes `names` serving `routes` on `env`; the live version is `ledger`.
    async fn launch(env: TestEnv, names: &[&str], routes: &'static str) -> Self {
        let timing = Timing::default();
        let mut hosts = BTreeMap::new();
        for name in names {
            hosts.insert(
                name.to_string(),
                env.host_process(&timing, routes, name).await,
            );
        }
        Self {
            config: env.path(&format!("{}.toml", names[0])),
            live: dedup_host::runtime::digest(&std::fs::read(guest("ledger")).unwrap()),
            env,
            timing,
            hosts,
            routes,
        }
    }

    /// Waits until every host serves the live version.
    async fn wait_live(&self) {
        let live = |r: &status::RouteStatus| r.digest.as_deref() == Some(self.live.as_str());
        self.wait_hosts(live, "serving the live version").await;
    }

    /// Waits until every running host's status of the route satisfies `check`.
    async fn wait_hosts(&self, check: impl Fn(&status::RouteStatus) -> bool, what: &str) {
        let names: Vec<String> = self.hosts.keys().cloned().collect();
        wait_for(Duration::from_secs(60), what, || async {
            let kv = self.env.js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
            let all = status::read_all(&kv).await.ok()?;
            names
                .iter()
                .all(|n| {
                    all.iter()
                        .find(|h| &h.instance_id == n)
                        .and_then(|h| h.routes.get("ledger"))
                        .is_some_and(&check)
                })
                .then_some(())
        })
        .await;
    }

    /// Publishes `n` adjustments, half with odd amounts (a candidate `ledger-next` rejects
    /// them), waits until they settle and every host has dropped the candidate.
    async fn reject_until_rolled_back(&self, n: u32) {
        self.publish(0..n, |i| i64::from(i) + 1).await;
        self.wait_settled(n as usize).await;
        let dropped = |r: &status::RouteStatus| r.candidate.is_none();
        self.wait_hosts(dropped, "every host dropping the candidate")
            .await;
    }

    /// Deploys `ledger-next` in shadow (run times ignored) and waits until every host runs it;
    /// returns its digest.
    async fn shadow_next(&self) -> String {
        let next = digest_of(&ok(
            &self.config,
            &[
                "deploy",
                "--route",
                "ledger",
                "--shadow",
                &path("ledger-next"),
                "--ignore",
                "/ran_ms",
            ],
        ));
        self.wait_candidate(&next).await;
        next
    }

    async fn wait_candidate(&self, digest: &str) {
        let prefix = format!("{digest} ");
        self.wait_hosts(
            |r| {
                r.candidate
                    .as_deref()
                    .is_some_and(|c| c.starts_with(&prefix))
            },
            "every host running the candidate",
        )
        .await;
    }

    /// Publishes adjustments `from..to` (key `k-<i>`, amount `amount(i)`).
    async fn publish(&self, range: std::ops::Range<u32>, amount: impl Fn(u32) -> i64) {
        for i in range {
            let payload = format!(
                r#"{{"account":"acc-{}","amount":{},"transaction_id":"tx-{i}"}}"#,
                i % 7,
                amount(i)
            );
            self.env
                .publish(
                    &format!("in.ledger.{i}"),
                    &format!("k-{i}"),
                    &[],
                    payload.into_bytes(),
                )
                .await;
        }
    }

    /// Waits until every one of `n` keys has an output or a dead letter and nothing is pending.
    async fn wait_settled(&self, n: usize) -> (Vec<Entry>, Vec<Letter>) {
        let settled = wait_for(Duration::from_secs(180), "every key settled", || async {
            let (outputs, letters) = (entries(&self.env).await, letters(&self.env).await);
            (outputs.len() + letters.len() >= n).then_some((outputs, letters))
        })
        .await;
        self.env.wait_drained(Duration::from_secs(60)).await;
        settled
    }

    fn stop(self) {
        for (_, child) in self.hosts {
            stop_gracefully(child);
        }
    }
}

/// An output: its transaction and whether it came from `ledger-next` (it has `currency`).
#[derive(Debug)]
struct Entry {
    tx: String,
    next: bool,
}

/// A dead letter: its key and the digest of the version that failed it.
#[derive(Debug)]
struct Letter {
    key: String,
    digest: String,
}

/// The ledger entries, in stream order (a fenced stream's claim records left out).
async fn entries(env: &TestEnv) -> Vec<Entry> {
    env.messages(OUTPUTS)
        .await
        .iter()
        .filter(|m| m.subject.starts_with("ledger.entries."))
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            Entry {
                tx: v["transaction_id"].as_str().unwrap().to_string(),
                next: v.get("currency").is_some(),
            }
        })
        .collect()
}

async fn letters(env: &TestEnv) -> Vec<Letter> {
    env.messages(DEAD)
        .await
        .iter()
        .map(|m| {
            let h = &m.headers;
            let get = |n: &str| h.get(n).map(|v| v.to_string()).unwrap_or_default();
            Letter {
                key: get("Dedup-Key"),
                digest: get("Dedup-Digest"),
            }
        })
        .collect()
}

/// `dedup-host diff --json`'s report.
fn diff(config: &Path) -> serde_json::Value {
    let text = ok(
        config,
        &["diff", "--route", "ledger", "--json", "--samples", "100"],
    );
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {text}"));
    serde_json::from_str(&text[start..text.rfind('}').unwrap() + 1]).unwrap()
}

/// Waits until the hosts' counts cover `n` shadow decisions (compared or skipped).
async fn wait_compared(config: &Path, n: u64) -> serde_json::Value {
    wait_for(Duration::from_secs(60), "the shadow counts", || async {
        let report = diff(config);
        let c = &report["report"]["counts"];
        let done = c["compared"].as_u64().unwrap() + c["skipped"].as_u64().unwrap();
        (done >= n).then_some(report)
    })
    .await
}
