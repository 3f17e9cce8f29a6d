//! Issue 42, finding 8: a key whose window outputs were begun by one version is never
//! finished by another. A canary candidate publishes its first output, its second is refused
//! (its stream is gone for now); then the canary is rolled back, or its split moves the key to
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

/// The candidate's outputs: the first to the output stream, the second to `spare.>`, whose
/// stream `SPARE` is gone (after the host started) until the test creates it again.
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

/// The stream capturing `spare.>`. (A host starting checks its duplicate window against
/// re-run gaps.)
fn spare() -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: "SPARE".into(),
        subjects: vec!["spare.>".into()],
        duplicate_window: Duration::from_secs(3600),
        ..Default::default()
    }
}

/// Runs `start` while `SPARE` exists (a host refuses outputs that no stream captures), then
/// deletes it: the candidate's second output fails to publish until the test creates it again.
async fn without_spare<T, F: std::future::Future<Output = T>>(env: &TestEnv, start: F) -> T {
    env.js.create_stream(spare()).await.unwrap();
    let started = start.await;
    env.js.delete_stream("SPARE").await.unwrap();
    started
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
    let host = without_spare(&env, env.host(&Timing::default(), &routes, "host-a")).await;
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
    let host = without_spare(&env, env.host(&Timing::default(), &routes, "host-a")).await;
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

/// Sets `file`'s modification time to two hours ago: a host polling every hour takes it at
/// start as a settled file.
fn age(file: &Path) {
    let old = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    let f = std::fs::File::options().write(true).open(file).unwrap();
    f.set_modified(old).unwrap();
}

/// Starts host B on `routes` served from `dir`, polling its files hourly: it takes the (old)
/// live file at start, and the candidate, written moments ago, not within the test, although
/// its files offer it all along.
async fn without_the_candidate(env: &TestEnv, dir: &Path, routes: &str) -> RunningHost {
    age(&dir.join("edge.wasm"));
    let mut config = env.config(&Timing::default(), routes);
    config.host.instance_id = Some("host-b".into());
    config.components.poll_interval = Duration::from_secs(3600);
    without_spare(env, dedup_host::serve::start(config))
        .await
        .expect("host starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pinned_to_a_candidate_another_host_runs_waits_for_it_on_a_host_that_has_not_loaded_it(
) {
    let env = TestEnv::start().await;
    let (dir, routes) = files(&env, 99);
    let host = without_spare(&env, env.host(&Timing::default(), &routes, "host-a")).await;
    wait_share(&host, 99).await;
    let key = key();
    begin_on_the_candidate(&env, &key).await;
    host.shutdown().await.unwrap();
    // Host B polls its files hourly: it takes the (old) live file at start, and the candidate,
    // written moments ago, not within the test. The candidate stays installed all along.
    let late = without_the_candidate(&env, &dir, &routes).await;
    let record = wait_for(
        Duration::from_secs(60),
        "host B handled the key's redelivery",
        || async {
            let record = env.claim("edge", &key).await?;
            let reason = record.reason.clone().unwrap_or_default();
            (record.permanent || reason.contains("not loaded on this host")).then_some(record)
        },
    )
    .await;
    assert!(
        !record.permanent,
        "a host that had not loaded the pinned candidate dead-lettered the key: {record:?}"
    );
    assert_eq!(record.digest, candidate_digest(), "{record:?}");
    // A host that runs the candidate finishes the key, with the candidate's whole set. (A
    // host starting now checks the new stream's duplicate window against re-run gaps.) Host
    // B stops first: beside it, every redelivery could go to B again, given back each time
    // (the full run beside CPU hogs once saw C wait past a minute).
    late.shutdown().await.unwrap();
    env.js.create_stream(spare()).await.unwrap();
    let host = env.host(&Timing::default(), &routes, "host-c").await;
    let record = settled(&env, &key).await;
    assert_eq!(record.state, ClaimState::Completed, "{record:?}");
    assert_eq!(record.digest, candidate_digest(), "{record:?}");
    assert_eq!(stored(&env, OUTPUTS).await, ["out.edge.a"]);
    assert_eq!(stored(&env, "SPARE").await, ["spare.edge.b"]);
    assert!(env.messages(DEAD).await.is_empty());
    host.shutdown().await.unwrap();
}

/// Found by the simulation (seed 9185 `--coalesce`): a claim-before delivery whose claim names
/// a version not installed on its host is settled for that (given back, or dead-lettered)
/// only once it is neither late nor superseded, since those run no version. Here, on a
/// coalescing route, a newer update of the entity waits behind a key begun by the candidate,
/// on a host that has not loaded the candidate (its files still offer it): the key is
/// coalesced and the newer update runs. Before the fix the key was given back to wait for
/// a host that loads the candidate, and the entity's newer update waited behind it. (In the
/// simulation, a stale copy of a message already settled reclaimed its coalesced key after a
/// promotion removed the version, and was dead-lettered instead of judged late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_key_pinned_to_a_version_not_loaded_here_is_coalesced_not_held() {
    let env = TestEnv::start().await;
    let (dir, routes) = files(&env, 99);
    let routes = format!("{routes}exclusive_by = {{ subject_token = 2 }}\ncoalesce = true\n");
    let host = without_spare(&env, env.host(&Timing::default(), &routes, "host-a")).await;
    wait_share(&host, 99).await;
    let key = key();
    begin_on_the_candidate(&env, &key).await;
    host.shutdown().await.unwrap();
    // A newer update of the same entity (`1`), for the live version.
    env.publish("in.edge.1", "newer", &[], "hello").await;
    // Host B has not loaded the candidate, which its files still offer (as in the test
    // above): it takes the old live file at start, and the candidate not within the test.
    let late = without_the_candidate(&env, &dir, &routes).await;
    let newer = wait_for(
        Duration::from_secs(60),
        "the newer update of the entity ran",
        || async {
            let record = env.claim("edge", "newer").await?;
            (record.state == ClaimState::Completed).then_some(record)
        },
    )
    .await;
    assert!(!newer.is_coalesced(), "{newer:?}");
    let record = env.claim("edge", &key).await.unwrap();
    assert!(record.is_coalesced(), "the superseded key: {record:?}");
    assert_eq!(
        record.effects_by,
        Some(candidate_digest()),
        "still names the version that began it: {record:?}"
    );
    // The candidate's first output; nothing of the live version's for the key; the newer
    // update's output.
    assert_eq!(
        stored(&env, OUTPUTS).await,
        ["out.edge.a", "in.edge.1.done"]
    );
    assert!(env.messages(DEAD).await.is_empty());
    late.shutdown().await.unwrap();
}

/// A claim-after route served from the object store (`after`), and one served from files
/// (`edge`) with the candidate beside its file in `mode` (`shadow`, or `canary` at 99 %).
fn after_routes(env: &TestEnv, canary: bool) -> String {
    let dir = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("uppercase"), dir.join("edge.wasm")).unwrap();
    write_candidate(&dir, 99);
    if !canary {
        std::fs::write(dir.join("edge.candidate.toml"), "mode = \"shadow\"\n").unwrap();
    }
    format!(
        r#"
[[routes]]
name = "edge"
subject = "in.edge.*"
component = "{}"
allowed_outputs = ["in.edge.*.done", "out.edge.>"]
claim = "after"
limits = {{ deadline = "1800ms" }}

[[routes]]
name = "after"
subject = "in.after.*"
allowed_outputs = ["in.after.*.done"]
claim = "after"
limits = {{ deadline = "1800ms" }}
"#,
        dir.join("edge.wasm").display()
    )
}

