//! The console's grants for the writes its pages make (issue 47), each used through the
//! console's HTTP endpoints (bearer login and CSRF value, as a browser's form sends them) under
//! exactly the console role's printed set, against a real host: a dead letter's replay that
//! clears a PENDING outbound call (the claim bucket's purge on a window route; on a fenced
//! route, the fenced claim subjects, where a marker clears the call: no purge of the fenced
//! stream), and a candidate's promote and abort (the component store's purge of the old
//! chunks).
//!
//! Each test takes its grant out of the console's set when `DEDUP_TEST_CONSOLE_WITHOUT` names
//! it (the check that the test fails without it), and [`server_conf_without`] fails if the
//! printed set no longer holds it.

use std::path::Path;
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::config::{Config, ConsoleConfig};
use dedup_host::console::auth::Access;
use dedup_host::ops::story::{self, Target};
use dedup_host_tests::console::{request, ConsoleProcess};
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guests::{cli, guest};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD};
use serde_json::json;

use super::{as_user, config_file, server_conf_without, setup_as_operator, violations, Deployment};

const TOKEN: &str = "console-grants-token";

/// A server whose users hold their printed sets (the console's without `missing`), for the
/// deployment of `routes`; returns it and the deployment's config text.
async fn restricted_console(
    routes: &str,
    fenced: bool,
    timing: &Timing,
    missing: Option<&str>,
) -> (TestEnv, String) {
    let mut scratch = TestEnv::start().await;
    scratch.fenced_outputs = fenced;
    let deployment = Deployment::new(&as_user(&scratch.config_text(timing, routes), "any"));
    let conf = server_conf_without(&deployment.file, "console", missing);
    drop(scratch);
    let mut env = TestEnv::start_with_conf(&conf, "admin", "pw").await;
    env.fenced_outputs = fenced;
    let text = env.config_text(timing, routes);
    (env, text)
}

/// `grant`, when `DEDUP_TEST_CONSOLE_WITHOUT` names it: the console's set without it, to
/// see the test fail.
fn missing_of(grant: &str) -> Option<&str> {
    let without = std::env::var("DEDUP_TEST_CONSOLE_WITHOUT").ok()?;
    (without == grant).then_some(grant)
}

/// A host of the deployment, connected as the host role.
async fn host(env: &TestEnv, text: &str) -> dedup_host::serve::RunningHost {
    let config = Config::parse(
        &as_user(text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    dedup_host::serve::start(config)
        .await
        .expect("the host starts")
}

/// Posts `form` to the console's `path` as the token's holder (bearer and CSRF value);
/// returns the page.
fn post(console: &ConsoleProcess, path: &str, form: &str) -> String {
    let access = Access::new(
        &ConsoleConfig {
            token: Some(TOKEN.into()),
            ..Default::default()
        },
        |_| None,
        console.addr,
    )
    .unwrap();
    let bearer = format!("Bearer {TOKEN}");
    let body = format!("{form}&csrf={}", access.csrf());
    let (status, page) = request(
        console.addr,
        "POST",
        path,
        &[("Authorization", bearer.as_str())],
        &body,
    );
    assert_eq!(status, 200, "POST {path}: {page}");
    page
}

/// Route `http` (the `http-call` guest), calls to the endpoint's `/hooks/` timing out after
/// 1 s; fenced effects when `fenced`.
fn http_route(endpoint: &Endpoint, fenced: bool) -> String {
    let effects = if fenced { "effects = \"fenced\"\n" } else { "" };
    format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:http-call}}"
{effects}allowed_outputs = ["in.http.*.done"]

[routes.http]
allow = ["http://127.0.0.1:{}/hooks/*"]
timeout = "1s"
# At most once: a PENDING call the replay did not clear dead-letters the key again.
on_unknown = "fail"
"#,
        endpoint.port()
    )
}

