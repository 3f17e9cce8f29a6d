//! OpenTelemetry traces (issue 29): the spans a real `dedup-host run` exports over OTLP to a
//! collector inside the test, and a dead collector that costs nothing but counted drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_host_tests::harness::{stop_gracefully, wait_for, TestEnv, Timing};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// A fenced-or-not route of the `flaky` guest that publishes two outputs per event.
fn route(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "tel"
subject = "in.tel.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.tel.*.done"]
config = {{ succeed_on_attempt = "1", outputs = "2" }}

[telemetry]
traces = "otlp"
protocol = "http/protobuf"
delay = "100ms"
{extra}
"#
    )
}

/// An OTLP/HTTP collector on a free port: every span it receives.
pub(crate) async fn collector() -> (String, Arc<Mutex<Vec<Span>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    collector_on(listener)
}

/// An OTLP/HTTP collector on `listener`: every span it receives.
fn collector_on(listener: tokio::net::TcpListener) -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let received = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
            let mut all = received.lock().unwrap();
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    all.extend(scope.spans);
                }
            }
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            ([("content-type", "application/x-protobuf")], answer)
        }),
    );
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), spans)
}

/// A span's attributes as text.
pub(crate) fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_exports_its_span_tree_and_outputs_carry_their_send_span() {
    let env = TestEnv::start().await;
    let (endpoint, spans) = collector().await;
    let routes = route(&format!("endpoint = \"{endpoint}\""));
    let host = env
        .host_process(&Timing::default(), &routes, "traced")
        .await;
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    env.publish("in.tel.a", "msg-a", &[("traceparent", &traceparent)], "x")
        .await;
    let outputs = wait_for(Duration::from_secs(60), "two outputs", || async {
        let outputs = env.outputs().await;
        (outputs.len() == 2).then_some(outputs)
    })
    .await;
    // Spans are exported after they end; the settle span ends with the ack.
    let tree = wait_for(Duration::from_secs(60), "the delivery's spans", || async {
        let spans = spans.lock().unwrap().clone();
        let process = spans.iter().find(|s| s.name == "process in.tel.a")?.clone();
        let children: Vec<Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == process.span_id)
            .cloned()
            .collect();
        let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
        let all = ["claim", "handle", "record", "settle"]
            .iter()
            .all(|n| names.contains(n))
            && names.iter().filter(|n| **n == "send in.tel.a.done").count() == 2;
        all.then_some((process, children))
    })
    .await;
    let (process, children) = tree;

    // The producer's trace continues: the delivery is a child of the publishing span.
    assert_eq!(hex(&process.trace_id), TRACE_ID);
    assert_eq!(hex(&process.parent_span_id), PRODUCER_SPAN);
    assert_eq!(process.kind, SpanKind::Consumer as i32);
    let a = attributes(&process);
    for (key, value) in [
        ("messaging.system", "nats"),
        ("messaging.operation.type", "process"),
        ("messaging.destination.name", "in.tel.a"),
        ("messaging.message.id", "msg-a"),
        ("messaging.nats.stream.sequence", "1"),
        ("messaging.nats.message.delivered", "1"),
        ("dedup.route", "tel"),
        ("dedup.key", "a"),
        ("dedup.attempt", "1"),
        ("dedup.outcome", "processed"),
    ] {
        assert_eq!(
            a.get(key).map(String::as_str),
            Some(value),
            "{key} in {a:?}"
        );
    }
    assert!(a["messaging.consumer.group.name"].contains("tel"), "{a:?}");
    assert!(
        a["dedup.fencing_token"].parse::<u64>().unwrap() > 0,
        "{a:?}"
    );
    assert!(a["dedup.digest"].starts_with("sha256:"), "{a:?}");

    let kind = |name: &str| {
        let span = children.iter().find(|s| s.name == name).unwrap();
        assert_eq!(hex(&span.trace_id), TRACE_ID, "{name}");
        (span.kind, attributes(span))
    };
    assert_eq!(kind("claim").0, SpanKind::Internal as i32);
    assert_eq!(kind("claim").1["dedup.claim"], "acquired");
    let (handle_kind, handle) = kind("handle");
    assert_eq!(handle_kind, SpanKind::Internal as i32);
    assert_eq!(handle["dedup.guest.outcome"], "success");
    assert!(
        handle["dedup.guest.fuel"].parse::<u64>().unwrap() > 0,
        "{handle:?}"
    );
    assert!(
        handle["dedup.guest.memory_bytes"].parse::<u64>().unwrap() > 0,
        "{handle:?}"
    );
    assert_eq!(kind("settle").0, SpanKind::Client as i32);
    assert_eq!(kind("settle").1["dedup.ack"], "ack");

    // Each output carries its own `send` span's context onward.
    let mut sends: Vec<String> = children
        .iter()
        .filter(|s| s.name == "send in.tel.a.done")
        .inspect(|s| {
            assert_eq!(s.kind, SpanKind::Producer as i32);
            let a = attributes(s);
            assert_eq!(a["messaging.destination.name"], "in.tel.a.done");
            assert_eq!(a["messaging.operation.type"], "send");
        })
        .map(|s| format!("00-{TRACE_ID}-{}-01", hex(&s.span_id)))
        .collect();
    let mut carried: Vec<String> = outputs
        .iter()
        .map(|m| m.headers.get("traceparent").unwrap().to_string())
        .collect();
    sends.sort();
    carried.sort();
    assert_eq!(carried, sends);
    stop_gracefully(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_drops_and_counts_spans_and_work_goes_on_until_it_is_back() {
    let env = TestEnv::start().await;
    // A port nobody listens on, until the collector comes up on it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    let endpoint = format!("http://{addr}");
    drop(dead);
    let routes = route(&format!("endpoint = \"{endpoint}\"\nqueue = 4\nbatch = 2"));
    let host = env
        .host(&Timing::default(), &routes, "dead-collector")
        .await;
    for i in 0..20 {
        env.publish(&format!("in.tel.m{i}"), &format!("m{i}"), &[], "x")
            .await;
    }
    wait_for(
        Duration::from_secs(60),
        "every message's outputs",
        || async { (env.outputs().await.len() == 40).then_some(()) },
    )
    .await;
    let dropped = wait_for(Duration::from_secs(60), "dropped spans counted", || async {
        let text = host.metrics().encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("dedup_spans_dropped_total "))?;
        let n: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        (n > 0.0).then_some(n)
    })
    .await;
    assert!(dropped >= 1.0);

    // The collector comes back: after the pause that failed exports started, deliveries
    // are traced and exported again.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_, spans) = collector_on(listener);
    let mut sent = 20;
    wait_for(Duration::from_secs(120), "spans exported again", || {
        sent += 1;
        let (env, spans, i) = (&env, spans.clone(), sent);
        async move {
            env.publish(&format!("in.tel.m{i}"), &format!("m{i}"), &[], "x")
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let spans = spans.lock().unwrap();
            spans
                .iter()
                .any(|s| s.name.starts_with("process "))
                .then_some(())
        }
    })
    .await;
    wait_for(
        Duration::from_secs(60),
        "every message's outputs",
        || async { (env.outputs().await.len() == 2 * sent).then_some(()) },
    )
    .await;
    let stats = host.shutdown().await.unwrap();
    assert_eq!(stats.processed, sent as u64, "{stats:?}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
