//! Operating routes that make outbound HTTP calls (issue 45): `inspect`, the console's key
//! story and `audit` show a key's journaled calls; `dead-letters replay` keeps the calls that
//! were answered (or, with `--fresh-effects`, sends them all again); shadow candidates never
//! send while canaries send under the same journal; and a fenced route journals the same way.
//! Against a real nats-server and a real local HTTP endpoint ([`Endpoint`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_delivery::journal::{CallRecord, CallState};
use dedup_host::candidate::canary::runs_on_candidate;
use dedup_host::claim::ClaimState;
use dedup_host::ops::letters::{self, Selection};
use dedup_host::ops::story::{self, Story, Target};
use dedup_host::serve::RunningHost;
use dedup_host_tests::console::{request, ConsoleProcess};
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guests::{cli, guest};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET};
use serde_json::{json, Value};

/// Route `http` running `component` (the `http-call` guest by default), allowed to call
/// `endpoint`'s `/hooks/` and `/slow`, with `extra` lines in its `[routes.http]`.
fn route_with(endpoint: &Endpoint, component: &str, extra: &str) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{component}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*", "http://127.0.0.1:{port}/slow"]
{extra}
"#
    )
}

fn route(endpoint: &Endpoint, extra: &str) -> String {
    route_with(endpoint, "{guest:http-call}", extra)
}

async fn tell(env: &TestEnv, routes: &str, key: &str) -> Story {
    let config = env.config(&Timing::default(), routes);
    story::tell(&env.js, &config, "http", Target::Key(key.into()))
        .await
        .expect("the key's story")
}

/// What the calls of key `key` got, from its one output.
async fn output_of(env: &TestEnv, key: &str) -> Vec<Value> {
    let subject = format!("in.http.{key}.done");
    let out = wait_for(Duration::from_secs(60), "the output", || async {
        env.outputs()
            .await
            .into_iter()
            .find(|m| m.subject.as_str() == subject)
    })
    .await;
    serde_json::from_slice(&out.payload).unwrap()
}

/// A call record written straight into the claim bucket, as a host would.
fn record(key: &str, index: u32, url: &str, at_ms: u64) -> CallRecord {
    CallRecord {
        index,
        state: CallState::Pending,
        method: "POST".into(),
        url: url.into(),
        body_digest: "sha256:0".into(),
        idempotency_key: format!("http.k.{key}.call.{index}"),
        at_ms,
        response: None,
        token: Some(1),
    }
}

#[tokio::test]
async fn inspect_the_console_and_audit_show_a_keys_calls() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let routes = route(&endpoint, "");
    let host = env.host(&Timing::default(), &routes, "h").await;
    let url = format!("{}/hooks/notify", endpoint.base());
    // k1: attempt 1 sends, asks for a retry; attempt 2 gets the recorded answer.
    let retried = json!({ "calls": [{ "url": url, "body": "b" }], "retry_first_attempt": true });
    env.publish("in.http.k1", "k1", &[], retried.to_string())
        .await;
    let once = json!({ "calls": [{ "url": url, "body": "b" }] });
    env.publish("in.http.k2", "k2", &[], once.to_string()).await;
    env.wait_completed("http", &["k1", "k2"], Duration::from_secs(60))
        .await;

    let k1 = tell(&env, &routes, "k1").await;
    assert_eq!(k1.calls.len(), 1, "{:?}", k1.calls);
    let call = &k1.calls[0];
    assert_eq!(
        (call.index, call.method.as_str(), call.url.as_str()),
        (0, "POST", url.as_str())
    );
    assert_eq!(
        (call.status, call.how, call.idempotency_key.as_str()),
        (Some(201), "replayed", "http.k.k1.call.0"),
        "attempt 2 got attempt 1's answer: {call:?}"
    );
    assert!(call.at_ms > 0);
    let k2 = tell(&env, &routes, "k2").await;
    assert_eq!(k2.calls.iter().map(|c| c.how).collect::<Vec<_>>(), ["sent"]);
    let json = serde_json::to_value(&k2).unwrap();
    assert_eq!(json["calls"][0]["status"], 201, "{json}");

    // A call left pending longer than the lease (its run died), one pending right now (a run
    // inside its call), and a URL a guest chose, written as hosts would.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let hostile = "http://127.0.0.1:1/hooks/<script>alert(1)</script>";
    let old = record("k2", 1, hostile, 1);
    kv.put("http.k.k2.call.1", old.to_bytes().into())
        .await
        .unwrap();
    let now = dedup_host::claim::record::now_ms();
    let fresh = record("k9", 0, "http://127.0.0.1:1/hooks/x", now);
    kv.put("http.k.k9.call.0", fresh.to_bytes().into())
        .await
        .unwrap();
    let config = env.config(&Timing::default(), &routes);
    let report = dedup_host::ops::audit::run(&env.js, &config, None)
        .await
        .unwrap();
    assert_eq!(report.pending_calls, 1, "only the old one: {report:?}");
    assert_eq!(
        (report.keys, report.completed),
        (2, 2),
        "call records are no keys: {report:?}"
    );
    assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
    let k2 = tell(&env, &routes, "k2").await;
    assert_eq!(
        k2.calls.iter().map(|c| c.how).collect::<Vec<_>>(),
        ["sent", "pending"]
    );

    let file = env.path("console.toml");
    std::fs::write(&file, env.config_text(&Timing::default(), &routes)).unwrap();
    let console = ConsoleProcess::start(&file, None);
    let (status, page) = request(console.addr, "GET", "/keys?route=http&q=k2", &[], "");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Outbound calls"), "{page}");
    assert!(page.contains("http.k.k2.call.0"), "{page}");
    assert!(page.contains("pending (outcome unknown)"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !page.contains("<script>alert"),
        "the URL is escaped: {page}"
    );
    drop(console);
    host.shutdown().await.unwrap();
}

