//! Issue 42, finding 8: a key whose window outputs were begun by one version is never
//! finished by another. A canary candidate publishes its first output, its second is refused
//! (no stream captures it yet); then the canary is rolled back, or its split moves the key to
//! the live version, before the key runs again. Window output ids are `<claim key>#<index>`
//! for every version, so a re-run on the live version would have its output dropped as a
//! duplicate of the candidate's (lost) beside the candidate's half-set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::candidate::canary::runs_on_candidate;
use dedup_host::claim::ClaimState;
use dedup_host::serve::RunningHost;
use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

/// The candidate's outputs: the first to the output stream, the second to `spare.>`, which
/// no stream captures until the test creates `SPARE`.
const PAYLOAD: &str = "emit:out.edge.a\u{1e}spare.edge.b";

/// The live version (`uppercase`) and the route's files: `edge.wasm`, and its canary
/// candidate `edge.candidate.wasm` (`hostile`, which emits the outputs its payload names)
/// running `percent` % of keys.
fn files(env: &TestEnv, percent: u8) -> (PathBuf, String) {
    let dir = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("uppercase"), dir.join("edge.wasm")).unwrap();
    write_candidate(&dir, percent);
    let routes = format!(
        r#"
[[routes]]
name = "edge"
subject = "in.edge.*"
component = "{}"
allowed_outputs = ["in.edge.*.done", "out.edge.>", "spare.edge.>"]
"#,
        dir.join("edge.wasm").display()
    );
    (dir, routes)
}

/// (Re)writes the candidate and its settings: a canary of `percent` % of keys.
fn write_candidate(dir: &Path, percent: u8) {
    let settings = format!("mode = \"canary\"\npercent = {percent}\n");
    std::fs::write(dir.join("edge.candidate.toml"), settings).unwrap();
    // Written anew, so the host reads the settings again with it.
    let bytes = std::fs::read(guest("hostile")).unwrap();
    std::fs::write(dir.join("edge.candidate.wasm"), bytes).unwrap();
}

fn candidate_digest() -> String {
    dedup_host::runtime::digest(&std::fs::read(guest("hostile")).unwrap())
}

/// A key the canary runs at 99 % and not at 1 %.
fn key() -> String {
    (0..)
        .map(|i| format!("k-{i}"))
        .find(|k| runs_on_candidate(k, 99) && !runs_on_candidate(k, 1))
        .unwrap()
}

/// Waits until `host` applies a canary share of `percent` on the route.
async fn wait_share(host: &RunningHost, percent: u8) {
    let line = format!("dedup_canary_share_percent{{route=\"edge\"}} {percent}");
    let what = format!("a canary share of {percent} %");
    wait_for(Duration::from_secs(30), &what, || async {
        host.metrics()
            .encode()
            .lines()
            .any(|l| l == line)
            .then_some(())
    })
    .await;
}

/// Publishes the key's message and waits until the candidate has published its first
/// output and the claim records that it began the key's effects.
async fn begin_on_the_candidate(env: &TestEnv, key: &str) {
    env.publish("in.edge.1", key, &[], PAYLOAD).await;
    let digest = candidate_digest();
    wait_for(
        Duration::from_secs(30),
        "the candidate's first output stored and its second refused",
        || async {
            let record = env.claim("edge", key).await?;
            let outputs = env.outputs().await;
            (record.state == ClaimState::Failed
                && record.digest == digest
                && outputs.iter().any(|m| m.subject.as_str() == "out.edge.a"))
            .then_some(())
        },
    )
    .await;
}

/// Waits until the key is settled for good (completed, or failed for good).
async fn settled(env: &TestEnv, key: &str) -> dedup_host::claim::ClaimRecord {
    wait_for(Duration::from_secs(60), "the key settled", || async {
        let record = env.claim("edge", key).await?;
        let done = record.state == ClaimState::Completed
            || record.state == ClaimState::Failed && record.permanent;
        done.then_some(record)
    })
    .await
}

/// The subjects of the outputs stored for the route, in `stream`.
async fn stored(env: &TestEnv, stream: &str) -> Vec<String> {
    let all = env.messages(stream).await;
    all.iter()
        .map(|m| m.subject.to_string())
        .filter(|s| s.contains("edge"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_begun_by_a_rolled_back_canary_is_dead_lettered_not_finished_by_the_live_version() {
    let env = TestEnv::start().await;
    let (dir, routes) = files(&env, 99);
    let host = env.host(&Timing::default(), &routes, "host-a").await;
    wait_share(&host, 99).await;
    let key = key();
    begin_on_the_candidate(&env, &key).await;
    // Rolled back before the key runs again.
    std::fs::remove_file(dir.join("edge.candidate.wasm")).unwrap();
    wait_share(&host, 0).await;
    let record = settled(&env, &key).await;
    let digest = candidate_digest();
    assert!(
        record.state == ClaimState::Failed && record.permanent,
        "the live version finished a key the candidate began: {record:?}"
    );
    let reason = record.reason.unwrap_or_default();
    assert!(
        reason.contains(&key) && reason.contains(&digest) && reason.contains("install it again"),
        "{reason}"
    );
    // One effect set begun, of one version: the candidate's first output, nothing of the live.
    assert_eq!(stored(&env, OUTPUTS).await, ["out.edge.a"]);
    let letters = env.messages(DEAD).await;
    assert_eq!(letters.len(), 1, "the message is dead-lettered, not lost");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_begun_by_a_canary_is_finished_by_it_after_its_split_moves_the_key() {
    let env = TestEnv::start().await;
    let (dir, routes) = files(&env, 99);
    let host = env.host(&Timing::default(), &routes, "host-a").await;
    wait_share(&host, 99).await;
    let key = key();
    begin_on_the_candidate(&env, &key).await;
    // The split now sends the key to the live version; then the missing stream appears.
    write_candidate(&dir, 1);
    wait_share(&host, 1).await;
    env.create_stream("SPARE", &["spare.>"]).await;
    let record = settled(&env, &key).await;
    assert_eq!(record.state, ClaimState::Completed, "{record:?}");
    assert_eq!(record.digest, candidate_digest(), "{record:?}");
    // The candidate's whole set, once; nothing of the live version's.
    assert_eq!(stored(&env, OUTPUTS).await, ["out.edge.a"]);
    assert_eq!(stored(&env, "SPARE").await, ["spare.edge.b"]);
    assert!(env.messages(DEAD).await.is_empty());
    host.shutdown().await.unwrap();
}
