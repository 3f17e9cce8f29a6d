//! Guarantees at the edges, replay, purge and inspect (issue 42, finding 10): a replay whose
//! publish the source stream answers as a duplicate puts the key back and says so, and the
//! operator commands find a route's claims where its contract says they live, whatever the
//! operator's config says.

use std::path::Path;
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::config::Config;
use dedup_host::ops::claims::{Origin, Place};
use dedup_host::ops::letters::{self, Action, Selection};
use dedup_host::ops::story::{self, Target};
use dedup_host::serve::RunningHost;
use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD, OUTPUTS};

/// The route `fixme` on a copy of the hostile guest (which rejects `sleep-reject:<ms>`),
/// so the test can swap in the fixed handler (uppercase). Call [`rejecting`] first.
fn routes(env: &TestEnv, claim: &str, effects: &str) -> String {
    format!(
        r#"
[[routes]]
name = "fixme"
subject = "in.fixme.*"
component = "{}"
allowed_outputs = ["in.fixme.*.done"]
claim = "{claim}"
effects = "{effects}"
limits = {{ deadline = "1s" }}
"#,
        env.path("fixme.wasm").display()
    )
}

fn config(env: &TestEnv, text: String) -> Config {
    Config::parse(&text, Path::new("ops.toml"), env.dir.path().into()).expect("valid config")
}

/// Puts the rejecting handler where the route's component is.
fn rejecting(env: &TestEnv) {
    std::fs::copy(guest("hostile"), env.path("fixme.wasm")).unwrap();
}

/// Starts the deployment's host and dead-letters key `f0`.
async fn dead_lettered(env: &TestEnv, routes: &str) -> RunningHost {
    let host = env.host(&Timing::default(), routes, "replayer").await;
    env.publish("in.fixme.e0", "f0", &[], "sleep-reject:0")
        .await;
    letters_stored(env, 1).await;
    host
}

async fn letters_stored(env: &TestEnv, n: usize) {
    // Generous: each letter follows the key's every attempt and backoff, slow beside a busy
    // machine's other work.
    wait_for(
        Duration::from_secs(90),
        &format!("{n} dead letter(s)"),
        || async { (env.messages(DEAD).await.len() == n).then_some(()) },
    )
    .await;
}

/// Swaps in the fixed handler and waits until the host serves it.
async fn fix(env: &TestEnv, host: &RunningHost) {
    std::fs::copy(guest("uppercase"), env.path("fixme.wasm")).unwrap();
    let digest = dedup_host::runtime::digest(&std::fs::read(guest("uppercase")).unwrap());
    wait_for(
        Duration::from_secs(60),
        "the fixed version served",
        || async {
            let m = host.metrics().encode();
            m.contains(&format!("digest=\"{digest}\"")).then_some(())
        },
    )
    .await;
}

async fn replay(env: &TestEnv, config: &Config, sequence: u64) -> Action {
    let selection = Selection {
        route: Some("fixme".into()),
        sequences: vec![sequence],
        ..Selection::default()
    };
    let list = letters::list(&env.js, config, &selection).await.unwrap();
    let mut actions = dedup_host::ops::replay::replay(&env.js, config, list, false)
        .await
        .unwrap();
    assert_eq!(actions.len(), 1, "{actions:?}");
    actions.remove(0)
}

