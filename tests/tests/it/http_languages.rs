//! Outbound HTTP from Python and JavaScript guests (issue 45): each language's ordinary client
//! (componentize-py's `poll_loop`, StarlingMonkey's `fetch`) goes through the host's
//! allowlist and journal, so a re-run of a key replays the recorded answer and the endpoint
//! sees each idempotency key once. The guests share the Rust `http-call` guest's contract.
//! Also `dedup-host test` cases answering calls from canned responses (`[[cases.http]]`).

use std::time::Duration;

use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing};
use serde_json::{json, Value};

/// Route `http` running guest `guest`, allowed to call `endpoint`'s `/hooks/`.
fn route(guest: &str, endpoint: &Endpoint) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:{guest}}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*"]
"#
    )
}

/// Runs key `k1` through `guest`: attempt 1 makes an allowed call and a refused one, then asks
/// for a retry; attempt 2 makes the same calls. Returns what the completed run's calls got.
///
/// The lease and ack wait are long: the in-process host shares the test's one thread with
/// these guests, which run for seconds on a busy machine, and a lease lapsed mid-run makes
/// another attempt, which is not what this test is about.
async fn call_then_re_run(guest: &str, endpoint: &Endpoint) -> Vec<Value> {
    let env = TestEnv::start().await;
    let timing = Timing {
        lease: "20s",
        heartbeat: "1s",
        ack_wait: "20s",
        ..Timing::default()
    };
    let host = env.host(&timing, &route(guest, endpoint), "h").await;
    let base = endpoint.base();
    let payload = json!({
        "calls": [
            { "url": format!("{base}/hooks/notify"), "body": "send once" },
            { "url": format!("{base}/elsewhere"), "body": "refused" },
        ],
        "retry_first_attempt": true,
    });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    env.wait_completed("http", &["k1"], Duration::from_secs(120))
        .await;
    // At least twice: CI saw a third attempt twice (stop 64, and a full run beside the
    // simulation), 0.1 s after the second, not reproduced since under load; what this test
    // is about (the call sent once, its answer replayed) is asserted whatever the count.
    let claim = env.claim("http", "k1").await.unwrap();
    assert!(claim.attempt >= 2, "the key ran again: {claim:?}");
    let out = wait_for(Duration::from_secs(60), "the output", || async {
        env.outputs()
            .await
            .into_iter()
            .find(|m| m.subject.as_str() == "in.http.k1.done")
    })
    .await;
    host.shutdown().await.unwrap();
    serde_json::from_slice(&out.payload).expect("the guest reports its calls as JSON")
}

/// What every language must show: the call sent once across two runs, under the host's key,
/// with the first run's answer replayed to the second; the refused call never sent.
fn assert_sent_once(guest: &str, endpoint: &Endpoint, got: &[Value]) {
    assert_eq!(
        (got[0]["status"].as_u64(), got[0]["body"].as_str()),
        (Some(201), Some("ok 1")),
        "{guest}: the second run got the first run's answer: {got:?}"
    );
    assert_eq!(got[1]["status"], Value::Null, "{guest}: refused: {got:?}");
    let seen = endpoint.seen();
    assert_eq!(seen.len(), 1, "{guest}: one request in all: {seen:?}");
    assert_eq!(
        (
            seen[0].path.as_str(),
            seen[0].key.as_deref(),
            seen[0].body.as_str()
        ),
        ("/hooks/notify", Some("http.k.k1.call.0"), "send once"),
        "{guest}: the request as the endpoint saw it"
    );
}

#[tokio::test]
async fn a_python_guest_calls_out_once_per_key_across_re_runs() {
    let endpoint = Endpoint::start().await;
    let got = call_then_re_run("http-call-python", &endpoint).await;
    assert_sent_once("python", &endpoint, &got);
    assert!(
        got[1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("HttpRequestDenied")),
        "the refusal is the error code poll_loop raised: {got:?}"
    );
}

#[tokio::test]
async fn a_javascript_guest_calls_out_once_per_key_across_re_runs() {
    let endpoint = Endpoint::start().await;
    let got = call_then_re_run("http-call-javascript", &endpoint).await;
    assert_sent_once("javascript", &endpoint, &got);
    assert!(
        got[1]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "fetch rejects a refused call: {got:?}"
    );
}

/// A case file for the Rust `http-call` guest: a call answered by the case's own canned
/// response, one answered by the file's, and one nobody answers.
const CASES: &str = r#"
[[cases.http]]
url = "http://api.example.test/v1/shared"
status = 202
body = "from the file"

[[case]]
name = "answered by the case"
subject = "in.http.a"
payload = '{"calls": [{"url": "http://api.example.test/v1/send", "body": "hi"}]}'
expect.outputs = [{ subject = "in.http.a.done", contains = '"status":201,"body":"canned"' }]

[[case.http]]
method = "POST"
url = "http://api.example.test/v1/send"
status = 201
body = "canned"

[[case]]
name = "answered by the file"
subject = "in.http.b"
payload = '{"calls": [{"url": "http://api.example.test/v1/shared", "method": "GET"}]}'
expect.outputs = [{ subject = "in.http.b.done", contains = '"status":202,"body":"from the file"' }]

[[case]]
name = "no canned response"
subject = "in.http.c"
payload = '{"calls": [{"url": "http://api.example.test/v1/other", "body": "hi"}]}'
expect.outputs = [{ subject = "in.http.c.done" }]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn test_cases_answer_calls_from_canned_responses_and_name_an_unanswered_call() {
    use dedup_host::cases::{self, CaseFile};
    use dedup_host::runtime::{EngineSettings, InvokeOptions, Runtime};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.toml");
    std::fs::write(&path, CASES).unwrap();
    let file = CaseFile::load(&path).expect("the case file loads");
    let runtime = Runtime::new(&EngineSettings::default()).expect("runtime");
    let guest = dedup_host_tests::guests::guest("http-call");
    let handler = runtime.load_file(&guest).expect("load http-call");
    let options = InvokeOptions::default();
    let results = cases::run(&handler, &options, &file.cases, &file.shared, dir.path())
        .await
        .expect("the cases run");
    let failures: Vec<Option<&str>> = results.iter().map(|r| r.failure.as_deref()).collect();
    assert_eq!(failures[..2], [None, None], "{failures:?}");
    let unanswered = failures[2].expect("a call with no canned response fails its case");
    assert!(
        unanswered.contains("POST http://api.example.test/v1/other")
            && unanswered.contains("[[case.http]]")
            && unanswered.contains("url = \"http://api.example.test/v1/other\""),
        "names the call and the entry to add: {unanswered}"
    );
}
