//! A claim-after route is renamed only once its consumer has nothing delivered and not
//! acknowledged: such a delivery may have published its outputs under ids of the old name
//! before its key was recorded (its settled write unanswered, or its host stopped between
//! the two), which no claim record shows; run again under the new name, it would publish them
//! under other ids (found by the simulation; `dedup_delivery::rename::pending_refuses`).

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use dedup_host_tests::guests::cli_async;
use dedup_host_tests::harness::{TestEnv, Timing, CONSUMER, SOURCE};
use futures::StreamExt;

/// A claim-after route named `name` with one output per message.
pub(crate) fn route(name: &str) -> String {
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "in.ren.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
claim = "after"
limits = {{ deadline = "1s" }}
allowed_outputs = ["in.ren.*.done"]
config = {{ succeed_on_attempt = "1", outputs = "1", work_ms = "0" }}
"#
    )
}

/// A test server with claim-after route `old` served once: message `a` completed under it,
/// and its host stopped.
pub(crate) async fn with_a_settled_under_old() -> (TestEnv, Timing) {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env.host(&timing, &route("old"), "h1").await;
    env.publish("in.ren.a", "a", &[], "x").await;
    env.wait_completed("old", &["a"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    (env, timing)
}

/// A message delivered and never acknowledged (as a host stopped between its publish and its
/// record leaves it) keeps `setup --rename-route` from going ahead, naming the fix; once a
/// host under the old name settled it, the rename goes through and nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_route_is_renamed_only_once_nothing_is_pending() {
    let (env, timing) = with_a_settled_under_old().await;

    env.publish("in.ren.b", "b", &[], "x").await;
    let source = env.js.get_stream(SOURCE).await.unwrap();
    let mut consumer = source
        .get_consumer::<pull::Config>(&format!("{CONSUMER}-old"))
        .await
        .unwrap();
    let old: pull::Batch = (consumer.fetch().max_messages(1))
        .expires(Duration::from_secs(3))
        .messages()
        .await
        .unwrap();
    let taken: Vec<_> = old.collect().await;
    // Delivered to this fetch, or to a pull request the stopped host left open (the server
    // hands messages to it until it expires): either way, delivered and not acknowledged.
    let pending = consumer.info().await.unwrap().num_ack_pending;
    assert_eq!(
        pending,
        1,
        "b is delivered and left unacknowledged ({} fetched here)",
        taken.len()
    );

    let path = env.path("renamed.toml");
    std::fs::write(&path, env.config_text(&timing, &route("new"))).unwrap();
    let (ok, out) = cli_async(&path, &["setup", "--rename-route", "old", "new"]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("1 message(s) delivered and not acknowledged") && out.contains("names `old`"),
        "{out}"
    );
    let new = format!("{CONSUMER}-new");
    assert!(source.consumer_info(&new).await.is_err(), "no `{new}` made");

    let host = env.host(&timing, &route("old"), "h1").await;
    env.wait_completed("old", &["a", "b"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    let (ok, out) = cli_async(&path, &["setup", "--rename-route", "old", "new"]).await;
    assert!(ok, "{out}");
    let mut config = env.config(&timing, &route("new"));
    config.host.instance_id = Some("h2".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    env.publish("in.ren.c", "c", &[], "x").await;
    env.wait_completed("new", &["a", "b", "c"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    assert_eq!(env.outputs().await.len(), 3, "none ran twice");
}
