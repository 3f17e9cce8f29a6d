//! Queue moves of an exclusive route at the edges (review of the issue 42 follow-ups): a
//! stopped move run again towards the recorded count re-queues everything; a queue stream
//! that cannot be read stops the change instead of passing for none; stored `Nats-*`
//! headers never reach the queue; a queued message whose source sequence the host did not
//! write is refused by name.

use std::time::Duration;

use async_nats::HeaderMap;
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host::exclusive;
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{wait_for, TestEnv, SOURCE};
use dedup_host_tests::nats::{NatsCluster, NatsServer};

use super::{
    a_stopped_queue_move, assert_queue_sound, change_with, ex_side, json, queued, MESSAGES,
};

/// The partition count recorded for route `ex`.
async fn recorded_partitions(env: &TestEnv, config: &Config) -> Option<usize> {
    let store = env
        .js
        .get_key_value(contract::bucket_name(config))
        .await
        .unwrap();
    let record = contract::read(&store, "ex").await.unwrap().unwrap().0;
    record.contract.partitions
}

/// Publishes a queued copy of source message `source` of entity `entity` onto its partition
/// under `partitions`, as a host queues it, with `extra` headers set after; its sequence in
/// the queue stream.
async fn enqueue(
    env: &TestEnv,
    config: &Config,
    partitions: usize,
    entity: &str,
    source: u64,
    extra: &[(&str, &str)],
) -> u64 {
    let subject = format!("in.ex.{entity}");
    let mut original = HeaderMap::new();
    original.insert("Nats-Msg-Id", format!("m{source}").as_str());
    let mut headers = exclusive::queued_headers(Some(&original), "ex", &subject, source);
    for (name, value) in extra {
        headers.insert(*name, *value);
    }
    env.js
        .publish_with_headers(
            exclusive::work_subject(config, "ex", partitions, entity),
            headers,
            b"probe:0".to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// `dedup-host setup` with `path`'s config.
async fn setup(path: &std::path::Path) {
    let path = path.to_path_buf();
    let run = tokio::task::spawn_blocking(move || cli(&path, &["setup"]))
        .await
        .unwrap();
    assert_eq!(run.code, 0, "{run:?}");
}

/// A change to 3 partitions stopped part-way, then run again with 2 partitions (the
/// recorded count) and another change (fenced effects): the whole queue goes back to
/// partitions under 2 before the new contract is recorded; none stays on partition 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_move_rerun_towards_the_recorded_count_requeues_everything() {
    let env = TestEnv::start().await;
    let ((_, old), _) = a_stopped_queue_move(&env, "partitions = 3").await;
    let (back, _) = ex_side(&env, "back", "partitions = 2\neffects = \"fenced\"");
    let (changed, out) = change_with(&back, "ex", &[]).await;
    assert!(changed, "{out}");
    assert_eq!(json(&out)["action"], "changed", "{out}");
    assert_queue_sound(&queued(&env, &old).await, MESSAGES, 2);
    assert_eq!(recorded_partitions(&env, &old).await, Some(2));
}

/// The change runs as a NATS user that may not read the queue stream's info: the change
/// stops, naming the queue stream, instead of taking the queue for absent and recording the
/// new count with the messages left on the old partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_stream_that_cannot_be_read_stops_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("server.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{\n  users = [\n    {{ user: admin, password: admin }}\n    {{ user: op, password: op, permissions: {{ publish: {{ deny: [\"$JS.API.STREAM.INFO.{SOURCE}_EXCLUSIVE\"] }} }} }}\n  ]\n}}\nno_auth_user: admin\n"
        ),
    )
    .unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    let js = async_nats::jetstream::new(server.connect().await);
    let env = TestEnv {
        servers: NatsCluster {
            nodes: vec![server],
        },
        dir,
        js,
        fenced_outputs: false,
    };
    let (old_path, old) = ex_side(&env, "old", "partitions = 2");
    setup(&old_path).await;
    for source in 1..=3 {
        enqueue(&env, &old, 2, &format!("e{source}"), source, &[]).await;
    }
    let (new_path, _) = ex_side(&env, "new", "partitions = 3");
    let text = std::fs::read_to_string(&new_path).unwrap();
    let text = text.replacen("[nats]\n", "[nats]\nuser = \"op\"\npassword = \"op\"\n", 1);
    std::fs::write(&new_path, text).unwrap();
    let (changed, out) = change_with(&new_path, "ex", &[]).await;
    assert!(!changed, "the queue could not be read: {out}");
    assert!(
        out.contains(&exclusive::stream_name(&old)),
        "names the queue stream: {out}"
    );
    assert_eq!(recorded_partitions(&env, &old).await, Some(2));
    assert_queue_sound(&queued(&env, &old).await, 3, 2);
}

