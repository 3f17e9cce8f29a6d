//! Retries with backoff, rejections, exhausted attempts and bad input: each gets its outcome
//! and the host keeps processing.

use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::config::Config;
use dedup_host::pipeline::effects::headers;
use dedup_host::serve::RunningHost;
use dedup_host_tests::harness::{http_get, wait_for, TestEnv, Timing, DEAD, OUTPUTS};

const ROUTES: &str = r#"
[[routes]]
name = "flaky"
subject = "in.flaky.*"
component = "{guest:flaky}"
config = { succeed_on_attempt = "3" }
allowed_outputs = ["in.flaky.*.done"]

[[routes]]
name = "stubborn"
subject = "in.stubborn.*"
component = "{guest:flaky}"
config = { succeed_on_attempt = "100" }
allowed_outputs = ["in.stubborn.*.done"]

[[routes]]
name = "ledger"
subject = "in.ledger.*"
component = "{guest:ledger}"
key = { json_pointer = "/transaction_id" }
allowed_outputs = ["ledger.entries.>"]

[[routes]]
name = "small"
subject = "in.small.*"
component = "{guest:uppercase}"
max_payload_bytes = 16
allowed_outputs = ["in.small.*.done"]

[[routes]]
name = "seq"
subject = "in.seq.*"
component = "{guest:uppercase}"
missing_key = "stream_sequence"
allowed_outputs = ["in.seq.*.done"]
"#;

fn timing() -> Timing {
    Timing {
        backoff: r#"["300ms", "600ms"]"#,
        max_deliver: 3,
        ..Timing::default()
    }
}

async fn dead_letters(
    env: &TestEnv,
    n: usize,
) -> Vec<async_nats::jetstream::message::StreamMessage> {
    wait_for(Duration::from_secs(30), "dead letters", || async {
        let m = env.messages(DEAD).await;
        (m.len() >= n).then_some(m)
    })
    .await
}

fn header(m: &async_nats::jetstream::message::StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn flaky_succeeds_on_the_configured_attempt_after_backoff() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    env.publish("in.flaky.job", "f1", &[], "x").await;
    let out = wait_for(Duration::from_secs(30), "flaky output", || async {
        env.messages(OUTPUTS).await.pop()
    })
    .await;
    assert_eq!(&out.payload[..], b"succeeded on attempt 3");
    let record = env.claim("flaky", "f1").await.unwrap();
    assert_eq!((record.state, record.attempt), (ClaimState::Completed, 3));
    // Two naks with the configured backoff (300 ms, then 600 ms) lie between the attempts.
    assert!(record.updated_ms - record.created_ms >= 900, "{record:?}");
    env.wait_drained(Duration::from_secs(10)).await;
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.retried, stats.processed), (2, 1));
}

#[tokio::test]
async fn a_rejection_dead_letters_the_original_with_the_reason_and_terms_it() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    let body = r#"{"account":"acc 1","amount":5,"transaction_id":"tx-1"}"#;
    env.publish("in.ledger.adj", "l1", &[("Trace", "abc")], body)
        .await;
    let dl = dead_letters(&env, 1).await;
    assert_eq!(&dl[0].payload[..], body.as_bytes(), "the original payload");
    assert_eq!(header(&dl[0], "Trace"), "abc", "the original headers");
    assert!(header(&dl[0], headers::REASON).contains("malformed adjustment"));
    assert_eq!(header(&dl[0], headers::ATTEMPT), "1");
    assert_eq!(header(&dl[0], headers::SUBJECT), "in.ledger.adj");
    env.wait_drained(Duration::from_secs(10)).await;
    let record = env.claim("ledger", "tx-1").await.unwrap();
    assert_eq!((record.state, record.permanent), (ClaimState::Failed, true));
    // The same transaction again is not run again.
    env.publish("in.ledger.adj", "l1-again", &[], body).await;
    env.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(env.messages(DEAD).await.len(), 1);
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.dead_lettered, stats.duplicates), (1, 1));
}

#[tokio::test]
async fn exhausting_max_deliver_dead_letters() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    env.publish("in.stubborn.job", "s1", &[], "x").await;
    let dl = dead_letters(&env, 1).await;
    let reason = header(&dl[0], headers::REASON);
    assert!(reason.contains("attempt 3 of 3"), "{reason}");
    assert_eq!(header(&dl[0], headers::ATTEMPT), "3");
    env.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(env.claim("stubborn", "s1").await.unwrap().attempt, 3);
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1));
}

