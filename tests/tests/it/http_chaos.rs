//! Chaos for outbound calls (issue 45): a host SIGSTOPped past its lease while its guests wait
//! inside calls to a slow endpoint, with many keys, on window and fenced routes. Another host
//! takes the keys over; then the stopped host wakes up, gets its answers, and must neither
//! record nor send anything more. With `on_unknown = "resend"` every idempotency key reaches
//! the endpoint at most twice and every completed key's call is there (once, counting by
//! key); with `"fail"` no key is ever sent twice.

use std::time::Duration;

use dedup_host::ops::story::{self, Target};
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::harness::{signal, stop_gracefully, wait_for, TestEnv, Timing};
use serde_json::json;

/// Keys in flight in the host that is stopped.
const STOPPED: usize = 12;
/// Keys published once the second host runs alone.
const LATER: usize = 4;

fn routes(endpoint: &Endpoint, policy: &str) -> String {
    let port = endpoint.port();
    format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{port}/hooks/*"]
on_unknown = "{policy}"
"#
    )
}

/// Publishes key `key`, whose one call is slow the first time its idempotency key is sent.
async fn publish(env: &TestEnv, endpoint: &Endpoint, key: &str) {
    let url = format!(
        "{}/hooks/{key}?delay_ms=5000&delay_first=1",
        endpoint.base()
    );
    let payload = json!({ "calls": [{ "url": url, "body": key }] });
    env.publish(&format!("in.http.{key}"), key, &[], payload.to_string())
        .await;
}

/// How one key ended.
#[derive(Debug, PartialEq)]
enum Ended {
    Completed,
    DeadLettered(String),
}

/// Runs the scenario; per key: how it ended and how many requests carried its call's
/// idempotency key.
async fn stopped_mid_calls(fenced: bool, policy: &str) -> Vec<(String, Ended, usize)> {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = fenced;
    let endpoint = Endpoint::start().await;
    let mut routes = routes(&endpoint, policy);
    if fenced {
        routes = routes.replace("allowed_outputs", "effects = \"fenced\"\nallowed_outputs");
    }
    let timing = Timing::default();
    let first = env.host_process(&timing, &routes, "first").await;
    let keys: Vec<String> = (0..STOPPED + LATER).map(|i| format!("c{i}")).collect();
    for key in &keys[..STOPPED] {
        publish(&env, &endpoint, key).await;
    }
    // Every call of the first batch has reached the endpoint (it answers in 5 s): the first
    // host waits inside all of them.
    wait_for(Duration::from_secs(60), "every first call sent", || async {
        (endpoint.seen().len() >= STOPPED).then_some(())
    })
    .await;
    signal(&first, "-STOP");
    let second = env.host(&timing, &routes, "second").await;
    for key in &keys[STOPPED..] {
        publish(&env, &endpoint, key).await;
    }
    let ended = |key: String| {
        let env = &env;
        async move {
            let record = env.claim("http", &key).await?;
            match record.state {
                dedup_host::claim::ClaimState::Completed => Some(Ended::Completed),
                dedup_host::claim::ClaimState::Failed if record.permanent => Some(
                    Ended::DeadLettered(record.reason.clone().unwrap_or_default()),
                ),
                _ => None,
            }
        }
    };
    wait_for(Duration::from_secs(120), "every key settled", || async {
        for key in &keys {
            ended(key.clone()).await?;
        }
        Some(())
    })
    .await;
    // The stopped host wakes up to its answers: its journal writes are refused, it sends
    // nothing more, publishes nothing, and leaves.
    signal(&first, "-CONT");
    stop_gracefully(first);
    let config = env.config(&timing, &routes);
    let per_key = endpoint.per_key();
    let mut out = Vec::new();
    for key in keys {
        let how = ended(key.clone()).await.expect("still settled");
        let story = story::tell(&env.js, &config, "http", Target::Key(key.clone()))
            .await
            .unwrap();
        if how == Ended::Completed {
            let call = story.calls.first().expect("the call is journaled");
            assert_eq!(
                (call.how, call.status),
                ("sent", Some(201)),
                "{key}: the journal holds the completing run's answer, not the stale host's: {:?}",
                story.calls
            );
            let subject = format!("in.http.{key}.done");
            let outputs = env.outputs().await;
            let stored = outputs.iter().filter(|m| m.subject.as_str() == subject);
            assert_eq!(stored.count(), 1, "{key}: one output");
        }
        let sent = per_key
            .get(&format!("http.k.{key}.call.0"))
            .copied()
            .unwrap_or(0);
        out.push((key, how, sent));
    }
    second.shutdown().await.unwrap();
    out
}

fn resent_at_most_twice(ended: &[(String, Ended, usize)]) {
    for (key, how, sent) in ended {
        assert_eq!(*how, Ended::Completed, "{key}: {ended:?}");
        assert!((1..=2).contains(sent), "{key} sent {sent} times: {ended:?}");
    }
    // The stopped host's calls were resent under their keys; the later ones went once.
    assert!(
        ended[..STOPPED].iter().all(|(_, _, sent)| *sent == 2),
        "{ended:?}"
    );
    assert!(
        ended[STOPPED..].iter().all(|(_, _, sent)| *sent == 1),
        "{ended:?}"
    );
}

fn never_twice(ended: &[(String, Ended, usize)]) {
    for (key, how, sent) in ended {
        assert!(*sent <= 1, "{key} sent {sent} times: {ended:?}");
        match how {
            Ended::Completed => assert_eq!(*sent, 1, "{key}: {ended:?}"),
            Ended::DeadLettered(why) => assert!(why.contains("outcome unknown"), "{key}: {why}"),
        }
    }
    // The stopped host's calls are of unknown outcome; the later ones completed.
    let unknown = ended[..STOPPED]
        .iter()
        .filter(|(_, how, _)| matches!(how, Ended::DeadLettered(_)))
        .count();
    assert_eq!(unknown, STOPPED, "{ended:?}");
    assert!(
        ended[STOPPED..]
            .iter()
            .all(|(_, how, _)| *how == Ended::Completed),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_host_stopped_inside_calls_has_them_resent_at_most_once_more_on_a_window_route() {
    resent_at_most_twice(&stopped_mid_calls(false, "resend").await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_has_them_resent_at_most_once_more_on_a_fenced_route() {
    resent_at_most_twice(&stopped_mid_calls(true, "resend").await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_never_has_them_sent_twice_under_fail_on_a_window_route() {
    never_twice(&stopped_mid_calls(false, "fail").await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_never_has_them_sent_twice_under_fail_on_a_fenced_route() {
    never_twice(&stopped_mid_calls(true, "fail").await);
}
