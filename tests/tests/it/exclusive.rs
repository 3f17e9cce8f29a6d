//! Exclusive routes (`exclusive_by`): across three `dedup-host run` processes, the messages
//! of one entity never run at the same time and run in publish order, while other entities
//! run in parallel; also with a host killed -9 midway and a message failing twice; and
//! coalescing. The guest (`hostile`'s `probe:`) reports when it ran; the test reads those
//! reports from the output stream and would see any overlap.

use std::collections::{BTreeMap, HashSet};
use std::process::Child;
use std::time::{Duration, Instant};

use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{
    publish_raw, publish_unparseable, signal, wait_for, TestEnv, Timing, DEAD, OUTPUTS,
};
use futures::StreamExt;

const ENTITIES: usize = 40;
const EVENTS: usize = 25;

fn route(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "ex"
subject = "in.ex.*"
component = "{{guest:hostile}}"
exclusive_by = {{ subject_token = 2 }}
concurrency = 8
allowed_outputs = ["in.ex.*.done"]
{extra}
"#
    )
}

/// A server with route `ex` set up by `dedup-host setup` (no host serving it yet): the env,
/// its timing and the routes' config text.
async fn set_up_route() -> (TestEnv, Timing, String) {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let routes = route("");
    let path = env.path("setup.toml");
    std::fs::write(&path, env.config_text(&timing, &routes)).unwrap();
    let set_up = dedup_host_tests::guests::cli(&path, &["setup"]);
    assert_eq!(set_up.code, 0, "{}{}", set_up.stdout, set_up.stderr);
    (env, timing, routes)
}

/// One run as the guest reported it.
#[derive(Debug, Clone)]
struct Run {
    entity: String,
    sequence: u64,
    start: u64,
    end: u64,
}

async fn runs(env: &TestEnv) -> Vec<Run> {
    env.messages(OUTPUTS)
        .await
        .iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("a probe report");
            let subject = v["subject"].as_str().unwrap();
            Run {
                entity: subject.rsplit('.').next().unwrap().to_string(),
                sequence: v["sequence"].as_u64().unwrap(),
                start: v["start"].as_u64().unwrap(),
                end: v["end"].as_u64().unwrap(),
            }
        })
        .collect()
}