#[tokio::test]
async fn bad_input_gets_its_outcome_and_the_host_keeps_processing() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    // Missing key: the route takes Nats-Msg-Id, so publish without one (plain core publish).
    let client = env.server().connect().await;
    client
        .publish("in.small.nokey", "tiny".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    env.publish("in.nowhere.x", "n1", &[], "nobody routes this")
        .await;
    env.publish("in.small.big", "b1", &[], vec![b'x'; 17]).await;
    env.publish("in.ledger.adj", "j1", &[], "{ not json").await;
    // Missing key with the stream-sequence fallback is processed.
    client
        .publish("in.seq.nokey", "by sequence".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    // And a good message after all that.
    env.publish("in.small.ok", "ok1", &[], "fine").await;

    let dl = dead_letters(&env, 4).await;
    let reasons: Vec<String> = dl.iter().map(|m| header(m, headers::REASON)).collect();
    let has = |s: &str| reasons.iter().any(|r| r.contains(s));
    assert!(has("header `Nats-Msg-Id` is missing"), "{reasons:?}");
    assert!(has("no route for subject `in.nowhere.x`"), "{reasons:?}");
    assert!(
        has("exceeds route `small`'s max_payload_bytes of 16"),
        "{reasons:?}"
    );
    assert!(has("payload is not JSON"), "{reasons:?}");
    let outputs = wait_for(Duration::from_secs(20), "two outputs", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() >= 2).then_some(m)
    })
    .await;
    let payloads: Vec<&[u8]> = outputs.iter().map(|m| &m.payload[..]).collect();
    assert!(
        payloads.contains(&&b"BY SEQUENCE"[..]) && payloads.contains(&&b"FINE"[..]),
        "{payloads:?}"
    );
    env.wait_drained(Duration::from_secs(10)).await;
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.dead_lettered, stats.processed), (4, 2));
}

/// Finding 4 of issue 25: a message whose every delivery met an outage (here the dead-letter
/// stream is gone) must not be lost when the server stops delivering it. It stays in its
/// stream, `audit`, the gauge and `/readyz` report it, and once the dead-letter stream is back
/// the hosts' sweep stores its letter and the key ends failed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_that_cannot_be_stored_strands_the_message_until_it_can() {
    strand_and_recover(
        "stubborn",
        "in.stubborn.a",
        "",
        dedup_host_tests::harness::SOURCE,
    )
    .await;
}

/// The same through an exclusive route: a partition gives nothing up within any wait, so the
/// queued message is not stranded but kept in the route's queue, handed out again and again
/// past the source's delivery bound, and its copy is removed once the letter is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_that_cannot_be_dead_lettered_waits_in_its_queue_until_it_can() {
    let solo = r#"
[[routes]]
name = "solo"
subject = "in.solo.*"
component = "{guest:flaky}"
config = { succeed_on_attempt = "100" }
exclusive_by = { subject_token = 2 }
allowed_outputs = ["in.solo.*.done"]
"#;
    let (env, config, host) = without_dead_letters("in.solo.a", solo).await;
    let queue = env.js.get_stream("EVENTS_EXCLUSIVE").await.unwrap();
    let subject = dedup_host::exclusive::work_subject(&config, "solo", 16, "a");
    let partition = subject.rsplit('.').nth(1).unwrap().parse().unwrap();
    let name = dedup_host::exclusive::partition_consumer_name(&config, "solo", partition);
    let partition: async_nats::jetstream::consumer::PullConsumer = queue
        .get_consumer(&name)
        .await
        .unwrap_or_else(|e| panic!("partition `{name}`: {e}"));
    wait_for(
        Duration::from_secs(120),
        "the copy handed out past the source's bound",
        || async {
            let info = partition.clone().info().await.ok()?.clone();
            (info.delivered.consumer_sequence > 4 && info.num_ack_pending == 1).then_some(())
        },
    )
    .await;
    let last = queue.clone().info().await.unwrap().state.last_sequence;
    assert!(queue.get_raw_message(last).await.is_ok(), "the copy stays");
    recover(&env, &config, host, ("solo", "in.solo.a"), "none left").await;
}

