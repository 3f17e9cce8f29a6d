//! An exclusive partition hands out a window of messages and never gives one up: while an
//! entity's message runs on a host paused with SIGSTOP, the entity's next message, handed out
//! again to a second host once its ack wait ran out in the paused one, must wait for the first
//! to leave the queue (`dedup_delivery::ahead`) instead of running beside it. Waiting, it is
//! handed out more often than the source's delivery bound, and is never taken for a message
//! at its last delivery (no stranded marker is written for it).

use std::process::Child;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, BUCKET, OUTPUTS, SOURCE};

const ROUTE: &str = r#"
[[routes]]
name = "ex"
subject = "in.ex.*"
component = "{guest:hostile}"
exclusive_by = { subject_token = 2 }
partitions = 1
allowed_outputs = ["in.ex.*.done"]
"#;

/// A run as the probe guest reported it: its key and when it ran (µs).
fn runs(outputs: &[async_nats::jetstream::message::StreamMessage]) -> Vec<(String, u64, u64)> {
    let mut runs: Vec<(String, u64, u64)> = outputs
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("a probe report");
            let key = v["key"].as_str().expect("key").to_string();
            (
                key,
                v["start"].as_u64().unwrap(),
                v["end"].as_u64().unwrap(),
            )
        })
        .collect();
    runs.sort_by_key(|r| r.1);
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entitys_next_message_waits_for_one_running_on_a_paused_host_and_never_runs_beside_it() {
    let env = TestEnv::start().await;
    // A long lease, so the paused owner's outlives the pause; a short ack wait, so the
    // messages it holds are handed out again to the second host meanwhile; a low delivery
    // bound on the source, which the waiting message passes.
    let timing = Timing {
        lease: "15s",
        ack_wait: "2s",
        max_deliver: 1,
        server_max_deliver: 4,
        ..Timing::default()
    };
    let a = Killed(env.host_process(&timing, ROUTE, "ex-a").await);
    // Long enough for the second to be handed out past the source's bound while it waits.
    env.publish("in.ex.e1", "first", &[], "probe:12000").await;
    env.publish("in.ex.e1", "second", &[], "probe:10").await;
    wait_for(
        Duration::from_secs(60),
        "the first run under a's lease",
        || async {
            let r = env.claim("ex", "first").await?;
            (r.state == ClaimState::InProgress).then_some(())
        },
    )
    .await;
    let queue = env
        .js
        .get_stream(format!("{SOURCE}_EXCLUSIVE"))
        .await
        .expect("the exclusive queue");
    let config = env.config(&timing, ROUTE);
    let name = dedup_host::exclusive::partition_consumer_name(&config, "ex", 0);
    let mut partition: PullConsumer = queue.get_consumer(&name).await.expect("the partition");
    let info = partition
        .info()
        .await
        .expect("the partition's info")
        .clone();
    let bound = dedup_host::exclusive::PARTITION_MAX_DELIVER;
    assert_eq!(
        info.config.max_deliver, bound,
        "a partition gives up only far past any wait"
    );
    let window = dedup_host::exclusive::PARTITION_WINDOW;
    assert_eq!(info.config.max_ack_pending, window);
    wait_for(Duration::from_secs(60), "both messages out", || async {
        let info = partition.clone().info().await.ok()?.clone();
        (info.num_ack_pending == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the guest starts its run
    signal(&a.0, "-STOP");

    // Both messages' ack waits run out in the paused host: b is handed both, finds the first
    // busy under a's lease and the second behind it.
    let _b = Killed(env.host_process(&timing, ROUTE, "ex-b").await);
    wait_for(
        Duration::from_secs(60),
        "both messages handed out again",
        || async {
            let info = partition.clone().info().await.ok()?.clone();
            (info.num_redelivered >= 2).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // what b does with them
    let first = env.claim("ex", "first").await.expect("first's record");
    assert_eq!(first.state, ClaimState::InProgress, "a's lease still holds");
    assert!(
        env.claim("ex", "second").await.is_none(),
        "the second message was claimed while the first ran"
    );
    signal(&a.0, "-CONT");

    env.wait_completed("ex", &["first", "second"], Duration::from_secs(120))
        .await;
    let runs = runs(&env.messages(OUTPUTS).await);
    assert_eq!(runs.len(), 2, "one run each: {runs:?}");
    assert_eq!(
        (runs[0].0.as_str(), runs[1].0.as_str()),
        ("first", "second"),
        "in publish order: {runs:?}"
    );
    assert!(
        runs[0].2 <= runs[1].1,
        "the second ran while the first still ran: {runs:?}"
    );
    let delivered = partition.info().await.expect("the partition's info");
    assert!(
        delivered.delivered.consumer_sequence >= 2 + 4,
        "the second message was handed out past the source's bound: {delivered:?}"
    );
    // A marker would let the sweep dead-letter a message that waits its turn.
    let claims = env.js.get_stream(format!("KV_{BUCKET}")).await.unwrap();
    let markers = format!("$KV.{BUCKET}.{}.>", dedup_host::stranded::PREFIX);
    let mut markers = claims.info_with_subjects(markers).await.unwrap();
    let marked = futures::StreamExt::next(&mut markers).await;
    assert!(
        marked.is_none(),
        "a waiting queued message was marked: {marked:?}"
    );
}

/// A host process killed when the test ends, passing or not (a paused one too).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
