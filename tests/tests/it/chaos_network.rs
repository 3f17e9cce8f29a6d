//! The chaos suite's network faults: a 3-node cluster and three `dedup-host run` processes,
//! each in a network namespace of its own ([`dedup_host_tests::netlab`]), under faults a real
//! network has and a process kill does not show:
//! - a host cut off from every node for twice the lease, then healed (window and fenced);
//! - a minority node cut off from the rest of its cluster while a host is connected to it;
//! - 200 ms ± 50 ms of latency and 10 % packet loss on every host's link for 30 s.
//!
//! Afterwards, as in the rest of the chaos suite, the streams and the KV must show one output
//! per key, every key completed, no dead letters, nothing pending or unacknowledged, and the
//! cross-layer audit must agree. How long a cut-off host took to work again after the heal is
//! printed (and reported in BENCHMARKS.md), never asserted.

use std::collections::HashMap;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dedup_host::claim::ClaimRecord;
use dedup_host_tests::harness::{TestEnv, Timing, DEAD, OUTPUTS};
use dedup_host_tests::netlab::{self, Lab, Member};

use super::chaos::{completed, pending, read_stream, PublishOnly, ROUTES};

/// Distinct keys per run: enough that every fault meets work in flight.
const KEYS: usize = 600;
/// How long every key may take to settle once the faults stop.
const SETTLE_BOUND: Duration = Duration::from_secs(150);

fn timing() -> Timing {
    Timing {
        lease: "3s",
        heartbeat: "500ms",
        ack_wait: "4s",
        backoff: r#"["500ms"]"#,
        max_deliver: 20,
        ..Timing::default()
    }
}

/// The lease of [`timing`].
const LEASE: Duration = Duration::from_secs(3);

/// A lab with the cluster and three hosts, each host in a namespace of its own.
struct World {
    env: TestEnv,
    hosts: Vec<Child>,
    places: Vec<Member>,
    // Dropped last: the namespaces outlive the processes in them.
    lab: Lab,
}

impl World {
    /// Starts the cluster and three hosts; host `i` connects to `urls(i)` (every node when
    /// `None`).
    async fn start(fenced: bool, urls: impl Fn(usize, &TestEnv) -> Option<Vec<String>>) -> Self {
        let mut lab = Lab::new();
        let mut env = TestEnv::start_cluster_in(&mut lab).await;
        env.fenced_outputs = fenced;
        let routes = routes(fenced);
        let mut hosts = Vec::new();
        let mut places = Vec::new();
        for i in 0..3 {
            let place = lab.add();
            let urls = urls(i, &env);
            hosts.push(
                env.host_process_at(
                    Some(&place),
                    urls.as_deref(),
                    &timing(),
                    &routes,
                    &format!("net-{i}"),
                )
                .await,
            );
            places.push(place);
        }
        Self {
            env,
            hosts,
            places,
            lab,
        }
    }

