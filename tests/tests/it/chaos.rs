//! The chaos suite: three `dedup-host run` processes on a 3-node cluster (streams and claims at
//! three replicas) take a few thousand events, 30 % of them published again under new message
//! ids, while a host is killed and restarted, another is paused past its lease and resumed, and
//! a NATS node is killed and restarted. Afterwards the streams and the KV must show exactly one
//! output per key, every key completed, no dead letters, nothing pending or unacknowledged.
//! The same workload runs again with fenced effects and a 1 s duplicate window on the output
//! stream: the fence, not the window, keeps every output single.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{TestEnv, Timing, DEAD, OUTPUTS};

/// The chaos suite's route: the hostile guest, keyed by a header (also the network faults').
pub(crate) const ROUTES: &str = r#"
[[routes]]
name = "chaos"
subject = "in.chaos.*"
component = "{guest:hostile}"
key = { header = "Key" }
allowed_outputs = ["in.chaos.*.done"]
"#;

/// Distinct keys, and how many of the publishes repeat an earlier key.
const KEYS: usize = 2_000;
const DUPLICATE_SHARE: f64 = 0.3;
/// How long every key may take to settle once the faults stop.
const SETTLE_BOUND: Duration = Duration::from_secs(120);

fn timing() -> Timing {
    Timing {
        lease: "3s",
        heartbeat: "500ms",
        ack_wait: "4s",
        backoff: r#"["500ms"]"#,
        max_deliver: 10,
        ..Timing::default()
    }
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} failed");
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_through_host_kills_pauses_and_a_node_restart() {
    chaos(ROUTES.to_string(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_effects_stay_exactly_once_with_a_one_second_window() {
    let routes = format!("{ROUTES}effects = \"fenced\"\n");
    chaos(routes, true).await;
}

async fn chaos(routes: String, fenced: bool) {
    let routes = routes.as_str();
    let mut env = TestEnv::start_cluster().await;
    env.fenced_outputs = fenced;
    let timing = timing();
    let mut hosts: Vec<Child> = Vec::new();
    for i in 0..3 {
        hosts.push(
            env.host_process(&timing, routes, &format!("chaos-{i}"))
                .await,
        );
    }

    // Publishing runs through the faults: a key, and 30 % repeats of earlier keys.
    let publisher = {
        let env = PublishOnly { js: env.js.clone() };
        tokio::spawn(async move {
            let mut published = 0usize;
            let mut repeats = 0usize;
            let mut next = 0usize;
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            while next < KEYS {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let repeat = next > 0 && (seed % 1000) as f64 / 1000.0 < DUPLICATE_SHARE;
                let key = if repeat {
                    repeats += 1;
                    format!("k{}", seed as usize % next)
                } else {
                    next += 1;
                    format!("k{}", next - 1)
                };
                env.publish(&key, &format!("p{published}")).await;
                published += 1;
                // About 20 s of publishing, so the faults below hit work in flight.
                if published.is_multiple_of(100) {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                }
            }
            (published, repeats)
        })
    };

    tokio::time::sleep(Duration::from_secs(3)).await;
    // kill -9 a host, then start it again.
    stop(hosts.remove(0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    hosts.insert(0, env.host_process(&timing, routes, "chaos-0b").await);
    // Pause a host past its lease (3 s + skew), then let it go on.
    signal(&hosts[1], "-STOP");
    tokio::time::sleep(Duration::from_secs(5)).await;
    signal(&hosts[1], "-CONT");
    // kill -9 a NATS node, then restart it.
    env.servers.nodes[1].kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    env.servers.nodes[1].restart();
    let faults_over = Instant::now();

    let (published, repeats) = publisher.await.unwrap();
    // Settled: every key completed and nothing pending or unacknowledged. The cluster may
    // still be electing leaders after the restart, so reads that time out are tried again.
    let mut settled = None;
    let mut done = 0;
    while faults_over.elapsed() < SETTLE_BOUND {
        done = completed(&env, KEYS).await.unwrap_or(0);
        if done == KEYS && pending(&env).await == Some((0, 0)) {
            settled = Some(faults_over.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let Some(settled) = settled else {
        let pending = pending(&env).await;
        panic!("not settled within {SETTLE_BOUND:?} after the faults: {done} of {KEYS} keys completed, pending {pending:?}");
    };

    // Exactly one output per key.
    let mut outputs = read_stream(&env, OUTPUTS).await;
    // A fenced stream also holds the claim records.
    outputs.retain(|m| {
        !m.subject
            .starts_with(dedup_host::subject::FENCED_CLAIMS_PREFIX)
    });
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for m in &outputs {
        *per_key.entry(m.subject.to_string()).or_default() += 1;
    }
    let doubled: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "outputs published twice: {doubled:?}");
    assert_eq!(per_key.len(), KEYS, "one output for every key");
    assert!(read_stream(&env, DEAD).await.is_empty(), "no dead letters");

    let mut reruns = 0;
    for k in 0..KEYS {
        let record = env.claim("chaos", &format!("k{k}")).await.unwrap();
        assert_eq!(record.state, ClaimState::Completed);
        reruns += record.attempt.saturating_sub(1);
    }
    // The cross-layer audit agrees: nothing lost, stuck or doubled.
    let config = env.config(&timing, routes);
    let report = dedup_host::ops::audit::run(&env.js, &config, None)
        .await
        .unwrap();
    assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
    assert_eq!(report.completed, KEYS as u64);
    println!(
        "chaos: {published} publishes ({repeats} repeats of {KEYS} keys); settled {settled:.1?} after the faults; {reruns} re-runs"
    );
    for host in hosts {
        stop(host);
    }
}

/// Every message of a stream, read again until the cluster answers.
pub(crate) async fn read_stream(
    env: &TestEnv,
    stream: &str,
) -> Vec<async_nats::jetstream::message::StreamMessage> {
    loop {
        match dedup_host::inspect::stream_messages(&env.js, stream).await {
            Ok(m) => return m,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// How many of the keys `k0`..`k<keys>` of route `chaos` are completed, if the bucket (or
/// the fenced stream) answers.
pub(crate) async fn completed(env: &TestEnv, keys: usize) -> Option<usize> {
    if env.fenced_outputs {
        let claims = dedup_host::scan::fenced_claims(&env.js, OUTPUTS)
            .await
            .ok()?;
        let done = claims
            .values()
            .filter(|(r, _)| r.state == ClaimState::Completed);
        return Some(done.count());
    }
    let kv = env.js.get_key_value("claims").await.ok()?;
    let mut done = 0;
    for k in 0..keys {
        let key = dedup_host::claim::key::encode("chaos", &format!("k{k}"));
        if let Some(v) = kv.get(key).await.ok()? {
            let record = dedup_host::claim::ClaimRecord::from_bytes(&v).unwrap();
            done += usize::from(record.state == ClaimState::Completed);
        }
    }
    Some(done)
}

/// Pending and unacknowledged messages over the source stream's consumers, if it answers.
pub(crate) async fn pending(env: &TestEnv) -> Option<(u64, usize)> {
    use futures::StreamExt;
    let stream = env.js.get_stream("EVENTS").await.ok()?;
    let mut infos = stream.consumers();
    let (mut pending, mut unacked) = (0, 0);
    while let Some(info) = infos.next().await {
        let info = info.ok()?;
        pending += info.num_pending;
        unacked += info.num_ack_pending;
    }
    Some((pending, unacked))
}

/// The publishing half of a test environment, movable into a task.
pub(crate) struct PublishOnly {
    /// The test's JetStream context.
    pub(crate) js: async_nats::jetstream::Context,
}

impl PublishOnly {
    /// Publishes until the stream acknowledges (a node may be down meanwhile); the message
    /// id makes a repeat harmless.
    pub(crate) async fn publish(&self, key: &str, msg_id: &str) {
        let env = self;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id);
        headers.insert("Key", key);
        loop {
            let sent = env
                .js
                .publish_with_headers(
                    format!("in.chaos.{key}"),
                    headers.clone(),
                    "sleep:200".into(),
                )
                .await;
            if let Ok(ack) = sent {
                if ack.await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
