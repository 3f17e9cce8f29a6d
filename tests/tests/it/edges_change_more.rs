//! More of `setup --change-route` and `--rename-route` at the edges (issue 42, review
//! follow-ups): a queue move of an exclusive route that stopped part-way is undone by a
//! call-off, or finished by running it again, leaving every message on a partition its
//! count consumes, in each entity's order; `--accept-dead KEY` lets a key that can never
//! complete move as it is; moving claims back never trusts hosts' clocks; a former default
//! name of this deployment is its own.

mod queue_moves;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream::stream::DiscardPolicy;
use async_nats::HeaderMap;
use dedup_host::claim::{key, ClaimState};
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host::exclusive;
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET};

use super::edges_change::{
    host, outputs, publish, record_in, recorded, refused, rewrite, side, Side,
};

/// `dedup-host setup --change-route <route> --json` and `extra` flags with `path`'s config:
/// (exit 0, output).
async fn change_with(path: &Path, route: &str, extra: &[&str]) -> (bool, String) {
    let path = path.to_path_buf();
    let mut args = vec!["setup", "--change-route", route, "--json"];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&path, &args)
    })
    .await
    .unwrap();
    (run.code == 0, run.stdout + &run.stderr)
}

/// The JSON object a `--json` run printed last.
fn json(out: &str) -> serde_json::Value {
    let start = out.find('{').expect("a JSON object");
    serde_json::from_str(&out[start..=out.rfind('}').unwrap()]).unwrap()
}

/// An exclusive route `ex` on `in.ex.*` (entity: the subject's second token) with `extra`;
/// the output stream takes fenced batches, so the route may run with either effects.
fn ex_side(env: &TestEnv, name: &str, extra: &str) -> (PathBuf, Config) {
    let routes = format!(
        "[[routes]]\nname = \"ex\"\nsubject = \"in.ex.*\"\ncomponent = \"{{guest:hostile}}\"\nexclusive_by = {{ subject_token = 2 }}\nallowed_outputs = [\"in.ex.*.done\"]\n{extra}\n"
    );
    let text = env.config_text(&Timing::default(), &routes).replace(
        "duplicate_window = \"10m\"",
        "duplicate_window = \"10m\"\neffects = \"fenced\"",
    );
    let path = env.path(&format!("{name}.toml"));
    std::fs::write(&path, &text).unwrap();
    let config = Config::parse(&text, Path::new("t.toml"), env.dir.path().into()).unwrap();
    (path, config)
}

/// A message waiting in route `ex`'s queue: (queue sequence, partition token, entity hash,
/// source sequence).
type Queued = (u64, u64, u64, u64);

/// Every message of route `ex` in the queue stream, in queue order.
async fn queued(env: &TestEnv, config: &Config) -> Vec<Queued> {
    let mut stream = env
        .js
        .get_stream(exclusive::stream_name(config))
        .await
        .unwrap();
    let state = stream.info().await.unwrap().state.clone();
    let base = format!("{}.", exclusive::route_subjects(config, "ex"));
    let mut found = Vec::new();
    for sequence in state.first_sequence..=state.last_sequence {
        let Ok(m) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let Some(rest) = m.subject.strip_prefix(&base) else {
            continue;
        };
        let (partition, hash) = rest.split_once('.').unwrap();
        let source: u64 = m
            .headers
            .get(exclusive::headers::SEQUENCE)
            .unwrap()
            .as_str()
            .parse()
            .unwrap();
        found.push((
            sequence,
            partition.parse().unwrap(),
            u64::from_str_radix(hash, 16).unwrap(),
            source,
        ));
    }
    found
}

/// Asserts the queue holds source sequences `1..=count` once each, every message on its
/// entity's partition under `partitions`, each entity's in source order.
fn assert_queue_sound(queue: &[Queued], count: u64, partitions: u64) {
    let mut sources: Vec<u64> = queue.iter().map(|q| q.3).collect();
    sources.sort();
    assert_eq!(
        sources,
        (1..=count).collect::<Vec<_>>(),
        "a message lost or doubled: {queue:?}"
    );
    let mut per_entity: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(_, partition, hash, source) in queue {
        assert_eq!(
            partition,
            hash % partitions,
            "a message on a partition {partitions} partitions do not consume it from: {queue:?}"
        );
        per_entity.entry(hash).or_default().push(source);
    }
    for (entity, sources) in per_entity {
        assert!(
            sources.windows(2).all(|w| w[0] < w[1]),
            "entity {entity:x} out of order: {sources:?}"
        );
    }
}

