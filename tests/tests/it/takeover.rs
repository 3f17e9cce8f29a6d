//! Leases: a dead owner's claim is taken over, a stale owner's effects are dropped, and a live
//! owner's heartbeats keep long work from being redelivered.

use std::time::Duration;

use dedup_host::claim::{key, ClaimRecord, ClaimState};
use dedup_host_tests::harness::{
    signal, stop_gracefully, wait_for, TestEnv, Timing, BUCKET, OUTPUTS,
};

const SLEEPY: &str = r#"
[[routes]]
name = "sleepy"
subject = "in.sleepy.*"
component = "{guest:hostile}"
allowed_outputs = ["in.sleepy.*.done"]
"#;

async fn claimed_by(env: &TestEnv, key: &str, owner: &str) -> ClaimRecord {
    wait_for(
        Duration::from_secs(20),
        &format!("{owner} to claim {key}"),
        || async {
            env.claim("sleepy", key)
                .await
                .filter(|r| r.owner == owner && r.state == ClaimState::InProgress)
        },
    )
    .await
}

#[tokio::test]
async fn a_claim_left_by_a_dead_owner_is_taken_over_after_its_lease() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env.host(&timing, SLEEPY, "survivor").await;
    // A host that claimed the key and died: its lease runs for one more second.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let now = dedup_host::claim::record::now_ms();
    let ghost = ClaimRecord {
        state: ClaimState::InProgress,
        owner: "ghost".into(),
        nonce: 1,
        attempt: 1,
        lease_expires_ms: now + 1000,
        digest: "old".into(),
        effects_by: None,
        unknown_effects: false,
        outputs_as: None,
        calls_as: None,
        reason: None,
        permanent: false,
        retry_at_ms: None,
        fencing_token: None,
        source_sequence: None,
        outputs: Vec::new(),
        batch_outputs: None,
        created_ms: now,
        updated_ms: now,
    };
    kv.create(key::encode("sleepy", "k1"), ghost.to_bytes())
        .await
        .unwrap();
    env.publish("in.sleepy.x", "k1", &[], "hello").await;

    let out = wait_for(Duration::from_secs(20), "output", || async {
        env.messages(OUTPUTS).await.pop()
    })
    .await;
    assert_eq!(&out.payload[..], b"hello");
    let record = env.claim("sleepy", "k1").await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_str(), record.attempt),
        (ClaimState::Completed, "survivor", 2)
    );
    assert!(
        record.updated_ms >= ghost.lease_expires_ms,
        "not before the lease lapsed"
    );
    let stats = host.shutdown().await.unwrap();
    assert!(
        stats.busy >= 1,
        "the live lease was respected first: {stats:?}"
    );
    assert_eq!(env.messages(OUTPUTS).await.len(), 1);
}

#[tokio::test]
async fn a_killed_host_is_replaced_and_the_output_is_published_once() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let mut victim = env.host_process(&timing, SLEEPY, "victim").await;
    env.publish("in.sleepy.x", "k1", &[], "sleep:1500").await;
    claimed_by(&env, "k1", "victim").await;
    victim.kill().expect("kill -9");
    victim.wait().unwrap();

    let host = env.host(&timing, SLEEPY, "heir").await;
    let out = wait_for(Duration::from_secs(30), "output", || async {
        env.messages(OUTPUTS).await.pop()
    })
    .await;
    let record = env.claim("sleepy", "k1").await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_str(), record.attempt),
        (ClaimState::Completed, "heir", 2)
    );
    env.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(env.messages(OUTPUTS).await.len(), 1);
    assert!(String::from_utf8_lossy(&out.payload).starts_with("slept 1500 ms"));
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stale_owner_publishes_nothing_records_nothing_and_acks_nothing() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let stale = env.host_process(&timing, SLEEPY, "stale").await;
    env.publish("in.sleepy.x", "k1", &[], "sleep:1500").await;
    claimed_by(&env, "k1", "stale").await;
    // Freeze it mid-run, past its lease and the consumer's ack wait.
    signal(&stale, "-STOP");
    let host = env.host(&timing, SLEEPY, "fresh").await;
    let out = wait_for(
        Duration::from_secs(30),
        "the new owner's output",
        || async { env.messages(OUTPUTS).await.pop() },
    )
    .await;
    let record = env.claim("sleepy", "k1").await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_str()),
        (ClaimState::Completed, "fresh")
    );

    // Wake the stale owner: its guest finishes, but it has lost the claim.
    signal(&stale, "-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = stop_gracefully(stale);
    assert_eq!(stats.lost_claims, 1, "{stats:?}");
    assert_eq!(
        (stats.processed, stats.outputs_published),
        (0, 0),
        "{stats:?}"
    );
    let after = env.claim("sleepy", "k1").await.unwrap();
    assert_eq!(after, record, "the stale owner wrote nothing");
    let outputs = env.messages(OUTPUTS).await;
    assert_eq!(outputs.len(), 1);
    assert_eq!(
        outputs[0].payload, out.payload,
        "the one output is the new owner's"
    );
    env.wait_drained(Duration::from_secs(10)).await;
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn heartbeats_keep_work_longer_than_ack_wait_from_being_redelivered() {
    let env = TestEnv::start().await;
    let timing = Timing {
        ack_wait: "1s",
        heartbeat: "200ms",
        lease: "1s",
        ..Timing::default()
    };
    let host = env.host(&timing, SLEEPY, "h").await;
    env.publish("in.sleepy.x", "k1", &[], "sleep:3500").await;
    wait_for(Duration::from_secs(30), "output", || async {
        env.messages(OUTPUTS).await.pop()
    })
    .await;
    env.wait_drained(Duration::from_secs(10)).await;
    let record = env.claim("sleepy", "k1").await.unwrap();
    assert_eq!((record.state, record.attempt), (ClaimState::Completed, 1));
    let stats = host.shutdown().await.unwrap();
    assert_eq!(
        (stats.busy, stats.lost_claims, stats.processed),
        (0, 0, 1),
        "no redelivery reached the host: {stats:?}"
    );
}