/// A call's URL is shown with its credentials and secret parameters masked where a key's
/// story is read (`inspect`, the console's key page); the journal keeps the exact URL.
#[tokio::test]
async fn a_calls_credentials_and_secret_parameters_are_masked_in_inspect_and_the_console() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let routes = route(&endpoint, "");
    let host = env.host(&Timing::default(), &routes, "h").await;
    let url = format!("{}/hooks/notify", endpoint.base());
    let once = json!({ "calls": [{ "url": url, "body": "b" }] });
    env.publish("in.http.k1", "k1", &[], once.to_string()).await;
    env.wait_completed("http", &["k1"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    // A second call of k1, as a host journals it, to a URL carrying secrets.
    let secret = "http://alice:pw-0451@127.0.0.1:1/hooks/x?id=7&api_key=key-0451&sig=sig-0451";
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let call = record("k1", 1, secret, 1);
    kv.put("http.k.k1.call.1", call.to_bytes().into())
        .await
        .unwrap();

    let file = env.path("operator.toml");
    std::fs::write(&file, env.config_text(&Timing::default(), &routes)).unwrap();
    let inspect = cli(&file, &["inspect", "--route", "http", "--key", "k1"]);
    assert_eq!(inspect.code, 0, "{inspect:?}");
    let shown = "http://***@127.0.0.1:1/hooks/x?id=7&api_key=***&sig=***";
    assert!(
        inspect.stdout.contains(shown) && !inspect.stdout.contains("0451"),
        "{}",
        inspect.stdout
    );
    let console = ConsoleProcess::start(&file, None);
    let (status, page) = request(console.addr, "GET", "/keys?route=http&q=k1", &[], "");
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("http://***@127.0.0.1:1/hooks/x?id=7&amp;api_key=***&amp;sig=***")
            && !page.contains("0451"),
        "{page}"
    );
    drop(console);
    let stored = kv.get("http.k.k1.call.1").await.unwrap().unwrap();
    assert_eq!(CallRecord::from_bytes(&stored).unwrap().url, secret);
}

/// Dead-letters key `key`: call 0 is answered, call 1 times out (the endpoint is slow for its
/// first request only), the guest asks for a retry, and the route allows one attempt.
async fn dead_letter_after_a_call(env: &TestEnv, endpoint: &Endpoint, key: &str) {
    let base = endpoint.base();
    let calls = json!([
        { "url": format!("{base}/hooks/a"), "body": "a" },
        { "url": format!("{base}/hooks/b?delay_ms=4000&delay_first=1"), "body": "b" },
    ]);
    let payload = json!({ "calls": calls, "retry_on_error": true });
    env.publish(&format!("in.http.{key}"), key, &[], payload.to_string())
        .await;
    wait_for(Duration::from_secs(60), "the key dead-lettered", || async {
        let record = env.claim("http", key).await?;
        (record.state == ClaimState::Failed && record.permanent).then_some(())
    })
    .await;
}

