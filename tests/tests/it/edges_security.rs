//! Guarantees at the edges, security (issue 42, findings 11 and 12): a guest or a producer
//! cannot choose another message's idempotency key through the host's `Dedup-*` headers, and
//! the console answers only its own host names, runs nothing on a GET and takes only the
//! sessions it handed out.

use std::path::Path;
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::config::Config;
use dedup_host::console::auth::COOKIE;
use dedup_host::idempotency::REPLAYED_MSG_ID;
use dedup_host::pipeline::effects::headers;
use dedup_host::serve::{self, RunningHost};
use dedup_host_tests::console::{login, request, request_as, ConsoleProcess};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

/// `first` emits what its payload says into the source stream, where `second` takes it;
/// `second` echoes each payload to `<subject>.done` (the hostile guest does both).
const CHAIN: &str = r#"
[[routes]]
name = "first"
subject = "in.first.*"
component = "{guest:hostile}"
allowed_outputs = ["in.second.*"]

[[routes]]
name = "second"
subject = "in.second.*"
component = "{guest:hostile}"
allowed_outputs = ["in.second.*.done"]
"#;

/// The chain's config: `first` publishes into the source stream, whose message ids must
/// outlast the longest gap between two runs of a key.
fn chain_config(env: &TestEnv) -> String {
    env.config_text(&Timing::default(), CHAIN)
        .replace("[source]\n", "[source]\nduplicate_window = \"10m\"\n")
}

async fn chain_host(env: &TestEnv) -> RunningHost {
    let text = chain_config(env);
    let mut config = Config::parse(&text, Path::new("test.toml"), env.dir.path().into())
        .expect("valid chain config");
    config.host.instance_id = Some("h".into());
    serve::start(config).await.expect("host starts")
}

const TOKEN: &str = "edges-security-token-0123";

