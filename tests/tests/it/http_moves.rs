//! A key's journal of outbound calls (issue 45, DESIGN.md rule 24) moves with its claim: when
//! `setup --change-route` moves a route's claims (window to fenced, fenced to window), the
//! `.call.<i>` records go along, so a dead letter replayed after the move replays its recorded
//! answer instead of sending the call again; `setup --rename-route` copies them to the new
//! name's claim as they were. Against a real nats-server and a real local endpoint counting requests per
//! idempotency key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guests::cli_async as run;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD};
use serde_json::{json, Value};

/// Route `name` running the `http-call` guest on `in.http.*`, allowed to call `endpoint`'s
/// `/hooks/`, with `extra` route lines (before its `[routes.http]`).
fn route(name: &str, endpoint: &Endpoint, extra: &str) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "in.http.*"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]
{extra}

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*"]
"#
    )
}

/// A config file whose output stream takes fenced batches and keeps message ids for 10
/// minutes (so the route runs under either effects): (path, text).
fn side(env: &TestEnv, file: &str, routes: &str) -> (PathBuf, String) {
    let text = env.config_text(&Timing::default(), routes).replace(
        "duplicate_window = \"10m\"",
        "duplicate_window = \"10m\"\neffects = \"fenced\"",
    );
    let path = env.path(file);
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// Starts an in-process host with config `text`.
async fn host(env: &TestEnv, text: &str, instance: &str) -> dedup_host::serve::RunningHost {
    let mut config =
        dedup_host::config::Config::parse(text, Path::new("t.toml"), env.dir.path().into())
            .unwrap();
    config.host.instance_id = Some(instance.to_string());
    dedup_host::serve::start(config).await.expect("host starts")
}

/// The JSON object a `--json` command printed last.
fn json_of(out: &str) -> Value {
    let start = out.find('{').unwrap_or_else(|| panic!("no JSON in {out}"));
    serde_json::from_str(&out[start..=out.rfind('}').unwrap()])
        .unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Publishes key `k1`, whose handler makes one call and then (attempt 2) a call at the same
/// index with another body: dead-lettered as not deterministic, its call 0 SENT once.
async fn dead_letter_after_a_call(env: &TestEnv, endpoint: &Endpoint, key: &str) {
    let url = format!("{}/hooks/notify", endpoint.base());
    let call = json!({ "url": url, "body": "attempt", "attempt_in_body": true });
    let payload = json!({ "calls": [call], "retry_first_attempt": true });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    letters(env, 1).await;
    assert_eq!(endpoint.per_key().get(key), Some(&1), "sent once");
}

/// Waits until `count` dead letters are stored.
async fn letters(env: &TestEnv, count: usize) {
    wait_for(
        Duration::from_secs(60),
        &format!("{count} dead letter(s)"),
        || async { (env.messages(DEAD).await.len() >= count).then_some(()) },
    )
    .await;
}

/// Replays every dead letter with config `path`, then waits for key `k1`'s re-run to end:
/// dead-lettered again (its journal answered call 0 and the re-run's other body did not
/// match), or completed (it found no journal and sent the call again). `state` reads the
/// key's record where the route's claims now are.
async fn replay_and_settle<F, Fut>(env: &TestEnv, path: &Path, state: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<ClaimState>>,
{
    let (replayed, out) = run(path, &["dead-letters", "replay", "--all", "--json"]).await;
    assert!(replayed, "{out}");
    wait_for(Duration::from_secs(60), "k1's re-run to end", || async {
        let again = env.messages(DEAD).await.len() >= 2;
        (again || state().await == Some(ClaimState::Completed)).then_some(())
    })
    .await;
}

/// Window <-> fenced: k1 is dead-lettered after its call under `from`, the route's claims
/// move to `to` with `setup --change-route`, the letter is replayed: the call is not sent
/// again.
async fn journal_moves_with_the_claims(from: &str, to: &str) {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let (_, old) = side(&env, "old.toml", &route("http", &endpoint, from));
    let (new_path, new) = side(&env, "new.toml", &route("http", &endpoint, to));
    let first = host(&env, &old, "old-1").await;
    dead_letter_after_a_call(&env, &endpoint, "http.k.k1.call.0").await;
    first.shutdown().await.unwrap();

    let (changed, out) = run(&new_path, &["setup", "--change-route", "http", "--json"]).await;
    assert!(changed, "{out}");
    let changed = json_of(&out);
    assert_eq!(changed["claims_moved"], 1, "{out}");
    assert_eq!(
        changed["calls_moved"], 1,
        "the journal moved with its claim: {out}"
    );

    let second = host(&env, &new, "new-1").await;
    let fenced = to.contains("fenced");
    replay_and_settle(&env, &new_path, || async {
        match fenced {
            true => env.fenced_claim("http", "k1").await.map(|(r, _)| r.state),
            false => env.claim("http", "k1").await.map(|r| r.state),
        }
    })
    .await;
    second.shutdown().await.unwrap();
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get("http.k.k1.call.0"),
        Some(&1),
        "the re-run after the move replayed the journal instead of sending: {per_key:?}"
    );
    assert_eq!(per_key.len(), 1, "{per_key:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_journal_moves_with_its_claim_from_window_to_fenced() {
    journal_moves_with_the_claims("", "effects = \"fenced\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_journal_moves_with_its_claim_from_fenced_to_window() {
    journal_moves_with_the_claims("effects = \"fenced\"", "").await;
}

/// A rename copies each claim's journal to the new name's claim, byte for byte (the record
/// keeps the idempotency key it was sent under), so a re-run under the new name finds the
/// answer recorded under the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_journal_is_copied_with_its_claim_by_a_rename() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let (_, old) = side(&env, "old.toml", &route("http", &endpoint, ""));
    let (new_path, _) = side(&env, "new.toml", &route("hooks", &endpoint, ""));
    let first = host(&env, &old, "old-1").await;
    dead_letter_after_a_call(&env, &endpoint, "http.k.k1.call.0").await;
    first.shutdown().await.unwrap();

    let (renamed, out) = run(
        &new_path,
        &["setup", "--rename-route", "http", "hooks", "--json"],
    )
    .await;
    assert!(renamed, "{out}");
    assert_eq!(json_of(&out)["calls_copied"], 1, "{out}");
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let recorded = kv
        .get("http.k.k1.call.0")
        .await
        .unwrap()
        .expect("journaled");
    let copied = kv.get("hooks.k.k1.call.0").await.unwrap();
    assert_eq!(
        copied.as_ref(),
        Some(&recorded),
        "the record is under the new name's claim, as it was"
    );
    let record = dedup_delivery::journal::CallRecord::from_bytes(&recorded).unwrap();
    assert_eq!(
        (record.state, record.idempotency_key.as_str()),
        (dedup_delivery::journal::CallState::Sent, "http.k.k1.call.0")
    );
}
