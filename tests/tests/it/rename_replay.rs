//! Replaying a dead letter after its route was renamed (`setup --rename-route http hooks`):
//! the letter names route `http`, but its message is consumed by `hooks`, whose copy of the
//! key's claim is the one reset (the replay says the route was renamed), and the key's
//! outbound calls keep the idempotency keys they had under `http` (DESIGN.md rule 24): a call
//! answered before is replayed from the journal, a call whose outcome was unknown is sent
//! again under the key the provider already saw. A letter of a route neither named nor
//! renamed is refused. Against a real nats-server and a local endpoint counting requests per
//! idempotency key.

use std::path::PathBuf;
use std::time::Duration;

use dedup_delivery::journal::{CallRecord, CallRequest, CallState};
use dedup_host::claim::ClaimState;
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guests::cli_async as run;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Route `name` running the `http-call` guest on `subject`, allowed to call `endpoint`'s
/// `/hooks/`; a call of unknown outcome dead-letters its message.
fn route(name: &str, subject: &str, endpoint: &Endpoint) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "{subject}"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*"]
on_unknown = "fail"
"#
    )
}

/// Writes config `file` with `routes`: (path, text).
fn config(env: &TestEnv, file: &str, routes: &str) -> (PathBuf, String) {
    let text = env.config_text(&Timing::default(), routes);
    let path = env.path(file);
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// Sends `POST path` with idempotency key `key` to `endpoint` by hand: what a host that
/// died before recording the answer sent.
async fn send_by_hand(endpoint: &Endpoint, path: &str, key: &str, body: &str) {
    let port = endpoint.port();
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

/// Key `k1` of route `http`, dead-lettered under that name: its call 0 was sent and
/// answered (SENT), its call 1 was sent by a run that died before recording the answer
/// (PENDING, and the route fails such calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_replayed_after_a_rename_runs_under_the_new_name_with_the_old_call_keys() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let (old, new) = (
        route("http", "in.http.*", &endpoint),
        route("hooks", "in.http.*", &endpoint),
    );
    let (new_path, _) = config(&env, "new.toml", &new);
    let (other_path, _) = config(&env, "other.toml", &route("other", "in.x.*", &endpoint));
    let (a, b) = (
        format!("{}/hooks/a", endpoint.base()),
        format!("{}/hooks/b", endpoint.base()),
    );
    // Call 1 was sent (the endpoint saw its key) and its answer never recorded.
    send_by_hand(&endpoint, "/hooks/b", "http.k.k1.call.1", "second").await;
    let pending = CallRequest::new("POST", &b, b"second");
    let record = CallRecord {
        index: 1,
        state: CallState::Pending,
        method: pending.method,
        url: pending.url,
        body_digest: pending.body_digest,
        idempotency_key: "http.k.k1.call.1".into(),
        at_ms: 1,
        response: None,
        token: None,
    };
    let first = env.host(&Timing::default(), &old, "old-1").await;
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    kv.put("http.k.k1.call.1", record.to_bytes().into())
        .await
        .unwrap();

    let payload =
        json!({ "calls": [{ "url": a, "body": "first" }, { "url": b, "body": "second" }] });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    wait_for(Duration::from_secs(60), "k1's dead letter", || async {
        (!env.messages(DEAD).await.is_empty()).then_some(())
    })
    .await;
    first.shutdown().await.unwrap();
    let record = env.claim("http", "k1").await.unwrap();
    assert_eq!((record.state, record.permanent), (ClaimState::Failed, true));

    let (renamed, out) = run(&new_path, &["setup", "--rename-route", "http", "hooks"]).await;
    assert!(renamed, "{out}");

    // A config that names neither `http` nor the route it was renamed to: `--all` takes no
    // letter of `http`, and `--route http` refuses it.
    let (_, out) = run(&other_path, &["dead-letters", "replay", "--all", "--json"]).await;
    assert!(!out.contains("in.http.k1"), "{out}");
    let (_, out) = run(
        &other_path,
        &[
            "dead-letters",
            "replay",
            "--route",
            "http",
            "--all",
            "--json",
        ],
    )
    .await;
    assert!(
        out.contains("refused") && out.contains("route `http` is not in this config"),
        "{out}"
    );
    let (_, out) = run(
        &new_path,
        &["dead-letters", "replay", "--all", "--dry-run", "--json"],
    )
    .await;
    assert!(
        out.contains("would replay") && out.contains("route `http` was renamed to `hooks`"),
        "{out}"
    );

    let second = env.host(&Timing::default(), &new, "new-1").await;
    let (replayed, out) = run(&new_path, &["dead-letters", "replay", "--all", "--json"]).await;
    assert!(replayed, "{out}");
    assert!(
        out.contains("\"replayed\"") && out.contains("route `http` was renamed to `hooks`"),
        "{out}"
    );
    env.wait_completed("hooks", &["k1"], Duration::from_secs(60))
        .await;
    second.shutdown().await.unwrap();
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get("http.k.k1.call.0"),
        Some(&1),
        "call 0 was answered under `http`: replayed, not sent again: {per_key:?}"
    );
    assert_eq!(
        per_key.get("http.k.k1.call.1"),
        Some(&2),
        "call 1 (outcome unknown) sent again under the key the provider saw: {per_key:?}"
    );
    assert_eq!(per_key.len(), 2, "no call under a new key: {per_key:?}");
    assert_eq!(env.messages(DEAD).await.len(), 1, "no second dead letter");
}
