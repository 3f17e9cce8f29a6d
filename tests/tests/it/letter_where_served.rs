//! A given-up message is dead-lettered under its route's contract (its key, claim mode and
//! effects), so only by a host that serves the route: a host whose config differs from the
//! contract (a change not applied yet, hosts of mixed configs during a rollout) leaves it
//! to one that does, rather than lettering it under its own config's key.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use dedup_host::consumers::route_consumer_name;
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

/// Route `lw`'s key `k1` on `in.lw.x` is given up (its delivery acked here, so no host runs
/// it, and the server's advisory sent by hand). A host whose config keys the route by
/// subject token, against its contract's `Nats-Msg-Id`, hears the advisory: it leaves a
/// marker and no letter. A host that serves the route then letters it under key `k1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_differs_from_the_contract_leaves_a_given_up_message_to_one_that_serves_it() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    // The first host records the route's contract (keyed by `Nats-Msg-Id`).
    let serving = env.host(&timing, &route(""), "serving").await;
    serving.shutdown().await.unwrap();
    let config = env.config(&timing, &route(""));

    env.publish("in.lw.x", "k1", &[], "spin-sleep:0:0").await;
    let source = env.js.get_stream(&config.source.stream).await.unwrap();
    let name = route_consumer_name(&config, "lw");
    let consumer: PullConsumer = source.get_consumer(&name).await.unwrap();
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let message = batch.next().await.expect("the message").unwrap();
    let sequence = message.info().unwrap().stream_sequence;
    message.double_ack().await.unwrap();

    let differing = env
        .host(&timing, &route("key = { subject_token = 2 }"), "differing")
        .await;
    wait_for(Duration::from_secs(30), "the route refused", || async {
        let why = refusals(&env, &config, "lw").await;
        why.get("differing")
            .is_some_and(Option::is_some)
            .then_some(())
    })
    .await;
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

    let serving = env.host(&timing, &route(""), "serving").await;
    wait_for(Duration::from_secs(60), "the marker swept", || async {
        kv.get(given_up.key()).await.ok()?.is_none().then_some(())
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
