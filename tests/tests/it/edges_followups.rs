//! Issue 42, review follow-ups of `setup --change-route`:
//! - a claim-after key dead-lettered after part of its window outputs was stored (by the
//!   pipeline after a guest's reject, or after the server gave up delivering it) blocks a
//!   change to fenced effects, as a claim-before key does: a replay of its letter under
//!   fenced effects would publish those outputs again without message ids; one a guest
//!   rejected before any publish under its key was attempted does not block it;
//! - a host of the previous release, holding the serving subject without a deployment
//!   (`dedup.control.serving.<source stream>.<route>`), counts as serving during a rolling
//!   upgrade, and a refusal names the serving subject that was silent;
//! - `setup --accept-dead` is refused without `--change-route` or `--rename-route`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::claim::{key, ClaimState};
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host::presence::{self, Probe};
use dedup_host::serve::{self, RunningHost};
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD, SOURCE};
use futures::StreamExt as _;

/// The hostile guest's payload: its first output goes to the output stream, its second to
/// `spare.fu.b`, whose stream is gone (that publish fails, and the delivery is retried).
const PARTIAL: &str = "emit:out.fu.a\u{1e}spare.fu.b";

/// Route `fu` on `in.fu.*` (the hostile guest, keyed by header `Key`) with `extra` lines.
fn route(outputs: &str, extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "fu"
subject = "in.fu.*"
component = "{{guest:hostile}}"
key = {{ header = "Key" }}
allowed_outputs = {outputs}
limits = {{ deadline = "1800ms" }}
{extra}
"#
    )
}

/// One side of a change: its config text, parsed config and file.
struct Side {
    config: Config,
    text: String,
    path: PathBuf,
}

/// A side named `name`: the output stream takes fenced batches and keeps message ids for
/// 10 minutes (so the route can run with either effects); claims in bucket `bucket`; the
/// server gives a message up after `server_max_deliver` deliveries.
fn side(env: &TestEnv, name: &str, routes: &str, bucket: &str, server_max: u32) -> Side {
    let timing = Timing {
        max_deliver: 1,
        server_max_deliver: i64::from(server_max),
        ..Timing::default()
    };
    let text = env
        .config_text(&timing, routes)
        .replace(
            "duplicate_window = \"10m\"",
            "duplicate_window = \"10m\"\neffects = \"fenced\"",
        )
        .replace(
            &format!("bucket = \"{BUCKET}\""),
            &format!("bucket = \"{bucket}\""),
        );
    let path = env.path(&format!("{name}.toml"));
    std::fs::write(&path, &text).unwrap();
    let config = Config::parse(&text, Path::new("t.toml"), env.dir.path().into()).unwrap();
    Side { config, text, path }
}

/// The window side: route `fu` claiming `claim`, allowed to publish the partial payload's
/// outputs.
fn window(env: &TestEnv, claim: &str, server_max: u32) -> Side {
    let routes = route(
        r#"["in.fu.*.done", "out.fu.>", "spare.fu.>"]"#,
        &format!("claim = \"{claim}\""),
    );
    side(env, "old", &routes, BUCKET, server_max)
}

/// The fenced side: route `fu` claiming before, fenced effects, claims in the output stream.
fn fenced(env: &TestEnv, server_max: u32) -> Side {
    let routes = route(r#"["out.fu.>"]"#, "effects = \"fenced\"");
    side(env, "new", &routes, BUCKET, server_max)
}

async fn host(env: &TestEnv, side: &Side, instance: &str) -> RunningHost {
    let mut config = Config::parse(&side.text, Path::new("t.toml"), env.dir.path().into()).unwrap();
    config.host.instance_id = Some(instance.to_string());
    serve::start(config).await.expect("host starts")
}

/// The stream capturing `spare.fu.>`: a host refuses outputs that no stream captures.
fn spare() -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: "SPARE".into(),
        subjects: vec!["spare.>".into()],
        duplicate_window: Duration::from_secs(3600),
        ..Default::default()
    }
}

/// [`host`] of the window side, started while `SPARE` exists, which is then deleted: output
/// `spare.fu.b` fails to publish from then on.
async fn window_host(env: &TestEnv, side: &Side, instance: &str) -> RunningHost {
    env.js.create_stream(spare()).await.unwrap();
    let started = host(env, side, instance).await;
    env.js.delete_stream("SPARE").await.unwrap();
    started
}

