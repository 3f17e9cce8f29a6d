//! A host with many routes: the instance pool is one host-wide resource the routes share, its
//! memories reserved for the largest configured limit, and an instance the pool has no room
//! for is made on demand instead of refused (issue 44).

use std::time::Duration;

use dedup_host::bindings::Event;
use dedup_host::runtime::engine::PoolTotals;
use dedup_host::runtime::{pool_overflows, EngineSettings, InvokeOptions, Outcome, Runtime};
use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, OUTPUTS};

/// Routes in the big host: half the server's default limit of 1,000 consumers per stream
/// (every route has its own durable consumer, plus one for unrouted subjects).
const ROUTES: usize = 500;

/// `n` routes on the uppercase guest at default settings: route `rI` takes `in.rI.*`.
fn routes(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[routes]]\nname = \"r{i}\"\nsubject = \"in.r{i}.*\"\ncomponent = \"{{guest:uppercase}}\"\nallowed_outputs = [\"in.r{i}.*.done\"]\n"
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_500_routes_starts_and_serves_every_route() {
    let env = TestEnv::start().await;
    let mut config = env.config(&Timing::default(), &routes(ROUTES));
    // The harness narrows concurrency for small machines; this host keeps the default.
    config.host.concurrency = dedup_host::config::DEFAULT_CONCURRENCY;
    config.host.instance_id = Some("scale".into());
    let pool = config.pool();
    assert!(
        pool.reserved_bytes() < 1 << 40,
        "the pool reserves {} GiB",
        pool.reserved_bytes() >> 30
    );
    let host = dedup_host::serve::start(config)
        .await
        .expect("a host with 500 routes starts");
    for i in 0..ROUTES {
        env.publish(
            &format!("in.r{i}.k"),
            &format!("m{i}"),
            &[],
            format!("hello {i}"),
        )
        .await;
    }
    let stream = env.js.get_stream(OUTPUTS).await.expect("output stream");
    wait_for(
        Duration::from_secs(120),
        "one output from each of the 500 routes",
        || {
            let mut stream = stream.clone();
            async move {
                let n = stream.info().await.ok()?.state.messages;
                (n >= ROUTES as u64).then_some(())
            }
        },
    )
    .await;
    let outputs = env.outputs().await;
    let mut subjects: Vec<String> = outputs.iter().map(|m| m.subject.to_string()).collect();
    subjects.sort();
    subjects.dedup();
    assert_eq!(subjects.len(), ROUTES, "one output per route");
    for i in [0, ROUTES / 2, ROUTES - 1] {
        let out = outputs
            .iter()
            .find(|m| m.subject.as_str() == format!("in.r{i}.k.done"))
            .unwrap_or_else(|| panic!("route r{i} answered"));
        assert_eq!(&out.payload[..], format!("HELLO {i}").as_bytes());
    }
    env.wait_completed("r499", &["m499"], Duration::from_secs(30))
        .await;
    drop(host);
}

#[tokio::test]
async fn an_instance_the_pool_has_no_room_for_is_made_on_demand() {
    // A pool with no component-instance slot: every instance overflows it.
    let runtime = Runtime::new(&EngineSettings {
        pool: PoolTotals {
            component_instances: 0,
            ..PoolTotals::for_instances(1)
        },
        ..EngineSettings::default()
    })
    .expect("runtime");
    let handler = runtime.load_file(&guest("uppercase")).expect("load");
    let before = pool_overflows();
    let event = Event {
        subject: "in.x.k".into(),
        payload: b"hello".to_vec(),
        headers: Vec::new(),
        key: "k".into(),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: 1,
        route: "x".into(),
    };
    let invocation = handler.invoke(event, &InvokeOptions::default()).await;
    let Outcome::Success(outputs) = invocation.outcome else {
        panic!("expected success on demand: {:?}", invocation.outcome)
    };
    assert_eq!(outputs[0].payload, b"HELLO");
    assert!(pool_overflows() > before, "the overflow is counted");
    // A trial instantiation of a new version overflows the same way.
    handler
        .probe(&InvokeOptions::default())
        .await
        .expect("a probe on demand");
}

/// `setup --dry-run` names the server's consumer limit when the config's routes would pass it
/// (counting the consumers already on the stream), with how to go past it; `setup` then
/// refuses before creating anything. The stream's own `max_consumers` keeps the case small.
#[tokio::test]
async fn setup_dry_run_names_the_consumer_limit_the_routes_would_pass() {
    let env = TestEnv::start().await;
    let text = env.config_text(&Timing::default(), &routes(4));
    let config = env.config(&Timing::default(), &routes(4));
    let stream = env
        .js
        .create_stream(async_nats::jetstream::stream::Config {
            name: config.source.stream.clone(),
            subjects: config.source_subjects(),
            max_consumers: 5,
            ..Default::default()
        })
        .await
        .expect("source stream");
    stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("another-team".into()),
            ..Default::default()
        })
        .await
        .expect("another team's consumer");
    let own = dedup_host::consumer_limit::wanted(&config)[0].1.len();
    assert!(own <= 5, "the routes alone fit: {own} consumers");
    let path = env.path("limit.toml");
    std::fs::write(&path, text).unwrap();
    let setup = |extra: &[&str]| {
        let out = std::process::Command::new(dedup_host_tests::guests::host_binary())
            .args(["setup", "--config"])
            .arg(&path)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stderr) = setup(&["--dry-run"]);
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "stream `{}` would hold {} consumers ({own} for this config's routes and partitions, 1 already there for others), past the server's limit of 5 (the stream's max_consumers",
        config.source.stream,
        own + 1
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains("several source streams"), "{stderr}");
    let (code, stderr) = setup(&[]);
    assert_eq!(code, Some(1), "{stderr}");
    let info = env
        .js
        .get_stream(&config.source.stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .consumer_count;
    assert_eq!(info, 1, "setup created no consumer: {stderr}");
}