    /// Publishes [`KEYS`] keys over about 12 s (a tenth of them published twice), in a task.
    fn publish(&self) -> tokio::task::JoinHandle<()> {
        let publisher = PublishOnly {
            js: self.env.js.clone(),
        };
        tokio::spawn(async move {
            for k in 0..KEYS {
                publisher.publish(&format!("k{k}"), &format!("p{k}")).await;
                if k % 10 == 0 && k > 0 {
                    // A repeat under a new message id: the claim, not the stream, stops it.
                    publisher
                        .publish(&format!("k{}", k / 2), &format!("r{k}"))
                        .await;
                }
                if k % 50 == 49 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        })
    }

    /// Waits until every key is completed and nothing is pending, then checks the streams,
    /// the claims and the audit.
    async fn settle_and_check(&self, faults_over: Instant) {
        let mut done = 0;
        let settled = loop {
            done = completed(&self.env, KEYS).await.unwrap_or(done);
            if done == KEYS && pending(&self.env).await == Some((0, 0)) {
                break faults_over.elapsed();
            }
            assert!(
                faults_over.elapsed() < SETTLE_BOUND,
                "not settled within {SETTLE_BOUND:?} after the faults: {done} of {KEYS} keys completed, pending {:?}",
                pending(&self.env).await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let mut outputs = read_stream(&self.env, OUTPUTS).await;
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
        assert!(
            read_stream(&self.env, DEAD).await.is_empty(),
            "no dead letters"
        );
        let config = self.env.config(&timing(), &routes(self.env.fenced_outputs));
        let report = dedup_host::ops::audit::run(&self.env.js, &config, None)
            .await
            .unwrap();
        assert!(report.anomalies.is_empty(), "{:?}", report.anomalies);
        assert_eq!(report.completed, KEYS as u64);
        println!("settled {settled:.1?} after the faults");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            let _ = host.kill();
            let _ = host.wait();
        }
    }
}

fn routes(fenced: bool) -> String {
    if fenced {
        format!("{ROUTES}effects = \"fenced\"\n")
    } else {
        ROUTES.to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_from_every_node_past_its_lease_stays_exactly_once() {
    cut_off_host(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_host_cut_off_from_every_node_past_its_lease_stays_exactly_once() {
    cut_off_host(true).await;
}

async fn cut_off_host(fenced: bool) {
    let mut world = World::start(fenced, |_, _| None).await;
    let publisher = world.publish();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let victim = world.places[1].clone();
    world.lab.cut(&victim);
    tokio::time::sleep(2 * LEASE).await;
    world.lab.heal();
    let healed = Instant::now();
    let healed_ms = unix_ms();
    if !fenced {
        // When the cut-off host works again: its first claim record written after the heal.
        // A measurement, not an assertion: on a busy machine the others may take every
        // message left before it is back (the settle check below is what must hold).
        match resumed_after(&world.env, "net-1", healed_ms, Duration::from_secs(30)).await {
            Some(resumed) => println!(
                "the cut-off host wrote its first claim record {resumed:.1?} after the heal"
            ),
            None => println!("the cut-off host wrote no claim record within 30 s of the heal"),
        }
        assert!(
            world.hosts[1].try_wait().expect("host status").is_none(),
            "the cut-off host exited"
        );
    }
    publisher.await.unwrap();
    world.settle_and_check(healed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_node_cut_from_its_cluster_under_a_connected_host_stays_exactly_once() {
    // Host 0 knows only node 2; the others know every node.
    let mut world = World::start(false, |i, env| {
        (i == 0).then(|| vec![env.servers.nodes[2].url()])
    })
    .await;
    let publisher = world.publish();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes: Vec<Member> = world
        .env
        .servers
        .nodes
        .iter()
        .map(|n| n.place().expect("lab node").clone())
        .collect();
    world.lab.cut_between(&[&nodes[2]], &[&nodes[0], &nodes[1]]);
    tokio::time::sleep(3 * LEASE).await;
    world.lab.heal();
    let healed = Instant::now();
    publisher.await.unwrap();
    world.settle_and_check(healed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_and_packet_loss_on_every_host_link_stay_exactly_once() {
    let mut world = World::start(false, |_, _| None).await;
    let before = netlab::shaped_packets();
    let places = world.places.clone();
    let links: Vec<&Member> = places.iter().collect();
    world.lab.shape(
        &links,
        Duration::from_millis(200),
        Duration::from_millis(50),
        0.10,
    );
    let publisher = world.publish();
    tokio::time::sleep(Duration::from_secs(30)).await;
    world.lab.heal();
    let healed = Instant::now();
    let shaped = netlab::shaped_packets() - before;
    assert!(
        shaped > 1_000,
        "the shaper saw only {shaped} packets: the hosts' traffic did not go through it"
    );
    println!("{shaped} packets delayed or dropped over 30 s");
    publisher.await.unwrap();
    world.settle_and_check(healed).await;
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// How long after `since_ms` the first claim record `owner` wrote appeared (watched from
/// the heal on, so no write is missed), if one did within `bound`.
async fn resumed_after(
    env: &TestEnv,
    owner: &str,
    since_ms: u64,
    bound: Duration,
) -> Option<Duration> {
    use futures::StreamExt;
    let kv = env.js.get_key_value("claims").await.expect("claims bucket");
    let mut watch = kv.watch_all().await.expect("watch the claims");
    let seen = tokio::time::timeout(bound, async {
        while let Some(Ok(entry)) = watch.next().await {
            let Ok(record) = ClaimRecord::from_bytes(&entry.value) else {
                continue;
            };
            if record.owner == owner && record.updated_ms > since_ms {
                return Some(record.updated_ms - since_ms);
            }
        }
        None
    })
    .await;
    seen.ok().flatten().map(Duration::from_millis)
}
