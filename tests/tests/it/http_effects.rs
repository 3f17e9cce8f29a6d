//! Outbound HTTP from guests (issue 45): the allowlist and its error codes, the limits, and
//! the journal that makes a re-run replay a call instead of sending it again, against a real
//! local HTTP endpoint ([`Endpoint`], counting requests per idempotency key) and, for the
//! journal, a real nats-server.

use std::sync::Arc;
use std::time::Duration;

use dedup_delivery::journal::{CallRecord, CallState};
use dedup_host::claim::journal::NatsCallStore;
use dedup_host::claim::ClaimState;
use dedup_host::pipeline::effects::headers;
use dedup_host::runtime::http::CallResult;
use dedup_host::runtime::InvokeOptions;
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guest_calls::{error, grant, run, Results};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, DEAD};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn the_allowlist_lets_named_endpoints_through_and_refuses_the_rest_with_an_error_code() {
    // A name that resolves to a loopback address, allowed as if it were a public host.
    std::env::set_var("DEDUP_HOST_TEST_RESOLVE", "public.example.test=127.0.0.1");
    let endpoint = Endpoint::start().await;
    let (base, port) = (endpoint.base(), endpoint.port());
    let results = Results::default();
    let allow = format!(
        r#"allow = ["http://127.0.0.1:{port}/hooks/*", {{ url = "http://127.0.0.1:{port}/redirect", methods = ["GET"] }}, "http://public.example.test:*/"]"#
    );
    let options = InvokeOptions {
        http: Some(grant(&allow, &results)),
        ..InvokeOptions::default()
    };
    let got = run(
        &options,
        json!([
            { "url": format!("{base}/hooks/a"), "body": "hello" },
            { "url": format!("{base}/other") },
            { "url": format!("{base}/redirect"), "method": "POST" },
            { "url": format!("{base}/redirect"), "method": "GET" },
            { "url": format!("http://public.example.test:{port}/hooks/b") },
            { "url": format!("{base}/hooks/c"), "headers": [["Idempotency-Key", "mine"]] },
        ]),
    )
    .await;
    assert_eq!(
        (got[0]["status"].as_u64(), got[0]["body"].as_str()),
        (Some(201), Some("ok 1")),
        "{got:?}"
    );
    assert!(
        error(&got[1]).contains("HttpRequestDenied"),
        "a path outside the prefix: {got:?}"
    );
    assert!(
        error(&got[2]).contains("HttpRequestDenied"),
        "a method the rule does not allow: {got:?}"
    );
    assert_eq!(
        got[3]["status"].as_u64(),
        Some(302),
        "the redirect is the guest's answer: {got:?}"
    );
    assert!(
        error(&got[4]).contains("DestinationIpProhibited"),
        "a public name resolving to loopback: {got:?}"
    );
    assert!(
        error(&got[5]).contains("Forbidden"),
        "the guest cannot set the idempotency key: {got:?}"
    );
    let seen = endpoint.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/hooks/a", "/redirect"],
        "nothing refused reached the endpoint, the redirect was not followed"
    );
    assert_eq!(
        seen[0].key.as_deref(),
        Some("http.k.k1.call.0"),
        "the host sets the idempotency key"
    );
    assert_eq!(seen[0].body, "hello");
    use CallResult::*;
    assert_eq!(
        *results.lock().unwrap(),
        [Sent, Denied, Denied, Sent, Prohibited]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_and_a_route_without_a_grant_refuse_calls_with_an_error_code() {
    let endpoint = Endpoint::start().await;
    let (base, port) = (endpoint.base(), endpoint.port());
    let results = Results::default();
    let settings = format!(
        "allow = [\"http://127.0.0.1:{port}/\"]\ntimeout = \"500ms\"\nmax_calls = 3\nmax_request_bytes = 10\nmax_response_bytes = 100\n"
    );
    let options = InvokeOptions {
        http: Some(grant(&settings, &results)),
        ..InvokeOptions::default()
    };
    let got = run(
        &options,
        json!([
            { "url": format!("{base}/hooks/a"), "body": "more than ten bytes" },
            { "url": format!("{base}/big?bytes=1000"), "method": "GET" },
            { "url": format!("{base}/slow?ms=5000"), "method": "GET" },
            { "url": format!("{base}/hooks/d") },
        ]),
    )
    .await;
    assert!(error(&got[0]).contains("HttpRequestBodySize"), "{got:?}");
    assert!(error(&got[1]).contains("HttpResponseBodySize"), "{got:?}");
    assert!(error(&got[2]).contains("Timeout"), "{got:?}");
    assert!(error(&got[3]).contains("ConnectionLimitReached"), "{got:?}");
    use CallResult::*;
    assert_eq!(*results.lock().unwrap(), [Limit, Limit, Failed, Limit]);
    let paths: Vec<String> = endpoint.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        ["/big", "/slow"],
        "an oversized request is never sent"
    );

    let ungranted = run(
        &InvokeOptions::default(),
        json!([{ "url": format!("{base}/hooks/a") }]),
    )
    .await;
    assert!(
        error(&ungranted[0]).contains("HttpRequestDenied"),
        "{ungranted:?}"
    );
    assert_eq!(
        endpoint.seen().len(),
        2,
        "a route without a grant sends nothing"
    );
}

