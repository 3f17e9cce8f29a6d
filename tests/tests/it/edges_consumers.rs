//! Guarantees at the seams of consumers and queues (issue 42, finding 10): a host binding an
//! existing consumer serves it as `setup` recorded it (only the contract's one-at-a-time is
//! enforced), the queue stage of an exclusive route marks a message on its last delivery,
//! and coalescing compares entities by value, not by the hash in the queue subject.

use std::time::Duration;

use async_nats::jetstream::kv::Operation;
use dedup_host::config::Config;
use dedup_host::exclusive::ORDER_ACK_WAIT;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, CONSUMER, DEAD, SOURCE};
use futures::StreamExt;

/// A route on `in.<name>.*` running `uppercase`; `extra` adds settings.
fn route(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nsubject = \"in.{name}.*\"\ncomponent = \"{{guest:uppercase}}\"\nallowed_outputs = [\"in.{name}.*.done\"]\n{extra}\n"
    )
}

/// Exclusive by the subject's last token.
const EXCLUSIVE: &str = "exclusive_by = { subject_token = 2 }";

/// The config of an in-process host with `routes` and `timing`.
fn config(env: &TestEnv, timing: &Timing, routes: &str, instance_id: &str) -> Config {
    let mut config = env.config(timing, routes);
    config.host.instance_id = Some(instance_id.into());
    config
}

