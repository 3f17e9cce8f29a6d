//! Acks after the record (issue 30, DESIGN.md rule 7): the final ack is a plain ack, and one
//! lost on the way costs exactly one redelivery, which the claim answers without running the
//! guest, in every mode that records an outcome: claim before, claim after, fenced effects.

use std::sync::Arc;
use std::time::Duration;

use dedup_host_tests::harness::{wait_for, TestEnv, Timing};
use dedup_host_tests::proxy::DroppingProxy;

/// A route of the `flaky` guest (one output per event, succeeding at once) with `extra` set.
fn route(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "acks"
subject = "in.acks.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.acks.*.done"]
config = {{ succeed_on_attempt = "1", outputs = "1" }}
limits = {{ deadline = "1s" }}
{extra}
"#
    )
}

/// Runs one message through a host whose first plain ack is dropped on the way to the
/// server, and checks that its guest ran once and the redelivery was acked without it.
async fn a_lost_ack_costs_one_redelivery(mut env: TestEnv, fenced: bool, extra: &str) {
    env.fenced_outputs = fenced;
    let upstream = env.server().url().trim_start_matches("nats://").to_string();
    // Only the route's consumer: the consumer of unrouted subjects also sees `in.acks.*`
    // (the routes do not cover `in.*.*` whole) and acks it there.
    let is_ack = |subject: &str, payload: &[u8]| {
        subject.starts_with("$JS.ACK.EVENTS.hosts-acks.") && payload == b"+ACK"
    };
    let proxy = DroppingProxy::start(upstream, 1, Arc::new(is_ack)).await;
    let mut config = env.config(&Timing::default(), &route(extra));
    config.nats.urls = vec![proxy.url.clone()];
    config.host.instance_id = Some("lossy".into());
    let host = dedup_host::serve::start(config).await.expect("host starts");

    env.publish("in.acks.k1", "k1", &[], "x").await;
    wait_for(Duration::from_secs(30), "the ack dropped", || async {
        (proxy.dropped() == 1).then_some(())
    })
    .await;
    // The server redelivers after the ack wait (2 s); the claim finds the key settled.
    env.wait_drained(Duration::from_secs(60)).await;
    let stats = host.shutdown().await.unwrap();
    assert_eq!(
        (stats.processed, stats.duplicates),
        (1, 1),
        "one run, one redelivery acked without running: {stats:?}"
    );
    let outputs = env.outputs().await;
    assert_eq!(outputs.len(), 1, "one output set");
    assert_eq!(proxy.dropped(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_plain_ack_costs_one_redelivery_that_does_not_run_the_guest() {
    a_lost_ack_costs_one_redelivery(TestEnv::start().await, false, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_plain_ack_on_a_claim_after_route_costs_one_redelivery() {
    a_lost_ack_costs_one_redelivery(TestEnv::start().await, false, "claim = \"after\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_plain_ack_on_a_fenced_route_costs_one_redelivery() {
    a_lost_ack_costs_one_redelivery(TestEnv::start().await, true, "effects = \"fenced\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_ack_is_acked_once_with_nothing_redelivered() {
    let env = TestEnv::start().await;
    let host = env
        .host(
            &Timing::default(),
            &route("ack = \"confirmed\""),
            "confirming",
        )
        .await;
    for i in 0..20 {
        env.publish(&format!("in.acks.k{i}"), &format!("k{i}"), &[], "x")
            .await;
    }
    env.wait_drained(Duration::from_secs(60)).await;
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.processed, stats.duplicates), (20, 0), "{stats:?}");
    assert_eq!(env.outputs().await.len(), 20);
}
