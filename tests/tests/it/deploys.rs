//! Safe deploys across `dedup-host run` processes: a shadow candidate compared on every host
//! with nothing of it stored, a canary rolled back automatically on every host, a healthy
//! canary promoted through a host killed with -9, and the commands' refusals.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_candidate_is_compared_on_every_host_and_nothing_of_it_is_stored() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    // The same version in shadow: no difference.
    let same = digest_of(&ok(
        &d.config,
        &["deploy", "--route", "ledger", "--shadow", &path("ledger")],
    ));
    d.wait_candidate(&same).await;
    d.publish(0..1000, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(1000).await;
    let report = wait_compared(&d.config, 1000).await;
    let counts = &report["report"]["counts"];
    assert_eq!(counts["differences"], 0, "{report:#}");
    assert!(counts["compared"].as_u64().unwrap() > 0, "{report:#}");
    assert_eq!(counts["matches"], counts["compared"], "{report:#}");

    // The next version in shadow: a field added to every entry, odd amounts refused.
    let next = digest_of(&ok(
        &d.config,
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
    d.wait_candidate(&next).await;
    d.publish(1000..1200, |i| i64::from(i) + 1).await;
    let (outputs, letters) = d.wait_settled(1200).await;
    let report = wait_compared(&d.config, 200).await;
    let counts = &report["report"]["counts"];
    assert!(
        counts["kinds"]["payload"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert!(
        counts["kinds"]["outcome"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert_eq!(
        counts["differences"].as_u64().unwrap(),
        counts["compared"].as_u64().unwrap(),
        "every entry differs: {report:#}"
    );
    let first = &report["report"]["first"];
    let payload = &first["payload"];
    assert_eq!(
        payload["differences"][0], "outputs[0].payload/currency",
        "{report:#}"
    );
    assert!(!payload["live"]["outputs"][0]["payload"]
        .as_str()
        .unwrap()
        .contains("currency"));
    assert!(payload["candidate"]["outputs"][0]["payload"]
        .as_str()
        .unwrap()
        .contains("\"currency\":\"EUR\""));
    assert_eq!(
        first["outcome"]["candidate"]["outcome"], "reject",
        "{report:#}"
    );
    let printed = ok(&d.config, &["diff", "--route", "ledger"]);
    eprintln!("{printed}");
    assert!(
        printed.contains("payload") && printed.contains("currency"),
        "{printed}"
    );

    // Nothing of the candidate's is stored: the live outputs are exactly a run without it.
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(outputs.len(), 1200);
    assert!(
        outputs.iter().all(|e| !e.next),
        "a candidate output was stored"
    );
    let txs: BTreeSet<&str> = outputs.iter().map(|e| e.tx.as_str()).collect();
    assert_eq!(txs.len(), 1200, "one output per key");
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains(&format!("candidate {next} shadow")),
        "{listing}"
    );
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_rejects_half_its_keys_is_rolled_back_on_every_host() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let next = digest_of(&ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "20%",
            &path("ledger-next"),
        ],
    ));
    d.wait_candidate(&next).await;
    // Rolled back on every host: none runs it any more.
    d.reject_until_rolled_back(600).await;
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains("ROLLED BACK") && listing.contains("rejects"),
        "{listing}"
    );
    // The live version handles the rest.
    d.publish(600..800, |i| i64::from(i) + 1).await;
    let (outputs, letters) = d.wait_settled(800).await;
    let mut settled: BTreeMap<String, u32> = BTreeMap::new();
    for e in &outputs {
        *settled.entry(e.tx.replace("tx-", "k-")).or_default() += 1;
    }
    for l in &letters {
        *settled.entry(l.key.clone()).or_default() += 1;
        assert_eq!(
            l.digest, next,
            "a reject of the candidate's carries its digest: {l:?}"
        );
    }
    assert_eq!(settled.len(), 800, "every key settled");
    assert!(
        settled.values().all(|n| *n == 1),
        "a key with effects from both versions"
    );
    let after: Vec<&Entry> = outputs
        .iter()
        .filter(|e| e.tx["tx-".len()..].parse::<u32>().unwrap() >= 600)
        .collect();
    assert_eq!(after.len(), 200);
    assert!(
        after.iter().all(|e| !e.next),
        "the candidate ran after its rollback"
    );
    assert!(!letters.is_empty() && outputs.iter().any(|e| e.next));
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_promoted_through_a_killed_host_runs_every_key_once() {
    let mut d = Deployment::start(&["host-a", "host-b"]).await;
    let next = digest_of(&ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "30%",
            &path("ledger-next"),
        ],
    ));
    d.wait_candidate(&next).await;
    d.publish(0..150, |i| 2 * i64::from(i) + 2).await;
    signal(&d.hosts["host-a"], "-KILL");
    d.hosts.remove("host-a").unwrap().wait().unwrap();
    d.publish(150..300, |i| 2 * i64::from(i) + 2).await;
    let c = d.env.host_process(&d.timing, d.routes, "host-c").await;
    d.hosts.insert("host-c".into(), c);
    d.wait_settled(300).await;
    let promoted = ok(&d.config, &["promote", "--route", "ledger"]);
    assert!(promoted.contains(&next), "{promoted}");
    d.wait_hosts(
        |r| r.digest.as_deref() == Some(next.as_str()) && r.candidate.is_none(),
        "every host serving the promoted version",
    )
    .await;
    d.publish(300..400, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(400).await;
    assert!(letters.is_empty(), "{letters:?}");
    let txs: BTreeSet<&str> = outputs.iter().map(|e| e.tx.as_str()).collect();
    assert_eq!(
        (outputs.len(), txs.len()),
        (400, 400),
        "every key exactly once"
    );
    let canary = outputs.iter().take(300).filter(|e| e.next).count();
    assert!(
        (30..=150).contains(&canary),
        "the canary ran {canary} of 300 keys"
    );
    let late = outputs
        .iter()
        .filter(|e| e.tx["tx-".len()..].parse::<u32>().unwrap() >= 300);
    assert!(
        late.clone().all(|e| e.next),
        "promoted: every later key on it"
    );
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains(&format!("ledger {next}")) || listing.contains(&next),
        "{listing}"
    );
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_commands_refuse_bad_input_with_the_reason_and_the_fix() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let config = env.path("host.toml");
    std::fs::write(&config, env.config_text(&timing, LEDGER)).unwrap();
    let refused = |args: &[&str], expect: &[&str]| {
        let (success, text) = cli(&config, args);
        assert!(!success, "dedup-host {args:?} succeeded: {text}");
        for e in expect {
            assert!(text.contains(e), "dedup-host {args:?}: `{e}` not in {text}");
        }
    };
    let next = path("ledger-next");
    refused(
        &["deploy", "--route", "ledger", "--shadow", &next],
        &["no live version", "--component FILE"],
    );
    ok(
        &config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--component",
            &path("ledger"),
        ],
    );
    refused(
        &["diff", "--route", "nope"],
        &["no route `nope`", "[[routes]]"],
    );
    refused(&["promote", "--route", "nope"], &["no route `nope`"]);
    refused(
        &["diff", "--route", "ledger"],
        &["no candidate", "--shadow FILE"],
    );
    refused(
        &["promote", "--route", "ledger"],
        &["no candidate", "deploy"],
    );
    refused(&["abort", "--route", "ledger"], &["no candidate"]);
    refused(
        &["deploy", "--route", "ledger", "--canary", "0%", &next],
        &["1% to 99%"],
    );
    refused(
        &["deploy", "--route", "ledger", "--canary", "100%", &next],
        &["1% to 99%"],
    );
    refused(
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "20%",
            &path("ledger"),
        ],
        &["serves already"],
    );
    let broken = env.path("broken.wasm");
    std::fs::write(&broken, b"\0asm\x01\0\0\0").unwrap();
    refused(
        &[
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            &broken.display().to_string(),
        ],
        &["broken.wasm"],
    );
    refused(
        &[
            "deploy", "--route", "ledger", "--shadow", &next, "--ignore", "ran_ms",
        ],
        &["JSON pointer", "/field"],
    );
    // Abort drops a candidate.
    ok(&config, &["deploy", "--route", "ledger", "--shadow", &next]);
    assert!(ok(&config, &["routes"]).contains("candidate sha256:"));
    ok(&config, &["abort", "--route", "ledger"]);
    assert!(!ok(&config, &["routes"]).contains("candidate sha256:"));
}