/// Key `k1` of route `http` is dead-lettered with call 0 answered and call 1 left PENDING
/// (its first request outlasts the timeout); the console replays it: the PENDING call is
/// cleared, sent again under the same idempotency key, and the key completes once.
async fn a_replay_clears_a_pending_call(fenced: bool, grant: &str) {
    let endpoint = Endpoint::start().await;
    let timing = Timing {
        max_deliver: 1,
        ..Timing::default()
    };
    let routes = http_route(&endpoint, fenced);
    let (env, text) = restricted_console(&routes, fenced, &timing, missing_of(grant)).await;
    setup_as_operator(&env, &text);
    let host = host(&env, &text).await;
    let base = endpoint.base();
    let calls = json!([
        { "url": format!("{base}/hooks/a"), "body": "a" },
        { "url": format!("{base}/hooks/b?delay_ms=4000&delay_first=1"), "body": "b" },
    ]);
    let payload = json!({ "calls": calls, "retry_on_error": true });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    wait_for(Duration::from_secs(60), "k1 dead-lettered", || async {
        let record = env.claim("http", "k1").await?;
        let failed = record.state == ClaimState::Failed && record.permanent;
        (failed && !env.messages(DEAD).await.is_empty()).then_some(())
    })
    .await;
    let config = Config::parse(&text, Path::new("admin.toml"), env.dir.path().into()).unwrap();
    let told = story::tell(&env.js, &config, "http", Target::Key("k1".into()))
        .await
        .expect("k1's story");
    let how: Vec<&str> = told.calls.iter().map(|c| c.how).collect();
    assert_eq!(how, ["sent", "pending"], "{:?}", told.calls);

    let console = ConsoleProcess::start(&config_file(&env, &text, "con"), Some(TOKEN));
    let page = post(&console, "/letters/replay", "route=http&confirmed=yes");
    assert!(
        page.contains("<td class=\"result\">replayed</td>")
            && page.contains("1 call(s) of unknown outcome cleared"),
        "the replay cleared the PENDING call: {page}"
    );
    env.wait_completed("http", &["k1"], Duration::from_secs(60))
        .await;
    let outputs: Vec<String> = env
        .outputs()
        .await
        .iter()
        .map(|m| m.subject.to_string())
        .collect();
    let done = outputs.iter().filter(|s| *s == "in.http.k1.done").count();
    assert_eq!(done, 1, "one output of k1: {outputs:?}");
    let per_key = endpoint.per_key();
    assert_eq!(
        (
            per_key.get("http.k.k1.call.0"),
            per_key.get("http.k.k1.call.1")
        ),
        (Some(&1), Some(&2)),
        "call 0 replayed from the journal, call 1 sent again once: {per_key:?}"
    );
    drop(console);
    host.shutdown().await.unwrap();
    assert_eq!(violations(&env), Vec::<String>::new());
}

/// On a window route the PENDING call is in the claim bucket: the replay resets the claim
/// and clears the call by a deletion marker on its subject, both within the bucket's
/// subjects (the console holds no purge of the bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_replays_a_window_key_with_a_pending_call_within_its_set() {
    a_replay_clears_a_pending_call(false, "$KV.claims.>").await;
}

/// On a fenced route the claim and its calls are in the fenced output stream: the replay
/// resets the claim there and clears the PENDING call by a marker on its subject (the
/// console holds no purge of the stream, which would reach the outputs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_replays_a_fenced_key_with_a_pending_call_within_its_set() {
    a_replay_clears_a_pending_call(true, "_dedup.claims.OUTPUTS.>").await;
}

/// A route served from the component store.
const STORED_ROUTE: &str = r#"
[[routes]]
name = "ledger"
subject = "in.ledger.*"
allowed_outputs = ["in.ledger.*.done"]
"#;

/// The digest a `deploy` printed (the last `sha256:` it names).
fn deployed(config: &Path, args: &[&str]) -> String {
    let out = cli(config, args);
    assert_eq!(out.code, 0, "dedup-host {args:?}: {out:?}");
    let printed = format!("{} {}", out.stdout, out.stderr);
    let digest = printed
        .split_whitespace()
        .rfind(|t| t.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("no digest printed: {printed}"));
    digest.trim_end_matches(['.', ',', ')']).to_string()
}

/// A shadow candidate promoted from the console, and a second one aborted there: each
/// rewrites the component store (and purges the old chunks) under the console's own user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_promotes_and_aborts_candidates_within_its_set() {
    let grant = "$JS.API.STREAM.PURGE.OBJ_dedup-components-EVENTS";
    let timing = Timing::default();
    let (env, text) = restricted_console(STORED_ROUTE, false, &timing, missing_of(grant)).await;
    let operator = setup_as_operator(&env, &text);
    let path = |name: &str| guest(name).display().to_string();
    let live = deployed(
        &operator,
        &[
            "deploy",
            "--route",
            "ledger",
            "--component",
            &path("uppercase"),
        ],
    );
    let host = host(&env, &text).await;
    let console = ConsoleProcess::start(&config_file(&env, &text, "con"), Some(TOKEN));
    let form = |digest: &str| {
        format!(
            "route=ledger&digest={}&confirmed=yes",
            digest.replace(':', "%3A")
        )
    };

    let next = deployed(
        &operator,
        &["deploy", "--route", "ledger", "--shadow", &path("flaky")],
    );
    assert_ne!(next, live);
    let page = post(&console, "/deploys/promote", &form(&next));
    assert!(
        page.contains(&format!("every host now serves {next}")),
        "promoted: {page}"
    );

    let again = deployed(
        &operator,
        &[
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            &path("uppercase"),
        ],
    );
    let page = post(&console, "/deploys/abort", &form(&again));
    assert!(
        page.contains("dropped; the live version runs every key"),
        "aborted: {page}"
    );
    drop(console);
    host.shutdown().await.unwrap();
    assert_eq!(violations(&env), Vec::<String>::new());
}
