//! The OTLP CLIENT span of each outbound HTTP call (issue 45), as a real `dedup-host run`
//! exports it: a child of the delivery's `process` span, with the HTTP semantic conventions
//! and the URL's secrets masked; a re-run's call answered from the journal is marked
//! `dedup.call.replayed` and sends nothing.

use std::collections::HashMap;
use std::time::Duration;

use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::harness::{stop_gracefully, wait_for, TestEnv, Timing};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;

use crate::telemetry::{attributes, collector};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_a_client_span_of_the_delivery_and_a_replayed_one_is_marked() {
    let env = TestEnv::start().await;
    let (otlp, spans) = collector().await;
    let endpoint = Endpoint::start().await;
    let port = endpoint.port();
    let routes = format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*"]

[telemetry]
traces = "otlp"
protocol = "http/protobuf"
delay = "100ms"
endpoint = "{otlp}"
"#
    );
    let host = env
        .host_process(&Timing::default(), &routes, "traced")
        .await;
    let base = endpoint.base();
    // Attempt 1 sends the first call and is refused the second, then asks for a retry;
    // attempt 2 makes the same calls: the first is replayed from the journal.
    let payload = json!({
        "calls": [
            { "url": format!("{base}/hooks/notify?token=secret&page=2"), "body": "once" },
            { "url": format!("{base}/elsewhere"), "body": "refused" },
        ],
        "retry_first_attempt": true,
    });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    env.wait_completed("http", &["k1"], Duration::from_secs(60))
        .await;
    let (processes, calls) = wait_for(Duration::from_secs(60), "four call spans", || async {
        let spans = spans.lock().unwrap().clone();
        let processes: Vec<Span> = spans
            .iter()
            .filter(|s| s.name == "process in.http.k1")
            .cloned()
            .collect();
        let calls: Vec<Span> = spans.iter().filter(|s| s.name == "POST").cloned().collect();
        (processes.len() == 2 && calls.len() == 4).then_some((processes, calls))
    })
    .await;

    let mut by_attempt: HashMap<String, Vec<HashMap<String, String>>> = HashMap::new();
    for call in &calls {
        assert_eq!(call.kind, SpanKind::Client as i32, "{call:?}");
        let parent = processes
            .iter()
            .find(|p| p.span_id == call.parent_span_id)
            .unwrap_or_else(|| panic!("a call span is a child of a delivery span: {call:?}"));
        assert_eq!(call.trace_id, parent.trace_id);
        assert!(
            call.start_time_unix_nano >= parent.start_time_unix_nano
                && call.end_time_unix_nano <= parent.end_time_unix_nano,
            "the call happened during its delivery"
        );
        let mut a = attributes(call);
        let failed = call.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32);
        a.insert("failed".into(), failed.to_string());
        let attempt = attributes(parent)["dedup.attempt"].clone();
        by_attempt.entry(attempt).or_default().push(a);
    }
    for attempt in ["1", "2"] {
        let calls = by_attempt.get_mut(attempt).expect("calls of each attempt");
        calls.sort_by(|a, b| a["dedup.call.index"].cmp(&b["dedup.call.index"]));
        let (sent, refused) = (&calls[0], &calls[1]);
        for (key, value) in [
            ("http.request.method", "POST".to_string()),
            (
                "url.full",
                format!("http://127.0.0.1:{port}/hooks/notify?token=***&page=2"),
            ),
            ("url.scheme", "http".into()),
            ("server.address", "127.0.0.1".into()),
            ("server.port", port.to_string()),
            ("http.response.status_code", "201".into()),
            ("dedup.call.index", "0".into()),
            (
                "dedup.call.result",
                if attempt == "1" { "sent" } else { "replayed" }.into(),
            ),
            ("dedup.call.replayed", (attempt == "2").to_string()),
            ("failed", "false".into()),
        ] {
            assert_eq!(
                sent.get(key),
                Some(&value),
                "attempt {attempt}, {key}: {sent:?}"
            );
        }
        assert!(!sent.contains_key("error.type"), "{sent:?}");
        for (key, value) in [
            ("url.full", format!("http://127.0.0.1:{port}/elsewhere")),
            ("error.type", "HttpRequestDenied".into()),
            ("dedup.call.result", "denied".into()),
            ("dedup.call.replayed", "false".into()),
            ("failed", "true".into()),
        ] {
            assert_eq!(
                refused.get(key),
                Some(&value),
                "attempt {attempt}, {key}: {refused:?}"
            );
        }
        assert!(
            !refused.contains_key("http.response.status_code"),
            "{refused:?}"
        );
    }
    assert_eq!(
        endpoint.per_key().get("http.k.k1.call.0"),
        Some(&1),
        "the replayed call sent nothing"
    );
    stop_gracefully(host);
}
