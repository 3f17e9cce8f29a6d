//! A claim-after route is not renamed while the server gave up on a message of it that is
//! not dead-lettered yet: a run of it may have published part of its outputs under ids of the
//! old name and left no record (its publish-failed mark refused by a claim-store leader
//! election that outlasted every delivery), so nothing of its key is carried, and under the
//! new name it would run again, dead-lettered by the marker sweep and replayed (or delivered
//! again by a new consumer started from the old one's ack floor), publishing those outputs again
//! under other ids (found by the simulation, seed 14265 `--claim-after`;
//! `dedup_delivery::rename::given_up_refuses`). Against a real nats-server.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::AckKind;
use dedup_host::stranded;
use dedup_host_tests::guests::cli_async;
use dedup_host_tests::harness::{wait_for, BUCKET, CONSUMER, DEAD, SOURCE};
use futures::StreamExt;

use crate::rename_pending::{route, with_a_settled_under_old};

/// Message `b` of route `old`, delivered until the server gave up on it and never recorded,
/// keeps `setup --rename-route old new` from going ahead while its stranded-message marker
/// stands; once a host under the old name dead-lettered it and its letter was replayed, the
/// rename goes through, the new consumer starts after the old one's last delivery, and
/// nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_route_is_not_renamed_while_a_message_given_up_on_waits_for_its_letter() {
    let (env, timing) = with_a_settled_under_old().await;

    // The server gives up on `b` after two deliveries, both given back unrun (as a host
    // whose every read of the key met a claim-store leader election gives them back).
    let mut source = env.js.get_stream(SOURCE).await.unwrap();
    let name = format!("{CONSUMER}-old");
    let mut consumer = source.get_consumer::<pull::Config>(&name).await.unwrap();
    let mut config = consumer.cached_info().config.clone();
    config.max_deliver = 2;
    source.update_consumer(config).await.unwrap();
    env.publish("in.ren.b", "b", &[], "x").await;
    let b = source.info().await.unwrap().state.last_sequence;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never gave up on b"
        );
        // Delivered to this fetch, or to a pull request the stopped host left open (given
        // back after the ack wait).
        let batch = (consumer.fetch().max_messages(1))
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        for m in batch.collect::<Vec<_>>().await.into_iter().flatten() {
            m.ack_with(AckKind::Nak(None)).await.unwrap();
        }
        let info = consumer.info().await.unwrap().clone();
        if info.num_ack_pending == 0 && info.delivered.stream_sequence == b {
            break;
        }
    }

    let path = env.path("renamed.toml");
    std::fs::write(&path, env.config_text(&timing, &route("new"))).unwrap();
    let rename = || cli_async(&path, &["setup", "--rename-route", "old", "new"]);
    // Its marker, as the host writes it before a message's last delivery.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let marker = env.mark_given_up(&name, b, 2).await;
    let (ok, out) = rename().await;
    assert!(!ok, "renamed with b's marker standing: {out}");
    assert!(
        out.contains(&format!("message(s) {b} of stream `{SOURCE}`"))
            && out.contains("dead-letters replay"),
        "{out}"
    );
    let new = format!("{CONSUMER}-new");
    assert!(source.consumer_info(&new).await.is_err(), "no `{new}` made");

    // The host under the old name sweeps the marker: b is dead-lettered, its key failed for
    // good (its effects unknown), and its letter replayed runs it once.
    stranded::mark(&kv, &marker).await;
    let old_path = env.path("old.toml");
    std::fs::write(&old_path, env.config_text(&timing, &route("old"))).unwrap();
    let host = env.host(&timing, &route("old"), "h1").await;
    wait_for(Duration::from_secs(60), "b's dead letter", || async {
        (!env.messages(DEAD).await.is_empty() && kv.get(marker.key()).await.ok()?.is_none())
            .then_some(())
    })
    .await;
    host.shutdown().await.unwrap();
    let (ok, out) = rename().await;
    assert!(!ok && out.contains("unsettled"), "{out}");
    let host = env.host(&timing, &route("old"), "h1").await;
    let (ok, out) = cli_async(
        &old_path,
        &["dead-letters", "replay", "--route", "old", "--all"],
    )
    .await;
    assert!(ok, "{out}");
    env.wait_completed("old", &["a", "b"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();

    let delivered = consumer.info().await.unwrap().delivered.stream_sequence;
    let (ok, out) = rename().await;
    assert!(ok, "{out}");
    // After the last message the old consumer delivered, where it would have gone on: from
    // its ack floor, a server that keeps the floor below a message it gave up on (2.15 does)
    // would deliver that message to `new`, with no marker to refuse the rename if its write
    // was refused too.
    let made = source.consumer_info(&new).await.unwrap();
    assert_eq!(
        made.config.deliver_policy,
        DeliverPolicy::ByStartSequence {
            start_sequence: delivered + 1
        },
        "{out}"
    );
    let host = env.host(&timing, &route("new"), "h2").await;
    env.publish("in.ren.c", "c", &[], "x").await;
    env.wait_completed("new", &["a", "b", "c"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
    assert_eq!(env.outputs().await.len(), 3, "none ran twice");
}