/// Replays the dead letters of `key`, keeping or discarding its journal.
async fn replay(env: &TestEnv, routes: &str, key: &str, fresh: bool) {
    let config = env.config(&one_attempt(), routes);
    let selection = Selection {
        route: Some("http".into()),
        ..Selection::default()
    };
    let list: Vec<_> = letters::list(&env.js, &config, &selection)
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.key == key)
        .collect();
    assert_eq!(list.len(), 1, "one letter of {key}");
    let actions =
        dedup_host::ops::replay::replay_effects(&env.js, &config, list, false, false, fresh)
            .await
            .unwrap();
    assert_eq!(actions[0].action, "replayed", "{actions:?}");
}

fn one_attempt() -> Timing {
    Timing {
        max_deliver: 1,
        ..Timing::default()
    }
}

#[tokio::test]
async fn a_replay_keeps_answered_calls_unless_fresh_effects_discards_the_journal() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let routes = route(&endpoint, "timeout = \"1s\"");
    let host = env.host(&one_attempt(), &routes, "h").await;
    for key in ["kept", "fresh"] {
        dead_letter_after_a_call(&env, &endpoint, key).await;
    }
    let k = |key: &str, i: u32| format!("http.k.{key}.call.{i}");
    let per_key = endpoint.per_key();
    for key in ["kept", "fresh"] {
        assert_eq!(
            (per_key.get(&k(key, 0)), per_key.get(&k(key, 1))),
            (Some(&1), Some(&1)),
            "{per_key:?}"
        );
    }

    replay(&env, &routes, "kept", false).await;
    env.wait_completed("http", &["kept"], Duration::from_secs(60))
        .await;
    let got = output_of(&env, "kept").await;
    assert_eq!(
        (got[0]["body"].as_str(), got[1]["body"].as_str()),
        (Some("ok 1"), Some("ok 2")),
        "call 0 replayed, call 1 (outcome unknown) sent again: {got:?}"
    );
    let story = tell(&env, &routes, "kept").await;
    let how: Vec<&str> = story.calls.iter().map(|c| c.how).collect();
    assert_eq!(how, ["replayed", "sent"], "{:?}", story.calls);

    replay(&env, &routes, "fresh", true).await;
    env.wait_completed("http", &["fresh"], Duration::from_secs(60))
        .await;
    let got = output_of(&env, "fresh").await;
    assert_eq!(
        (got[0]["body"].as_str(), got[1]["body"].as_str()),
        (Some("ok 2"), Some("ok 2")),
        "every call sent again: {got:?}"
    );
    let per_key = endpoint.per_key();
    assert_eq!(
        [
            per_key.get(&k("kept", 0)),
            per_key.get(&k("kept", 1)),
            per_key.get(&k("fresh", 0)),
            per_key.get(&k("fresh", 1)),
        ],
        [Some(&1), Some(&2), Some(&2), Some(&2)],
        "{per_key:?}"
    );
    host.shutdown().await.unwrap();
}

/// `http-call` with a custom section appended: the same behaviour under another digest.
fn http_call_variant() -> Vec<u8> {
    let mut bytes = std::fs::read(guest("http-call")).unwrap();
    bytes.extend_from_slice(&[0x00, 0x06, 0x04, b't', b'e', b's', b't', b'x']);
    bytes
}

/// The route's files: the live `http.wasm` (`http-call`) and its candidate (the variant),
/// with `settings` as its `.candidate.toml`.
fn with_candidate(env: &TestEnv, endpoint: &Endpoint, settings: &str, extra: &str) -> String {
    let dir: PathBuf = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("http-call"), dir.join("http.wasm")).unwrap();
    std::fs::write(dir.join("http.candidate.toml"), settings).unwrap();
    std::fs::write(dir.join("http.candidate.wasm"), http_call_variant()).unwrap();
    let live = dir.join("http.wasm");
    route_with(endpoint, &display(&live), extra)
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

