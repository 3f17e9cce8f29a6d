//! Operating a host: `/metrics` after a known workload, `/readyz` across start-up, serving
//! and SIGTERM, JSON logs and trace context. The operator's commands are in `repairs.rs`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dedup_host::claim::key;
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{http_get, wait_for, TestEnv, Timing, BUCKET, DEAD, OUTPUTS};
use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};

/// An uppercase route keyed by header, and a hostile one.
pub(crate) const ROUTES: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
key = { header = "Idem-Key" }

[[routes]]
name = "bad"
subject = "in.bad.*"
component = "{guest:hostile}"
allowed_outputs = ["in.bad.*.done"]
"#;

type Exposition = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

/// The value of one series (a histogram's count), or 0 when the series is absent.
fn value(e: &Exposition, family: &str, labels: &[(&str, &str)]) -> f64 {
    let family = e
        .families
        .get(family)
        .unwrap_or_else(|| panic!("no family `{family}`"));
    for s in family.iter_samples() {
        let set = s.get_labelset().expect("labels");
        if labels
            .iter()
            .all(|(k, v)| set.get_label_value(k) == Some(*v))
        {
            return match &s.value {
                OpenMetricsValue::Counter(c) => c.value.as_f64(),
                OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
                OpenMetricsValue::Histogram(h) => h.count.unwrap_or(0) as f64,
                other => panic!("unexpected value {other:?}"),
            };
        }
    }
    0.0
}