/// Route `http` running the `http-call` guest, allowed to call `endpoint`'s `/hooks/` and
/// `/slow`, with `extra` lines in its `[routes.http]`.
fn route(endpoint: &Endpoint, extra: &str) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*", "http://127.0.0.1:{port}/slow"]
{extra}
"#
    )
}

async fn dead_letter(env: &TestEnv) -> async_nats::jetstream::message::StreamMessage {
    wait_for(Duration::from_secs(60), "a dead letter", || async {
        env.messages(DEAD).await.pop()
    })
    .await
}

fn reason(letter: &async_nats::jetstream::message::StreamMessage) -> String {
    letter
        .headers
        .get(headers::REASON)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// The one output of key `key` (what its calls got).
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

#[tokio::test]
async fn a_re_run_replays_the_recorded_answer_instead_of_calling_again() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let host = env
        .host(&Timing::default(), &route(&endpoint, ""), "h")
        .await;
    let url = format!("{}/hooks/notify", endpoint.base());
    // Attempt 1 makes the call, then asks for a retry; attempt 2 runs the same call.
    let payload =
        json!({ "calls": [{ "url": url, "body": "send once" }], "retry_first_attempt": true });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    env.wait_completed("http", &["k1"], Duration::from_secs(60))
        .await;
    let got = output_of(&env, "k1").await;
    assert_eq!(
        (got[0]["status"].as_u64(), got[0]["body"].as_str()),
        (Some(201), Some("ok 1")),
        "the second run got the first run's answer: {got:?}"
    );
    assert_eq!(env.claim("http", "k1").await.unwrap().attempt, 2);
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get("http.k.k1.call.0"),
        Some(&1),
        "sent once across two runs: {per_key:?}"
    );
    let kv = env
        .js
        .get_key_value(dedup_host_tests::harness::BUCKET)
        .await
        .unwrap();
    let record = kv
        .get("http.k.k1.call.0")
        .await
        .unwrap()
        .expect("the call is journaled");
    let record = CallRecord::from_bytes(&record).expect("a call record");
    assert_eq!(
        (record.state, record.response.map(|r| r.status)),
        (CallState::Sent, Some(201))
    );
    let metrics = host.metrics().encode();
    for result in ["sent", "replayed"] {
        let counted = metrics.lines().any(|l| {
            l.starts_with("dedup_http_calls_total{")
                && l.contains(&format!("result=\"{result}\""))
                && l.ends_with(" 1")
        });
        assert!(counted, "one call {result}:\n{metrics}");
    }
    host.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_handler_whose_re_run_sends_another_body_is_dead_lettered_naming_the_call() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let host = env
        .host(&Timing::default(), &route(&endpoint, ""), "h")
        .await;
    let url = format!("{}/hooks/notify", endpoint.base());
    let call = json!({ "url": url, "body": "attempt", "attempt_in_body": true });
    let payload = json!({ "calls": [call], "retry_first_attempt": true });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    let letter = dead_letter(&env).await;
    let why = reason(&letter);
    assert!(
        why.contains("not deterministic") && why.contains("outbound call 0"),
        "{why}"
    );
    assert_eq!(
        endpoint.per_key().get("http.k.k1.call.0"),
        Some(&1),
        "the second body was never sent"
    );
    let record = env.claim("http", "k1").await.unwrap();
    assert_eq!((record.state, record.permanent), (ClaimState::Failed, true));
    host.shutdown().await.unwrap();
}