fn counted(host: &RunningHost, line_start: &str) -> u64 {
    host.metrics()
        .encode()
        .lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_shadow_candidate_never_sends_and_its_diff_shows_the_requests() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let routes = with_candidate(&env, &endpoint, "mode = \"shadow\"\n", "timeout = \"1s\"");
    let host = env.host(&Timing::default(), &routes, "h").await;
    let base = endpoint.base();
    // The live run's call 0 is answered; its call 1 times out (left pending): a run that
    // may send would send call 1 again; the shadow is refused it.
    let calls = json!([
        { "url": format!("{base}/hooks/a"), "body": "a" },
        { "url": format!("{base}/slow?ms=3000"), "body": "b" },
    ]);
    env.publish(
        "in.http.s1",
        "s1",
        &[],
        json!({ "calls": calls }).to_string(),
    )
    .await;
    env.wait_completed("http", &["s1"], Duration::from_secs(60))
        .await;
    wait_for(Duration::from_secs(60), "the shadow comparison", || async {
        (counted(&host, "dedup_shadow_results_total{") > 0).then_some(())
    })
    .await;
    let per_key = endpoint.per_key();
    assert_eq!(
        (
            per_key.get("http.k.s1.call.0"),
            per_key.get("http.k.s1.call.1")
        ),
        (Some(&1), Some(&1)),
        "the shadow sent nothing: {per_key:?}"
    );
    let live = output_of(&env, "s1").await;
    assert_eq!(live[0]["body"].as_str(), Some("ok 1"), "{live:?}");
    // The shadow's sample shows both runs' requests.
    let config = env.config(&Timing::default(), &routes);
    let store = dedup_host::candidate::record::open(&env.js, &config)
        .await
        .unwrap();
    let digest = dedup_host::runtime::digest(&http_call_variant());
    let sample = wait_for(Duration::from_secs(60), "a shadow sample", || async {
        let report = dedup_host::candidate::record::read(&store, "http", &digest)
            .await
            .ok()?;
        report.last.into_iter().next()
    })
    .await;
    assert_eq!(sample.candidate.calls.len(), 2, "{sample:?}");
    assert!(
        sample.candidate.calls[1].starts_with(&format!("POST {base}/slow?ms=3000 sha256:")),
        "{sample:?}"
    );
    assert_eq!(sample.live.calls, sample.candidate.calls, "{sample:?}");
    assert!(
        sample
            .differences
            .iter()
            .any(|d| d.starts_with("outputs[0].payload/1")),
        "the shadow's call 1 was refused: {sample:?}"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_canary_sends_for_real_under_the_same_journal() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let settings = "mode = \"canary\"\npercent = 99\n";
    let routes = with_candidate(&env, &endpoint, settings, "");
    let host = env.host(&Timing::default(), &routes, "h").await;
    let key = (0..)
        .map(|i| format!("c{i}"))
        .find(|k| runs_on_candidate(k, 99))
        .unwrap();
    let url = format!("{}/hooks/notify", endpoint.base());
    let payload = json!({ "calls": [{ "url": url, "body": "c" }], "retry_first_attempt": true });
    env.publish(&format!("in.http.{key}"), &key, &[], payload.to_string())
        .await;
    env.wait_completed("http", &[&key], Duration::from_secs(60))
        .await;
    let record = env.claim("http", &key).await.unwrap();
    let digest = dedup_host::runtime::digest(&http_call_variant());
    assert_eq!(
        (record.digest.as_str(), record.attempt),
        (digest.as_str(), 2)
    );
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get(&format!("http.k.{key}.call.0")),
        Some(&1),
        "the canary sent once, its re-run replayed: {per_key:?}"
    );
    let story = tell(&env, &routes, &key).await;
    assert_eq!(story.calls[0].how, "replayed", "{:?}", story.calls);
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_fenced_route_journals_its_calls_in_its_stream_and_replays_them() {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    let endpoint = Endpoint::start().await;
    let routes =
        route(&endpoint, "").replace("allowed_outputs", "effects = \"fenced\"\nallowed_outputs");
    let host = env.host(&Timing::default(), &routes, "h").await;
    let url = format!("{}/hooks/notify", endpoint.base());
    let payload = json!({ "calls": [{ "url": url, "body": "f" }], "retry_first_attempt": true });
    env.publish("in.http.f1", "f1", &[], payload.to_string())
        .await;
    env.wait_completed("http", &["f1"], Duration::from_secs(60))
        .await;
    let got = output_of(&env, "f1").await;
    assert_eq!(got[0]["body"].as_str(), Some("ok 1"), "{got:?}");
    assert_eq!(endpoint.per_key().get("http.k.f1.call.0"), Some(&1));
    let subject = dedup_host::fenced::claim_subject("OUTPUTS", "http.k.f1") + ".call.0";
    let stream = env.js.get_stream("OUTPUTS").await.unwrap();
    let stored = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .expect("the call is journaled in the fenced stream");
    let record = CallRecord::from_bytes(&stored.payload).unwrap();
    assert_eq!(
        (record.state, record.response.map(|r| r.status)),
        (CallState::Sent, Some(201))
    );
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    assert!(
        kv.get("http.k.f1.call.0").await.unwrap().is_none(),
        "nothing in the claim bucket"
    );
    let story = tell(&env, &routes, "f1").await;
    assert_eq!(
        story.calls.iter().map(|c| c.how).collect::<Vec<_>>(),
        ["replayed"]
    );
    host.shutdown().await.unwrap();
}

/// Clearing a call record (what a replay does to a PENDING call) expects the sequence of the
/// record it read, in a fenced output stream and in the claim bucket alike: a record a run
/// wrote since (a host claimed the key between the read and the marker) is refused, named,
/// and kept.
#[tokio::test]
async fn clearing_a_fenced_call_record_is_refused_when_a_run_wrote_it_since() {
    let env = TestEnv::start().await;
    env.js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "FOUT".into(),
            subjects: vec![dedup_host::fenced::claim_subjects("FOUT")],
            ..Default::default()
        })
        .await
        .unwrap();
    let claim = dedup_host::fenced::claim_subject("FOUT", "http.k.k1");
    a_clear_expects_the_record_read(&env, &claim, &format!("{claim}.call.0")).await;
}

