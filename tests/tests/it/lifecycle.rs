//! A host's life around its streams: set-up refuses streams it cannot trust, a deleted
//! consumer is re-created, and shutdown hands back what was pulled but not started.

use std::time::Duration;

use dedup_host::serve;
use dedup_host_tests::harness::{
    wait_for, TestEnv, Timing, CONSUMER, OUTPUTS, SOURCE, UPPER_ROUTE,
};

#[tokio::test]
async fn a_chained_route_needs_a_source_window_longer_than_a_rerun() {
    let env = TestEnv::start().await;
    // `first` publishes into the source stream, whose window is 2 minutes; a 60 s deadline
    // makes the longest gap between two runs of a key longer than that.
    let routes = r#"
[[routes]]
name = "first"
subject = "in.first.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.second.*"]
limits = { deadline = "60s" }
"#;
    // Refused at validation, before anything is created (it used to be found by `run`, after
    // the stream was made with the short window).
    let text = env.config_text(&Timing::default(), routes);
    let err = dedup_host::config::Config::parse(
        &text,
        std::path::Path::new("t.toml"),
        env.dir.path().into(),
    )
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("route `first`'s output subject `in.second.*` lands in the source stream, which keeps message ids for 120s"),
        "{err}"
    );
    assert!(err.contains("where no route takes it"), "{err}");
}

#[tokio::test]
async fn an_existing_stream_with_other_subjects_is_reported_not_bound() {
    let env = TestEnv::start().await;
    env.create_stream(OUTPUTS, &["elsewhere.>"]).await;
    let err = serve::start(env.config(&Timing::default(), UPPER_ROUTE))
        .await
        .err()
        .expect("refused");
    let shown = format!("{err:#}");
    assert!(
        shown.contains(&format!("stream `{OUTPUTS}`")) && shown.contains("elsewhere.>"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_consumer_is_re_created() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), UPPER_ROUTE, "h").await;
    env.publish("in.upper.a", "before", &[], "a").await;
    env.wait_completed("upper", &["before"], Duration::from_secs(20))
        .await;
    let stream = env.js.get_stream(SOURCE).await.unwrap();
    stream
        .delete_consumer(&format!("{CONSUMER}-upper"))
        .await
        .unwrap();
    env.publish("in.upper.b", "after", &[], "b").await;
    env.wait_completed("upper", &["after"], Duration::from_secs(30))
        .await;
    assert_eq!(env.messages(OUTPUTS).await.len(), 2);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_what_was_pulled_but_not_started() {
    let env = TestEnv::start().await;
    // A long ack wait: a message left unacked would wait 60 s for its redelivery.
    let timing = Timing {
        ack_wait: "60s",
        ..Timing::default()
    };
    let routes = r#"
[[routes]]
name = "slow"
subject = "in.slow.*"
component = "{guest:hostile}"
allowed_outputs = ["in.slow.*.done"]
concurrency = 1
max_in_flight = 1
"#;
    let first = env.host(&timing, routes, "first").await;
    for i in 0..3 {
        env.publish(
            &format!("in.slow.m{i}"),
            &format!("m{i}"),
            &[],
            "sleep:1500",
        )
        .await;
    }
    wait_for(
        Duration::from_secs(20),
        "the first message running",
        || async { env.claim("slow", "m0").await },
    )
    .await;
    first.shutdown().await.unwrap();
    let second = env.host(&timing, routes, "second").await;
    env.wait_completed("slow", &["m0", "m1", "m2"], Duration::from_secs(20))
        .await;
    second.shutdown().await.unwrap();
}