/// Route `ex` set up with 2 partitions and `MESSAGES` messages queued (what hosts queue,
/// entities e0..e2 in turn, the fourth message large); then the queue stream refuses any
/// write that outgrows it by a small message (discard new), so a change to 3 partitions
/// moves the first three and stops at the large one.
const MESSAGES: u64 = 9;

async fn a_stopped_queue_move(env: &TestEnv, new_extra: &str) -> ((PathBuf, Config), PathBuf) {
    let old = ex_side(env, "old", "partitions = 2");
    let (new_path, _) = ex_side(env, "new", new_extra);
    let setup = tokio::task::spawn_blocking({
        let path = old.0.clone();
        move || cli(&path, &["setup"])
    })
    .await
    .unwrap();
    assert_eq!(setup.code, 0, "{setup:?}");
    for source in 1..=MESSAGES {
        let entity = format!("e{}", source % 3);
        let subject = format!("in.ex.{entity}");
        let mut original = HeaderMap::new();
        original.insert("Nats-Msg-Id", format!("m{source}").as_str());
        let headers = exclusive::queued_headers(Some(&original), "ex", &subject, source);
        let payload = if source == 4 {
            vec![b'x'; 20_000]
        } else {
            b"probe:0".to_vec()
        };
        env.js
            .publish_with_headers(
                exclusive::work_subject(&old.1, "ex", 2, &entity),
                headers,
                payload.into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    assert_queue_sound(&queued(env, &old.1).await, MESSAGES, 2);

    let mut stream = env
        .js
        .get_stream(exclusive::stream_name(&old.1))
        .await
        .unwrap();
    let info = stream.info().await.unwrap().clone();
    let mut full = info.config.clone();
    full.max_bytes = info.state.bytes as i64 + 2_000;
    full.discard = DiscardPolicy::New;
    env.js.update_stream(&full).await.unwrap();
    let (changed, out) = change_with(&new_path, "ex", &[]).await;
    assert!(!changed, "the queue refused the large copy: {out}");
    assert!(out.contains("did not finish"), "{out}");
    let queue = queued(env, &old.1).await;
    assert!(
        queue.iter().any(|q| q.1 != q.2 % 2),
        "part of the queue moved: {queue:?}"
    );
    env.js.update_stream(&info.config).await.unwrap();
    (old, new_path)
}

/// A change to 3 partitions stopped after moving part of an exclusive route's queue, then
/// called off (run with the recorded config): every message goes back to its partition
/// under 2, none lost or doubled, each entity's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_called_off_queue_move_puts_every_message_back_on_a_recorded_partition() {
    let env = TestEnv::start().await;
    let ((old_path, old), _) = a_stopped_queue_move(&env, "partitions = 3").await;
    let (changed, out) = change_with(&old_path, "ex", &[]).await;
    assert!(changed, "{out}");
    assert_eq!(json(&out)["action"], "called off", "{out}");
    assert_queue_sound(&queued(&env, &old).await, MESSAGES, 2);
    let store = env
        .js
        .get_key_value(contract::bucket_name(&old))
        .await
        .unwrap();
    let record = contract::read(&store, "ex").await.unwrap().unwrap().0;
    assert_eq!(record.contract.partitions, Some(2));
}

/// The same stopped move (to 3 partitions and fenced effects), run again: it finishes, every
/// message on its partition under 3, each entity's in source order (the copies the first
/// run made came first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_queue_move_run_again_finishes_in_each_entitys_order() {
    let env = TestEnv::start().await;
    let extra = "partitions = 3\neffects = \"fenced\"";
    let ((_, old), new_path) = a_stopped_queue_move(&env, extra).await;
    let (changed, out) = change_with(&new_path, "ex", &[]).await;
    assert!(changed, "{out}");
    assert_eq!(json(&out)["action"], "changed", "{out}");
    assert_queue_sound(&queued(&env, &old).await, MESSAGES, 3);
}

