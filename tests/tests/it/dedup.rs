//! Exactly-once effect under duplicates and competing hosts.

use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, OUTPUTS};

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

/// A claim create is one round trip that a deleted key refuses (its deletion marker holds the
/// subject): the key must still be created over it, in both claim modes, or a key an operator
/// deleted to run it again would stay busy forever.
#[tokio::test]
async fn a_key_deleted_or_purged_from_the_claim_bucket_runs_again() {
    // The same route claimed after running (one create, no lease).
    let after = format!("{UPPER_BY_HEADER}claim = \"after\"\nlimits = {{ deadline = \"1s\" }}\n");
    for (routes, mode) in [(UPPER_BY_HEADER, "before"), (after.as_str(), "after")] {
        let env = TestEnv::start().await;
        let host = env.host(&Timing::default(), routes, "h").await;
        let kv = env.js.get_key_value(BUCKET).await.unwrap();
        let claim_key = dedup_host::claim::key::encode("upper", "k1");
        for (round, remove) in ["first", "delete", "purge"].into_iter().enumerate() {
            match remove {
                "delete" => kv.delete(&claim_key).await.unwrap(),
                "purge" => kv.purge(&claim_key).await.unwrap(),
                _ => {}
            }
            let id = format!("m-{round}");
            env.publish("in.upper.x", &id, &[("Idem-Key", "k1")], "abc")
                .await;
            wait_for(
                Duration::from_secs(20),
                &format!("{mode}: run {} of the key", round + 1),
                || async { (host.stats().processed == round as u64 + 1).then_some(()) },
            )
            .await;
            let record = env.claim("upper", "k1").await.expect("claim record");
            assert_eq!(record.state, ClaimState::Completed, "{mode}, {remove}");
        }
        let stats = host.shutdown().await.unwrap();
        assert_eq!((stats.processed, stats.busy), (3, 0), "{mode}: {stats:?}");
        // The re-runs' outputs carry the first run's message id: the window drops them.
        assert_eq!(env.messages(OUTPUTS).await.len(), 1, "{mode}");
    }
}

/// A new claim bucket keeps two records per key (completing a key then removes nothing); a
/// bucket an older host created with one record per key is still served the same way.
#[tokio::test]
async fn claim_buckets_with_two_or_one_records_per_key_both_serve() {
    for existing in [None, Some(1)] {
        let env = TestEnv::start().await;
        if let Some(history) = existing {
            let config = async_nats::jetstream::kv::Config {
                bucket: BUCKET.into(),
                history,
                ..Default::default()
            };
            env.js.create_key_value(config).await.unwrap();
        }
        let host = env.host(&Timing::default(), UPPER_BY_HEADER, "h").await;
        env.publish("in.upper.x", "m1", &[("Idem-Key", "k1")], "abc")
            .await;
        env.publish("in.upper.x", "m2", &[("Idem-Key", "k1")], "abc")
            .await;
        env.wait_completed("upper", &["k1"], Duration::from_secs(20))
            .await;
        env.wait_drained(Duration::from_secs(20)).await;
        assert_eq!(env.messages(OUTPUTS).await.len(), 1, "{existing:?}");
        let mut bucket = env.js.get_stream(format!("KV_{BUCKET}")).await.unwrap();
        let history = bucket.info().await.unwrap().config.max_messages_per_subject;
        assert_eq!(history, existing.unwrap_or(2));
        let stats = host.shutdown().await.unwrap();
        assert_eq!((stats.processed, stats.duplicates), (1, 1), "{existing:?}");
    }
}
