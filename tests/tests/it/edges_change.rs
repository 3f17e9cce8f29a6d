//! `setup --change-route` at the edges (issue 42, finding 7): claim records are read from the
//! old contract's claim store and written to the new one (window -> fenced, bucket -> bucket)
//! and counted as moved; a window key not settled, whose output may be stored, is never run
//! again fenced (the change is refused naming it, and goes through once it settled under the
//! old contract); and a host that still serves the route counts as serving however old its
//! status record is (paused by SIGSTOP, its record gone). Later follow-ups: a host starting
//! mid-change (the record marked as changing) waits for the change; only a subscriber of this
//! deployment's serving subject blocks it; a key dead-lettered after a window output blocks
//! window -> fenced; claims moved A -> B -> A keep what happened on B.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::claim::{key, ClaimRecord, ClaimState};
use dedup_host::components::status;
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host::serve::{self, RunningHost};
use dedup_host_tests::guests::{cli, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, BUCKET};

/// The hostile guest's echo on `in.mv.*` (output `in.mv.*.done`), keyed by header `Key` so
/// a copy published later under another message id is the same key.
fn route(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "mv"
subject = "in.mv.*"
component = "{{guest:hostile}}"
key = {{ header = "Key" }}
allowed_outputs = ["in.mv.*.done"]
{extra}
"#
    )
}

/// Config text: the output stream takes fenced batches and keeps message ids for 10 minutes
/// (so the route can run with either effects); claims in bucket `bucket`.
fn text(env: &TestEnv, extra: &str, bucket: &str) -> String {
    env.config_text(&Timing::default(), &route(extra))
        .replace(
            "duplicate_window = \"10m\"",
            "duplicate_window = \"10m\"\neffects = \"fenced\"",
        )
        .replace(
            &format!("bucket = \"{BUCKET}\""),
            &format!("bucket = \"{bucket}\""),
        )
}

/// One side of a change: its config text, parsed config and file.
pub(super) struct Side {
    pub(super) config: Config,
    pub(super) text: String,
    pub(super) path: PathBuf,
}

pub(super) fn side(env: &TestEnv, name: &str, extra: &str, bucket: &str) -> Side {
    let text = text(env, extra, bucket);
    let path = env.path(&format!("{name}.toml"));
    std::fs::write(&path, &text).unwrap();
    let config = Config::parse(&text, Path::new("t.toml"), env.dir.path().into()).unwrap();
    Side { config, text, path }
}

pub(super) async fn host(env: &TestEnv, side: &Side, instance: &str) -> RunningHost {
    let mut config = Config::parse(&side.text, Path::new("t.toml"), env.dir.path().into()).unwrap();
    config.host.instance_id = Some(instance.to_string());
    serve::start(config).await.expect("host starts")
}

/// `dedup-host setup --change-route mv --json` with `side`'s config: (exit 0, output).
async fn change(side: &Side) -> (bool, String) {
    let path = side.path.clone();
    let run = tokio::task::spawn_blocking(move || {
        cli(&path, &["setup", "--change-route", "mv", "--json"])
    })
    .await
    .unwrap();
    (run.code == 0, run.stdout + &run.stderr)
}

/// Waits until host `instance` reports route `mv` refused by its contract.
pub(super) async fn refused(env: &TestEnv, config: &Config, instance: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("{instance} refusing the route"),
        || async {
            let store = status::open(&env.js, config).await.ok()?;
            let hosts = status::read_all(&store).await.ok()?;
            hosts
                .iter()
                .find(|h| h.instance_id == instance)
                .and_then(|h| h.routes.get("mv"))
                .and_then(|r| r.contract_refused.clone())
                .map(|_| ())
        },
    )
    .await;
}

/// The recorded contract's effects and claims.
pub(super) async fn recorded(env: &TestEnv, config: &Config) -> (String, String) {
    let store = env
        .js
        .get_key_value(contract::bucket_name(config))
        .await
        .unwrap();
    let record = contract::read(&store, "mv").await.unwrap().unwrap().0;
    (
        format!("{:?}", record.contract.effects),
        record.contract.claims,
    )
}