/// Kills a host with -9 while its guest waits inside a slow call, then lets a second host
/// take the key over; returns the endpoint's requests per idempotency key.
async fn killed_mid_call(env: &TestEnv, endpoint: &Endpoint, policy: &str) {
    let routes = route(endpoint, &format!("on_unknown = \"{policy}\""));
    let mut first = env.host_process(&Timing::default(), &routes, "first").await;
    let url = format!("{}/slow?ms=3000", endpoint.base());
    let payload = json!({ "calls": [{ "url": url, "body": "slow one" }] });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    wait_for(Duration::from_secs(60), "the call to arrive", || async {
        (!endpoint.seen().is_empty()).then_some(())
    })
    .await;
    signal(&first, "-KILL");
    first.wait().expect("the killed host is reaped");
    let second = env.host(&Timing::default(), &routes, "second").await;
    match policy {
        "resend" => {
            env.wait_completed("http", &["k1"], Duration::from_secs(90))
                .await
        }
        _ => {
            let letter = dead_letter(env).await;
            let why = reason(&letter);
            assert!(
                why.contains("outcome unknown") && why.contains("outbound call 0"),
                "{why}"
            );
        }
    }
    second.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_call_left_pending_by_a_killed_host_is_resent_under_the_same_key() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    killed_mid_call(&env, &endpoint, "resend").await;
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get("http.k.k1.call.0"),
        Some(&2),
        "resent once, same key: {per_key:?}"
    );
    assert_eq!(per_key.len(), 1, "{per_key:?}");
    let got = output_of(&env, "k1").await;
    assert_eq!(got[0]["body"].as_str(), Some("slow 2"), "{got:?}");
}

#[tokio::test]
async fn a_call_left_pending_by_a_killed_host_is_failed_for_an_operator_when_the_route_says_so() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    killed_mid_call(&env, &endpoint, "fail").await;
    assert_eq!(
        endpoint.per_key().get("http.k.k1.call.0"),
        Some(&1),
        "never sent twice"
    );
    let record = env.claim("http", "k1").await.unwrap();
    assert_eq!((record.state, record.permanent), (ClaimState::Failed, true));
}

#[tokio::test]
async fn a_stale_owner_cannot_write_the_journal() {
    use dedup_delivery::journal::{CallStore as _, JournalError};
    use dedup_host::claim::kv::KvClaimStore;
    use dedup_host::claim::{ClaimOutcome, ClaimStore as _, Claimer};
    let env = TestEnv::start().await;
    let kv = env
        .js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "journal".into(),
            history: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let store = Arc::new(KvClaimStore::new(kv));
    let claimer = Claimer::new(
        store.clone(),
        "a",
        Duration::from_secs(30),
        Duration::from_millis(200),
    );
    let ClaimOutcome::Acquired(lease) = claimer.claim("http.k.k9", "sha256:0").await.unwrap()
    else {
        panic!("the first claim wins");
    };
    let journal = |token| NatsCallStore::for_claim(&env.js, "journal", lease.key(), token);
    let record = |index| CallRecord {
        index,
        state: CallState::Pending,
        method: "POST".into(),
        url: "http://h/p".into(),
        body_digest: "sha256:0".into(),
        idempotency_key: format!("http.k.k9.call.{index}"),
        at_ms: 1,
        response: None,
        token: None,
    };
    let owner = journal(lease.fencing_token());
    owner
        .write(record(0))
        .await
        .expect("the owner records its call");
    let stamped = CallRecord {
        token: Some(lease.fencing_token()),
        ..record(0)
    };
    assert_eq!(
        owner.read(0).await.unwrap(),
        Some(stamped),
        "stored with the writer's token"
    );
    assert_eq!(
        journal(lease.fencing_token() + 1000).write(record(1)).await,
        Err(JournalError::Fenced),
        "another token is refused"
    );
    // Another host takes the key over: the first owner's next write is refused.
    let (mut taken, revision) = store.get(lease.key()).await.unwrap().unwrap();
    taken.owner = "b".into();
    taken.fencing_token = Some(revision + 1);
    let new_revision = store.update(lease.key(), &taken, revision).await.unwrap();
    assert_eq!(owner.write(record(1)).await, Err(JournalError::Fenced));
    assert_eq!(owner.read(1).await.unwrap(), None, "nothing was recorded");
    journal(new_revision)
        .write(record(1))
        .await
        .expect("the new owner records");
}

/// A pending call record of key `http.k.<key>` at `index`.
fn pending_record(key: &str, index: u32) -> CallRecord {
    CallRecord {
        index,
        state: CallState::Pending,
        method: "POST".into(),
        url: "http://h/p".into(),
        body_digest: "sha256:0".into(),
        idempotency_key: format!("http.k.{key}.call.{index}"),
        at_ms: 1,
        response: None,
        token: None,
    }
}