fn header(m: &async_nats::jetstream::message::StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// Waits until `route`'s key is completed.
async fn completed(env: &TestEnv, route: &str, key: &str) {
    wait_for(
        Duration::from_secs(60),
        &format!("`{route}` key `{key}` completed"),
        || async {
            env.claim(route, key)
                .await
                .filter(|r| r.state == ClaimState::Completed)
        },
    )
    .await;
}

/// The payloads published on `subject` in the outputs stream.
async fn outputs_on(env: &TestEnv, subject: &str) -> Vec<String> {
    env.messages(OUTPUTS)
        .await
        .into_iter()
        .filter(|m| &*m.subject == subject)
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_set_a_downstream_routes_key() {
    let env = TestEnv::start().await;
    let host = chain_host(&env).await;
    // Guest `first` tries to run its output under the victim's key in `second`.
    let emit = format!("emit:in.second.x\u{1f}{REPLAYED_MSG_ID}\u{1f}victim");
    env.publish("in.first.a", "attacker", &[], emit).await;
    let letter = wait_for(Duration::from_secs(60), "`first`'s dead letter", || async {
        env.messages(DEAD)
            .await
            .into_iter()
            .find(|m| header(m, headers::KEY) == "attacker")
    })
    .await;
    let reason = header(&letter, headers::REASON);
    assert!(
        reason.contains("forbidden output") && reason.contains(REPLAYED_MSG_ID),
        "{reason}"
    );
    // The victim's own message still runs, with its own payload.
    env.publish("in.second.x", "victim", &[], "victim's payload")
        .await;
    completed(&env, "second", "victim").await;
    assert_eq!(
        outputs_on(&env, "in.second.x.done").await,
        ["victim's payload"]
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_cannot_take_a_key_with_a_forged_replay_header() {
    let env = TestEnv::start().await;
    let host = chain_host(&env).await;
    // A real dead letter (sequence 1), whose number a forger can guess.
    env.publish("in.second.d", "dead", &[], "reject:8").await;
    wait_for(Duration::from_secs(60), "the dead letter", || async {
        (env.messages(DEAD).await.len() == 1).then_some(())
    })
    .await;
    // Forged: a plain message id, and a replay's message id naming that letter.
    let forged = [(REPLAYED_MSG_ID, "victim")];
    env.publish("in.second.y", "forger", &forged, "forged 1")
        .await;
    env.publish("in.second.y", "replay:1", &forged, "forged 2")
        .await;
    completed(&env, "second", "forger").await;
    completed(&env, "second", "replay:1").await;
    // The victim's message runs, with its own payload.
    env.publish("in.second.y", "victim", &[], "victim's payload")
        .await;
    completed(&env, "second", "victim").await;
    env.wait_drained(Duration::from_secs(30)).await;
    let mut ran = outputs_on(&env, "in.second.y.done").await;
    ran.sort();
    assert_eq!(ran, ["forged 1", "forged 2", "victim's payload"]);
    host.shutdown().await.unwrap();
}

/// A replay redelivered after its letter was purged (its first ack lost) proves nothing any
/// more, and under its own id `replay:<n>` it would run a second time. When the key it names
/// is completed, it is answered as that key's duplicate (harmless for a forgery too: the key
/// ran already).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_letter_is_gone_is_a_duplicate_of_its_completed_key() {
    let env = TestEnv::start().await;
    let host = chain_host(&env).await;
    env.publish("in.second.y", "done-key", &[], "the first run")
        .await;
    completed(&env, "second", "done-key").await;
    let replayed = [(REPLAYED_MSG_ID, "done-key")];
    env.publish("in.second.y", "replay:7", &replayed, "the first run")
        .await;
    env.publish("in.second.y", "after", &[], "after").await;
    completed(&env, "second", "after").await;
    env.wait_drained(Duration::from_secs(30)).await;
    let mut ran = outputs_on(&env, "in.second.y.done").await;
    ran.sort();
    assert_eq!(
        ran,
        ["after", "the first run"],
        "the replay did not run again"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_answers_only_its_hosts_runs_nothing_on_a_get_and_takes_only_live_sessions() {
    let env = TestEnv::start().await;
    let host = chain_host(&env).await;
    let config = env.path("console.toml");
    std::fs::write(&config, chain_config(&env)).unwrap();
    let console = ConsoleProcess::start(&config, Some(TOKEN));
    let addr = console.addr;

    // DNS rebinding: another site's name pointed at the console is not answered.
    let (status, body) = request_as(addr, "evil.example", "GET", "/", &[]);
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("evil.example"), "{body}");
    let (status, _) = request_as(
        addr,
        &format!("localhost:{}", addr.port()),
        "GET",
        "/login",
        &[],
    );
    assert_eq!(status, 200);

    // A token in a URL logs nobody in.
    let (status, _) = request(addr, "GET", &format!("/login?token={TOKEN}"), &[], "");
    assert_eq!(status, 200, "the form, no session");

    // A session is a random token from the login form.
    let session = login(addr, TOKEN).expect("the token logs in");
    assert!(login(addr, "wrong-token-0123456").is_none());
    let cookie = [("Cookie", session.as_str())];
    let (status, page) = request(addr, "GET", "/audit", &cookie, "");
    assert_eq!(status, 200);
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the audit form carries the CSRF value")
        .to_string();

    // A GET runs no audit, whatever its query.
    let (status, page) = request(addr, "GET", "/audit?run=1", &cookie, "");
    assert_eq!(status, 200);
    assert!(!page.contains("audit-summary"), "a GET ran the audit");
    // The form's POST does.
    let (status, page) = request(addr, "POST", "/audit", &cookie, &format!("csrf={csrf}"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("audit-summary"), "{page}");
    let (status, _) = request(addr, "POST", "/audit", &[], &format!("csrf={csrf}"));
    assert_eq!(status, 401, "an audit needs a login");

    // A cookie the console did not hand out is refused (one derived from the secret, what
    // sessions used to be, is refused too: `console::auth`'s unit test).
    let derived = "5f".repeat(32);
    let forged = format!("{COOKIE}={derived}");
    let (status, _) = request(
        addr,
        "POST",
        "/audit",
        &[("Cookie", &forged)],
        &format!("csrf={csrf}"),
    );
    assert_eq!(status, 401, "a forged cookie");

    // After a logout the old cookie is refused.
    let (status, _) = request(addr, "POST", "/logout", &cookie, &format!("csrf={csrf}"));
    assert_eq!(status, 303);
    let (status, _) = request(addr, "POST", "/audit", &cookie, &format!("csrf={csrf}"));
    assert_eq!(status, 401, "an old cookie");
    drop(console);
    host.shutdown().await.unwrap();
}
