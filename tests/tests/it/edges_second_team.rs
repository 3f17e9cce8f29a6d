//! A second team on the default stream with a default deployment name and the same route
//! name as the first (issue 42's new-user trial): the route consumer names match, the
//! subjects do not, and no command of the second team takes the first team's route as its
//! own. Also what `setup --rename-route` carries over: claims whose outputs keep their old
//! ids, and the deployed component.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv};

/// A team's config as the quick start writes it: the default source stream and deployment
/// name, one route named `route` on `<prefix>.*`.
pub(crate) fn team(env: &TestEnv, prefix: &str, route: &str) -> (PathBuf, Config) {
    let text = format!(
        r#"
[nats]
urls = ["{url}"]

[source]
subjects = ["{prefix}.*"]
ack_wait = "2s"

[claims]
lease = "2s"
heartbeat = "500ms"
storage = "memory"

[[output_streams]]
name = "OUT_{prefix}"
subjects = ["{prefix}-out.>"]

[[routes]]
name = "{route}"
subject = "{prefix}.*"
allowed_outputs = ["{prefix}-out.>"]
"#,
        url = env.server().url(),
    );
    let path = env.path(&format!("{prefix}-{route}.toml"));
    std::fs::write(&path, &text).unwrap();
    (path.clone(), Config::load(&path).expect("valid"))
}

/// Runs a `dedup-host` command off the runtime's threads: (exit code, stdout + stderr).
pub(crate) async fn cli(config: &Path, args: &[&str]) -> (i32, String) {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = dedup_host_tests::guests::cli(&config, &args);
        (run.code, format!("{}{}", run.stdout, run.stderr))
    })
    .await
    .unwrap()
}