/// The README's "Changing a handler safely" block, run as a script from a folder holding only
/// the two versions and the ledger's case file, with `dedup-host` on the PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_safe_deploy_section_runs_as_a_script() {
    let script = dedup_host_tests::readme::block("deploys-script");
    let env = TestEnv::start().await;
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("ledger");
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["ledger", "ledger-next"] {
        std::fs::copy(guest(name), folder.join(format!("{name}.wasm"))).unwrap();
    }
    let cases = workspace_root().join("guests/rust/ledger/cases.toml");
    std::fs::copy(cases, folder.join("cases.toml")).unwrap();
    let (success, text) = dedup_host_tests::readme::run(&script, &folder, &env.server().url());
    assert!(success, "{text}");
    for expected in [
        " passed, 0 failed",
        "as a shadow candidate beside sha256:",
        "live host(s) have candidate sha256:",
        "route `ledger`: candidate sha256:",
        "as a canary 20% candidate",
        "canary 20% since",
        "promoted the candidate of route `ledger`",
        "and no candidate",
    ] {
        assert!(text.contains(expected), "`{expected}` not in:\n{text}");
    }
    let entries = env.messages("LEDGER").await;
    assert_eq!(entries.len(), 3, "the live version's outputs, once each");
    assert!(entries
        .iter()
        .all(|m| !String::from_utf8_lossy(&m.payload).contains("currency")));
}