/// A host serving `ROUTES` and `extra_routes`, one attempt a message and the server's bound 4,
/// and a message on `subject` published once the dead-letter stream is gone.
async fn without_dead_letters(subject: &str, extra_routes: &str) -> (TestEnv, Config, RunningHost) {
    let env = TestEnv::start().await;
    let timing = Timing {
        max_deliver: 1,
        ..Timing::default()
    };
    let mut config = env.config(&timing, &format!("{ROUTES}{extra_routes}"));
    config.source.server_max_deliver = 4;
    config.host.instance_id = Some("h".into());
    config.host.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    let host = dedup_host::serve::start(config.clone()).await.unwrap();
    env.js.delete_stream(DEAD).await.unwrap();
    env.publish(subject, "stuck", &[], "x").await;
    (env, config, host)
}

async fn strand_and_recover(route: &str, subject: &str, extra_routes: &str, held_in: &str) {
    let (env, config, host) = without_dead_letters(subject, extra_routes).await;
    let addr = host.metrics_addr().unwrap();

    let report = wait_for(
        Duration::from_secs(120),
        "a not_dead_lettered anomaly",
        || async {
            let r = dedup_host::ops::audit::run(&env.js, &config, None)
                .await
                .ok()?;
            r.anomalies
                .iter()
                .any(|a| a.class == "not_dead_lettered")
                .then_some(r)
        },
    )
    .await;
    let classes: Vec<_> = report.anomalies.iter().map(|a| a.class).collect();
    assert_eq!(
        classes,
        ["missing_stream", "not_dead_lettered"],
        "{:?}",
        report.anomalies
    );
    let detail = &report.anomalies[1].detail;
    assert!(
        detail.contains("delivered 4 times") && detail.contains(held_in),
        "{detail}"
    );
    wait_for(
        Duration::from_secs(60),
        "the stranded gauge at 1",
        || async { (host.metrics().stranded() == 1).then_some(()) },
    )
    .await;
    let (status, body) = http_get(addr, "/readyz").unwrap();
    assert_eq!(
        status, 200,
        "a stranded message does not make the host unready: {body}"
    );
    assert!(body.contains("not dead-lettered yet"), "{body}");
    let held = env.js.get_stream(held_in).await.unwrap();
    let last = held.clone().info().await.unwrap().state.last_sequence;
    assert!(
        held.get_raw_message(last).await.is_ok(),
        "the message stays in `{held_in}`"
    );

    recover(
        &env,
        &config,
        host,
        (route, subject),
        "gave up after 4 deliveries",
    )
    .await;
}

/// The operator brings the dead-letter stream back: the letter of `route`'s message on
/// `subject` is stored (its reason holding `reason`), the key ends failed for good, and a queued
/// copy leaves the queue.
async fn recover(
    env: &TestEnv,
    config: &Config,
    host: RunningHost,
    (route, subject): (&str, &str),
    reason: &str,
) {
    dedup_host::setup::ensure(&env.js, config).await.unwrap();
    let letters = wait_for(
        Duration::from_secs(120),
        "the stranded message's letter",
        || async {
            let m = env.messages(DEAD).await;
            (!m.is_empty()).then_some(m)
        },
    )
    .await;
    assert_eq!(letters.len(), 1);
    let stored = header(&letters[0], headers::REASON);
    assert!(stored.contains(reason), "{stored}");
    assert_eq!(header(&letters[0], headers::ROUTE), route);
    assert_eq!(header(&letters[0], headers::KEY), "stuck");
    assert_eq!(header(&letters[0], headers::SUBJECT), subject);
    let record = env.claim(route, "stuck").await.unwrap();
    assert_eq!(record.state, ClaimState::Failed);
    assert!(record.permanent, "{record:?}");
    let report = wait_for(Duration::from_secs(60), "a clean audit", || async {
        let r = dedup_host::ops::audit::run(&env.js, config, None)
            .await
            .ok()?;
        r.anomalies.is_empty().then_some(r)
    })
    .await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    wait_for(
        Duration::from_secs(60),
        "the stranded gauge at 0",
        || async { (host.metrics().stranded() == 0).then_some(()) },
    )
    .await;
    if let Ok(held) = env.js.get_stream("EVENTS_EXCLUSIVE").await {
        // The queue also keeps the copier's epoch on the route's order subject.
        let order = dedup_host::exclusive::order_subject(config, route);
        let state = held.clone().info().await.unwrap().state.clone();
        let mut copies = Vec::new();
        for sequence in state.first_sequence..=state.last_sequence {
            match held.get_raw_message(sequence).await {
                Ok(m) if m.subject.as_str() != order => copies.push(m.subject),
                _ => {}
            }
        }
        assert!(
            copies.is_empty(),
            "the dead-lettered copy left the queue: {copies:?}"
        );
    }
    host.shutdown().await.unwrap();
}
