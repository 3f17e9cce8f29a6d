//! Holding a claim to the end: the heartbeat keeps the lease until the outcome is recorded
//! (not just until the guest returns), and a host that lost its claim neither records nor
//! naks: acks are keyed by stream sequence and would act on the new owner's delivery.

use std::time::Duration;

use dedup_host::claim::{key, ClaimRecord, ClaimState};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD, SOURCE};
use futures::StreamExt;

/// The source consumer's (redelivered, unacknowledged) counts, summed over its consumers.
async fn deliveries(env: &TestEnv) -> (u64, usize) {
    let stream = env.js.get_stream(SOURCE).await.unwrap();
    let mut infos = stream.consumers();
    let (mut redelivered, mut unacked) = (0, 0);
    while let Some(info) = infos.next().await {
        let info = info.unwrap();
        redelivered += info.num_redelivered as u64;
        unacked += info.num_ack_pending;
    }
    (redelivered, unacked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_kept_while_outputs_are_being_published() {
    let env = TestEnv::start().await;
    // Something answers nothing on the output subject: each publish waits out the client's
    // timeout (5 s), far past the 2 s lease.
    let client = env.server().connect().await;
    let _silent = client.subscribe("slow.>").await.unwrap();
    let routes = r#"
[[routes]]
name = "slow"
subject = "in.slow.*"
component = "{guest:hostile}"
allowed_outputs = ["slow.>"]
"#;
    let timing = Timing::default();
    // A host refuses outputs that no stream captures: `SLOW` is there at the start, then
    // gone, and only the silent subscriber is left on the output subject.
    let slow = async_nats::jetstream::stream::Config {
        name: "SLOW".into(),
        subjects: vec!["slow.>".into()],
        duplicate_window: Duration::from_secs(3600),
        ..Default::default()
    };
    env.js.create_stream(slow).await.unwrap();
    let a = env.host(&timing, routes, "a").await;
    let b = env.host(&timing, routes, "b").await;
    env.js.delete_stream("SLOW").await.unwrap();
    env.publish("in.slow.x", "k", &[], "emit:slow.x").await;
    let first = wait_for(Duration::from_secs(10), "the claim", || async {
        env.claim("slow", "k").await
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let now = env.claim("slow", "k").await.unwrap();
    assert_eq!(
        (now.owner.as_str(), now.attempt, now.state),
        (first.owner.as_str(), 1, ClaimState::InProgress),
        "the owner kept its lease through a slow publish: {now:?}"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_claim_was_taken_over_does_not_nak() {
    let env = TestEnv::start().await;
    // No heartbeat during the guest's one second: the takeover is found by the next write.
    let timing = Timing {
        lease: "7s",
        heartbeat: "2s",
        ack_wait: "7s",
        ..Timing::default()
    };
    let routes = r#"
[[routes]]
name = "late"
subject = "in.late.*"
component = "{guest:hostile}"
"#;
    let host = env.host(&timing, routes, "a").await;
    // The dead-letter stream is gone: the rejection's dead letter fails for now.
    env.js.delete_stream(DEAD).await.unwrap();
    env.publish("in.late.x", "k", &[], "sleep-reject:1000")
        .await;
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let claim_key = key::encode("late", "k");
    let (record, revision) = wait_for(Duration::from_secs(10), "the claim", || async {
        let entry = kv.entry(&claim_key).await.ok()??;
        Some((ClaimRecord::from_bytes(&entry.value).ok()?, entry.revision))
    })
    .await;
    // Another owner takes the key over while the guest runs.
    let thief = ClaimRecord {
        owner: "thief".into(),
        lease_expires_ms: dedup_host::claim::record::now_ms() + 60_000,
        ..record
    };
    kv.update(&claim_key, thief.to_bytes(), revision)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (redelivered, unacked) = deliveries(&env).await;
    assert_eq!(
        (redelivered, unacked),
        (0, 1),
        "no nak from the stale owner: the delivery waits for its ack wait"
    );
    let now = env.claim("late", "k").await.unwrap();
    assert_eq!(now.owner, "thief", "nothing recorded over the new owner");
    host.shutdown().await.unwrap();
}