/// The ledger with fenced effects, one account at a time.
const FENCED_EXCLUSIVE: &str = r#"
[[routes]]
name = "ledger"
subject = "in.ledger.*"
allowed_outputs = ["ledger.entries.>"]
effects = "fenced"
exclusive_by = { json_pointer = "/account" }
"#;

/// The ledger claimed after it runs.
const CLAIM_AFTER: &str = r#"
[[routes]]
name = "ledger"
subject = "in.ledger.*"
allowed_outputs = ["ledger.entries.>"]
claim = "after"
limits = { deadline = "1500ms" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_on_a_fenced_exclusive_route_survives_a_reload_and_promotes_in_order() {
    canary_reload_promote(FENCED_EXCLUSIVE, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_on_a_claim_after_route_survives_a_reload_and_promotes_once() {
    canary_reload_promote(CLAIM_AFTER, false).await;
}

/// A healthy canary of half the keys on `routes`, a reload of every host mid-traffic (the
/// candidate keeps running), then `promote`: every key has exactly one entry, from one version,
/// and (on an exclusive route) each account's entries are in publish order.
async fn canary_reload_promote(routes: &'static str, fenced: bool) {
    let d = Deployment::start_with(&["host-a", "host-b"], routes, fenced).await;
    let deployed = ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "50%",
            &path("ledger-next"),
            "--wait",
            "60s",
        ],
    );
    assert!(
        deployed.contains("all 2 live host(s) have candidate"),
        "{deployed}"
    );
    let candidate = status_candidate(&d).await;
    d.publish(0..200, |i| 2 * i64::from(i) + 2).await;
    // Reload every host with a changed route (its payload limit) while the batch runs.
    for name in d.hosts.keys() {
        let file = d.env.path(&format!("{name}.toml"));
        let text = std::fs::read_to_string(&file).unwrap().replace(
            "name = \"ledger\"\n",
            "name = \"ledger\"\nmax_payload_bytes = \"512KiB\"\n",
        );
        std::fs::write(&file, text).unwrap();
    }
    let reloaded = ok(&d.config, &["reload"]);
    assert!(reloaded.contains("of 2 live; 0 refused"), "{reloaded}");
    d.publish(200..400, |i| 2 * i64::from(i) + 2).await;
    d.wait_candidate(&candidate).await;
    d.wait_settled(400).await;
    let promoted = ok(
        &d.config,
        &["promote", "--route", "ledger", "--wait", "60s"],
    );
    assert!(promoted.contains(&candidate), "{promoted}");
    d.publish(400..500, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(500).await;
    assert!(letters.is_empty(), "{letters:?}");
    let index = |e: &Entry| e.tx["tx-".len()..].parse::<u32>().unwrap();
    let txs: BTreeSet<u32> = outputs.iter().map(index).collect();
    assert_eq!((outputs.len(), txs.len()), (500, 500), "every key once");
    let after_reload = outputs
        .iter()
        .filter(|e| (200..400).contains(&index(e)) && e.next)
        .count();
    assert!(
        after_reload > 20,
        "the canary ran {after_reload} of 200 keys after the reload"
    );
    assert!(
        outputs.iter().filter(|e| index(e) >= 400).all(|e| e.next),
        "promoted: every later key on it"
    );
    if routes.contains("exclusive_by") {
        // One account at a time, in publish order: each account's entries ascend.
        let mut last: BTreeMap<u32, u32> = BTreeMap::new();
        for e in &outputs {
            let i = index(e);
            if let Some(prev) = last.insert(i % 7, i) {
                assert!(prev < i, "account {} ran tx-{i} after tx-{prev}", i % 7);
            }
        }
    }
    d.stop();
}

/// The digest of the candidate every host reports running.
async fn status_candidate(d: &Deployment) -> String {
    wait_for(
        Duration::from_secs(60),
        "a candidate on the hosts",
        || async {
            let kv = d.env.js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
            let all = status::read_all(&kv).await.ok()?;
            let c = all
                .iter()
                .find_map(|h| h.routes.get("ledger")?.candidate.clone())?;
            Some(c.split(' ').next()?.to_string())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_file_in_a_shared_component_directory_is_rolled_back_and_promoted_there() {
    let env = TestEnv::start().await;
    let dir = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("ledger"), dir.join("ledger.wasm")).unwrap();
    let routes: &'static str = Box::leak(
        format!("{LEDGER}\n[components]\ndir = \"{}\"\n", dir.display()).into_boxed_str(),
    );
    let d = Deployment::launch(env, &["host-a", "host-b"], routes).await;
    d.wait_live().await;
    let next = dedup_host::runtime::digest(&std::fs::read(guest("ledger-next")).unwrap());
    // A canary of a fifth of the keys that rejects odd amounts: rolled back, on the files.
    std::fs::write(
        dir.join("ledger.candidate.toml"),
        "mode = \"canary\"\npercent = 20\n",
    )
    .unwrap();
    std::fs::copy(guest("ledger-next"), dir.join("ledger.candidate.wasm")).unwrap();
    d.wait_candidate(&next).await;
    assert!(ok(&d.config, &["routes"]).contains(&format!("candidate {next} canary")));
    // Rolled back on every host: none runs it any more.
    d.reject_until_rolled_back(400).await;
    assert!(!dir.join("ledger.candidate.wasm").exists());
    assert!(dir.join("ledger.candidate.wasm.rolled-back").exists());
    let why = std::fs::read_to_string(dir.join("ledger.candidate.rolled-back.txt")).unwrap();
    assert!(why.contains("rejects"), "{why}");
    // Again in shadow (no settings file), compared, then promoted with the command.
    std::fs::remove_file(dir.join("ledger.candidate.toml")).unwrap();
    std::fs::copy(guest("ledger-next"), dir.join("ledger.candidate.wasm")).unwrap();
    d.wait_candidate(&next).await;
    d.publish(400..500, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(500).await;
    let report = wait_compared(&d.config, 1).await;
    assert!(
        report["report"]["counts"]["kinds"]["payload"]
            .as_u64()
            .unwrap_or(0)
            > 0
            || report["report"]["counts"]["skipped"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    let promoted = ok(
        &d.config,
        &["promote", "--route", "ledger", "--wait", "60s"],
    );
    assert!(promoted.contains(&next), "{promoted}");
    d.publish(500..600, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(600).await;
    let mut settled: BTreeMap<String, u32> = BTreeMap::new();
    for e in &outputs {
        *settled.entry(e.tx.replace("tx-", "k-")).or_default() += 1;
    }
    for l in &letters {
        *settled.entry(l.key.clone()).or_default() += 1;
        assert_eq!(l.digest, next, "only the candidate rejects: {l:?}");
    }
    assert_eq!(settled.len(), 600, "every key settled");
    assert!(settled.values().all(|n| *n == 1), "a key settled twice");
    let index = |e: &&Entry| e.tx["tx-".len()..].parse::<u32>().unwrap();
    assert!(outputs.iter().filter(|e| index(e) >= 500).all(|e| e.next));
    assert!(outputs
        .iter()
        .filter(|e| (400..500).contains(&index(e)))
        .all(|e| !e.next));
    // Bad input about file candidates names the file to use.
    let (success, text) = cli(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            &path("ledger-next"),
        ],
    );
    assert!(!success && text.contains("ledger.candidate.wasm"), "{text}");
    let (success, text) = cli(&d.config, &["abort", "--route", "ledger"]);
    assert!(!success && text.contains("no candidate"), "{text}");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_added_by_a_reload_runs_the_candidate_stored_for_it() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let second = LEDGER
        .replace("\"ledger\"", "\"ledger2\"")
        .replace("in.ledger.*", "in.ledger2.*");
    let both = format!("{LEDGER}{second}");
    let cli_config = d.env.path("cli.toml");
    std::fs::write(&cli_config, d.env.config_text(&d.timing, &both)).unwrap();
    ok(
        &cli_config,
        &[
            "deploy",
            "--route",
            "ledger2",
            "--component",
            &path("ledger"),
        ],
    );
    let next = ok(
        &cli_config,
        &[
            "deploy",
            "--route",
            "ledger2",
            "--canary",
            "50%",
            &path("ledger-next"),
        ],
    );
    let next = digest_of(&next);
    for name in d.hosts.keys() {
        let file = d.env.path(&format!("{name}.toml"));
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("{text}{second}")).unwrap();
    }
    let reloaded = ok(&d.config, &["reload"]);
    assert!(reloaded.contains("of 2 live; 0 refused"), "{reloaded}");
    wait_for(
        Duration::from_secs(60),
        "both hosts running ledger2's candidate",
        || async {
            let kv = d.env.js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
            let all = status::read_all(&kv).await.ok()?;
            let running = all
                .iter()
                .filter(|h| d.hosts.contains_key(&h.instance_id))
                .filter_map(|h| h.routes.get("ledger2")?.candidate.clone())
                .filter(|c| c.starts_with(&next))
                .count();
            (running == 2).then_some(())
        },
    )
    .await;
    for i in 0..100 {
        let payload = format!(r#"{{"account":"b","amount":2,"transaction_id":"tx-{i}"}}"#);
        let subject = format!("in.ledger2.{i}");
        d.env
            .publish(&subject, &format!("k2-{i}"), &[], payload.into_bytes())
            .await;
    }
    let (outputs, _) = d.wait_settled(100).await;
    assert!(outputs.iter().any(|e| e.next), "the candidate ran no key");
    assert!(
        outputs.iter().any(|e| !e.next),
        "the live version ran no key"
    );
    d.stop();
}
