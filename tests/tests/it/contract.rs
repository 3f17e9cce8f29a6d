//! Route contracts (DESIGN.md rule 19): what every host must agree on for a route's
//! guarantees is recorded on the server when the route is first set up. Hosts of different
//! sizes agree on an exclusive route's partitions; a host whose config differs is refused the
//! route, with both values and the fix; a reload never unfences a fenced route; and a contract
//! change (window -> fenced, 4 -> 8 partitions) under traffic across three `dedup-host run`
//! processes loses, doubles and reorders nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dedup_host::components::status;
use dedup_host::contract::{self, ContractRecord, RouteContract};
use dedup_host_tests::guests::host_binary;
use dedup_host_tests::harness::{stop_gracefully, wait_for, TestEnv, Timing, OUTPUTS};

/// An exclusive route of the `hostile` guest's probe (it reports when it ran) on `in.ex.*`.
fn exclusive(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "ex"
subject = "in.ex.*"
component = "{{guest:hostile}}"
exclusive_by = {{ subject_token = 2 }}
allowed_outputs = ["in.ex.*.done"]
{extra}
"#
    )
}

/// The recorded contract of `route`.
async fn recorded(
    env: &TestEnv,
    config: &dedup_host::config::Config,
    route: &str,
) -> ContractRecord {
    let store = env
        .js
        .get_key_value(contract::bucket_name(config))
        .await
        .expect("contract bucket");
    contract::read(&store, route)
        .await
        .expect("readable")
        .expect("recorded")
        .0
}

