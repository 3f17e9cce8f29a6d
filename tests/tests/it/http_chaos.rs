//! Chaos for outbound calls (issue 45): a host SIGSTOPped past its lease, or killed with -9,
//! while its guests wait inside calls to a slow endpoint, with many keys, on window and fenced
//! routes, with Rust, Python and JavaScript guests. Another host takes the keys over; a
//! stopped host then wakes up, gets its answers, and must neither record nor send anything
//! more. With `on_unknown = "resend"` every idempotency key reaches the endpoint at most
//! twice, every completed key's call is there (once, counting by key) with one output, and
//! nothing is left pending or dead-lettered; with `"fail"` no key is ever sent twice.

use std::time::Duration;

use dedup_host::ops::story::{self, Target};
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::harness::{signal, stop_gracefully, wait_for, TestEnv, Timing, DEAD};
use serde_json::json;

/// How the first host is taken out while its guests wait inside calls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGSTOP past its lease; SIGCONT once the second host has settled every key.
    Stop,
    /// kill -9.
    Kill,
}

/// One run of the scenario.
struct Scenario {
    /// The `http-call` guest of a language (`http-call`, `http-call-python`, ...).
    guest: &'static str,
    fenced: bool,
    /// `on_unknown`.
    policy: &'static str,
    fault: Fault,
    /// Keys in flight in the first host when it is taken out.
    first: usize,
    /// Keys published once the second host runs alone.
    later: usize,
}

impl Scenario {
    /// A Rust guest's host SIGSTOPped with 12 keys in flight.
    fn stopped(fenced: bool, policy: &'static str) -> Self {
        Self {
            guest: "http-call",
            fenced,
            policy,
            fault: Fault::Stop,
            first: 12,
            later: 4,
        }
    }

    /// `guest`'s host killed with -9 with 6 keys in flight, on a window route, resending.
    fn killed(guest: &'static str) -> Self {
        Self {
            guest,
            fenced: false,
            policy: "resend",
            fault: Fault::Kill,
            first: 6,
            later: 2,
        }
    }
}

/// Per key, in publish order: how it ended and how many requests carried its call's
/// idempotency key; and how many keys were in flight in the first host.
struct Ran {
    keys: Vec<(String, Ended, usize)>,
    first: usize,
}

fn routes(endpoint: &Endpoint, guest: &str, policy: &str) -> String {
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

/// Runs the scenario.
async fn interrupted_mid_calls(scenario: Scenario) -> Ran {
    let Scenario {
        guest,
        fenced,
        policy,
        fault,
        first: in_flight,
        later,
    } = scenario;
    let mut env = TestEnv::start().await;
    env.fenced_outputs = fenced;
    let endpoint = Endpoint::start().await;
    let mut routes = routes(&endpoint, guest, policy);
    if fenced {
        routes = routes.replace("allowed_outputs", "effects = \"fenced\"\nallowed_outputs");
    }
    let timing = Timing::default();
    let mut first = env.host_process(&timing, &routes, "first").await;
    let keys: Vec<String> = (0..in_flight + later).map(|i| format!("c{i}")).collect();
    for key in &keys[..in_flight] {
        publish(&env, &endpoint, key).await;
    }
    // Every call of the first batch has reached the endpoint (it answers in 5 s): the first
    // host waits inside all of them.
    wait_for(Duration::from_secs(60), "every first call sent", || async {
        (endpoint.seen().len() >= in_flight).then_some(())
    })
    .await;
    match fault {
        Fault::Stop => signal(&first, "-STOP"),
        Fault::Kill => {
            first.kill().expect("kill -9");
            first.wait().expect("reaped");
        }
    }
    let second = env.host(&timing, &routes, "second").await;
    for key in &keys[in_flight..] {
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
    if fault == Fault::Stop {
        // The stopped host wakes up to its answers: its journal writes are refused, it sends
        // nothing more, publishes nothing, and leaves.
        signal(&first, "-CONT");
        stop_gracefully(first);
    }
    // Nothing stuck: every message acknowledged, by the second host.
    env.wait_drained(Duration::from_secs(60)).await;
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
    if policy == "resend" {
        // Nothing lost: no dead letter, and the cross-layer audit agrees (no anomaly, no
        // call left PENDING).
        assert!(env.messages(DEAD).await.is_empty(), "no dead letters");
        let report = dedup_host::ops::audit::run(&env.js, &config, None)
            .await
            .unwrap();
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.pending_calls, 0, "no call left PENDING");
    }
    second.shutdown().await.unwrap();
    Ran {
        keys: out,
        first: in_flight,
    }
}

fn resent_at_most_twice(ran: &Ran) {
    let (ended, first) = (&ran.keys, ran.first);
    for (key, how, sent) in ended {
        assert_eq!(*how, Ended::Completed, "{key}: {ended:?}");
        assert!((1..=2).contains(sent), "{key} sent {sent} times: {ended:?}");
    }
    // The first host's calls were resent under their keys; the later ones went once.
    assert!(
        ended[..first].iter().all(|(_, _, sent)| *sent == 2),
        "{ended:?}"
    );
    assert!(
        ended[first..].iter().all(|(_, _, sent)| *sent == 1),
        "{ended:?}"
    );
}

fn never_twice(ran: &Ran) {
    let (ended, first) = (&ran.keys, ran.first);
    for (key, how, sent) in ended {
        assert!(*sent <= 1, "{key} sent {sent} times: {ended:?}");
        match how {
            Ended::Completed => assert_eq!(*sent, 1, "{key}: {ended:?}"),
            Ended::DeadLettered(why) => assert!(why.contains("outcome unknown"), "{key}: {why}"),
        }
    }
    // The stopped host's calls are of unknown outcome; the later ones completed.
    let unknown = ended[..first]
        .iter()
        .filter(|(_, how, _)| matches!(how, Ended::DeadLettered(_)))
        .count();
    assert_eq!(unknown, first, "{ended:?}");
    assert!(
        ended[first..]
            .iter()
            .all(|(_, how, _)| *how == Ended::Completed),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_host_stopped_inside_calls_has_them_resent_at_most_once_more_on_a_window_route() {
    resent_at_most_twice(&interrupted_mid_calls(Scenario::stopped(false, "resend")).await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_has_them_resent_at_most_once_more_on_a_fenced_route() {
    resent_at_most_twice(&interrupted_mid_calls(Scenario::stopped(true, "resend")).await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_never_has_them_sent_twice_under_fail_on_a_window_route() {
    never_twice(&interrupted_mid_calls(Scenario::stopped(false, "fail")).await);
}

#[tokio::test]
async fn a_host_stopped_inside_calls_never_has_them_sent_twice_under_fail_on_a_fenced_route() {
    never_twice(&interrupted_mid_calls(Scenario::stopped(true, "fail")).await);
}

#[tokio::test]
async fn a_python_guests_host_killed_inside_calls_has_them_resent_at_most_once_more() {
    resent_at_most_twice(&interrupted_mid_calls(Scenario::killed("http-call-python")).await);
}

#[tokio::test]
async fn a_javascript_guests_host_killed_inside_calls_has_them_resent_at_most_once_more() {
    resent_at_most_twice(&interrupted_mid_calls(Scenario::killed("http-call-javascript")).await);
}
