//! `inspect` costs the same whatever the size of the store: every claim record names the
//! source message whose run wrote it (claim before, claim after, and an exclusive route's
//! original rather than its queue copy), and the story reads those by sequence plus the
//! messages still waiting for the route, never the route's whole settled history.

use std::time::Duration;

use dedup_host::ops::story::{tell, Story, Target};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing};

/// One key `k` on a claim-before, a claim-after and an exclusive route.
const ROUTES: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
key = { header = "Idem-Key" }

[[routes]]
name = "later"
subject = "in.later.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.later.*.done"]
key = { header = "Idem-Key" }
claim = "after"
limits = { deadline = "1800ms" }

[[routes]]
name = "ex"
subject = "in.ex.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.ex.*.done"]
key = { header = "Idem-Key" }
exclusive_by = { subject_token = 2 }
"#;

async fn story(env: &TestEnv, route: &str, target: Target) -> Story {
    let config = env.config(&Timing::default(), ROUTES);
    tell(&env.js, &config, route, target)
        .await
        .unwrap_or_else(|e| panic!("inspect {route}: {e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_the_message_a_record_names_and_those_waiting_not_settled_repeats() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), ROUTES, "told").await;
    let k = [("Idem-Key", "k")];
    env.publish("in.upper.a", "m1", &k, "one").await; // source sequence 1
    env.publish("in.later.a", "m2", &k, "two").await; // 2
    env.publish("in.ex.a", "m3", &k, "three").await; // 3 (its queue copy has its own)
    for route in ["upper", "later", "ex"] {
        env.wait_completed(route, &["k"], Duration::from_secs(30))
            .await;
    }
    for (route, sequence) in [("upper", 1), ("later", 2), ("ex", 3)] {
        let record = env.claim(route, "k").await.unwrap();
        assert_eq!(
            record.source_sequence,
            Some(sequence),
            "route `{route}`: the record names the source message that ran: {record:?}"
        );
    }
    // A repeat of the settled key (sequence 4), acknowledged as a duplicate.
    env.publish("in.upper.a", "m4", &k, "again").await;
    wait_for(
        Duration::from_secs(30),
        "the repeat acknowledged",
        || async { (env.pending().await == (0, 0)).then_some(()) },
    )
    .await;
    host.shutdown().await.unwrap();
    // With no host serving, these wait for the route: 5 repeats `k`, 6 carries a new key.
    env.publish("in.upper.a", "m5", &k, "waiting").await;
    env.publish("in.upper.b", "m6", &[("Idem-Key", "w")], "new")
        .await;

    let upper = story(&env, "upper", Target::Key("k".into())).await;
    assert!(upper.verdict.starts_with("completed"), "{upper:?}");
    assert_eq!(
        upper.source_sequences,
        vec![1, 5],
        "the message that ran and the one waiting; the settled repeat is not read"
    );
    let asked = story(&env, "upper", Target::Sequence(4)).await;
    assert_eq!(asked.key, "k");
    assert_eq!(asked.source_sequences, vec![1, 4, 5]);
    let later = story(&env, "later", Target::Key("k".into())).await;
    assert_eq!(later.source_sequences, vec![2]);
    let ex = story(&env, "ex", Target::Key("k".into())).await;
    assert_eq!(ex.source_sequences, vec![3]);
    let waiting = story(&env, "upper", Target::Key("w".into())).await;
    assert!(
        waiting.verdict.starts_with("not claimed yet"),
        "{waiting:?}"
    );
    assert_eq!(waiting.source_sequences, vec![6]);
}
