//! An exclusive partition whose message the server gave up on (its partition consumer's
//! `max_deliver` spent) while the message's owner, paused with SIGSTOP, still holds a live
//! lease: the partition hands out the entity's next message, and that one must wait for the
//! lease (`dedup_delivery::ahead`, found by the simulation: `docs/src/how/simulation.md`)
//! instead of running beside the paused run once it resumes.

use std::process::Child;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::AckKind;
use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, OUTPUTS, SOURCE};
use futures::StreamExt;

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
async fn a_partition_waits_for_a_given_up_message_whose_paused_owner_still_holds_its_lease() {
    let env = TestEnv::start().await;
    // A long lease, so the paused owner's outlives the pause; an ack wait above the pull
    // requests' expiry (2 s), so once the owner is paused its open pulls end and every later
    // delivery goes to this test's fetches, then to the second host.
    let timing = Timing {
        lease: "15s",
        ack_wait: "2s",
        ..Timing::default()
    };
    let a = Killed(env.host_process(&timing, ROUTE, "ex-a").await);
    env.publish("in.ex.e1", "first", &[], "probe:4000").await;
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
    // Counted by the partition's consumer: the queue stream also holds the copier's epoch.
    let config = env.config(&timing, ROUTE);
    let name = dedup_host::exclusive::partition_consumer_name(&config, "ex", 0);
    let partition: PullConsumer = queue.get_consumer(&name).await.expect("the partition");
    wait_for(Duration::from_secs(60), "both messages queued", || async {
        let info = partition.clone().info().await.ok()?.clone();
        (info.num_pending + info.num_ack_pending as u64 == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the guest starts its run
    signal(&a.0, "-STOP");
    tokio::time::sleep(Duration::from_millis(2_500)).await; // a's open pulls end

    // The first message's deliveries are spent (as busy copies and outage naks would spend
    // them) until the server gives up on it, with a's lease still live.
    let bound = config.source.server_max_deliver as u64;
    let mut spent = 0;
    // The first copy's queue sequence (the copier's epoch comes before it in the stream).
    let mut first = None;
    while spent < bound {
        let mut batch = partition
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(3))
            .messages()
            .await
            .expect("fetch");
        let Some(message) = batch.next().await else {
            continue;
        };
        let message = message.expect("a delivery");
        let info = message.info().expect("delivery metadata");
        let sequence = *first.get_or_insert(info.stream_sequence);
        assert_eq!(
            info.stream_sequence, sequence,
            "only the first message is out"
        );
        spent = info.delivered as u64;
        message.ack_with(AckKind::Nak(None)).await.expect("nak");
    }

    // The partition now hands out the second message to b, while a's lease on the first
    // lives: b must not run it.
    let _b = Killed(env.host_process(&timing, ROUTE, "ex-b").await);
    wait_for(
        Duration::from_secs(60),
        "the second message delivered",
        || async {
            let mut partition = partition.clone();
            let delivered = partition.info().await.ok()?.delivered.stream_sequence;
            (delivered >= 2).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // what b does with it
    let first = env.claim("ex", "first").await.expect("first's record");
    assert_eq!(first.state, ClaimState::InProgress, "a's lease still holds");
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
}

/// A host process killed when the test ends, passing or not (a paused one too).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