/// Per host: why it does not serve `route` (`None`: it serves it).
pub(crate) async fn refusals(
    env: &TestEnv,
    config: &dedup_host::config::Config,
    route: &str,
) -> BTreeMap<String, Option<String>> {
    let store = status::open(&env.js, config).await.expect("status bucket");
    status::read_all(&store)
        .await
        .expect("statuses")
        .into_iter()
        .filter_map(|h| Some((h.instance_id, h.routes.get(route)?.contract_refused.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_different_sizes_agree_and_a_host_that_differs_is_refused_the_route() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let small_routes = exclusive("concurrency = 2");
    let small = env.host(&timing, &small_routes, "small").await;
    let mut big_config = env.config(&timing, &exclusive("concurrency = 12"));
    big_config.host.instance_id = Some("big".into());
    big_config.host.concurrency = 64;
    big_config.host.max_in_flight = 256;
    let big = dedup_host::serve::start(big_config.clone()).await.unwrap();
    let record = recorded(&env, &big_config, "ex").await;
    assert_eq!(
        record.contract.partitions,
        Some(dedup_host::config::DEFAULT_PARTITIONS)
    );
    assert_eq!(record.recorded_by, "small");

    let mut eight = env.config(&timing, &exclusive("partitions = 8"));
    eight.host.instance_id = Some("eight".into());
    let differing = dedup_host::serve::start(eight.clone()).await.unwrap();
    let why = wait_for(Duration::from_secs(20), "three hosts reporting", || async {
        let r = refusals(&env, &eight, "ex").await;
        (r.len() == 3 && r.get("eight").is_some_and(Option::is_some)).then_some(r)
    })
    .await;
    assert_eq!(why["small"], None);
    assert_eq!(why["big"], None);
    let refused = why["eight"]
        .clone()
        .expect("the differing host is refused the route");
    assert!(
        refused.contains("partitions: recorded 16, this config 8"),
        "{refused}"
    );
    assert!(
        refused.contains("dedup-host setup --config <this config> --change-route ex"),
        "{refused}"
    );

    for i in 0..30 {
        env.publish(
            &format!("in.ex.e{}", i % 3),
            &format!("k{i}"),
            &[],
            "probe:5",
        )
        .await;
    }
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("ex", &keys, Duration::from_secs(60))
        .await;
    assert_eq!(
        differing.stats().processed,
        0,
        "the refused host ran nothing"
    );
    assert_eq!(
        recorded(&env, &eight, "ex").await,
        record,
        "the contract is unchanged"
    );
    for host in [small, big, differing] {
        host.shutdown().await.unwrap();
    }
}

/// A fenced route of the `flaky` guest on `in.fan.*`.
fn fenced(effects: &str, outputs: &str) -> String {
    format!(
        r#"
[[routes]]
name = "fan"
subject = "in.fan.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
allowed_outputs = [{outputs}]
effects = "{effects}"
config = {{ succeed_on_attempt = "1", outputs = "1", work_ms = "1" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_never_unfences_a_fenced_route() {
    let env = TestEnv::start().await;
    let before = fenced("fenced", "\"in.fan.*.done\"");
    let host = dedup_host::serve::start(either_config(&env, &before, "fenced-host"))
        .await
        .unwrap();
    env.publish("in.fan.a", "a", &[], "x").await;
    wait_for(
        Duration::from_secs(20),
        "the fenced claim completed",
        || async { env.fenced_claim("fan", "a").await.map(|_| ()) },
    )
    .await;

    // An output subject the running output streams do not fence: refused whole (it used to
    // move the route's claims to the bucket, where every completed key is unknown).
    let wider = either_effects(
        &env,
        &fenced("fenced", "\"in.fan.*.done\", \"extra.x\""),
        "fenced-host",
    )
    .replace("\"out.>\"]", "\"out.>\", \"extra.>\"]");
    let wider = dedup_host::config::Config::parse(
        &wider,
        std::path::Path::new("t.toml"),
        env.dir.path().into(),
    )
    .expect("the new config is valid on its own");
    let report = host.reload(Ok(wider)).await;
    assert!(!report.applied, "{report:?}");
    assert!(
        report.problems[0].contains("restart the hosts with this config"),
        "{report:?}"
    );

    // Window effects by reload: the route is refused on this host, its messages wait.
    let window = either_config(&env, &fenced("window", "\"in.fan.*.done\""), "fenced-host");
    let report = host.reload(Ok(window.clone())).await;
    assert!(report.applied, "{report:?}");
    let why = wait_for(Duration::from_secs(20), "the route refused", || async {
        refusals(&env, &window, "fan")
            .await
            .remove("fenced-host")
            .flatten()
    })
    .await;
    assert!(
        why.contains("effects: recorded \"fenced\", this config \"window\""),
        "{why}"
    );
    env.publish("in.fan.a", "a-again", &[], "x").await;
    env.publish("in.fan.b", "b", &[], "x").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        env.claim("fan", "b").await.is_none(),
        "no claim in the bucket"
    );
    assert!(
        env.fenced_claim("fan", "b").await.is_none(),
        "not run unfenced"
    );

    // Back to the recorded contract: served again, the waiting messages run fenced, once.
    assert!(
        host.reload(Ok(either_config(&env, &before, "fenced-host")))
            .await
            .applied
    );
    wait_for(Duration::from_secs(30), "b completed fenced", || async {
        env.fenced_claim("fan", "b").await.map(|_| ())
    })
    .await;
    env.wait_drained(Duration::from_secs(20)).await;
    let outputs: Vec<String> = env
        .messages(OUTPUTS)
        .await
        .iter()
        .filter(|m| m.subject.starts_with("in.fan."))
        .map(|m| m.subject.to_string())
        .collect();
    assert_eq!(
        outputs
            .iter()
            .filter(|s| s.starts_with("in.fan.a."))
            .count(),
        1,
        "{outputs:?}"
    );
    assert_eq!(
        outputs
            .iter()
            .filter(|s| s.starts_with("in.fan.b."))
            .count(),
        1,
        "{outputs:?}"
    );
    host.shutdown().await.unwrap();
}

const ENTITIES: usize = 6;
const EVENTS: usize = 30;

/// Config text whose output stream accepts fenced batches and keeps message ids for 10
/// minutes, so a route can run with either effects.
fn either_effects(env: &TestEnv, routes: &str, instance: &str) -> String {
    env.config_text(&Timing::default(), routes)
        .replace(
            "duplicate_window = \"10m\"",
            "duplicate_window = \"10m\"\neffects = \"fenced\"",
        )
        .replace(
            "[host]\n",
            &format!("[host]\ninstance_id = \"{instance}\"\n"),
        )
}

/// [`either_effects`], parsed.
fn either_config(env: &TestEnv, routes: &str, instance: &str) -> dedup_host::config::Config {
    let text = either_effects(env, routes, instance);
    dedup_host::config::Config::parse(&text, std::path::Path::new("t.toml"), env.dir.path().into())
        .expect("valid config")
}

/// Writes one host's config file ([`either_effects`]).
fn host_config(env: &TestEnv, routes: &str, instance: &str) -> PathBuf {
    let path = env.path(&format!("{instance}.toml"));
    std::fs::write(&path, either_effects(env, routes, instance)).unwrap();
    path
}

/// Host processes, killed if the test fails before stopping them.
struct Hosts(Vec<Child>);

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in &mut self.0 {
            let _ = host.kill();
            let _ = host.wait();
        }
    }
}

fn run(path: &PathBuf) -> Child {
    Command::new(host_binary())
        .args(["run", "--config"])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start dedup-host run")
}

fn cli(args: &[&str], config: &std::path::Path) -> (bool, String) {
    let run = dedup_host_tests::guests::cli(config, args);
    (run.code == 0, run.stdout + &run.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_change_under_traffic_loses_doubles_and_reorders_nothing() {
    let env = TestEnv::start().await;
    let old_routes = exclusive("partitions = 4\nconcurrency = 4");
    let new_routes = exclusive("partitions = 8\nconcurrency = 4\neffects = \"fenced\"");
    let instances = ["c0", "c1", "c2"];
    let paths: Vec<PathBuf> = instances
        .iter()
        .map(|i| host_config(&env, &old_routes, i))
        .collect();
    let config = either_config(&env, &old_routes, "c0");
    let mut hosts = Hosts(paths.iter().map(run).collect());
    wait_for(Duration::from_secs(60), "three hosts serving", || async {
        let r = refusals(&env, &config, "ex").await;
        (r.len() == 3 && r.values().all(Option::is_none)).then_some(())
    })
    .await;

    let publisher = {
        let js = env.js.clone();
        tokio::spawn(async move {
            for event in 0..EVENTS {
                for entity in 0..ENTITIES {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", format!("e{entity}-{event}").as_str());
                    js.publish_with_headers(format!("in.ex.e{entity}"), h, "probe:10".into())
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    // A third of the way in: every host gets the new config and refuses the route (it differs
    // from the contract) after draining; the change then moves what the old contract left.
    wait_for(Duration::from_secs(60), "some traffic handled", || async {
        (probe_runs(&env).await.len() >= ENTITIES * EVENTS / 3).then_some(())
    })
    .await;
    for (path, instance) in paths.iter().zip(instances) {
        assert_eq!(host_config(&env, &new_routes, instance), *path);
    }
    // Every host refuses the route by contract: the reload says where and why, and exits
    // non-zero (issue 42, finding 14).
    let (sent, text) = cli(&["reload"], &paths[0]);
    assert!(!sent && text.contains("3 refused"), "{text}");
    let new_config = either_config(&env, &new_routes, "c0");
    wait_for(
        Duration::from_secs(60),
        "every host refusing the old contract",
        || async {
            let r = refusals(&env, &new_config, "ex").await;
            (r.len() == 3 && r.values().all(Option::is_some)).then_some(())
        },
    )
    .await;
    // A host records its refusal before its drain ends (what it has in flight still going
    // out): the change says so and changes nothing, and the operator runs it again, as its
    // message says.
    let text = wait_for(
        Duration::from_secs(60),
        "the change once drained",
        || async {
            let (changed, text) = cli(&["setup", "--change-route", "ex"], &paths[0]);
            assert!(
                changed || text.contains("still served under its recorded contract"),
                "{text}"
            );
            changed.then_some(text)
        },
    )
    .await;
    assert!(text.contains("contract changed"), "{text}");
    eprintln!("{text}");
    assert!(
        text.contains("partitions: recorded 4, this config 8"),
        "{text}"
    );
    assert_eq!(
        recorded(&env, &new_config, "ex").await.contract.partitions,
        Some(8)
    );
    wait_for(
        Duration::from_secs(60),
        "every host serving the new contract",
        || async {
            let r = refusals(&env, &new_config, "ex").await;
            (r.len() == 3 && r.values().all(Option::is_none)).then_some(())
        },
    )
    .await;
    publisher.await.unwrap();

    let runs = wait_for(Duration::from_secs(120), "every event run", || async {
        let runs = probe_runs(&env).await;
        (runs.len() >= ENTITIES * EVENTS).then_some(runs)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs_after = probe_runs(&env).await;
    assert_eq!(runs_after.len(), runs.len(), "no late second run");
    let mut per_sequence: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &runs {
        *per_sequence.entry(r.1).or_default() += 1;
    }
    assert_eq!(per_sequence.len(), ENTITIES * EVENTS, "every event ran");
    assert!(
        per_sequence.values().all(|n| *n == 1),
        "an event ran twice: {per_sequence:?}"
    );
    // Per entity: runs in source order and never overlapping.
    let mut by_entity: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for (entity, sequence, start, end) in runs {
        by_entity
            .entry(entity)
            .or_default()
            .push((start, sequence, end));
    }
    for (entity, mut runs) in by_entity {
        runs.sort();
        for pair in runs.windows(2) {
            assert!(pair[0].1 < pair[1].1, "{entity}: out of order {pair:?}");
            assert!(pair[0].2 <= pair[1].0, "{entity}: overlapping {pair:?}");
        }
    }
    for host in hosts.0.drain(..) {
        stop_gracefully(host);
    }
}

/// The probe runs reported in the output stream: (entity, source sequence, start, end).
async fn probe_runs(env: &TestEnv) -> Vec<(String, u64, u64, u64)> {
    env.messages(OUTPUTS)
        .await
        .iter()
        .filter(|m| m.subject.starts_with("in.ex."))
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("a probe report");
            let subject = v["subject"].as_str().unwrap();
            (
                subject.rsplit('.').next().unwrap().to_string(),
                v["sequence"].as_u64().unwrap(),
                v["start"].as_u64().unwrap(),
                v["end"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// An exclusive route recorded by hosts from before the copier (issue 44): they queue one
/// message at a time, unfenced, and must not queue beside a copier. A host of this version
/// refuses the route, naming the field and the change; its messages wait. Once no host serves
/// the route, `setup --change-route` records the copier (a record those hosts cannot read, so
/// they refuse the route), and the host serves every waiting message once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_route_recorded_before_the_copier_is_served_once_its_contract_is_changed() {
    served_once_changed("copier", "true", |c| c.copier = false).await;
}

/// The same for a route recorded by hosts from before partition windows (issue 44): they count
/// on one message at a time per partition, and beside a window would run an entity's next
/// message while the previous one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_route_recorded_before_partition_windows_is_served_once_its_contract_is_changed(
) {
    let window = dedup_host::exclusive::PARTITION_WINDOW.to_string();
    served_once_changed("partition_window", &window, |c| c.partition_window = None).await;
}

/// An exclusive route whose contract was recorded as `older` makes it (lacking `field`, which
/// this config sets to `value`): refused, then served once `setup --change-route` records it.
async fn served_once_changed(field: &str, value: &str, older: impl FnOnce(&mut RouteContract)) {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let routes = exclusive("");
    let config = env.config(&timing, &routes);
    let route = &config.routes[0];
    let mut recorded_older =
        ContractRecord::new(contract::of(&config, route), "older", &config, route);
    older(&mut recorded_older.contract);
    let store = contract::open(&env.js, &config).await.unwrap();
    let bytes = serde_json::to_vec(&recorded_older).unwrap();
    store.put("ex", bytes.into()).await.unwrap();
    assert!(
        !String::from_utf8(store.get("ex").await.unwrap().unwrap().to_vec())
            .unwrap()
            .contains(field)
    );

    let host = env.host(&timing, &routes, "new").await;
    let why = wait_for(Duration::from_secs(20), "the route refused", || async {
        refusals(&env, &config, "ex").await.remove("new").flatten()
    })
    .await;
    assert!(
        why.contains(&format!("{field}: recorded null, this config {value}"))
            && why.contains("--change-route ex"),
        "{why}"
    );
    for i in 0..30 {
        let subject = format!("in.ex.e{}", i % 3);
        env.publish(&subject, &format!("k{i}"), &[], "probe:5")
            .await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        env.claim("ex", "k0").await.is_none(),
        "the refused route ran"
    );

    let path = env.path("change.toml");
    std::fs::write(&path, env.config_text(&timing, &routes)).unwrap();
    let (changed, text) = cli(&["setup", "--change-route", "ex", "--json"], &path);
    assert!(changed && text.contains(field), "{text}");
    assert_eq!(
        recorded(&env, &config, "ex").await.contract,
        contract::of(&config, route)
    );
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("ex", &keys, Duration::from_secs(60))
        .await;
    // One output per key, each entity's in publish order.
    let mut seen = BTreeMap::<String, Vec<u64>>::new();
    for m in env.messages(OUTPUTS).await {
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        let entity = v["subject"].as_str().unwrap().rsplit('.').next().unwrap();
        seen.entry(entity.into())
            .or_default()
            .push(v["sequence"].as_u64().unwrap());
    }
    assert_eq!(seen.values().map(Vec::len).sum::<usize>(), 30, "{seen:?}");
    for (entity, order) in &seen {
        assert!(order.is_sorted(), "{entity}: {order:?}");
    }
    host.shutdown().await.unwrap();
}
