//! A given-up message is dead-lettered under its route's contract (its key, claim mode and
//! effects), so only by a host that serves the route: a host whose config differs from the
//! contract (a change not applied yet, hosts of mixed configs during a rollout) leaves it
//! to one that does, rather than lettering it under its own config's key.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use dedup_host::consumers::route_consumer_name;
use dedup_host::serve::RunningHost;
use dedup_host::stranded::{Marker, Origin};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing};
use futures::StreamExt;

use crate::contract::refusals;
use crate::markers_per_deployment::{advisory, letters};

/// Route `lw` of the `hostile` guest, keyed as `key` says (`""`: by `Nats-Msg-Id`).
fn route(key: &str) -> String {
    format!(
        r#"
[[routes]]
name = "lw"
subject = "in.lw.*"
component = "{{guest:hostile}}"
allowed_outputs = ["in.lw.*.done"]
{key}
"#
    )
}

/// Route `lw`'s key `k1` on `in.lw.x`, given up: the first host records the route's contract
/// (keyed by `Nats-Msg-Id`) and stops; the message's delivery is acked here, so no host runs
/// it. Returns the route's consumer and the message's sequence.
async fn given_up_message(env: &TestEnv, timing: &Timing) -> (String, u64) {
    let serving = env.host(timing, &route(""), "serving").await;
    serving.shutdown().await.unwrap();
    let config = env.config(timing, &route(""));
    env.publish("in.lw.x", "k1", &[], "spin-sleep:0:0").await;
    let source = env.js.get_stream(&config.source.stream).await.unwrap();
    let name = route_consumer_name(&config, "lw");
    let consumer: PullConsumer = source.get_consumer(&name).await.unwrap();
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = batch.next().await.expect("the message").unwrap();
    let sequence = message.info().unwrap().stream_sequence;
    message.double_ack().await.unwrap();
    (name, sequence)
}

/// Starts a host whose config keys route `lw` by subject token, against its contract's
/// `Nats-Msg-Id`, and waits until it refuses the route.
async fn differing_host(env: &TestEnv, timing: &Timing) -> RunningHost {
    let config = env.config(timing, &route(""));
    let differing = env
        .host(timing, &route("key = { subject_token = 2 }"), "differing")
        .await;
    wait_for(Duration::from_secs(30), "the route refused", || async {
        let why = refusals(env, &config, "lw").await;
        why.get("differing")
            .is_some_and(Option::is_some)
            .then_some(())
    })
    .await;
    differing
}

/// A host that serves route `lw` sweeps the marker and letters the message under the
/// contract's key `k1`.
async fn lettered_by_a_serving_host(env: &TestEnv, timing: &Timing, marker: &Marker) {
    let config = env.config(timing, &route(""));
    let kv = env.js.get_key_value(&config.claims.bucket).await.unwrap();
    let serving = env.host(timing, &route(""), "serving").await;
    wait_for(Duration::from_secs(60), "the marker swept", || async {
        kv.get(marker.key()).await.ok()?.is_none().then_some(())
    })
    .await;
    let dead = env.messages(&config.dead_letter.stream).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let header = |name: &str| dead[0].headers.get(name).map(|v| v.as_str().to_string());
    assert_eq!(header("Dedup-Route").as_deref(), Some("lw"));
    assert_eq!(
        header("Dedup-Key").as_deref(),
        Some("k1"),
        "the contract's key"
    );
    serving.shutdown().await.unwrap();
}

/// The advisory: the host that differs hears the server give the message up; it leaves a
/// marker and no letter. A host that serves the route then letters it under key `k1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_differs_from_the_contract_leaves_a_given_up_message_to_one_that_serves_it() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let (name, sequence) = given_up_message(&env, &timing).await;
    let config = env.config(&timing, &route(""));
    let differing = differing_host(&env, &timing).await;
    let origin = Origin {
        stream: &config.source.stream,
        sequence,
        consumer: &name,
    };
    let given_up = Marker::new(origin, 5, String::new());
    let kv = env.js.get_key_value(&config.claims.bucket).await.unwrap();
    // Sent again until handled: the host may not follow the advisories yet (handling one
    // twice is harmless).
    wait_for(Duration::from_secs(30), "the advisory handled", || async {
        advisory(&env, &given_up).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let marked = kv.get(given_up.key()).await.ok()?.is_some();
        (marked || letters(&env, &config).await > 0).then_some(())
    })
    .await;
    assert_eq!(
        letters(&env, &config).await,
        0,
        "a host that does not serve route lw lettered its message under its own key"
    );
    differing.shutdown().await.unwrap();
    lettered_by_a_serving_host(&env, &timing, &given_up).await;
}

/// The sweep: a marker already standing (the advisory's host died before lettering) is left
/// as it is by the host that differs, through a whole pass of its sweep (its stranded gauge
/// counts it), and lettered under key `k1` by a host that serves the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_differs_from_the_contract_leaves_a_standing_marker_to_one_that_serves_it() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let (name, sequence) = given_up_message(&env, &timing).await;
    let config = env.config(&timing, &route(""));
    let standing = env.mark_given_up(&name, sequence, 5).await;
    let differing = differing_host(&env, &timing).await;
    let left = wait_for(Duration::from_secs(60), "a sweep that left it", || async {
        let lettered = letters(&env, &config).await > 0;
        (lettered || differing.metrics().stranded() == 1).then_some(lettered)
    })
    .await;
    assert!(
        !left,
        "a host that does not serve route lw lettered its message under its own key"
    );
    let kv = env.js.get_key_value(&config.claims.bucket).await.unwrap();
    let left = kv.get(standing.key()).await.unwrap();
    let left: Marker = serde_json::from_slice(&left.expect("the marker stands")).unwrap();
    // Left as it was, not tried and failed (a failed letter is retried with a backoff and
    // would leave the gauge at 1 too).
    assert_eq!(
        (left.tries, left.error),
        (0, None),
        "the marker is left for a host that serves the route"
    );
    differing.shutdown().await.unwrap();
    lettered_by_a_serving_host(&env, &timing, &standing).await;
}
