//! The sandbox boundary and dead letters: guest outputs that could hurt NATS or panic the host
//! are refused whole, dead letters always land (or the message ends with the reason recorded),
//! and a key's backoff holds however many copies of it arrive.

use std::process::Command;
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use dedup_host::claim::ClaimState;
use dedup_host::pipeline::effects::headers;
use dedup_host_tests::guests::host_binary;
use dedup_host_tests::harness::{
    publish_unparseable, wait_for, TestEnv, Timing, DEAD, DEAD_SUBJECT, OUTPUTS, UPPER_ROUTE,
};

const ROUTES: &str = r#"
[[routes]]
name = "emit"
subject = "in.emit.*"
component = "{guest:hostile}"
allowed_outputs = ["out.>"]
max_payload_bytes = 2_000_000
"#;

fn timing() -> Timing {
    Timing {
        max_deliver: 2,
        ..Timing::default()
    }
}

fn header(m: &StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// The payload that makes the hostile guest return exactly these outputs.
fn emit(outputs: &[(&str, &[(&str, &str)])]) -> String {
    let records: Vec<String> = outputs
        .iter()
        .map(|(subject, headers)| {
            let mut fields = vec![subject.to_string()];
            for (n, v) in *headers {
                fields.push(n.to_string());
                fields.push(v.to_string());
            }
            fields.join("\u{1f}")
        })
        .collect();
    format!("emit:{}", records.join("\u{1e}"))
}

async fn dead_letter(env: &TestEnv, key: &str) -> StreamMessage {
    wait_for(
        Duration::from_secs(30),
        &format!("the dead letter of `{key}`"),
        || async {
            env.messages(DEAD)
                .await
                .into_iter()
                .find(|m| header(m, headers::KEY) == key)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_that_could_hurt_nats_are_refused_whole_and_nothing_is_published() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    let cases: Vec<(String, &str)> = vec![
        (emit(&[("out.a", &[("Bad Name", "v")])]), "output 0: header name"),
        (emit(&[("out.a", &[("Bad:Name", "v")])]), "output 0: header name"),
        (emit(&[("out.a", &[("Bäd", "v")])]), "output 0: header name"),
        (emit(&[("out.a", &[("X", "a\r\nPUB x 1")])]), "line breaks"),
        (emit(&[("out.a", &[("Nats-Rollup", "all")])]), "JetStream control header"),
        (emit(&[("out.a", &[("nats-ttl", "1s")])]), "JetStream control header"),
        (emit(&[("out.a", &[("NATS-Expected-Stream", "NOPE")])]), "JetStream control header"),
        (emit(&[("out.a", &[("Nats-Msg-Id", "forged")])]), "JetStream control header"),
        (emit(&[("out.*", &[])]), "wildcard"),
        (emit(&[("out.>", &[])]), "wildcard"),
        (emit(&[("", &[])]), "is empty"),
        (emit(&[("out.a b", &[])]), "whitespace"),
        // All or nothing: a good first output is not published when a later one is refused.
        (emit(&[("out.fine", &[]), ("$JS.API.STREAM.DELETE.OUTPUTS", &[])]), "output 1: subject `$JS.API.STREAM.DELETE.OUTPUTS` is in the server's reserved `$JS.` namespace"),
        (emit(&[("out.fine", &[]), ("_INBOX.x", &[])]), "output 1"),
    ];
    env.publish(
        "in.emit.keep",
        "keep",
        &[],
        emit(&[("out.keep", &[("X-Ok", "yes")])]),
    )
    .await;
    for (i, (payload, _)) in cases.iter().enumerate() {
        env.publish("in.emit.x", &format!("case-{i}"), &[], payload.clone())
            .await;
    }
    for (i, (payload, reason)) in cases.iter().enumerate() {
        let key = format!("case-{i}");
        let letter = dead_letter(&env, &key).await;
        let shown = header(&letter, headers::REASON);
        assert!(
            shown.contains("forbidden output") && shown.contains(reason),
            "{payload:?}: reason `{shown}` lacks `{reason}`"
        );
        let record = env.claim("emit", &key).await.unwrap();
        assert_eq!(
            (record.state, record.permanent, record.attempt),
            (ClaimState::Failed, true, 1),
            "{payload:?}: forbidden outputs are permanent"
        );
    }
    env.wait_drained(Duration::from_secs(20)).await;
    let outputs = env.messages(OUTPUTS).await;
    let subjects: Vec<&str> = outputs.iter().map(|m| &*m.subject).collect();
    assert_eq!(subjects, ["out.keep"], "only the good message published");
    assert_eq!(header(&outputs[0], "X-Ok"), "yes");
    assert!(env.js.get_stream(OUTPUTS).await.is_ok(), "not deleted");
    let stats = host.shutdown().await.unwrap();
    assert_eq!(stats.dead_lettered, cases.len() as u64);
}

#[tokio::test]
async fn guest_reasons_are_bounded() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    env.publish("in.emit.x", "long", &[], "reject:50000").await;
    let letter = dead_letter(&env, "long").await;
    let reason = header(&letter, headers::REASON);
    assert!(reason.len() <= 1100, "{} bytes", reason.len());
    assert!(!reason.contains('\n'));
    let record = env.claim("emit", "long").await.unwrap();
    let stored = record.reason.unwrap();
    assert!(stored.len() <= 1100, "{} bytes stored", stored.len());
    assert!(stored.contains("(50000 bytes in all)"), "{stored}");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_drop_control_headers_and_fit_the_max_payload() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), ROUTES, "h").await;
    // Accepted by the source stream (its name is EVENTS), refused by any other stream.
    env.publish(
        "in.emit.x",
        "expects",
        &[("Nats-Expected-Stream", "EVENTS"), ("Trace", "t1")],
        "reject:10",
    )
    .await;
    let letter = dead_letter(&env, "expects").await;
    assert_eq!(
        header(&letter, "Dedup-Original-Nats-Expected-Stream"),
        "EVENTS"
    );
    assert_eq!(header(&letter, "Trace"), "t1", "other headers are kept");
    assert!(letter.headers.get("Nats-Expected-Stream").is_none());

    // The original plus the host's headers is more than the server takes in one message.
    let max = env.js.client().server_info().max_payload;
    let big = format!("reject:{}", "x".repeat(max - 200));
    env.publish("in.emit.big", "big", &[], big.clone()).await;
    let letter = dead_letter(&env, "big").await;
    assert_eq!(header(&letter, headers::TRUNCATED), big.len().to_string());
    assert!(letter.payload.len() < big.len());
    assert!(big.as_bytes().starts_with(&letter.payload));
    let sequence: u64 = header(&letter, headers::SEQUENCE).parse().unwrap();
    let whole = env
        .js
        .get_stream("EVENTS")
        .await
        .unwrap()
        .get_raw_message(sequence)
        .await
        .unwrap();
    assert_eq!(
        whole.payload.len(),
        big.len(),
        "the pointer finds the whole"
    );
    env.wait_drained(Duration::from_secs(20)).await;
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_dead_letter_refused_for_good_ends_the_message_with_the_reason_recorded() {
    let env = TestEnv::start().await;
    // An operator's dead-letter stream that takes only tiny messages.
    env.js
        .create_stream(async_nats::jetstream::stream::Config {
            name: DEAD.into(),
            subjects: vec![DEAD_SUBJECT.into()],
            duplicate_window: Duration::from_secs(600),
            max_message_size: 64,
            ..Default::default()
        })
        .await
        .unwrap();
    let host = env.host(&timing(), ROUTES, "h").await;
    env.publish("in.emit.x", "nowhere", &[], "reject:10").await;
    let record = wait_for(Duration::from_secs(30), "the permanent failure", || async {
        env.claim("emit", "nowhere").await.filter(|r| r.permanent)
    })
    .await;
    let reason = record.reason.unwrap();
    assert!(reason.contains("not dead-lettered"), "{reason}");
    env.wait_drained(Duration::from_secs(20)).await;
    assert!(env.messages(DEAD).await.is_empty());
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn publish_refuses_a_bad_header_with_a_clear_error() {
    let out = Command::new(host_binary())
        .args([
            "publish",
            "--server",
            "nats://127.0.0.1:1",
            "--subject",
            "a.b",
            "--key",
            "k",
            "--payload",
            "x",
            "--header",
            "Bad Name=v",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an error, not a panic (101): {stderr}"
    );
    assert!(stderr.contains("Bad Name"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_client_cannot_parse_ends_as_a_dead_letter() {
    let env = TestEnv::start().await;
    let mut config = env.config(&timing(), UPPER_ROUTE);
    config.source.server_max_deliver = 3;
    config.host.instance_id = Some("h".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    env.publish("in.upper.first", "first", &[], "a").await;
    publish_unparseable(env.server().port(), "in.upper.poison");
    let letter = wait_for(
        Duration::from_secs(60),
        "the poison's dead letter",
        || async { env.messages(DEAD).await.pop() },
    )
    .await;
    assert_eq!(&letter.payload[..], b"poison");
    assert_eq!(header(&letter, headers::SUBJECT), "in.upper.poison");
    // Delivered (the vendored async-nats keeps the connection) and dead-lettered at once,
    // long before the server's max deliver (`edges_headers` checks it in full).
    assert!(
        header(&letter, headers::REASON).contains("header isn't valid utf-8"),
        "{:?}",
        letter.headers
    );
    assert!(
        !header(&letter, headers::RAW_HEADERS).is_empty(),
        "the raw header block is kept, base64"
    );
    // The host is still serving.
    env.publish("in.upper.after", "after", &[], "b").await;
    wait_for(Duration::from_secs(30), "both good outputs", || async {
        (env.messages(OUTPUTS).await.len() == 2).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_corrupt_claim_record_dead_letters_instead_of_looping() {
    let env = TestEnv::start().await;
    let host = env.host(&timing(), UPPER_ROUTE, "h").await;
    let kv = env.js.get_key_value("claims").await.unwrap();
    kv.put(
        dedup_host::claim::key::encode("upper", "garbled"),
        "not json".into(),
    )
    .await
    .unwrap();
    env.publish("in.upper.x", "garbled", &[], "abc").await;
    let letter = dead_letter(&env, "garbled").await;
    let reason = header(&letter, headers::REASON);
    assert!(
        reason.contains("corrupt") && reason.contains("delete the key"),
        "{reason}"
    );
    env.wait_drained(Duration::from_secs(10)).await;
    host.shutdown().await.unwrap();
}