/// Waits until `f0` is completed, then until nothing is pending, and checks it published
/// exactly one output.
async fn completed_once(env: &TestEnv) {
    env.wait_completed("fixme", &["f0"], Duration::from_secs(60))
        .await;
    env.wait_drained(Duration::from_secs(60)).await;
    let outputs = env.outputs().await;
    let payloads: Vec<_> = outputs
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).to_string())
        .collect();
    assert_eq!(
        payloads,
        ["SLEEP-REJECT:0"],
        "the key completed exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_replay_puts_the_key_back_and_says_so_window() {
    repeated_replay("before", "window").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_replay_puts_the_key_back_and_says_so_fenced() {
    repeated_replay("before", "fenced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_replay_puts_the_key_back_and_says_so_claim_after() {
    repeated_replay("after", "window").await;
}

/// Letter 1 is replayed while the handler still rejects: it fails again (letter 2). Replayed
/// again inside the source's duplicate window, its publish stores nothing; the key used to
/// be left reset with no message to run it, reported "replayed". It is put back (failed for
/// good) and reported `already replayed`; letter 2, replayed twice quickly, completes the
/// key once.
async fn repeated_replay(claim: &str, effects: &str) {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = effects == "fenced";
    rejecting(&env);
    let routes = routes(&env, claim, effects);
    let config = env.config(&Timing::default(), &routes);
    let host = dead_lettered(&env, &routes).await;
    assert_eq!(replay(&env, &config, 1).await.action, "replayed");
    letters_stored(&env, 2).await;
    wait_for(Duration::from_secs(90), "the key failed again", || async {
        env.claim("fixme", "f0").await.filter(|c| c.permanent)
    })
    .await;
    fix(&env, &host).await;

    let again = replay(&env, &config, 1).await;
    assert_eq!(again.action, "already replayed", "{again:?}");
    assert!(
        again.detail.contains("replay:1") && again.detail.contains("failed again"),
        "{again:?}"
    );
    let key = env.claim("fixme", "f0").await.unwrap();
    assert!(
        key.state == ClaimState::Failed && key.permanent,
        "the key is put back as it was, not left reset with nothing to run it: {key:?}"
    );

    let first = replay(&env, &config, 2).await;
    assert_eq!(first.action, "replayed", "{first:?}");
    let second = replay(&env, &config, 2).await;
    assert!(
        second.action == "already replayed" || second.action == "skipped",
        "{second:?}"
    );
    completed_once(&env).await;
    host.shutdown().await.unwrap();
}

/// The route was set up fenced (its claims in the output stream); the operator's config
/// says window. `inspect`, `replay` and `purge` still find the claim in the stream, and say
/// the contract told them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_follow_a_fenced_contract_under_a_window_config() {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    rejecting(&env);
    let host = dead_lettered(&env, &routes(&env, "before", "fenced")).await;
    env.fenced_outputs = false;
    let operator = config(
        &env,
        env.config_text(&Timing::default(), &routes(&env, "before", "window")),
    );
    env.fenced_outputs = true;
    follows_the_contract(&env, &host, &operator, Place::Stream(OUTPUTS.into())).await;
    host.shutdown().await.unwrap();
}

/// The operator's config names another claim bucket (which does not exist) than the one
/// the route was set up with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_follow_the_contracts_bucket_under_another_bucket() {
    let env = TestEnv::start().await;
    rejecting(&env);
    let routes = routes(&env, "before", "window");
    let host = dead_lettered(&env, &routes).await;
    let text = env.config_text(&Timing::default(), &routes);
    let elsewhere = format!("bucket = \"{BUCKET}-elsewhere\"");
    let operator = config(
        &env,
        text.replace(&format!("bucket = \"{BUCKET}\""), &elsewhere),
    );
    assert_ne!(operator.claims.bucket, BUCKET);
    follows_the_contract(&env, &host, &operator, Place::Bucket(BUCKET.into())).await;
    host.shutdown().await.unwrap();
}

async fn follows_the_contract(env: &TestEnv, host: &RunningHost, operator: &Config, at: Place) {
    let tell = || story::tell(&env.js, operator, "fixme", Target::Key("f0".into()));
    let dead = tell().await.unwrap();
    assert_eq!(
        (&dead.claims.place, dead.claims.origin),
        (&at, Origin::Contract)
    );
    let record = dead.claim.as_ref().expect("inspect finds the claim");
    assert!(record.permanent, "{record:?}");
    assert!(
        dead.verdict.starts_with("dead-lettered"),
        "{}",
        dead.verdict
    );

    fix(env, host).await;
    let replayed = replay(env, operator, 1).await;
    assert_eq!(replayed.action, "replayed", "{replayed:?}");
    assert!(
        replayed.detail.contains("key reset") && replayed.detail.contains("route's contract"),
        "{replayed:?}"
    );
    env.wait_completed("fixme", &["f0"], Duration::from_secs(60))
        .await;
    assert_eq!(env.outputs().await.len(), 1, "the key completed once");
    let done = tell().await.unwrap();
    assert!(done.verdict.starts_with("completed"), "{}", done.verdict);

    let list = letters::list(&env.js, operator, &Selection::default())
        .await
        .unwrap();
    let purged = letters::purge(&env.js, operator, list, false, false)
        .await
        .unwrap();
    let actions: Vec<_> = purged.iter().map(|a| a.action).collect();
    assert_eq!(actions, ["purged"], "{purged:?}");
    assert!(env.messages(DEAD).await.is_empty());
}