/// `dedup-host setup --change-route fu --json` with `side`'s config: (exit 0, output).
async fn change(side: &Side) -> (bool, String) {
    let path = side.path.clone();
    let run = tokio::task::spawn_blocking(move || {
        cli(&path, &["setup", "--change-route", "fu", "--json"])
    })
    .await
    .unwrap();
    (run.code == 0, run.stdout + &run.stderr)
}

/// The recorded contract's effects and claims.
async fn recorded(env: &TestEnv, config: &Config) -> (String, String) {
    let store = env
        .js
        .get_key_value(contract::bucket_name(config))
        .await
        .unwrap();
    let record = contract::read(&store, "fu").await.unwrap().unwrap().0;
    (
        format!("{:?}", record.contract.effects),
        record.contract.claims,
    )
}

async fn publish(env: &TestEnv, key: &str, copy: &str, payload: &str) {
    let id = format!("{key}-{copy}");
    env.publish("in.fu.x", &id, &[("Key", key)], payload.to_string())
        .await;
}

/// Waits until output `out.fu.a` (the partial payload's first) is stored.
async fn first_output_stored(env: &TestEnv) {
    wait_for(
        Duration::from_secs(30),
        "the first output stored",
        || async {
            let outputs = env.outputs().await;
            outputs
                .iter()
                .any(|m| m.subject.as_str() == "out.fu.a")
                .then_some(())
        },
    )
    .await;
}

/// Waits until key `k1` of route `fu` failed for good.
async fn dead(env: &TestEnv) {
    wait_for(Duration::from_secs(60), "k1 failed for good", || async {
        let record = env.claim("fu", "k1").await?;
        (record.state == ClaimState::Failed && record.permanent).then_some(())
    })
    .await;
}

/// The change from `old` to fenced effects is refused naming key `k1`, and changes nothing.
async fn refused_naming_k1(env: &TestEnv, new: &Side) {
    let (changed, out) = change(new).await;
    assert!(!changed, "window -> fenced went through: {out}");
    assert!(
        out.contains("failed for good") && out.contains(&key::encode("fu", "k1")),
        "{out}"
    );
    assert_eq!(
        recorded(env, &new.config).await.0,
        "Window",
        "nothing changed"
    );
}

