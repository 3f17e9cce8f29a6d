//! Exactly-once effect under duplicates and competing hosts.

use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, OUTPUTS};

const UPPER_BY_HEADER: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
key = { header = "Idem-Key" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_with_duplicates_and_two_hosts_give_a_thousand_outputs() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let a = env.host(&timing, UPPER_BY_HEADER, "host-a").await;
    let b = env.host(&timing, UPPER_BY_HEADER, "host-b").await;

    const EVENTS: usize = 1000;
    let mut published = 0;
    for i in 0..EVENTS {
        let key = format!("key-{i}");
        let subject = format!("in.upper.e{i}");
        env.publish(
            &subject,
            &format!("msg-{i}"),
            &[("Idem-Key", &key)],
            format!("event {i}"),
        )
        .await;
        published += 1;
        if i % 10 < 3 {
            // 30 %: the same key again under a different message id (a producer retry).
            assert!(
                !env.publish(
                    &subject,
                    &format!("msg-{i}-again"),
                    &[("Idem-Key", &key)],
                    format!("event {i}")
                )
                .await
            );
            published += 1;
        }
    }
    assert_eq!(published, 1300);

    let outputs = wait_for(Duration::from_secs(60), "1000 outputs", || async {
        let n = env.messages(OUTPUTS).await.len();
        (n >= EVENTS).then_some(n)
    })
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    assert_eq!(outputs, EVENTS, "exactly one output per key");
    assert_eq!(
        env.messages(OUTPUTS).await.len(),
        EVENTS,
        "no late extra outputs"
    );

    for i in 0..EVENTS {
        let record = env
            .claim("upper", &format!("key-{i}"))
            .await
            .unwrap_or_else(|| panic!("no claim for key-{i}"));
        assert_eq!(record.state, ClaimState::Completed, "key-{i}: {record:?}");
    }
    let (sa, sb) = (a.shutdown().await.unwrap(), b.shutdown().await.unwrap());
    assert_eq!(sa.processed + sb.processed, EVENTS as u64);
    assert_eq!(
        sa.duplicates + sb.duplicates,
        300,
        "every second copy is a dedup hit: {sa:?} {sb:?}"
    );
    assert!(
        sa.processed > 0 && sb.processed > 0,
        "both hosts took part: {sa:?} {sb:?}"
    );
    // The cross-layer audit agrees.
    let config = env.config(&timing, UPPER_BY_HEADER);
    let report = dedup_host::ops::audit::run(&env.js, &config, None)
        .await
        .unwrap();
    assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
    assert_eq!(
        (report.messages, report.completed, report.duplicates),
        (1300, EVENTS as u64, 300)
    );
}

#[tokio::test]
async fn outputs_carry_deterministic_message_ids() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), UPPER_BY_HEADER, "h").await;
    env.publish("in.upper.x", "m1", &[("Idem-Key", "k1")], "abc")
        .await;
    let out = wait_for(Duration::from_secs(20), "output", || async {
        env.messages(OUTPUTS).await.pop()
    })
    .await;
    let id = out
        .headers
        .get("Nats-Msg-Id")
        .expect("output id")
        .to_string();
    assert_eq!(id, "upper.k.k1#0");
    assert_eq!(&out.payload[..], b"ABC");
    host.shutdown().await.unwrap();
}