/// The candidate host `host-a` reports running beside route `edge`'s live version.
async fn reported_candidate(env: &TestEnv, routes: &str) -> Option<Option<String>> {
    let config = env.config(&Timing::default(), routes);
    let status = dedup_host::components::status::open(&env.js, &config)
        .await
        .ok()?;
    let hosts = dedup_host::components::status::read_all(&status)
        .await
        .ok()?;
    let host = hosts.into_iter().find(|h| h.instance_id == "host-a")?;
    Some(host.routes.get("edge")?.candidate.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_of_a_claim_after_route_is_refused_by_deploy_and_by_the_hosts() {
    let env = TestEnv::start().await;
    // Hosts: a shadow runs beside a claim-after route (it publishes nothing); turned into a
    // canary, it is dropped, and the live version keeps every key.
    let routes = after_routes(&env, false);
    let host = env.host(&Timing::default(), &routes, "host-a").await;
    wait_for(
        Duration::from_secs(30),
        "the shadow candidate runs",
        || async {
            let candidate = reported_candidate(&env, &routes).await??;
            candidate.contains("shadow").then_some(())
        },
    )
    .await;
    write_candidate(&env.path("handlers"), 99);
    wait_for(Duration::from_secs(30), "the canary refused", || async {
        reported_candidate(&env, &routes)
            .await?
            .is_none()
            .then_some(())
    })
    .await;
    host.shutdown().await.unwrap();

    // The CLI: refused before anything is uploaded, naming the route and the way out.
    let config_file = env.path("after.toml");
    let text = env.config_text(&Timing::default(), &after_routes(&env, true));
    std::fs::write(&config_file, text).unwrap();
    let run = |args: Vec<String>| {
        let config_file = config_file.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            dedup_host_tests::guests::cli(&config_file, &args)
        })
    };
    let setup = run(vec!["setup".into()]).await.unwrap();
    assert_eq!(setup.code, 0, "{setup:?}");
    let live = guest("uppercase").display().to_string();
    let deploy = ["deploy", "--route", "after", "--component", &live];
    let deployed = run(deploy.map(String::from).to_vec()).await.unwrap();
    assert_eq!(deployed.code, 0, "{deployed:?}");
    let canary = guest("hostile").display().to_string();
    let args = ["deploy", "--route", "after", "--canary", "20%", &canary];
    let refused = run(args.map(String::from).to_vec()).await.unwrap();
    assert_eq!(refused.code, 1, "a refusal: {refused:?}");
    assert!(
        refused
            .stderr
            .contains("route `after` claims after running")
            && refused.stderr.contains("--shadow"),
        "{refused:?}"
    );
    let config = env.config(&Timing::default(), &after_routes(&env, true));
    let bucket = env
        .js
        .get_object_store(&config.components.bucket)
        .await
        .unwrap();
    let stored = dedup_host::candidate::store::current(&bucket, "after").await;
    assert!(stored.unwrap().is_none(), "a refused canary was uploaded");
}

