//! A claim-after route's contract changes to claim before only once its consumer has nothing
//! delivered and not acknowledged: such a delivery may have published its outputs before its
//! key was recorded (its settled write unanswered, or its host stopped between the two), which
//! no claim record shows; run under claim before, its key would be claimed as new, by whatever
//! version runs then (found by the simulation, seed 26406 `--claim-after`;
//! `dedup_delivery::change::open_refuses`).

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use dedup_host_tests::guests::cli_async;
use dedup_host_tests::harness::{TestEnv, Timing, BUCKET, CONSUMER, SOURCE};
use futures::StreamExt;

/// Route `chp` with one output per message, claiming after its run or (`after` false) before.
fn route(after: bool) -> String {
    let claim = if after { "claim = \"after\"\n" } else { "" };
    format!(
        r#"
[[routes]]
name = "chp"
subject = "in.chp.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
{claim}limits = {{ deadline = "1s" }}
allowed_outputs = ["in.chp.*.done"]
config = {{ succeed_on_attempt = "1", outputs = "1", work_ms = "0" }}
"#
    )
}

/// A message delivered and never acknowledged (as a host stopped between its publish and its
/// record leaves it) keeps `setup --change-route` from claim after to claim before from going
/// ahead, naming the consumer, the count and the fix, and so does a message the server gave up
/// on whose letter is not stored yet (its stranded-message marker); once a host under the old
/// config settled it and the marker is gone, the change goes through and nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_route_changes_to_claim_before_only_once_nothing_is_pending() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env.host(&timing, &route(true), "h1").await;
    env.publish("in.chp.a", "a", &[], "x").await;
    env.wait_completed("chp", &["a"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();

    env.publish("in.chp.b", "b", &[], "x").await;
    let mut source = env.js.get_stream(SOURCE).await.unwrap();
    let name = format!("{CONSUMER}-chp");
    let mut consumer = source.get_consumer::<pull::Config>(&name).await.unwrap();
    let fetched: pull::Batch = (consumer.fetch().max_messages(1))
        .expires(Duration::from_secs(3))
        .messages()
        .await
        .unwrap();
    let taken: Vec<_> = fetched.collect().await;
    // Delivered to this fetch, or to a pull request the stopped host left open.
    let pending = consumer.info().await.unwrap().num_ack_pending;
    assert_eq!(
        pending,
        1,
        "b is left unacknowledged ({} fetched here)",
        taken.len()
    );

    let path = env.path("before.toml");
    std::fs::write(&path, env.config_text(&timing, &route(false))).unwrap();
    let (ok, out) = cli_async(&path, &["setup", "--change-route", "chp"]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("route `chp` claims after running")
            && out.contains("has 1 message(s) delivered and not acknowledged")
            && out.contains(&format!("`{name}` (1)"))
            && out.contains("reload (or restart) the hosts with the old config"),
        "{out}"
    );
    let (ok, out) = cli_async(&path, &["setup", "--change-route", "chp"]).await;
    assert!(
        !ok && out.contains("delivered and not acknowledged"),
        "still refused, the mark cleared: {out}"
    );

    let host = env.host(&timing, &route(true), "h1").await;
    env.wait_completed("chp", &["a", "b"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    // A message the server gave up on whose letter is not stored yet: its marker stands (as
    // the host writes it before a message's last delivery). Nothing is pending.
    let b = source.info().await.unwrap().state.last_sequence;
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let marker = env.mark_given_up(&name, b, 5).await;
    let (ok, out) = cli_async(&path, &["setup", "--change-route", "chp"]).await;
    assert!(!ok, "changed with b's marker standing: {out}");
    assert!(
        out.contains("has 0 message(s) delivered and not acknowledged")
            && out.contains("and 1 message(s) given up by the server"),
        "{out}"
    );
    kv.purge(marker.key()).await.unwrap();
    let (ok, out) = cli_async(&path, &["setup", "--change-route", "chp"]).await;
    assert!(ok && out.contains("contract changed"), "{out}");
    let host = env.host(&timing, &route(false), "h2").await;
    env.publish("in.chp.c", "c", &[], "x").await;
    env.wait_completed("chp", &["a", "b", "c"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    assert_eq!(env.outputs().await.len(), 3, "none ran twice");
}