/// The outputs of route `mv` (without claim records).
pub(super) async fn outputs(env: &TestEnv) -> usize {
    env.outputs()
        .await
        .iter()
        .filter(|m| m.subject.starts_with("in.mv."))
        .count()
}

pub(super) async fn publish(env: &TestEnv, key: &str, copy: &str) {
    env.publish(
        "in.mv.x",
        &format!("{key}-{copy}"),
        &[("Key", key)],
        "hello",
    )
    .await;
}

/// Runs k1..k3 to completion under `old`, changes to `new` with a host of `new` running
/// (refusing the route until the change), then sends each key again: each is a duplicate
/// under the new contract, and `claims_moved` counts the three records.
async fn settled_keys_move(new_extra: &str, new_bucket: &str) {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", new_extra, new_bucket);
    let keys = ["k1", "k2", "k3"];
    let first = host(&env, &old, "old-1").await;
    for k in keys {
        publish(&env, k, "a").await;
    }
    env.wait_completed("mv", &keys, Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    assert_eq!(outputs(&env).await, 3);

    let second = host(&env, &new, "new-1").await;
    refused(&env, &new.config, "new-1").await;
    let (changed, out) = change(&new).await;
    assert!(changed, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out[..=out.rfind('}').unwrap()]).unwrap();
    assert_eq!(json["action"], "changed", "{out}");
    assert_eq!(json["claims_moved"], 3, "{out}");
    for k in keys {
        publish(&env, k, "b").await;
    }
    env.wait_drained(Duration::from_secs(30)).await;
    assert_eq!(outputs(&env).await, 3, "a settled key ran again");
    let stats = second.shutdown().await.unwrap();
    assert!(stats.duplicates >= 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_keys_move_from_window_to_fenced_and_stay_duplicates() {
    settled_keys_move("effects = \"fenced\"", BUCKET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_keys_move_from_one_bucket_to_another_and_stay_duplicates() {
    settled_keys_move("", "claims-next").await;
}

/// Window -> fenced with a key whose window output is stored but whose record is not final
/// (what a release after a partial publish, or a host killed between publish and record,
/// leaves): the change is refused naming the key, the operator serves the route under the old
/// contract until the key settles, the change then goes through, and the key's output exists
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_key_open_after_its_output_was_stored_is_not_run_again_fenced() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    assert_eq!(outputs(&env).await, 1);
    // The output is stored under its window message id; the record goes back to released.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let claim_key = key::encode("mv", "k1");
    let mut record: ClaimRecord = env.claim("mv", "k1").await.unwrap();
    record.state = ClaimState::Failed;
    record.permanent = false;
    record.reason = Some("released: an output stream did not answer".into());
    record.retry_at_ms = Some(0);
    kv.put(&claim_key, record.to_bytes()).await.unwrap();
    publish(&env, "k1", "b").await;

    let second = host(&env, &new, "new-1").await;
    refused(&env, &new.config, "new-1").await;
    let (changed, out) = change(&new).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains("not settled") && out.contains(&claim_key) && out.contains("old config"),
        "{out}"
    );
    assert_eq!(
        recorded(&env, &new.config).await.0,
        "Window",
        "nothing changed"
    );
    second.shutdown().await.unwrap();

    // The fix the refusal names: serve under the old contract until the key settled.
    let again = host(&env, &old, "old-2").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    env.wait_drained(Duration::from_secs(30)).await;
    again.shutdown().await.unwrap();
    let third = host(&env, &new, "new-2").await;
    refused(&env, &new.config, "new-2").await;
    let (changed, out) = change(&new).await;
    assert!(changed, "{out}");
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
    publish(&env, "k1", "c").await;
    env.wait_drained(Duration::from_secs(30)).await;
    third.shutdown().await.unwrap();
    assert_eq!(outputs(&env).await, 1, "k1's output stored twice");
}

/// A host process, killed if the test ends first.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = signal_quiet(&self.0, "-CONT");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal_quiet(child: &std::process::Child, sig: &str) -> std::io::Result<()> {
    std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .map(|_| ())
}

/// Deletes host `instance`'s status record, as its expiry would once the host was paused
/// longer than the bucket's max age.
async fn forget_status(env: &TestEnv, config: &Config, instance: &str) {
    let store = status::open(&env.js, config).await.unwrap();
    store.purge(instance).await.unwrap();
}

/// A host serving the route, paused (SIGSTOP) with its status record gone, and then running
/// again with its record gone: the change is refused both times, naming the evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_host_whose_status_aged_out_still_counts_as_serving() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let path = env.path("p1.toml");
    std::fs::write(
        &path,
        old.text
            .replace("[host]\n", "[host]\ninstance_id = \"p1\"\n"),
    )
    .unwrap();
    let serving = Process(
        std::process::Command::new(host_binary())
            .args(["run", "--config"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start dedup-host run"),
    );
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;

    signal(&serving.0, "-STOP");
    forget_status(&env, &old.config, "p1").await;
    let (changed, out) = change(&new).await;
    assert!(!changed, "a paused host was taken as gone: {out}");
    assert!(
        out.contains("still served") && out.contains("paused"),
        "{out}"
    );
    assert_eq!(recorded(&env, &new.config).await.0, "Window");

    signal(&serving.0, "-CONT");
    forget_status(&env, &old.config, "p1").await;
    let (changed, out) = change(&new).await;
    assert!(!changed, "a running host was taken as gone: {out}");
    assert!(out.contains("host `p1` answered"), "{out}");
    assert_eq!(recorded(&env, &new.config).await.0, "Window");
}

/// Rewrites key `key`'s claim record of route `mv` in bucket `bucket` with `change`.
pub(super) async fn rewrite(
    env: &TestEnv,
    bucket: &str,
    key: &str,
    change: impl FnOnce(&mut ClaimRecord),
) {
    let kv = env.js.get_key_value(bucket).await.unwrap();
    let claim_key = key::encode("mv", key);
    let entry = kv.get(&claim_key).await.unwrap().expect("a claim record");
    let mut record = ClaimRecord::from_bytes(&entry).unwrap();
    change(&mut record);
    kv.put(&claim_key, record.to_bytes()).await.unwrap();
}

/// Key `key`'s claim record of route `mv` in bucket `bucket`.
pub(super) async fn record_in(env: &TestEnv, bucket: &str, key: &str) -> Option<ClaimRecord> {
    let kv = env.js.get_key_value(bucket).await.ok()?;
    let entry = kv.get(key::encode("mv", key)).await.ok()??;
    Some(ClaimRecord::from_bytes(&entry).unwrap())
}

/// The contract-refused reason host `instance` reports for route `mv`, once it reports one.
async fn refusal(env: &TestEnv, config: &Config, instance: &str) -> String {
    refused(env, config, instance).await;
    let store = status::open(&env.js, config).await.unwrap();
    let hosts = status::read_all(&store).await.unwrap();
    let host = hosts.iter().find(|h| h.instance_id == instance).unwrap();
    host.routes["mv"].contract_refused.clone().unwrap()
}

/// A host that starts while `setup --change-route` is between its steps (the contract record
/// marked as changing, the old contract still recorded) does not serve the route under the
/// old contract, though its config matches it: it waits, and the change then finishes with
/// the host running; the key sent meanwhile runs once, under the new contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_starting_during_a_change_does_not_serve_until_the_change_ends() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();

    // What the change writes before it probes for serving hosts.
    let store = env
        .js
        .get_key_value(contract::bucket_name(&old.config))
        .await
        .unwrap();
    let (record, revision) = contract::read(&store, "mv").await.unwrap().unwrap();
    let marking = contract::Changing {
        to: contract::of(&new.config, &new.config.routes[0]),
        since_ms: 1,
        // As a release that predates change runs wrote it: lapsed, so the change takes it.
        run: None,
    };
    store
        .update("mv", contract::encode(&record, Some(&marking)), revision)
        .await
        .unwrap();

    let late = host(&env, &old, "old-2").await;
    let reason = refusal(&env, &old.config, "old-2").await;
    assert!(
        reason.contains("being changed") && reason.contains("--change-route mv"),
        "{reason}"
    );
    publish(&env, "k2", "a").await;
    // The change, run again, finishes (the waiting host holds no serving subscription).
    let (changed, out) = change(&new).await;
    assert!(changed, "{out}");
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
    let reason = refusal(&env, &old.config, "old-2").await;
    assert!(reason.contains("differs"), "{reason}");
    let next = host(&env, &new, "new-1").await;
    wait_for(Duration::from_secs(30), "k2 completed fenced", || async {
        let (record, _) = env.fenced_claim("mv", "k2").await?;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    next.shutdown().await.unwrap();
    late.shutdown().await.unwrap();
    assert_eq!(outputs(&env).await, 2, "k2 ran twice or not at all");
}

/// Nothing changes the contract while a client subscribes to this deployment's serving
/// subject and says nothing (the refusal names the subject and how to find the client), but
/// a subscriber on another deployment's serving subject does not block this deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_subscriber_of_this_deployments_serving_subject_blocks_a_change() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "", "claims-next");
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    let second = host(&env, &new, "new-1").await;
    refused(&env, &new.config, "new-1").await;

    let client = env.servers.connect().await;
    let mut billing = new.config.clone();
    billing.deployment.name = Some("billing".into());
    let theirs = dedup_host::presence::serving_subject(&billing, "mv");
    let _other = client.subscribe(theirs).await.unwrap();
    let ours = dedup_host::presence::serving_subject(&new.config, "mv");
    let listener = client.subscribe(ours.clone()).await.unwrap();
    client.flush().await.unwrap();
    let (changed, out) = change(&new).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains("answered nothing")
            && out.contains(&ours)
            && out.contains("nats server report connections"),
        "{out}"
    );
    assert_eq!(
        recorded(&env, &new.config).await.1,
        format!("bucket {BUCKET}")
    );

    drop(listener);
    client.flush().await.unwrap();
    let (changed, out) = change(&new).await;
    assert!(
        changed,
        "another deployment's subscriber blocked the change: {out}"
    );
    assert_eq!(recorded(&env, &new.config).await.1, "bucket claims-next");
    second.shutdown().await.unwrap();
}

/// Window -> fenced with a key dead-lettered after its window output was stored: a replay of
/// its letter would run it fenced, without message ids, so the change is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_dead_lettered_after_its_window_output_blocks_the_change_to_fenced() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    // What a run that published its output and then failed for good leaves.
    rewrite(&env, BUCKET, "k1", |r| {
        assert!(r.effects_by.is_some(), "the window output marks the record");
        r.state = ClaimState::Failed;
        r.permanent = true;
        r.reason = Some("rejected".into());
    })
    .await;
    let (changed, out) = change(&new).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains("failed for good") && out.contains(&key::encode("mv", "k1")),
        "{out}"
    );
    assert_eq!(
        recorded(&env, &new.config).await.0,
        "Window",
        "nothing changed"
    );
    let store = env
        .js
        .get_key_value(contract::bucket_name(&old.config))
        .await
        .unwrap();
    let (_, marked) = contract::lookup_marked(&store, "mv").await.unwrap();
    assert_eq!(marked, None, "a refused change leaves no mark");
}

