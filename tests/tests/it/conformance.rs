//! One conformance suite for every guest language, through the real pipeline: the same
//! scenarios against each language's conformance guest (`guests/<lang>/conformance`, built by
//! `guests/build.sh` into `guests/out/conformance-<lang>.wasm`). Adding a language is adding
//! its guest and one line to `languages!` below. What a guest does with one event (outputs,
//! rejections, retries, log lines) is checked without NATS by its case file,
//! `guests/conformance/cases.toml` (`authoring.rs` runs it for every language).

use std::collections::BTreeMap;
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::pipeline::effects::headers;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

macro_rules! languages {
    ($($test:ident => $lang:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                conformance($lang).await;
            }
        )*
    };
}

languages! {
    rust => "rust",
    python => "python",
    javascript => "javascript",
    c => "c",
}

fn routes(lang: &str) -> String {
    let route = |name: &str, config: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\nsubject = \"in.{name}.*\"\ncomponent = \"{{guest:conformance-{lang}}}\"\nallowed_outputs = [\"in.{name}.*.done\"]\nconfig = {{ {config} }}\n\n"
        )
    };
    route("upper", "mode = \"upper\"")
        + &route("reject", "mode = \"reject\"")
        + &route("retry", "mode = \"retry\", succeed_on_attempt = \"3\"")
}

/// The scenarios every language's guest must pass.
async fn conformance(lang: &str) {
    let env = TestEnv::start().await;
    let timing = Timing {
        backoff: r#"["100ms"]"#,
        ..Timing::default()
    };
    let host = env.host(&timing, &routes(lang), "h").await;
    // Transform and output, once per key even when the key comes twice.
    env.publish("in.upper.a", "u1", &[], "hello, world").await;
    env.publish("in.upper.a", "u1", &[], "hello, world").await;
    // Reject malformed input with a reason; accept good input.
    env.publish("in.reject.a", "r1", &[], "not json").await;
    env.publish("in.reject.b", "r2", &[], r#"{"ok":true}"#)
        .await;
    // Retry based on the attempt number and a config value.
    env.publish("in.retry.a", "t1", &[], "x").await;

    // A liveness bound, not a timing: it includes compiling an 18 MB Python or 12 MB
    // JavaScript component beside the other tests (35-41 s on a quiet machine).
    let outputs = wait_for(Duration::from_secs(180), "three outputs", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() >= 3).then_some(m)
    })
    .await;
    let dead = wait_for(Duration::from_secs(30), "one dead letter", || async {
        let m = env.messages(DEAD).await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    env.wait_drained(Duration::from_secs(20)).await;

    let by_subject: BTreeMap<String, (String, String)> = outputs
        .iter()
        .map(|m| {
            let lang = m
                .headers
                .get("lang")
                .map(|v| v.to_string())
                .unwrap_or_default();
            (
                m.subject.to_string(),
                (String::from_utf8_lossy(&m.payload).into_owned(), lang),
            )
        })
        .collect();
    let expected = |payload: &str| (payload.to_string(), lang.to_string());
    assert_eq!(
        by_subject.get("in.upper.a.done"),
        Some(&expected("HELLO, WORLD")),
        "{lang}"
    );
    assert_eq!(
        by_subject.get("in.reject.b.done"),
        Some(&expected(r#"{"ok":true}"#)),
        "{lang}"
    );
    assert_eq!(
        by_subject.get("in.retry.a.done"),
        Some(&expected("succeeded on attempt 3")),
        "{lang}"
    );
    assert_eq!(outputs.len(), 3, "{lang}: one output per key");

    assert_eq!(dead.len(), 1, "{lang}");
    let reason = dead[0]
        .headers
        .get(headers::REASON)
        .map(|v| v.to_string())
        .unwrap_or_default();
    assert_eq!(reason, "malformed: expected a JSON object", "{lang}");
    let rejected = env.claim("reject", "r1").await.unwrap();
    assert_eq!(
        (rejected.state, rejected.permanent),
        (ClaimState::Failed, true),
        "{lang}"
    );
    let retried = env.claim("retry", "t1").await.unwrap();
    assert_eq!(
        (retried.state, retried.attempt),
        (ClaimState::Completed, 3),
        "{lang}"
    );
    let stats = host.shutdown().await.unwrap();
    assert_eq!(
        (stats.processed, stats.retried, stats.dead_lettered),
        (3, 2, 1),
        "{lang}"
    );
}
