//! Faults at the seams the review found: an outage backs off instead of burning the server's
//! delivery bound, and an output the server can never store is the handler's fault, in both
//! effects modes.

use std::time::Duration;

use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS, UPPER_ROUTE};

/// Finding 4: a missing output stream used to be retried every second, so 100 s of outage
/// used up the server's delivery bound (100) and stranded the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_backs_off_exponentially_and_the_message_completes_after_it() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), UPPER_ROUTE, "outage").await;
    let mut outputs = env.js.get_stream(OUTPUTS).await.unwrap();
    let config = outputs.info().await.unwrap().config.clone();
    env.js.delete_stream(OUTPUTS).await.unwrap();
    env.publish("in.upper.a", "during-outage", &[], "abc").await;
    wait_for(
        Duration::from_secs(20),
        "the first refused publish",
        || async { (host.stats().errors >= 1).then_some(()) },
    )
    .await;
    // Delays of 1, 2, 4 and 8 s, each jittered down to half at most: five deliveries at most
    // in 12 s, where a fixed one-second retry makes about twelve. (A slower machine makes fewer.)
    tokio::time::sleep(Duration::from_secs(12)).await;
    let errors = host.stats().errors;
    assert!(errors <= 5, "{errors} deliveries in 12 s of outage");
    env.js.create_stream(config).await.unwrap();
    env.wait_completed("upper", &["during-outage"], Duration::from_secs(60))
        .await;
    let stored: Vec<_> = env.messages(OUTPUTS).await;
    assert_eq!(stored.len(), 1, "one output");
    assert_eq!(host.stats().retried, 0, "an outage uses up no attempt");
    host.shutdown().await.unwrap();
}

/// Finding 5: an output over the server's max payload was taken for an outage and retried
/// every second (leaving an abandoned partial batch each time on a fenced route). It is
/// checked output by output before anything is published, and dead-letters the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_over_the_servers_max_payload_is_dead_lettered_at_once() {
    for effects in ["window", "fenced"] {
        let mut env = TestEnv::start().await;
        env.fenced_outputs = effects == "fenced";
        let routes = format!(
            r#"
[[routes]]
name = "big"
subject = "in.big.*"
component = "{{guest:hostile}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.big.*.done"]
effects = "{effects}"
[routes.limits]
memory_bytes = 201326592
max_output_bytes = 134217728
"#
        );
        let host = env.host(&Timing::default(), &routes, "big").await;
        env.publish("in.big.a", "big-1", &[], "big-output").await;
        let letters = wait_for(Duration::from_secs(30), "the dead letter", || async {
            let letters = env.messages(DEAD).await;
            (!letters.is_empty()).then_some(letters)
        })
        .await;
        let reason = letters[0]
            .headers
            .get("Dedup-Reason")
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        assert!(
            reason.contains("over the server's max_payload"),
            "{effects}: {reason}"
        );
        assert_eq!(
            letters[0]
                .headers
                .get("Dedup-Claim-Key")
                .map(|v| v.as_str().to_string()),
            Some("big.k.a".to_string()),
            "{effects}"
        );
        let stats = host.stats();
        assert_eq!(
            (stats.retried, stats.errors),
            (0, 0),
            "{effects}: {stats:?}"
        );
        assert!(
            env.messages(OUTPUTS)
                .await
                .iter()
                .all(|m| !m.subject.starts_with("in.big.")),
            "{effects}: nothing published"
        );
        host.shutdown().await.unwrap();
    }
}