/// Publishes a message with `Nats-Msg-Id` `id` that the hostile guest finishes at once.
async fn publish(env: &TestEnv, subject: &str, id: &str) {
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", id);
    env.js
        .publish_with_headers(subject.to_string(), h, "spin-sleep:0:0".into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Waits until every key of `ids` of `route` is completed.
async fn wait_completed(env: &TestEnv, config: &Config, route: &str, ids: &[String]) {
    wait_for(Duration::from_secs(60), "keys completed", || async {
        let kv = env.js.get_key_value(&config.claims.bucket).await.ok()?;
        for id in ids {
            let key = dedup_host::claim::key::encode(route, id);
            let entry = kv.get(key).await.ok()??;
            let record = dedup_host::claim::ClaimRecord::from_bytes(&entry).unwrap();
            if record.state != dedup_host::claim::ClaimState::Completed {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// The stored bytes of `route`'s contract.
async fn contract_bytes(env: &TestEnv, config: &Config, route: &str) -> Vec<u8> {
    let kv = env
        .js
        .get_key_value(dedup_host::contract::bucket_name(config))
        .await
        .unwrap();
    kv.get(route).await.unwrap().expect("recorded").to_vec()
}

/// Sets team `path` up and deploys the hostile guest to its route.
pub(crate) async fn set_up(path: &Path, route: &str) {
    let (code, out) = cli(path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let hostile = guest("hostile");
    let (code, out) = cli(
        path,
        &[
            "deploy",
            "--route",
            route,
            "--component",
            hostile.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
}

/// Team 2 (`payments.*`) runs `setup --change-route greeter` while team 1 (`orders.*`) serves
/// its route `greeter`: both default names, the default stream, so both name the route's
/// consumer `dedup-host-greeter`. The change is refused before it writes anything (no
/// changing mark), naming both deployments and the fix, and team 1's host keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_teams_change_route_of_the_same_name_is_refused_before_any_mark() {
    let env = TestEnv::start().await;
    let (one_path, one) = team(&env, "orders", "greeter");
    let (two_path, two) = team(&env, "payments", "greeter");
    let (theirs, mine) = (one.deployment_name(), two.deployment_name());
    assert_ne!(theirs, mine);
    assert_eq!(
        dedup_host::consumers::route_consumer_name(&one, "greeter"),
        dedup_host::consumers::route_consumer_name(&two, "greeter"),
        "the trial's premise: one consumer name"
    );
    set_up(&one_path, "greeter").await;
    let mut config = one.clone();
    config.host.instance_id = Some("team-1".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    publish(&env, "orders.0", "o-0").await;
    wait_completed(&env, &one, "greeter", &["o-0".into()]).await;
    let before = contract_bytes(&env, &one, "greeter").await;

    let (code, out) = cli(&two_path, &["setup", "--change-route", "greeter"]).await;
    assert_eq!(code, 1, "refused: {out}");
    for needed in [theirs.as_str(), mine.as_str(), "[deployment] name"] {
        assert!(out.contains(needed), "names {needed}: {out}");
    }
    let after = contract_bytes(&env, &one, "greeter").await;
    assert!(
        !dedup_host::contract::is_marked(&after),
        "no changing mark: {}",
        String::from_utf8_lossy(&after)
    );
    assert_eq!(before, after, "team 1's contract unchanged");

    // Team 1's host keeps serving.
    let ids: Vec<String> = (1..5).map(|i| format!("o-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        publish(&env, &format!("orders.{}", i + 1), id).await;
    }
    wait_completed(&env, &one, "greeter", &ids).await;
    host.shutdown().await.unwrap();
}

/// Route `name` over `in.ren.*` with its component in the store: each key publishes one
/// output.
fn store_route(name: &str) -> String {
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "in.ren.*"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.ren.*.done"]
config = {{ succeed_on_attempt = "1", outputs = "1", work_ms = "0" }}
"#
    )
}

/// Route `greeter` set up with its component deployed to the store and keys `a`, `b`, `c`
/// completed (one output each), its host stopped; then `greet2`'s config written beside it.
/// (greeter's config path, greet2's config path, greet2's config).
async fn renamable(env: &TestEnv) -> (PathBuf, PathBuf, Config) {
    let timing = dedup_host_tests::harness::Timing::default();
    let old_path = env.path("greeter.toml");
    std::fs::write(&old_path, env.config_text(&timing, &store_route("greeter"))).unwrap();
    let (code, out) = cli(&old_path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let flaky = guest("flaky");
    let deploy = ["deploy", "--route", "greeter", "--component"];
    let (code, out) = cli(
        &old_path,
        &[&deploy[..], &[flaky.to_str().unwrap()]].concat(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let mut config = env.config(&timing, &store_route("greeter"));
    config.host.instance_id = Some("h1".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    for k in ["a", "b", "c"] {
        env.publish(&format!("in.ren.{k}"), k, &[], "x").await;
    }
    env.wait_completed("greeter", &["a", "b", "c"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    assert_eq!(env.outputs().await.len(), 3);
    let new_path = env.path("greet2.toml");
    std::fs::write(&new_path, env.config_text(&timing, &store_route("greet2"))).unwrap();
    let new = Config::load(&new_path).expect("valid");
    (old_path, new_path, new)
}

/// After `setup --rename-route greeter greet2`, the keys finished before the rename keep
/// their outputs under the old ids: `audit` finds no anomaly and `inspect` shows the output
/// present. The deployed component moves with the route: `greet2` runs new messages with no
/// `deploy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_route_keeps_its_outputs_and_its_component() {
    let env = TestEnv::start().await;
    let (_, path, config) = renamable(&env).await;
    let (code, out) = cli(&path, &["setup", "--rename-route", "greeter", "greet2"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("copied to `greet2`"), "{out}");

    let (code, out) = cli(&path, &["audit"]).await;
    assert_eq!(code, 0, "no anomaly: {out}");
    let (code, out) = cli(&path, &["inspect", "--route", "greet2", "--key", "a"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("greeter.k.a#0") && out.contains("present"),
        "{out}"
    );
    assert!(!out.contains("MISSING"), "{out}");

    let objects = env
        .js
        .get_object_store(&config.components.bucket)
        .await
        .unwrap();
    let store = dedup_host::components::store::deployed;
    assert!(store(&objects, "greet2").await.is_some(), "carried over");
    let (code, out) = cli(&path, &["routes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("nothing deployed"), "{out}");
    let mut serving = config.clone();
    serving.host.instance_id = Some("h2".into());
    let host = dedup_host::serve::start(serving).await.unwrap();
    env.publish("in.ren.d", "d", &[], "x").await;
    env.wait_completed("greet2", &["d"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    assert_eq!(env.outputs().await.len(), 4, "none ran twice");
}

/// `--accept-dead` naming a key that is unknown or not dead-lettered is refused, naming each
/// key, and the rename changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_dead_naming_no_dead_lettered_key_is_refused() {
    let env = TestEnv::start().await;
    let (_, path, config) = renamable(&env).await;
    let rename = ["setup", "--rename-route", "greeter", "greet2"];
    let named = ["--accept-dead", "nosuch", "--accept-dead", "a"];
    let (code, out) = cli(&path, &[&rename[..], &named[..]].concat()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not a dead-lettered key of route `greeter`"),
        "{out}"
    );
    assert!(out.contains("`nosuch`") && out.contains("`a`"), "{out}");
    let source = env.js.get_stream(&config.source.stream).await.unwrap();
    let consumer = dedup_host::consumers::route_consumer_name(&config, "greeter");
    assert!(source.consumer_info(&consumer).await.is_ok(), "not renamed");
    let kv = env
        .js
        .get_key_value(dedup_host::contract::bucket_name(&config))
        .await
        .unwrap();
    let old = kv.get("greeter").await.unwrap().expect("still recorded");
    assert!(!dedup_host::contract::is_marked(&old), "no mark left");
    assert!(kv.get("greet2").await.unwrap().is_none());
}
