//! Routes cannot starve each other: a route whose guests hold as much of the instance pool as
//! they may, or whose guests sleep by the dozen, leaves its neighbours their instances and
//! their long-running lanes, with no dead letters and no missed deadlines of their own.

use std::time::Duration;

use dedup_host::pipeline::effects::headers;
use dedup_host::serve::{self, RunningHost};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS, UPPER_ROUTE};

fn timing() -> Timing {
    Timing {
        max_deliver: 2,
        ..Timing::default()
    }
}

/// A host with one long-running lane, so any convoy on it shows.
async fn host(env: &TestEnv, routes: &str) -> RunningHost {
    let mut config = env.config(&timing(), routes);
    config.host.instance_id = Some("h".into());
    config.host.long_running_lanes = Some(1);
    serve::start(config).await.expect("host starts")
}

/// Dead letters of `route`.
async fn dead_of(env: &TestEnv, route: &str) -> usize {
    env.messages(DEAD)
        .await
        .iter()
        .filter(|m| m.headers.get(headers::ROUTE).map(|v| v.as_str()) == Some(route))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_holding_its_whole_pool_share_leaves_the_neighbours_theirs() {
    let env = TestEnv::start().await;
    let routes = r#"
[[routes]]
name = "hog"
subject = "in.hog.*"
component = "{guest:pool-hog}"
concurrency = 16
limits = { deadline = "3s" }

"#
    .to_string()
        + UPPER_ROUTE;
    let host = host(&env, &routes).await;
    for i in 0..16 {
        env.publish("in.hog.x", &format!("hog-{i}"), &[], "x").await;
    }
    // Every hog slot holds eight memories now.
    wait_for(Duration::from_secs(20), "the hogs running", || async {
        (env.claim("hog", "hog-15").await.is_some()).then_some(())
    })
    .await;
    let keys: Vec<String> = (0..40).map(|i| format!("up-{i}")).collect();
    for key in &keys {
        env.publish("in.upper.x", key, &[], "abc").await;
    }
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("upper", &keys, Duration::from_secs(30))
        .await;
    assert_eq!(dead_of(&env, "upper").await, 0);
    assert_eq!(env.messages(OUTPUTS).await.len(), keys.len());
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_long_runners_do_not_hold_the_lanes() {
    let env = TestEnv::start().await;
    let routes = r#"
[[routes]]
name = "sleepers"
subject = "in.sleepers.*"
component = "{guest:hostile}"
concurrency = 64
max_in_flight = 64
limits = { deadline = "20s" }

[[routes]]
name = "worker"
subject = "in.worker.*"
component = "{guest:hostile}"
concurrency = 4
limits = { deadline = "2s" }
"#;
    let host = host(&env, routes).await;
    // Each sleeper computes long enough to need a lane, then sleeps 3 s in the host.
    let sleepers: Vec<String> = (0..64).map(|i| format!("s-{i}")).collect();
    for key in &sleepers {
        env.publish("in.sleepers.x", key, &[], "spin-sleep:5:3000")
            .await;
    }
    wait_for(Duration::from_secs(20), "the sleepers running", || async {
        (env.claim("sleepers", "s-63").await.is_some()).then_some(())
    })
    .await;
    // 50 ms of computing each, with a 2 s deadline: they need the lane while 64 others sleep.
    let workers: Vec<String> = (0..10).map(|i| format!("w-{i}")).collect();
    for key in &workers {
        env.publish("in.worker.x", key, &[], "spin-sleep:50:0")
            .await;
    }
    let workers: Vec<&str> = workers.iter().map(String::as_str).collect();
    env.wait_completed("worker", &workers, Duration::from_secs(30))
        .await;
    for key in &workers {
        let record = env.claim("worker", key).await.unwrap();
        assert_eq!(record.attempt, 1, "no missed deadline: {record:?}");
    }
    // Sleeping at once, not one after another on the lane (64 x 3 s).
    let sleepers: Vec<&str> = sleepers.iter().map(String::as_str).collect();
    env.wait_completed("sleepers", &sleepers, Duration::from_secs(40))
        .await;
    assert_eq!(
        dead_of(&env, "worker").await + dead_of(&env, "sleepers").await,
        0
    );
    host.shutdown().await.unwrap();
}

/// Why each route's component was refused, as the host reports it in the status bucket.
async fn refusals(env: &TestEnv) -> Vec<(String, String)> {
    let Ok(store) = env.js.get_key_value("dedup-hosts-EVENTS").await else {
        return Vec::new();
    };
    let hosts = dedup_host::components::status::read_all(&store)
        .await
        .unwrap_or_default();
    hosts
        .into_iter()
        .flat_map(|h| h.routes.into_iter())
        .filter_map(|(route, s)| Some((route, s.refused?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiling_is_bounded_per_route_and_never_holds_up_the_others() {
    let env = TestEnv::start().await;
    let routes = r#"
[[routes]]
name = "huge"
subject = "in.huge.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.huge.*.done"]
max_component_bytes = 1000

[[routes]]
name = "slow"
subject = "in.slow.*"
component = "{guest:conformance-python}"
allowed_outputs = ["in.slow.*.done"]
compile_timeout = "1us"
"#
    .to_string()
        + UPPER_ROUTE;
    let host = host(&env, &routes).await;
    env.publish("in.upper.x", "served", &[], "abc").await;
    env.publish("in.huge.x", "waits", &[], "abc").await;
    env.wait_completed("upper", &["served"], Duration::from_secs(30))
        .await;
    let refused = wait_for(Duration::from_secs(30), "both refusals", || async {
        let r = refusals(&env).await;
        (r.len() == 2).then_some(r)
    })
    .await;
    let reason = |route: &str| {
        refused
            .iter()
            .find(|(r, _)| r == route)
            .map(|(_, why)| why.clone())
            .unwrap_or_default()
    };
    assert!(
        reason("huge").contains("over route `huge`'s max_component_bytes of 1000"),
        "{refused:?}"
    );
    assert!(
        reason("slow").contains("took more than route `slow`'s compile_timeout"),
        "{refused:?}"
    );
    // A refused route is not served: its message waits in the stream, nothing is lost.
    assert!(env.claim("huge", "waits").await.is_none());
    assert_eq!(dead_of(&env, "huge").await, 0);
    host.shutdown().await.unwrap();
}