#[tokio::test]
async fn journal_writes_are_fenced_by_the_revision_the_lease_holds_without_reading_the_claim() {
    use dedup_delivery::journal::{CallStore as _, JournalError};
    use dedup_host::claim::kv::KvClaimStore;
    use dedup_host::claim::{ClaimOutcome, ClaimStore as _, Claimer};
    use futures::StreamExt as _;
    let env = TestEnv::start().await;
    let kv = env
        .js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "journal".into(),
            history: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let store = Arc::new(KvClaimStore::new(kv));
    let claimer = Claimer::new(
        store.clone(),
        "a",
        Duration::from_secs(30),
        Duration::from_millis(200),
    );
    let claim = |key: &'static str| {
        let claimer = &claimer;
        async move {
            match claimer.claim(&format!("http.k.{key}"), "sha256:0").await {
                Ok(ClaimOutcome::Acquired(lease)) => lease,
                _ => panic!("the first claim of {key} wins"),
            }
        }
    };
    let lease = claim("k1").await;
    // Everything this connection sends from now on, in order: reads of the stream among them.
    let client = env.js.client();
    let mut seen = client.subscribe(">").await.unwrap();
    let owner = NatsCallStore::for_claim(&env.js, "journal", lease.key(), lease.fencing_token())
        .held_at(lease.held_revision());
    owner
        .write(pending_record("k1", 0))
        .await
        .expect("recorded");
    lease.renew().await.expect("a heartbeat");
    owner
        .write(pending_record("k1", 1))
        .await
        .expect("recorded at the renewed revision");
    // Neither write read anything: one unfenced by a lease reads the claim once, and that is
    // the only read before a marker published after it.
    let unheld = NatsCallStore::for_claim(&env.js, "journal", lease.key(), lease.fencing_token());
    unheld
        .write(pending_record("k1", 2))
        .await
        .expect("recorded");
    client.publish("marker.end", "".into()).await.unwrap();
    let mut reads = 0;
    while let Some(m) = seen.next().await {
        let subject = m.subject.as_str();
        if subject == "marker.end" {
            break;
        }
        let read = subject.starts_with("$JS.API.STREAM.MSG.GET.")
            || subject.starts_with("$JS.API.DIRECT.GET.");
        reads += read as u32;
    }
    assert_eq!(
        reads, 1,
        "the unheld write read the claim; the held ones read nothing"
    );
    drop(seen);

    // The claim renewed by this run behind the lease's back (a heartbeat whose answer the
    // lease has not seen): refused at the held revision, read back once, ours, recorded.
    let (ours, revision) = store.get(lease.key()).await.unwrap().unwrap();
    store.update(lease.key(), &ours, revision).await.unwrap();
    owner
        .write(pending_record("k1", 3))
        .await
        .expect("our own renewal is told from a takeover");

    // Taken over by another host: refused, whatever revision the lease holds.
    let (mut taken, revision) = store.get(lease.key()).await.unwrap().unwrap();
    taken.owner = "b".into();
    taken.fencing_token = Some(revision + 1);
    store.update(lease.key(), &taken, revision).await.unwrap();
    assert_eq!(
        owner.write(pending_record("k1", 4)).await,
        Err(JournalError::Fenced),
        "a stale owner records nothing"
    );
    assert!(lease.renew().await.is_err(), "the lease sees the takeover");
    assert_eq!(
        lease.held_revision().get(),
        None,
        "a lost lease holds nothing"
    );
    assert_eq!(
        owner.write(pending_record("k1", 4)).await,
        Err(JournalError::Fenced)
    );
    assert_eq!(owner.read(4).await.unwrap(), None, "nothing was recorded");

    // A settled claim holds nothing either: nothing is recorded under it.
    let lease = claim("k2").await;
    let owner = NatsCallStore::for_claim(&env.js, "journal", lease.key(), lease.fencing_token())
        .held_at(lease.held_revision());
    lease.complete(Vec::new()).await.expect("completed");
    assert_eq!(
        owner.write(pending_record("k2", 0)).await,
        Err(JournalError::Fenced),
        "no call is recorded once the outcome is"
    );
}

/// A reload that takes `[routes.http]` away from a route whose served component makes calls
/// is refused, naming the route and the fix: carried over, the component would run with every
/// call denied and nothing saying why (a start refuses such a component).
#[tokio::test]
async fn a_reload_that_takes_http_away_from_a_calling_component_is_refused() {
    let env = TestEnv::start().await;
    let endpoint = Endpoint::start().await;
    let granted = route(&endpoint, "");
    let host = env.host(&Timing::default(), &granted, "h").await;
    // Served: one message runs (no call) before the reload.
    env.publish("in.http.k0", "k0", &[], json!({ "calls": [] }).to_string())
        .await;
    env.wait_completed("http", &["k0"], Duration::from_secs(60))
        .await;
    let ungranted = granted
        .split("[routes.http]")
        .next()
        .expect("the route's lines")
        .to_string();
    let mut config = env.config(&Timing::default(), &ungranted);
    config.host.instance_id = Some("h".into());
    let report = host.reload(Ok(config)).await;
    assert!(
        !report.applied
            && report.problems.iter().any(|p| p.contains("route `http`")
                && p.contains("wasi:http/outgoing-handler")
                && p.contains("[routes.http]")),
        "{:?}",
        report.problems
    );
    host.shutdown().await.unwrap();
}