/// Route `name`'s consumer as the server has it: (ack wait, max deliver, max ack pending).
async fn settings(env: &TestEnv, name: &str) -> Option<(Duration, i64, i64)> {
    let source = env.js.get_stream(SOURCE).await.ok()?;
    let info = source
        .consumer_info(format!("{CONSUMER}-{name}"))
        .await
        .ok()?;
    let c = &info.config;
    Some((c.ack_wait, c.max_deliver, c.max_ack_pending))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_other_consumer_settings_serves_them_as_setup_recorded_and_recreates_a_missing_one(
) {
    let env = TestEnv::start().await;
    let routes = [route("plain", ""), route("ex", EXCLUSIVE)].concat();
    // `setup` records the consumers with host A's config (ack wait 2 s).
    let a = config(&env, &Timing::default(), &routes, "a");
    let items = dedup_host::provision::provision(&env.js, &a, false)
        .await
        .unwrap();
    assert!(!items.is_empty());
    let recorded = settings(&env, "plain").await.expect("setup made it");
    assert_eq!(
        recorded,
        (
            Duration::from_secs(2),
            a.source.server_max_deliver,
            a.source.max_ack_pending
        )
    );
    let queue = (
        ORDER_ACK_WAIT,
        a.source.server_max_deliver,
        dedup_host::exclusive::COPY_WINDOW,
    );
    assert_eq!(settings(&env, "ex").await, Some(queue));

    // Host B, bigger and configured otherwise, binds them (a rolling restart).
    let timing = Timing {
        ack_wait: "7s",
        ..Timing::default()
    };
    let mut b = config(&env, &timing, &routes, "b");
    b.source.max_ack_pending = 50;
    b.source.server_max_deliver = a.source.server_max_deliver + 23;
    let host = dedup_host::serve::start(b.clone()).await.unwrap();
    env.publish("in.plain.a", "p-1", &[], "hello").await;
    env.publish("in.ex.a", "x-1", &[], "hello").await;
    env.wait_completed("plain", &["p-1"], Duration::from_secs(60))
        .await;
    env.wait_completed("ex", &["x-1"], Duration::from_secs(60))
        .await;
    assert_eq!(
        settings(&env, "plain").await,
        Some(recorded),
        "a host's bind keeps the settings setup recorded"
    );
    assert_eq!(
        settings(&env, "ex").await,
        Some(queue),
        "the exclusive route's consumer stays one at a time, with setup's delivery bound"
    );

    // A missing consumer is re-created by the host, with its own config.
    let source = env.js.get_stream(SOURCE).await.unwrap();
    source
        .delete_consumer(&format!("{CONSUMER}-plain"))
        .await
        .unwrap();
    let back = wait_for(
        Duration::from_secs(60),
        "the deleted consumer re-created by its host",
        || settings(&env, "plain"),
    )
    .await;
    assert_eq!(
        back,
        (Duration::from_secs(7), b.source.server_max_deliver, 50)
    );
    env.publish("in.plain.b", "p-2", &[], "again").await;
    env.wait_completed("plain", &["p-2"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_stage_marks_a_message_on_its_last_delivery_until_it_is_dead_lettered() {
    let env = TestEnv::start().await;
    let routes = route("ex", &format!("{EXCLUSIVE}\ncoalesce = true"));
    let mut config = config(&env, &Timing::default(), &routes, "h");
    config.source.server_max_deliver = 2;
    let host = dedup_host::serve::start(config.clone()).await.unwrap();
    let claims = env.js.get_key_value(BUCKET).await.unwrap();
    let mut markers = claims.watch("=stranded.>").await.unwrap();
    // The queue is gone: every delivery fails to queue, until the server gives up.
    env.js
        .delete_stream(dedup_host::exclusive::stream_name(&config))
        .await
        .unwrap();
    env.publish("in.ex.a", "k-1", &[], "stuck").await;

    let marked = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(Ok(entry)) = markers.next().await {
            if entry.operation == Operation::Put {
                return Some(entry);
            }
        }
        None
    })
    .await
    .expect("no stranded marker within 90 s")
    .expect("the watch ended");
    let by = format!("{CONSUMER}-ex");
    assert_eq!(marked.key, dedup_host::stranded::key(SOURCE, 1) + "." + &by);
    let marker: dedup_host::stranded::Marker = serde_json::from_slice(&marked.value).unwrap();
    assert!(
        marker.reason.contains("last delivery (2) did not queue it"),
        "{marker:?}"
    );

    // The advisory's host dead-letters it, and the marker goes with it.
    let letters = wait_for(Duration::from_secs(90), "the dead letter", || async {
        let m = env.messages(DEAD).await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(letters.len(), 1);
    wait_for(Duration::from_secs(60), "the marker removed", || async {
        matches!(claims.get(&marked.key).await, Ok(None)).then_some(())
    })
    .await;
    host.shutdown().await.unwrap();
}

/// Queues a message of route `co` on the queue subject of `entity` (its hash), as the source
/// loop would for a message of that entity, with the original's headers.
async fn queue_directly(
    env: &TestEnv,
    config: &Config,
    subject: &str,
    entity: &str,
    msg_id: &str,
    payload: &str,
    sequence: u64,
) {
    let mut original = async_nats::HeaderMap::new();
    original.insert("Nats-Msg-Id", msg_id);
    let headers = dedup_host::exclusive::queued_headers(Some(&original), "co", subject, sequence);
    let work =
        dedup_host::exclusive::work_subject(config, "co", config.routes[0].partitions(), entity);
    env.js
        .publish_with_headers(work, headers, payload.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_not_coalesced_for_a_newer_one_of_another_entity_with_the_same_hash() {
    let env = TestEnv::start().await;
    let routes = route("co", &format!("{EXCLUSIVE}\ncoalesce = true"));
    let config = config(&env, &Timing::default(), &routes, "h");
    dedup_host::setup::ensure(&env.js, &config).await.unwrap();
    dedup_host::setup::ensure_queue(&env.js, &config)
        .await
        .unwrap();
    // A of entity `e1`, then B of entity `e2` whose (crafted) value hashes as `e1`'s: B
    // waits on A's queue subject, newer, and will run; but it is another entity's update.
    queue_directly(&env, &config, "in.co.e1", "e1", "k-a", "alpha", 1001).await;
    queue_directly(&env, &config, "in.co.e2", "e1", "k-b", "beta", 1002).await;
    let host = dedup_host::serve::start(config.clone()).await.unwrap();
    env.wait_completed("co", &["k-a", "k-b"], Duration::from_secs(60))
        .await;
    let a = env.claim("co", "k-a").await.unwrap();
    assert!(
        !a.is_coalesced(),
        "A was skipped for another entity's message: {a:?}"
    );
    env.wait_drained(Duration::from_secs(30)).await;
    let mut outputs: Vec<_> = env
        .outputs()
        .await
        .iter()
        .map(|m| (m.subject.to_string(), m.payload.clone()))
        .collect();
    outputs.sort();
    assert_eq!(
        outputs,
        [
            ("in.co.e1.done".to_string(), "ALPHA".into()),
            ("in.co.e2.done".to_string(), "BETA".into())
        ]
    );
    host.shutdown().await.unwrap();
}

/// A reload that moves a route to another subject re-filters the route's consumer: kept on
/// the old subject, the new subject's messages went to the unrouted consumer, which found the
/// route and acked them without a run (found by a review of the settings fix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_moves_a_route_to_another_subject_runs_that_subjects_messages() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let before = route("moving", "");
    let host = env.host(&timing, &before, "h").await;
    env.publish("in.moving.k1", "k1", &[], "x").await;
    env.wait_completed("moving", &["k1"], Duration::from_secs(60))
        .await;
    let after = before
        .replace("subject = \"in.moving.*\"", "subject = \"in.moved.*\"")
        .replace("[\"in.moving.*.done\"]", "[\"in.moved.*.done\"]");
    let report = host.reload(Ok(config(&env, &timing, &after, "h"))).await;
    assert!(report.applied, "{report:?}");
    env.publish("in.moved.k2", "k2", &[], "x").await;
    env.wait_completed("moving", &["k2"], Duration::from_secs(60))
        .await;
    let outputs = env.outputs().await;
    assert!(
        outputs
            .iter()
            .any(|m| m.subject.as_str() == "in.moved.k2.done"),
        "the moved subject's message ran: {:?}",
        outputs
            .iter()
            .map(|m| m.subject.to_string())
            .collect::<Vec<_>>()
    );
    host.shutdown().await.unwrap();
}
