//! Attempts count guest outcomes only: an output stream that is missing (an outage) does not
//! use up a key's attempts, a failed key waits out its backoff however many copies arrive, and
//! a guest cannot ask for a retry later than the largest backoff.

use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD};

/// A route whose outputs go to `ORPHANS`, a stream the test creates and deletes.
const ORPHAN: &str = r#"
[[routes]]
name = "orphan"
subject = "in.orphan.*"
component = "{guest:hostile}"
allowed_outputs = ["orphan.>"]
"#;

const ROUTES: &str = r#"
[[routes]]
name = "keyed"
subject = "in.keyed.*"
component = "{guest:hostile}"
key = { header = "Key" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_uses_up_no_attempt() {
    let env = TestEnv::start().await;
    let timing = Timing {
        max_deliver: 2,
        backoff: r#"["100ms"]"#,
        ..Timing::default()
    };
    // A host refuses outputs that no stream captures, so `ORPHANS` is there at the start;
    // then it is lost (an outage): every publish of the output fails.
    env.js.create_stream(orphans()).await.unwrap();
    let host = env.host(&timing, ORPHAN, "h").await;
    env.js.delete_stream("ORPHANS").await.unwrap();
    env.publish("in.orphan.x", "o1", &[], "emit:orphan.x").await;
    wait_for(
        Duration::from_secs(20),
        "a few failed publishes",
        || async { (host.stats().errors >= 3).then_some(()) },
    )
    .await;
    let record = env.claim("orphan", "o1").await.unwrap();
    assert!(record.attempt <= 1 && !record.permanent, "{record:?}");
    assert!(env.messages(DEAD).await.is_empty(), "not dead-lettered");

    // The outage ends: the same attempt publishes.
    env.js.create_stream(orphans()).await.unwrap();
    let record = wait_for(Duration::from_secs(20), "completion", || async {
        env.claim("orphan", "o1")
            .await
            .filter(|r| r.state == ClaimState::Completed)
    })
    .await;
    assert_eq!(record.attempt, 1);
    assert_eq!(env.messages("ORPHANS").await.len(), 1);
    host.shutdown().await.unwrap();
}

/// The stream that captures route `orphan`'s outputs.
fn orphans() -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: "ORPHANS".into(),
        subjects: vec!["orphan.>".into()],
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_waits_out_its_backoff_whatever_copies_arrive() {
    let env = TestEnv::start().await;
    let timing = Timing {
        max_deliver: 5,
        backoff: r#"["3s"]"#,
        ..Timing::default()
    };
    let host = env.host(&timing, ROUTES, "h").await;
    // Five copies of one key, under different message ids, all failing.
    for i in 0..5 {
        env.publish(
            "in.keyed.x",
            &format!("copy-{i}"),
            &[("Key", "k")],
            "retry:0",
        )
        .await;
    }
    wait_for(Duration::from_secs(10), "the first attempt", || async {
        env.claim("keyed", "k")
            .await
            .filter(|r| r.state == ClaimState::Failed)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let record = env.claim("keyed", "k").await.unwrap();
    assert_eq!(
        record.attempt, 1,
        "no second run before the backoff: {record:?}"
    );
    let due = record
        .retry_at_ms
        .expect("the record says when the retry is due");
    assert!(due >= record.updated_ms + 2900, "{record:?}");
    wait_for(Duration::from_secs(20), "the second attempt", || async {
        env.claim("keyed", "k").await.filter(|r| r.attempt >= 2)
    })
    .await;
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_guest_asking_to_retry_in_an_hour_is_retried_after_the_largest_backoff() {
    let env = TestEnv::start().await;
    let timing = Timing {
        max_deliver: 3,
        backoff: r#"["100ms", "300ms"]"#,
        ..Timing::default()
    };
    let host = env.host(&timing, ROUTES, "h").await;
    env.publish("in.keyed.x", "later", &[("Key", "later")], "retry:3600000")
        .await;
    let record = wait_for(Duration::from_secs(20), "a second attempt", || async {
        env.claim("keyed", "later").await.filter(|r| r.attempt >= 2)
    })
    .await;
    let due = record.retry_at_ms.unwrap_or(0);
    assert!(
        due <= record.updated_ms + 300,
        "clamped to 300ms: {record:?}"
    );
    host.shutdown().await.unwrap();
}
