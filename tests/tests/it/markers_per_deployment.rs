//! Two deployments on one source stream and one claim bucket (the second-team trial): each
//! sweeps only its own stranded-message markers and takes only its own consumers'
//! `MAX_DELIVERIES` advisories, so neither dead-letters the other's messages under its own
//! routes (or none), and each `audit` lists only its own.

use std::time::Duration;

use async_nats::jetstream::kv::Store;
use dedup_host::config::Config;
use dedup_host::consumers::route_consumer_name;
use dedup_host::stranded::{self, Marker, Origin};
use dedup_host_tests::harness::{wait_for, TestEnv};

use crate::edges_second_team::{cli, set_up, team};

/// The marker of message `sequence` of `config`'s source stream, given up by `route`'s
/// consumer, as a host writes it before a last delivery: due at once.
fn marker(config: &Config, route: &str, sequence: u64) -> Marker {
    let origin = Origin {
        stream: &config.source.stream,
        sequence,
        consumer: &route_consumer_name(config, route),
    };
    Marker::new(origin, 5, "its last delivery (5) did not settle it".into())
}

/// Waits until `marker` is gone from the claim bucket.
async fn removed(kv: &Store, marker: &Marker, what: &str) {
    wait_for(Duration::from_secs(60), what, || async {
        kv.get(marker.key()).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Publishes a message the hostile guest finishes at once on `subject` (its key the
/// subject): its sequence.
async fn publish(env: &TestEnv, subject: &'static str) -> u64 {
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", subject);
    let ack = (env.js)
        .publish_with_headers(subject, h, "spin-sleep:0:0".into())
        .await;
    ack.unwrap().await.unwrap().sequence
}

/// The messages in the dead-letter stream (none when it is not there).
pub(crate) async fn letters(env: &TestEnv, config: &Config) -> u64 {
    match env.js.get_stream(&config.dead_letter.stream).await {
        Ok(mut dead) => dead.info().await.unwrap().state.messages,
        Err(_) => 0,
    }
}

/// Nothing is dead-lettered and `theirs`, another deployment's marker, still stands.
async fn left_alone(env: &TestEnv, config: &Config, kv: &Store, theirs: &Marker) {
    assert_eq!(
        letters(env, config).await,
        0,
        "team orders lettered team payments' message"
    );
    let standing = kv.get(theirs.key()).await.unwrap();
    assert!(standing.is_some(), "their marker removed");
}

/// Publishes a `MAX_DELIVERIES` advisory for `marker`'s message, as the server does.
pub(crate) async fn advisory(env: &TestEnv, marker: &Marker) {
    let consumer = marker.consumer.as_deref().unwrap();
    let subject = format!(
        "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{consumer}",
        marker.stream
    );
    let body = serde_json::json!({
        "type": "io.nats.jetstream.advisory.v1.max_deliver",
        "stream": marker.stream,
        "consumer": consumer,
        "stream_seq": marker.sequence,
        "deliveries": marker.deliveries,
    });
    let client = env.servers.connect().await;
    client
        .publish(subject, body.to_string().into())
        .await
        .unwrap();
    client.flush().await.unwrap();
}

/// Team `orders` (route `ra`) runs a host; team `payments` (route `rb`) has a message the
/// server gave up on, its marker standing. Team `orders`' sweep and advisory handler pass it
/// by (its own marker, of a message gone, is removed after it in the same order), its audit
/// does not list it, team `payments`' does; then team `payments`' host settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_leaves_another_deployments_given_up_messages_to_it() {
    let env = TestEnv::start().await;
    let (one_path, one) = team(&env, "orders", "ra");
    let (two_path, two) = team(&env, "payments", "rb");
    assert_ne!(one.deployment_name(), two.deployment_name());
    assert_eq!(one.claims.bucket, two.claims.bucket, "one claim bucket");
    set_up(&one_path, "ra").await;
    let share = ["setup", "--apply", "--share-stream", &two.source.stream];
    let (code, out) = cli(&two_path, &share).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(&two_path, &["setup", "--share-stream", &two.source.stream]).await;
    assert_eq!(code, 0, "{out}");
    let hostile = dedup_host_tests::guests::guest("hostile");
    let deploy = ["deploy", "--route", "rb", "--component"];
    let (code, out) = cli(
        &two_path,
        &[&deploy[..], &[hostile.to_str().unwrap()]].concat(),
    )
    .await;
    assert_eq!(code, 0, "{out}");

    let stream = env.js.get_stream(&one.source.stream).await.unwrap();
    let theirs = publish(&env, "payments.0").await;
    // A message of team `orders` that is gone: its marker is simply removed.
    let gone = publish(&env, "orders.gone").await;
    stream.delete_message(gone).await.unwrap();
    let kv = env.js.get_key_value(&one.claims.bucket).await.unwrap();
    let their_marker = marker(&two, "rb", theirs);
    let our_marker = marker(&one, "ra", gone);
    // And one of a consumer the server no longer has (a route a reload removed, its
    // consumer deleted since): no other deployment claims it, so team orders takes it.
    let mut orphan = our_marker.clone();
    orphan.consumer = Some("dedup-host-removed".into());
    // And one of another application's consumer on the stream: nobody's here.
    let mut foreign = our_marker.clone();
    foreign.consumer = Some("billing-app".into());
    stranded::mark(&kv, &their_marker).await;
    stranded::mark(&kv, &foreign).await;
    stranded::mark(&kv, &our_marker).await;
    stranded::mark(&kv, &orphan).await;

    let mut config = one.clone();
    config.host.instance_id = Some("orders-1".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    // The sweep reads the markers in the order they were written.
    removed(&kv, &our_marker, "team orders' own marker swept").await;
    removed(&kv, &orphan, "the removed route's marker swept").await;
    let standing = kv.get(foreign.key()).await.unwrap();
    assert!(standing.is_some(), "another application's marker swept");
    left_alone(&env, &one, &kv, &their_marker).await;

    // The advisories, theirs first: team orders' hosts take only their own.
    let later = our_marker.clone().not_before(Duration::from_secs(3600));
    stranded::mark(&kv, &later).await;
    advisory(&env, &their_marker).await;
    advisory(&env, &later).await;
    removed(&kv, &later, "team orders' own advisory handled").await;
    left_alone(&env, &one, &kv, &their_marker).await;

    // (Exit 2: the audit could not run.)
    let (code, out) = cli(&one_path, &["audit"]).await;
    assert!(code != 2 && !out.contains("not_dead_lettered"), "{out}");
    let (code, out) = cli(&two_path, &["audit"]).await;
    assert!(code != 2 && out.contains("not_dead_lettered"), "{out}");
    host.shutdown().await.unwrap();

    // Team payments' host sweeps its marker: the key settled by then (the marker is this
    // test's, the server did not give the message up), or lettered under team payments'
    // route, never under none.
    let mut config = two.clone();
    config.host.instance_id = Some("payments-1".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    removed(&kv, &their_marker, "team payments' marker swept").await;
    for letter in env.messages(&two.dead_letter.stream).await {
        let route = letter.headers.get("Dedup-Route");
        assert_eq!(route.map(|r| r.as_str()), Some("rb"), "{letter:?}");
    }
    host.shutdown().await.unwrap();
}