/// [`clearing_a_fenced_call_record_is_refused_when_a_run_wrote_it_since`] in the claim
/// bucket (a window route): a deletion marker, not a purge.
#[tokio::test]
async fn clearing_a_call_record_in_the_claim_bucket_is_refused_when_a_run_wrote_it_since() {
    let env = TestEnv::start().await;
    env.js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: BUCKET.into(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let subject = format!("$KV.{BUCKET}.http.k.k1.call.0");
    a_clear_expects_the_record_read(&env, "http.k.k1", &subject).await;
}

/// Writes call 0 of claim `store_key` twice on `subject` and clears it, first at the
/// sequence of the older record (refused), then at the newer one's.
async fn a_clear_expects_the_record_read(env: &TestEnv, store_key: &str, subject: &str) {
    use dedup_host::ops::calls::KeyCalls;
    let record = |state| CallRecord {
        index: 0,
        state,
        method: "POST".into(),
        url: "http://h/p".into(),
        body_digest: "sha256:0".into(),
        idempotency_key: "http.k.k1.call.0".into(),
        at_ms: 1,
        response: None,
        token: None,
    };
    let put = |r: CallRecord| {
        let (js, subject) = (env.js.clone(), subject.to_string());
        async move {
            let ack = js.publish(subject, r.to_bytes().into()).await.unwrap();
            ack.await.unwrap().sequence
        }
    };
    let read = put(record(CallState::Pending)).await;
    // A run of the key writes the call again after the operator's read.
    let written = put(record(CallState::Sent)).await;
    let calls = KeyCalls::of(&env.js, BUCKET, store_key);
    let refused = calls.clear_at(0, read).await.unwrap_err().to_string();
    assert!(
        refused.contains("changed since it was read") && refused.contains(subject),
        "{refused}"
    );
    let kept = calls.records().await.unwrap();
    assert_eq!(
        kept.iter().map(|r| r.state).collect::<Vec<_>>(),
        [CallState::Sent],
        "the run's record is kept"
    );
    calls
        .clear_at(0, written)
        .await
        .expect("the record read is cleared");
    assert!(calls.records().await.unwrap().is_empty());
}