/// Window -> fenced with key k1 dead-lettered after its window output: refused, naming
/// `--accept-dead`; with `--accept-dead <k1's claim key>` the change goes through, k1's record
/// moves as it is (failed for good), and k1 sent again does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_key_accepted_by_name_moves_as_it_is_and_stays_dead() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    rewrite(&env, BUCKET, "k1", |r| {
        r.state = ClaimState::Failed;
        r.permanent = true;
        r.reason = Some("rejected".into());
    })
    .await;
    let claim_key = key::encode("mv", "k1");
    let (changed, out) = change_with(&new.path, "mv", &[]).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains(&claim_key) && out.contains("--accept-dead"),
        "{out}"
    );
    let (changed, out) = change_with(&new.path, "mv", &["--accept-dead", &claim_key]).await;
    assert!(changed, "{out}");
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
    let (moved, _) = env.fenced_claim("mv", "k1").await.expect("k1 moved");
    assert!(
        moved.state == ClaimState::Failed && moved.permanent,
        "{moved:?}"
    );

    let second = host(&env, &new, "new-1").await;
    publish(&env, "k1", "b").await;
    env.wait_drained(Duration::from_secs(30)).await;
    second.shutdown().await.unwrap();
    let (after, _) = env.fenced_claim("mv", "k1").await.unwrap();
    assert!(
        after.state == ClaimState::Failed && after.permanent,
        "{after:?}"
    );
    assert_eq!(outputs(&env).await, 1, "k1 ran again");
}

/// Claims moved A -> B -> A where the host that wrote A's record had a clock an hour ahead:
/// B's completion of k1, written later but stamped earlier, still wins when the claims come
/// back (the store the route was served from holds its newest record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_moved_back_keep_a_later_write_stamped_earlier() {
    let env = TestEnv::start().await;
    let a = side(&env, "a", "", BUCKET);
    let b = side(&env, "b", "", "claims-next");
    let first = host(&env, &a, "a-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    rewrite(&env, BUCKET, "k1", |r| {
        r.state = ClaimState::Failed;
        r.permanent = false;
        r.reason = Some("released: an output stream did not answer".into());
        r.retry_at_ms = Some(0);
        r.updated_ms += 3_600_000;
    })
    .await;
    let on_b = host(&env, &b, "b-1").await;
    refused(&env, &b.config, "b-1").await;
    let (changed, out) = change_with(&b.path, "mv", &[]).await;
    assert!(changed, "{out}");
    publish(&env, "k1", "b").await;
    wait_for(Duration::from_secs(30), "k1 completed on B", || async {
        let record = record_in(&env, "claims-next", "k1").await?;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    on_b.shutdown().await.unwrap();
    let (changed, out) = change_with(&a.path, "mv", &[]).await;
    assert!(changed, "{out}");
    let record = env.claim("mv", "k1").await.unwrap();
    assert_eq!(
        record.state,
        ClaimState::Completed,
        "A's record, stamped later, shadows k1's completion on B: {record:?}"
    );
}

/// Rewrites route `mv`'s contract record as a former default name of this deployment wrote
/// it (another `auto-` name, this config's route consumer).
async fn recorded_by_a_former_default_name(env: &TestEnv, side: &Side, route: &str) {
    let store = env
        .js
        .get_key_value(contract::bucket_name(&side.config))
        .await
        .unwrap();
    let (mut record, revision) = contract::read(&store, route).await.unwrap().unwrap();
    assert!(record.deployment.as_deref().unwrap().starts_with("auto-"));
    record.deployment = Some("auto-00000000000000ff".into());
    record.consumer = Some(dedup_host::consumers::route_consumer_name(
        &side.config,
        route,
    ));
    store
        .update(route, contract::encode(&record, None), revision)
        .await
        .unwrap();
}

/// A contract recorded under a former default name of this deployment (same route
/// consumer) is this deployment's: a change goes through instead of being refused as
/// another deployment's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_takes_a_former_default_name_as_its_own() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    env.wait_completed("mv", &["k1"], Duration::from_secs(30))
        .await;
    first.shutdown().await.unwrap();
    recorded_by_a_former_default_name(&env, &old, "mv").await;
    let (changed, out) = change_with(&new.path, "mv", &[]).await;
    assert!(
        changed,
        "a former default name was taken as another's: {out}"
    );
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
}