/// Publishes ENTITIES x EVENTS probes from four concurrent publishers, interleaved; the
/// publish order of an entity is its stream order. `special` gets a payload of its own.
async fn publish_workload(
    env: &TestEnv,
    special: Option<(&str, &str)>,
    pace: Option<Duration>,
) -> Vec<String> {
    let mut keys = Vec::new();
    let mut tasks = Vec::new();
    for publisher in 0..4 {
        let js = env.js.clone();
        let special = special.map(|(k, p)| (k.to_string(), p.to_string()));
        let mut mine = Vec::new();
        for event in 0..EVENTS {
            for entity in (publisher..ENTITIES).step_by(4) {
                mine.push((entity, event));
            }
        }
        keys.extend(mine.iter().map(|(e, n)| format!("e{e}-{n}")));
        tasks.push(tokio::spawn(async move {
            for (entity, event) in mine {
                let key = format!("e{entity}-{event}");
                let payload = match &special {
                    Some((k, p)) if *k == key => p.clone(),
                    _ => "probe:20".to_string(),
                };
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", key.as_str());
                js.publish_with_headers(format!("in.ex.e{entity}"), h, payload.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                if let Some(pace) = pace {
                    tokio::time::sleep(pace).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    keys
}

/// Per entity: runs never overlap, and their order is the publish order. Returns whether
/// runs of different entities overlapped (parallelism) and the serial time they add up to.
fn check_exclusive_and_ordered(runs: &[Run]) -> (bool, Duration) {
    let mut by_entity: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_entity.entry(&r.entity).or_default().push(r);
    }
    for (entity, runs) in &mut by_entity {
        runs.sort_by_key(|r| r.start);
        for pair in runs.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "{entity}: two runs overlap: {:?} and {:?}",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0].sequence < pair[1].sequence,
                "{entity}: sequence {} ran before {}, against publish order",
                pair[1].sequence,
                pair[0].sequence
            );
        }
    }
    let mut all: Vec<&Run> = runs.iter().collect();
    all.sort_by_key(|r| r.start);
    let parallel = all
        .windows(2)
        .any(|p| p[0].entity != p[1].entity && p[1].start < p[0].end);
    let serial = runs.iter().map(|r| r.end - r.start).sum::<u64>();
    (parallel, Duration::from_micros(serial))
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

async fn wait_all(env: &TestEnv, keys: &[String], within: Duration) {
    wait_for(within, "every key completed", || async {
        for key in keys {
            let record = env.claim("ex", key).await?;
            if record.state != ClaimState::Completed {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// What happens to the hosts while the workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Nothing.
    None,
    /// One host killed -9 midway, one message failing twice.
    Kill,
    /// Each host in turn paused (SIGSTOP) past the copier's pin and the source ack wait,
    /// then resumed, while messages keep coming: whichever host copies the route's messages
    /// onto its queue is paused once, another takes over, and the paused one wakes up holding
    /// messages it had not copied yet (`pipeline/copier.rs`).
    PauseEach,
}

async fn exclusive_workload(fault: Fault) {
    let faults = fault == Fault::Kill;
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let routes = route("");
    let mut hosts = Vec::new();
    for i in 0..3 {
        hosts.push(env.host_process(&timing, &routes, &format!("ex-{i}")).await);
    }
    let started = Instant::now();
    // One message of one entity fails twice before it succeeds.
    let special = faults.then_some(("e7-3", "probe:20:3"));
    let pace = (fault == Fault::PauseEach).then_some(Duration::from_millis(100));
    let publishing = publish_workload(&env, special, pace);
    let keys = if fault == Fault::PauseEach {
        let (keys, ()) = tokio::join!(publishing, async {
            for host in &hosts {
                tokio::time::sleep(Duration::from_millis(800)).await;
                signal(host, "-STOP");
                tokio::time::sleep(dedup_host::exclusive::COPIER_PIN_TTL + Duration::from_secs(2))
                    .await;
                signal(host, "-CONT");
            }
        });
        keys
    } else if faults {
        let (keys, ()) = tokio::join!(publishing, async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            let mut victim = hosts.remove(0);
            victim.kill().expect("kill -9");
            let _ = victim.wait();
        });
        keys
    } else {
        publishing.await
    };
    wait_all(&env, &keys, Duration::from_secs(90)).await;
    let elapsed = started.elapsed();
    let runs = runs(&env).await;
    assert_eq!(runs.len(), ENTITIES * EVENTS, "one output per key");
    let distinct: HashSet<u64> = runs.iter().map(|r| r.sequence).collect();
    assert_eq!(distinct.len(), runs.len(), "no key ran to an output twice");
    let (parallel, serial) = check_exclusive_and_ordered(&runs);
    assert!(parallel, "other entities ran in parallel");
    eprintln!(
        "exclusive ({:?}): {} runs in {elapsed:?}; the runs add up to {serial:?} (ratio {:.2})",
        fault,
        runs.len(),
        elapsed.as_secs_f64() / serial.as_secs_f64()
    );
    env.wait_drained(Duration::from_secs(30)).await;
    let config = env.config(&timing, &routes);
    let report = dedup_host::ops::audit::run(&env.js, &config, None)
        .await
        .unwrap();
    assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
    for h in hosts {
        stop(h);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_per_entity_at_a_time_in_publish_order_across_three_hosts() {
    exclusive_workload(Fault::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_and_ordered_through_a_killed_host_and_a_failing_message() {
    exclusive_workload(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_and_ordered_while_each_host_in_turn_is_paused_past_the_copiers_pin() {
    exclusive_workload(Fault::PauseEach).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_runs_the_first_and_the_last_update_and_few_between() {
    let env = TestEnv::start().await;
    let host = env
        .host(&Timing::default(), &route("coalesce = true"), "co")
        .await;
    // The first update is running (slowly) while the other 99 arrive.
    env.publish("in.ex.doc", "u0", &[], "probe:300").await;
    wait_for(
        Duration::from_secs(10),
        "the first update running",
        || async { env.claim("ex", "u0").await.map(|_| ()) },
    )
    .await;
    let mut keys = vec!["u0".to_string()];
    for i in 1..100 {
        let key = format!("u{i}");
        env.publish("in.ex.doc", &key, &[], "probe:300").await;
        keys.push(key);
    }
    wait_all(&env, &keys, Duration::from_secs(30)).await;
    let runs = runs(&env).await;
    let sequences: Vec<u64> = runs.iter().map(|r| r.sequence).collect();
    assert!(
        sequences.contains(&1),
        "the first update ran: {sequences:?}"
    );
    assert!(
        sequences.contains(&100),
        "the last update ran: {sequences:?}"
    );
    assert!(runs.len() < 10, "far fewer than 100 runs: {sequences:?}");
    let last = runs.iter().max_by_key(|r| r.end).unwrap();
    assert_eq!(last.sequence, 100, "the last state wins");
    check_exclusive_and_ordered(&runs);
    let metrics = host.metrics().encode();
    assert!(
        metrics.contains(&format!(
            r#"dedup_messages_total{{route="ex",outcome="coalesced"}} {}"#,
            100 - runs.len()
        )),
        "{metrics}"
    );
    host.shutdown().await.unwrap();
}

/// A coalesced key was skipped, not run: a later message with the same key (a producer's
/// retry, or a queue copy made again) is the newest of its entity and runs. It used to find
/// the key completed and be acked, so neither message ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_message_with_a_coalesced_key_still_runs() {
    let env = TestEnv::start().await;
    let routes = route("coalesce = true\nkey = { header = \"Idem-Key\" }");
    // A lease a loaded machine's pauses do not lapse: a first run dropped for a lapsed lease
    // would be retried behind the newer updates and rightly coalesced, and the test asks
    // that the first one runs.
    let timing = Timing {
        lease: "8s",
        ack_wait: "8s",
        ..Timing::default()
    };
    let host = env.host(&timing, &routes, "co-again").await;
    env.publish("in.ex.doc", "m0", &[("Idem-Key", "k0")], "probe:1000")
        .await;
    wait_for(
        Duration::from_secs(10),
        "the first update running",
        || async { env.claim("ex", "k0").await.map(|_| ()) },
    )
    .await;
    env.publish("in.ex.doc", "m1", &[("Idem-Key", "k1")], "probe:20")
        .await;
    env.publish("in.ex.doc", "m2", &[("Idem-Key", "k2")], "probe:20")
        .await;
    let keys = ["k0", "k1", "k2"].map(String::from);
    wait_all(&env, &keys, Duration::from_secs(30)).await;
    let ran: Vec<u64> = runs(&env).await.iter().map(|r| r.sequence).collect();
    assert_eq!(ran, [1, 3], "the second update was coalesced");
    // The producer sends the second update again, after every other: now it is the newest.
    env.publish("in.ex.doc", "m1-again", &[("Idem-Key", "k1")], "probe:20")
        .await;
    wait_for(Duration::from_secs(30), "the repeat run", || async {
        let ran: Vec<u64> = runs(&env).await.iter().map(|r| r.sequence).collect();
        (ran == [1, 3, 4]).then_some(())
    })
    .await;
    let k1 = env.claim("ex", "k1").await.unwrap();
    assert_eq!(k1.state, ClaimState::Completed);
    assert!(!k1.is_coalesced(), "{k1:?}");
    host.shutdown().await.unwrap();
}

#[test]
fn coalescing_without_an_entity_key_is_refused() {
    let text = format!(
        "[source]\nsubjects = [\"in.>\"]\n{}",
        route("coalesce = true").replace("exclusive_by = { subject_token = 2 }\n", "")
    )
    .replace("{guest:hostile}", "/dev/null");
    let err = dedup_host::config::Config::parse(
        &text,
        std::path::Path::new("t.toml"),
        std::env::temp_dir(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("routes[0].coalesce") && err.contains("set exclusive_by"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_provisions_the_queue_and_a_one_at_a_time_route_consumer() {
    let env = TestEnv::start().await;
    let path = env.path("setup.toml");
    std::fs::write(&path, env.config_text(&Timing::default(), &route(""))).unwrap();
    let run = || {
        let out = std::process::Command::new(dedup_host_tests::guests::host_binary())
            .args(["setup", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = run();
    assert_eq!(code, Some(0), "{text}");
    let mut queue = env.js.get_stream("EVENTS_EXCLUSIVE").await.unwrap();
    let config = queue.info().await.unwrap().config.clone();
    assert_eq!(
        (config.retention, config.subjects),
        (
            async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            vec!["dedup.exclusive.EVENTS.>".to_string()]
        )
    );
    let source = env.js.get_stream("EVENTS").await.unwrap();
    let consumer = source.consumer_info("hosts-ex").await.unwrap();
    // Its copier's window, handed to one pinned host.
    assert_eq!(
        (
            consumer.config.max_ack_pending,
            consumer.config.priority_groups
        ),
        (
            dedup_host::exclusive::COPY_WINDOW,
            vec!["copier".to_string()]
        )
    );
    let (code, text) = run();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        !text.contains("DIFFERS") && !text.contains("created"),
        "{text}"
    );
}

/// A takeover copies what the last copier left, read back from the source stream: a message
/// there whose header block does not parse (a producer's raw `HPUB`) is left to its own
/// delivery, which dead-letters it, and the route goes on. (Read back with async-nats's own
/// parse, it failed every takeover whose range held it: the ack floor stayed below it and the
/// route stopped for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_whose_range_holds_an_unparsable_message_goes_on() {
    let (env, timing, routes) = set_up_route().await;
    let mut keys = Vec::new();
    for i in 0..6 {
        if i == 3 {
            publish_unparseable(env.server().port(), "in.ex.e2");
        }
        let key = format!("k{i}");
        env.publish(&format!("in.ex.e{}", i % 2), &key, &[], "probe:5")
            .await;
        keys.push(key);
    }
    // A copier that took all seven and died: pulled under the group, never acked.
    let consumer: async_nats::jetstream::consumer::PullConsumer = (env.js.get_stream("EVENTS"))
        .await
        .unwrap()
        .get_consumer("hosts-ex")
        .await
        .unwrap();
    let mut pulled = (consumer.stream().group("copier"))
        .max_messages_per_batch(7)
        .messages()
        .await
        .unwrap();
    for _ in 0..7 {
        let next = tokio::time::timeout(Duration::from_secs(10), pulled.next());
        next.await.expect("delivered").unwrap().unwrap();
    }
    drop(pulled);

    let host = env.host_process(&timing, &routes, "ex-0").await;
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("ex", &keys, Duration::from_secs(90))
        .await;
    let letter = wait_for(
        Duration::from_secs(30),
        "the poison's dead letter",
        || async { env.messages(DEAD).await.pop() },
    )
    .await;
    assert_eq!(&letter.payload[..], b"poison");
    let runs = runs(&env).await;
    assert_eq!(runs.len(), 6, "one output per key");
    check_exclusive_and_ordered(&runs);
    stop(host);
}

/// A producer's raw header block that does not end in an empty line: nats-server appends its
/// pin id to each delivery to the route's copier after cutting the block's last two bytes, so
/// the pin runs into the last header (here the message id, the route's key, which would then
/// differ with every pin). The message is dead-lettered with a reason naming the cause and the
/// fix, not run under a mangled key; the other messages run once each, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_block_the_servers_pin_runs_into_is_dead_lettered_not_run() {
    let (env, timing, routes) = set_up_route().await;
    let host = env.host_process(&timing, &routes, "ex-0").await;
    let mut keys = Vec::new();
    for i in 0..6 {
        if i == 3 {
            let block = b"NATS/1.0\r\nNats-Msg-Id: mangled\r\n";
            publish_raw(env.server().port(), "in.ex.e1", block, b"probe:5");
        }
        let key = format!("k{i}");
        env.publish(&format!("in.ex.e{}", i % 2), &key, &[], "probe:5")
            .await;
        keys.push(key);
    }
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("ex", &keys, Duration::from_secs(90))
        .await;
    let letter = wait_for(
        Duration::from_secs(30),
        "the mangled message's dead letter",
        || async { env.messages(DEAD).await.pop() },
    )
    .await;
    let reason = (letter.headers.get("Dedup-Reason"))
        .map(|v| v.to_string())
        .unwrap_or_default();
    assert!(
        reason.contains("does not end in an empty line"),
        "the letter says why: {reason}"
    );
    let runs = runs(&env).await;
    assert_eq!(
        runs.len(),
        6,
        "one output per key, none for the mangled message"
    );
    check_exclusive_and_ordered(&runs);
    stop(host);
}
