//! The console role's writes (issue 47): the console keeps the writes its pages make, under
//! its own user, and a write its user may not make is named on the page with the fix.

use std::path::Path;
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::console::{request, ConsoleProcess};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD};

use super::{as_user, config_file, server_conf_without, setup_as_operator, Deployment};

/// The route whose handler rejects every message (`sleep-reject:0`): a dead letter to replay.
const FIXME_ROUTE: &str = r#"
[[routes]]
name = "fixme"
subject = "in.fixme.*"
component = "{guest:hostile}"
allowed_outputs = ["in.fixme.*.done"]
limits = { deadline = "1s" }
"#;

/// The console keeps the writes its pages make (a replay republishes and resets the claim,
/// under the console's own user, not the operator's); one its user may not make shows, on
/// the page, the refused subject and the fix, not a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_write_its_user_may_not_make_names_the_subject_and_the_fix() {
    const TOKEN: &str = "console-token-for-the-test";
    let timing = Timing::default();
    let scratch = TestEnv::start().await;
    let deployment = Deployment::new(&as_user(&scratch.config_text(&timing, FIXME_ROUTE), "any"));
    // The replay's republish on the source subjects, taken out of the console's set.
    let conf = server_conf_without(&deployment.file, "console", Some("in.*.*"));
    drop(scratch);
    let env = TestEnv::start_with_conf(&conf, "admin", "pw").await;
    let text = env.config_text(&timing, FIXME_ROUTE);
    setup_as_operator(&env, &text);
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let host = dedup_host::serve::start(config).await.expect("host starts");
    env.publish("in.fixme.k1", "f1", &[], "sleep-reject:0")
        .await;
    wait_for(Duration::from_secs(60), "the dead letter of f1", || async {
        (!env.messages(DEAD).await.is_empty()).then_some(())
    })
    .await;

    let console = ConsoleProcess::start(&config_file(&env, &text, "con"), Some(TOKEN));
    let access = dedup_host::console::auth::Access::new(
        &dedup_host::config::ConsoleConfig {
            token: Some(TOKEN.into()),
            ..Default::default()
        },
        |_| None,
        console.addr,
    )
    .unwrap();
    let bearer = format!("Bearer {TOKEN}");
    let (status, page) = request(
        console.addr,
        "POST",
        "/letters/replay",
        &[("Authorization", bearer.as_str())],
        &format!("route=fixme&confirmed=yes&csrf={}", access.csrf()),
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("permissions violation") && page.contains("grant `in.fixme.k1`"),
        "the refused subject and the fix: {page}"
    );
    assert!(page.contains("dedup-host permissions"), "{page}");
    drop(console);
    host.shutdown().await.unwrap();
}

/// Two writes at once, each on its own connection (as the console makes them): the refusal
/// the server sent one is reported by that one only, never by the other.
#[tokio::test]
async fn a_refusal_is_reported_by_the_connection_it_was_sent_to_only() {
    use dedup_host::refusals::Refusals;
    let (env, text) = super::restricted(FIXME_ROUTE, false, None).await;
    let config = Config::parse(
        &as_user(&text, "con"),
        Path::new("con.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let (refused, other) = (Refusals::own(), Refusals::own());
    let started = std::time::Instant::now();
    let a = dedup_host::connect::connect_observed(&config, "write a", refused.clone())
        .await
        .unwrap();
    let _b = dedup_host::connect::connect_observed(&config, "write b", other.clone())
        .await
        .unwrap();
    // No role may publish here: the server refuses `a` and says so on its connection.
    a.publish("not.granted.subject", "x".into()).await.unwrap();
    a.flush().await.unwrap();
    let denied = wait_for(Duration::from_secs(30), "a's refusal", || async {
        refused.since(started)
    })
    .await;
    assert_eq!(denied.subject, "not.granted.subject");
    let failed = other.explain(anyhow::anyhow!("b failed on its own"), started);
    assert_eq!(format!("{failed:#}"), "b failed on its own");
    assert_eq!(other.since(started), None);
}