/// A source message carrying `Nats-Expected-Last-Subject-Sequence` goes through the
/// exclusive route (a host queues and runs it), and a queued message carrying one is moved
/// by a change: neither copy takes the expectation along, so both are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_nats_headers_never_reach_the_queue() {
    let env = TestEnv::start().await;
    let (old_path, old) = ex_side(&env, "old", "partitions = 2");
    setup(&old_path).await;
    // Queue sequences run one ahead of source sequences: an expectation that holds on the
    // source never holds by chance on the queue.
    env.js
        .publish(
            format!(
                "{}.zz.0.0",
                exclusive::stream_subjects(&old).trim_end_matches(".>")
            ),
            "offset".into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let host = dedup_host::serve::start(old.clone()).await.unwrap();
    let mut last = 0;
    for key in ["a1", "a2"] {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", key);
        if last > 0 {
            h.insert(
                "Nats-Expected-Last-Subject-Sequence",
                last.to_string().as_str(),
            );
        }
        last = env
            .js
            .publish_with_headers("in.ex.e1", h, "probe:0".into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence;
    }
    env.wait_completed("ex", &["a1", "a2"], Duration::from_secs(60))
        .await;
    wait_for(
        Duration::from_secs(60),
        "a1 and a2 acked off the queue",
        || async { queued(&env, &old).await.is_empty().then_some(()) },
    )
    .await;
    host.shutdown().await.unwrap();

    let first = enqueue(&env, &old, 2, "e2", 101, &[]).await;
    let expected = first.to_string();
    enqueue(
        &env,
        &old,
        2,
        "e2",
        102,
        &[("Nats-Expected-Last-Subject-Sequence", expected.as_str())],
    )
    .await;
    let (new_path, _) = ex_side(&env, "new", "partitions = 3");
    let (changed, out) = change_with(&new_path, "ex", &[]).await;
    assert!(changed, "{out}");
    let queue = queued(&env, &old).await;
    let sources: Vec<u64> = queue.iter().map(|q| q.3).collect();
    assert_eq!(sources, [101, 102], "{queue:?}");
    assert!(queue.iter().all(|q| q.1 == q.2 % 3), "{queue:?}");
}

/// A message in the queue whose `Dedup-Source-Sequence` says 1 while its message id is not
/// one the host writes for it: the move refuses, naming its queue sequence, and moves
/// nothing (grouping by the header would have deleted the real message 1 as a copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_message_the_host_did_not_write_is_refused_by_name() {
    let env = TestEnv::start().await;
    let (old_path, old) = ex_side(&env, "old", "partitions = 2");
    setup(&old_path).await;
    for source in 1..=3 {
        enqueue(&env, &old, 2, "e1", source, &[]).await;
    }
    let forged = enqueue(&env, &old, 2, "e1", 1, &[("Nats-Msg-Id", "forged-1")]).await;
    let before = queued(&env, &old).await;
    let (new_path, _) = ex_side(&env, "new", "partitions = 3");
    let (changed, out) = change_with(&new_path, "ex", &[]).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains(&format!("message {forged} in queue stream")),
        "names the message: {out}"
    );
    // The mark this run wrote stays: the error says so, and how to finish or clear it.
    assert!(
        out.contains("its mark stays on route `ex`'s contract record")
            && out.contains("--change-route ex` again")
            && out.contains("calls the change off"),
        "says the mark is left and how to clear it: {out}"
    );
    assert_eq!(queued(&env, &old).await, before, "something moved");
    assert_eq!(recorded_partitions(&env, &old).await, Some(2));
}