fn scrape(addr: SocketAddr) -> Exposition {
    let (status, body) = http_get(addr, "/metrics").expect("scrape");
    assert_eq!(status, 200);
    openmetrics_parser::openmetrics::parse_openmetrics(&body)
        .expect("the scrape parses as OpenMetrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_known_workload_per_route_and_layer() {
    let env = TestEnv::start().await;
    // A route with nothing deployed in the object store: its messages wait, and the poller
    // sees them.
    let idle = format!("{ROUTES}\n[[routes]]\nname = \"idle\"\nsubject = \"in.idle.*\"\n");
    let mut config = env.config(&Timing::default(), &idle);
    config.host.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    config.host.instance_id = Some("metered".into());
    let host = dedup_host::serve::start(config).await.expect("host starts");
    let addr = host.metrics_addr().expect("metrics served");

    for i in 0..5 {
        env.publish(
            &format!("in.upper.e{i}"),
            &format!("m{i}"),
            &[("Idem-Key", &format!("k{i}"))],
            "hi",
        )
        .await;
    }
    // Two producer retries under new message ids: caught by the claim.
    for i in 0..2 {
        env.publish(
            &format!("in.upper.e{i}"),
            &format!("m{i}-again"),
            &[("Idem-Key", &format!("k{i}"))],
            "hi",
        )
        .await;
    }
    // A repeat of a message id: caught by the stream, never delivered.
    assert!(
        env.publish("in.upper.e0", "m0", &[("Idem-Key", "k0")], "hi")
            .await
    );
    env.publish("in.bad.x", "b1", &[], "reject:malformed").await;
    env.publish("in.bad.y", "b2", &[], "panic").await;
    env.wait_completed(
        "upper",
        &["k0", "k1", "k2", "k3", "k4"],
        Duration::from_secs(20),
    )
    .await;
    // A re-run after the record was lost: its output is a duplicate for the output stream.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    kv.purge(key::encode("upper", "k4")).await.unwrap();
    env.publish("in.upper.e4", "m4-rerun", &[("Idem-Key", "k4")], "hi")
        .await;
    env.wait_completed("upper", &["k4"], Duration::from_secs(20))
        .await;
    env.wait_drained(Duration::from_secs(30)).await;

    let m = scrape(addr);
    let upper = |outcome| {
        value(
            &m,
            "dedup_messages",
            &[("route", "upper"), ("outcome", outcome)],
        )
    };
    assert_eq!(upper("processed"), 6.0);
    assert_eq!(upper("duplicate"), 2.0);
    assert_eq!(upper("dead_lettered"), 0.0);
    let bad = |outcome| {
        value(
            &m,
            "dedup_messages",
            &[("route", "bad"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        bad("dead_lettered"),
        2.0,
        "the rejection, and the panic after its last attempt"
    );
    assert_eq!(
        bad("retried"),
        4.0,
        "the panic, retried until out of attempts"
    );
    let hits = |route, layer| value(&m, "dedup_hits", &[("route", route), ("layer", layer)]);
    assert_eq!(hits("upper", "claim"), 2.0);
    assert_eq!(hits("upper", "output"), 1.0);
    assert_eq!(hits("upper", "stream"), 0.0);
    assert_eq!(value(&m, "dedup_outputs", &[("route", "upper")]), 6.0);
    assert_eq!(
        value(
            &m,
            "dedup_traps",
            &[("route", "bad"), ("trap", "guest trap")]
        ),
        5.0
    );
    assert_eq!(value(&m, "dedup_guest_seconds", &[("route", "upper")]), 6.0);
    assert!(value(&m, "dedup_claim_write_seconds", &[("route", "upper")]) >= 8.0);
    assert!(value(&m, "dedup_end_to_end_seconds", &[("route", "upper")]) >= 8.0);
    assert_eq!(value(&m, "dedup_in_flight", &[("route", "upper")]), 0.0);
    assert_eq!(
        value(&m, "dedup_free_guest_slots", &[("route", "upper")]),
        16.0
    );
    assert_eq!(value(&m, "dedup_deploys", &[("route", "upper")]), 1.0);
    assert_eq!(
        value(&m, "dedup_consumer_bound", &[("route", "upper")]),
        1.0
    );
    let serving = &m.families["dedup_serving_info"];
    assert_eq!(
        serving.iter_samples().count(),
        2,
        "one version per served route"
    );
    // The consumer poller reports the waiting messages within its interval.
    for i in 0..3 {
        env.publish(&format!("in.idle.e{i}"), &format!("i{i}"), &[], "x")
            .await;
    }
    wait_for(Duration::from_secs(15), "pending polled", || async {
        let m = scrape(addr);
        (value(&m, "dedup_consumer_pending", &[("route", "idle")]) == 3.0).then_some(())
    })
    .await;
    assert_eq!(
        value(
            &scrape(addr),
            "dedup_consumer_ack_pending",
            &[("route", "upper")]
        ),
        0.0
    );
    let stats = host.shutdown().await.unwrap();
    assert_eq!(
        (stats.processed, stats.duplicates),
        (6, 2),
        "one source of truth"
    );
}

/// Starts `dedup-host run` with `extra` flags; its stderr is piped for the caller.
fn run_host(env: &TestEnv, routes: &str, extra: &[&str]) -> Child {
    let path = env.path("host.toml");
    std::fs::write(&path, env.config_text(&Timing::default(), routes)).unwrap();
    Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&path)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup-host run")
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_goes_503_200_503_across_a_refused_start_serving_and_sigterm_and_logs_are_json() {
    let env = TestEnv::start().await;
    let component = env.path("slow.wasm");
    std::fs::copy(guest("hostile"), &component).unwrap();
    let routes = format!(
        r#"
[[routes]]
name = "slow"
subject = "in.slow.*"
component = "{}"
allowed_outputs = ["in.slow.*.done"]
"#,
        component.display()
    );
    // The route's contract on the server differs from this config (another host's config
    // recorded it): the host starts refusing the route. (A component that can never be
    // served stops `run` at start instead: `edges_operator`.)
    let path = env.path("host.toml");
    std::fs::write(&path, env.config_text(&Timing::default(), &routes)).unwrap();
    let config = dedup_host::config::Config::load(&path).unwrap();
    let contracts = dedup_host::contract::open(&env.js, &config).await.unwrap();
    let wanted = dedup_host::contract::of(&config, &config.routes[0]);
    let record = |contract| {
        let record = dedup_host::contract::ContractRecord {
            contract,
            recorded_by: "another host".into(),
            recorded_ms: 0,
            deployment: None,
            consumer: None,
            subjects: None,
        };
        serde_json::to_vec(&record).unwrap()
    };
    let mut other = wanted.clone();
    other.forever = !other.forever;
    contracts.put("slow", record(other).into()).await.unwrap();
    let addr = free_addr();
    let mut child = run_host(
        &env,
        &routes,
        &["--metrics-addr", &addr.to_string(), "--log-format", "json"],
    );
    let stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });

    let body = wait_for(Duration::from_secs(30), "/readyz answering 503", || async {
        match http_get(addr, "/readyz") {
            Some((503, body)) if body.contains("route `slow`") => Some(body),
            _ => None,
        }
    })
    .await;
    let missing: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(missing["ready"], false);
    assert!(
        missing["missing"][0]
            .as_str()
            .unwrap()
            .contains("route `slow`"),
        "{body}"
    );
    assert_eq!(
        http_get(addr, "/healthz").unwrap().0,
        200,
        "alive while not ready"
    );

    // The contract becomes this config's (what `setup --change-route` records).
    contracts.put("slow", record(wanted).into()).await.unwrap();
    wait_for(Duration::from_secs(30), "/readyz answering 200", || async {
        (http_get(addr, "/readyz")?.0 == 200).then_some(())
    })
    .await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    env.publish(
        "in.slow.a",
        "s1",
        &[("traceparent", traceparent)],
        "sleep-reject:3000",
    )
    .await;
    env.publish("in.slow.b", "s2", &[("traceparent", traceparent)], "hello")
        .await;
    wait_for(Duration::from_secs(20), "the output", || async {
        (!env.messages(OUTPUTS).await.is_empty()).then_some(())
    })
    .await;
    let output = &env.messages(OUTPUTS).await[0];
    assert_eq!(
        output.headers.get("traceparent").map(|v| v.as_str()),
        Some(traceparent),
        "trace context carried to outputs"
    );
    // The slow message is running: SIGTERM must turn /readyz to 503 while it drains.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    wait_for(
        Duration::from_secs(5),
        "/readyz answering 503 while draining",
        || async {
            let (status, body) = http_get(addr, "/readyz")?;
            (status == 503 && body.contains("shutting down")).then_some(())
        },
    )
    .await;
    assert!(child.wait().unwrap().success());

    let letters = env.messages(DEAD).await;
    assert_eq!(
        letters.len(),
        1,
        "the slow rejection was dead-lettered during the drain"
    );
    assert_eq!(
        letters[0].headers.get("traceparent").map(|v| v.as_str()),
        Some(traceparent),
        "trace context carried to dead letters"
    );
    let lines = lines.join().unwrap();
    let dead_lettering = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("dead-lettering"))
        })
        .unwrap_or_else(|| panic!("no JSON dead-lettering line in {lines:#?}"));
    let span = &dead_lettering["span"];
    assert_eq!(span["route"], "slow");
    assert_eq!(span["key"], "s1");
    assert_eq!(span["attempt"], 1);
    assert!(span["fencing_token"].as_u64().is_some(), "{span}");
    assert!(
        span["digest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{span}"
    );
    assert_eq!(span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
}