/// A key that stored output 0 of a delivery whose output 1 could not be published, then was
/// dead-lettered by a guest's reject (another copy of the key), blocks window -> fenced.
async fn dead_after_a_partial_publish_blocks_the_change(claim: &str) {
    let env = TestEnv::start().await;
    let old = window(&env, claim, 100);
    let new = fenced(&env, 100);
    let first = window_host(&env, &old, "old-1").await;
    publish(&env, "k1", "a", PARTIAL).await;
    first_output_stored(&env).await;
    publish(&env, "k1", "b", "reject:0").await;
    dead(&env).await;
    env.wait_drained(Duration::from_secs(60)).await;
    first.shutdown().await.unwrap();
    refused_naming_k1(&env, &new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_key_dead_lettered_after_a_partial_publish_blocks_the_change_to_fenced() {
    dead_after_a_partial_publish_blocks_the_change("after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_before_key_dead_lettered_after_a_partial_publish_blocks_the_change_to_fenced() {
    dead_after_a_partial_publish_blocks_the_change("before").await;
}

/// A claim-after key a guest rejected, with no publish under the key attempted, cannot have
/// stored window outputs: it does not block window -> fenced (nor name a version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_key_rejected_before_any_publish_does_not_block_the_change_to_fenced() {
    let env = TestEnv::start().await;
    let old = window(&env, "after", 100);
    let new = fenced(&env, 100);
    let first = window_host(&env, &old, "old-1").await;
    publish(&env, "k1", "a", "reject:0").await;
    dead(&env).await;
    let record = env.claim("fu", "k1").await.unwrap();
    assert!(!record.may_have_effects(), "no mark: {record:?}");
    env.wait_drained(Duration::from_secs(60)).await;
    first.shutdown().await.unwrap();
    let (changed, out) = change(&new).await;
    assert!(changed, "window -> fenced refused: {out}");
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
}

/// A claim-after message whose second output can never be published is given up by the
/// server (its `server_max_deliver`) after output 0 was stored: its dead letter leaves a
/// record that blocks window -> fenced. The host runs until the consumer has nothing
/// unacknowledged, as the change's refusal of open deliveries tells an operator: the server
/// drops a given-up message from its pending deliveries only as it serves a later pull, so
/// stopping the host at the letter can leave it counted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_key_the_server_gave_up_after_a_partial_publish_blocks_the_change_to_fenced()
{
    let env = TestEnv::start().await;
    let old = window(&env, "after", 4);
    let new = fenced(&env, 4);
    let first = window_host(&env, &old, "old-1").await;
    publish(&env, "k1", "a", PARTIAL).await;
    first_output_stored(&env).await;
    wait_for(Duration::from_secs(90), "the dead letter", || async {
        env.messages(DEAD).await.pop()
    })
    .await;
    dead(&env).await;
    env.wait_drained(Duration::from_secs(60)).await;
    first.shutdown().await.unwrap();
    refused_naming_k1(&env, &new).await;
}

/// A host of the previous release holds the serving subject without a deployment name
/// (`dedup.control.serving.<source stream>.<route>`): a probe finds it, answering or silent,
/// and the change is refused naming it, until it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_of_the_previous_release_on_the_old_serving_subject_blocks_a_change() {
    let env = TestEnv::start().await;
    let routes = route(r#"["in.fu.*.done"]"#, "");
    let old = side(&env, "old", &routes, BUCKET, 100);
    let new = side(&env, "new", &routes, "claims-next", 100);
    // The contract is recorded by a host of this release, which then stops.
    let first = host(&env, &old, "old-1").await;
    first.shutdown().await.unwrap();
    let next = async_nats::jetstream::kv::Config {
        bucket: "claims-next".into(),
        history: 2,
        ..Default::default()
    };
    env.js.create_key_value(next).await.unwrap();

    let client = env.servers.connect().await;
    let subject = format!("dedup.control.serving.{SOURCE}.fu");
    // Silent, as a paused old host would be.
    let silent = client.subscribe(subject.clone()).await.unwrap();
    client.flush().await.unwrap();
    let probe = presence::probe(&client, &new.config, "fu").await.unwrap();
    assert_eq!(
        probe,
        Probe::Silent(vec![subject.clone()]),
        "a silent old host counts as serving, on its subject"
    );
    let (changed, out) = change(&new).await;
    assert!(!changed, "{out}");
    assert!(
        out.contains(&format!("no answer came on `{subject}`:")),
        "names the silent subject: {out}"
    );
    drop(silent);

    // Answering with its instance id, as an old host does.
    let mut held = client.subscribe(subject).await.unwrap();
    let answering = client.clone();
    let answers = tokio::spawn(async move {
        while let Some(request) = held.next().await {
            if let Some(reply) = request.reply {
                let _ = answering.publish(reply, "previous-host".into()).await;
            }
        }
    });
    client.flush().await.unwrap();
    let probe = presence::probe(&client, &new.config, "fu").await.unwrap();
    assert_eq!(probe, Probe::Answered("previous-host".into()));
    let (changed, out) = change(&new).await;
    assert!(!changed, "{out}");
    assert!(out.contains("previous-host"), "{out}");
    assert_eq!(
        recorded(&env, &new.config).await.1,
        format!("bucket {BUCKET}")
    );

    answers.abort();
    let _ = answers.await;
    client.flush().await.unwrap();
    wait_for(Duration::from_secs(30), "the old host gone", || async {
        let probe = presence::probe(&client, &new.config, "fu").await.ok()?;
        (probe == Probe::NoneServes).then_some(())
    })
    .await;
    let (changed, out) = change(&new).await;
    assert!(changed, "{out}");
    assert_eq!(recorded(&env, &new.config).await.1, "bucket claims-next");
}

/// `--accept-dead` only means something to a route change or rename: alone it is refused
/// (exit 2, naming the flags it needs) instead of being ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_dead_without_a_route_change_is_refused() {
    let env = TestEnv::start().await;
    let old = window(&env, "after", 100);
    let run = cli(&old.path, &["setup", "--accept-dead", "fu.k1"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("--change-route") && run.stderr.contains("--rename-route"),
        "{run:?}"
    );
    env.js.create_stream(spare()).await.unwrap();
    let setup = cli(&old.path, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let with = cli(
        &old.path,
        &["setup", "--change-route", "fu", "--accept-dead", "fu.k1"],
    );
    assert_eq!(with.code, 0, "with a route change it is taken: {with:?}");
}