/// Finding 8 on a claim-after route, found by the simulation (a promotion between two runs of
/// a key): a publish failed part-way, then a new live version replaced the one that began the
/// key's effects. The new version does not finish the key (its outputs would sit beside the
/// old version's first one); the key is dead-lettered, still naming the version gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_after_key_begun_by_a_replaced_version_is_dead_lettered_not_finished_by_the_new_one(
) {
    let env = TestEnv::start().await;
    let dir = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("hostile"), dir.join("edge.wasm")).unwrap();
    let routes = format!(
        r#"
[[routes]]
name = "edge"
subject = "in.edge.*"
component = "{}"
allowed_outputs = ["in.edge.*.done", "out.edge.>", "spare.edge.>"]
claim = "after"
limits = {{ deadline = "1800ms" }}
"#,
        dir.join("edge.wasm").display()
    );
    let host = without_spare(&env, env.host(&Timing::default(), &routes, "host-a")).await;
    let key = "k-after";
    env.publish("in.edge.1", key, &[], PAYLOAD).await;
    let digest = candidate_digest();
    wait_for(
        Duration::from_secs(30),
        "the first output stored and the key marked with the version that published it",
        || async {
            let record = env.claim("edge", key).await?;
            let outputs = env.outputs().await;
            (record.effects_by.as_deref() == Some(digest.as_str())
                && outputs.iter().any(|m| m.subject.as_str() == "out.edge.a"))
            .then_some(())
        },
    )
    .await;
    // A new live version replaces it before the key runs again.
    std::fs::copy(guest("uppercase"), dir.join("edge.wasm")).unwrap();
    let record = settled(&env, key).await;
    assert!(
        record.state == ClaimState::Failed && record.permanent,
        "the new live version finished a key the old one began: {record:?}"
    );
    assert_eq!(
        record.effects_by.as_deref(),
        Some(digest.as_str()),
        "{record:?}"
    );
    let reason = record.reason.unwrap_or_default();
    assert!(
        reason.contains(key) && reason.contains(&digest) && reason.contains("install it again"),
        "{reason}"
    );
    assert_eq!(stored(&env, OUTPUTS).await, ["out.edge.a"]);
    assert_eq!(env.messages(DEAD).await.len(), 1, "dead-lettered, not lost");
    host.shutdown().await.unwrap();
}
