//! Claim-after routes (`claim = "after"`): run first, publish the outputs, then create the key
//! completed. The promises for effects are claim-before's: one output per key through
//! repeated keys, killed hosts and stale owners (the output stream's window drops a racing
//! run's copy), with one claim write per message instead of a lease and heartbeats.

use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{signal, stop_gracefully, TestEnv, Timing, OUTPUTS};

const ROUTE: &str = r#"
[[routes]]
name = "after"
subject = "in.after.*"
component = "{guest:hostile}"
key = { subject_token = 2 }
allowed_outputs = ["in.after.*.done"]
claim = "after"
limits = { deadline = "1800ms" }
"#;

#[tokio::test]
async fn a_repeated_key_runs_once_and_the_key_is_created_completed_in_one_write() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env.host(&timing, ROUTE, "after-1").await;
    env.publish("in.after.k1", "first", &[], "hello").await;
    env.wait_completed("after", &["k1"], Duration::from_secs(20))
        .await;
    // The same key under another message id: the stream keeps both, the record skips it.
    env.publish("in.after.k1", "second", &[], "hello").await;
    env.wait_drained(Duration::from_secs(20)).await;
    let record = env.claim("after", "k1").await.unwrap();
    assert_eq!((record.state, record.attempt), (ClaimState::Completed, 1));
    assert_eq!(record.lease_expires_ms, 0, "no lease was ever taken");
    assert_eq!(env.messages(OUTPUTS).await.len(), 1, "one output");
    let stats = host.stats();
    assert_eq!((stats.processed, stats.duplicates), (1, 1), "{stats:?}");
    // Only the create: no in-progress record was ever written (revision 1 of a fresh bucket).
    let kv = env.js.get_key_value("claims").await.unwrap();
    let entry = kv
        .entry(dedup_host::claim::key::encode("after", "k1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.revision, 1, "one claim write per message");
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_killed_host_is_replaced_and_the_output_is_published_once() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let mut victim = env.host_process(&timing, ROUTE, "victim").await;
    env.publish("in.after.k2", "k2", &[], "sleep:1500").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    victim.kill().expect("kill -9");
    let _ = victim.wait();
    let host = env.host(&timing, ROUTE, "heir").await;
    env.wait_completed("after", &["k2"], Duration::from_secs(30))
        .await;
    env.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(env.claim("after", "k2").await.unwrap().owner, "heir");
    assert_eq!(env.messages(OUTPUTS).await.len(), 1);
    host.shutdown().await.unwrap();
}

/// Two runs of one key at the same time (two publishes of it, run side by side): both publish
/// the same output id, the stream keeps one copy, and the run that loses the create acks
/// its delivery as a duplicate.
#[tokio::test]
async fn two_runs_at_once_publish_one_output_and_one_create_wins() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env.host(&timing, ROUTE, "racer").await;
    env.publish("in.after.k4", "one", &[], "sleep:300").await;
    env.publish("in.after.k4", "two", &[], "sleep:300").await;
    env.wait_completed("after", &["k4"], Duration::from_secs(20))
        .await;
    env.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(env.messages(OUTPUTS).await.len(), 1, "one output");
    let stats = host.stats();
    assert_eq!((stats.processed, stats.duplicates), (1, 1), "{stats:?}");
    let text = host.metrics().encode();
    let output_hits = text
        .lines()
        .find(|l| {
            l.starts_with("dedup_hits_total{route=\"after\"") && l.contains("layer=\"output\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(
        output_hits,
        Some(1),
        "the second run's output was a stream duplicate"
    );
    host.shutdown().await.unwrap();
}

/// A host frozen mid-run past the ack wait: another host runs and completes the key; the
/// resumed host stores no second output and no record (its guest's wall-clock deadline has
/// passed, or its create loses).
#[tokio::test]
async fn a_stale_run_loses_the_create_and_its_output_copy_is_dropped() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let stale = env.host_process(&timing, ROUTE, "stale").await;
    env.publish("in.after.k3", "k3", &[], "sleep:1500").await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Frozen mid-run, past the ack wait: the message is delivered again, to a fresh host.
    signal(&stale, "-STOP");
    let host = env.host(&timing, ROUTE, "fresh").await;
    env.wait_completed("after", &["k3"], Duration::from_secs(30))
        .await;
    let record = env.claim("after", "k3").await.unwrap();
    assert_eq!(record.owner, "fresh");
    signal(&stale, "-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = stop_gracefully(stale);
    assert_eq!(stats.processed, 0, "{stats:?}");
    assert_eq!(
        env.claim("after", "k3").await.unwrap(),
        record,
        "the record is the fresh host's"
    );
    assert_eq!(
        env.messages(OUTPUTS).await.len(),
        1,
        "the stale copy was dropped by the window"
    );
    env.wait_drained(Duration::from_secs(10)).await;
    host.shutdown().await.unwrap();
}