/// Claims moved A -> B -> A: a record A kept from before the first move (failed for a
/// retry) does not shadow the key's completion on B when the claims come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_moved_back_keep_what_happened_in_between() {
    let env = TestEnv::start().await;
    let a = side(&env, "a", "", BUCKET);
    let b = side(&env, "b", "", "claims-next");
    let first = host(&env, &a, "a-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    rewrite(&env, BUCKET, "k1", |r| {
        r.state = ClaimState::Failed;
        r.permanent = false;
        r.reason = Some("released: an output stream did not answer".into());
        r.retry_at_ms = Some(0);
    })
    .await;

    let on_b = host(&env, &b, "b-1").await;
    refused(&env, &b.config, "b-1").await;
    let (changed, out) = change(&b).await;
    assert!(changed, "{out}");
    publish(&env, "k1", "b").await;
    wait_for(Duration::from_secs(30), "k1 completed on B", || async {
        let record = record_in(&env, "claims-next", "k1").await?;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    on_b.shutdown().await.unwrap();

    let (changed, out) = change(&a).await;
    assert!(changed, "{out}");
    let record = env.claim("mv", "k1").await.unwrap();
    assert_eq!(
        record.state,
        ClaimState::Completed,
        "A's stale record shadows k1's completion on B: {record:?}"
    );
    assert_eq!(outputs(&env).await, 1);
}
