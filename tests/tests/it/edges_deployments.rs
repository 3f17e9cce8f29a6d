//! Deployments sharing one server cannot touch each other by accident (DESIGN.md rule 23):
//! what a deployment creates records its owner, a command run with another deployment's
//! config is refused before it changes anything, and a renamed route is refused instead of
//! running the whole retained history again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, CONSUMER, SOURCE};
use futures::StreamExt;

mod former_names;

/// A team's config as the quick start writes it: the default source stream, one route named
/// `handler` on `<prefix>.*`, its component deployed through the store.
fn team(env: &TestEnv, prefix: &str) -> (PathBuf, Config) {
    let text = format!(
        r#"
[nats]
urls = ["{url}"]

[source]
subjects = ["{prefix}.*"]
ack_wait = "2s"

[claims]
lease = "2s"
heartbeat = "500ms"
storage = "memory"

[[routes]]
name = "handler"
subject = "{prefix}.*"
"#,
        url = env.server().url(),
    );
    let path = env.path(&format!("{prefix}.toml"));
    std::fs::write(&path, &text).unwrap();
    (path.clone(), Config::load(&path).expect("valid"))
}

/// Runs a `dedup-host` command off the runtime's threads: (exit code, stdout + stderr).
async fn cli(config: &Path, args: &[&str]) -> (i32, String) {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = dedup_host_tests::guests::cli(&config, &args);
        (run.code, format!("{}{}", run.stdout, run.stderr))
    })
    .await
    .unwrap()
}

/// What the server holds that a deployment owns: every stream's and consumer's config, and
/// the contracts and deployed components (claims and host status, which the running host
/// writes, are left out).
async fn snapshot(env: &TestEnv, config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    let mut streams = env.js.streams();
    while let Some(info) = streams.next().await {
        let info = info.unwrap();
        let mut config = info.config.clone();
        let metadata: BTreeMap<_, _> = std::mem::take(&mut config.metadata).into_iter().collect();
        lines.push(format!("stream {config:?} {metadata:?}"));
        if info.config.name.starts_with("KV_") || info.config.name.starts_with("OBJ_") {
            // Their consumers are the watches and listings of hosts and commands.
            continue;
        }
        let stream = env.js.get_stream(&info.config.name).await.unwrap();
        let mut consumers = stream.consumers();
        while let Some(c) = consumers.next().await {
            let c = c.unwrap();
            if c.config.durable_name.is_some() {
                let mut config = c.config.clone();
                let metadata: BTreeMap<_, _> =
                    std::mem::take(&mut config.metadata).into_iter().collect();
                lines.push(format!("consumer {} {config:?} {metadata:?}", c.name));
            }
        }
    }
    let contracts = dedup_host::contract::bucket_name(config);
    if let Ok(kv) = env.js.get_key_value(&contracts).await {
        let mut keys = kv.keys().await.unwrap();
        while let Some(key) = keys.next().await {
            let key = key.unwrap();
            let value = kv.get(&key).await.unwrap().unwrap_or_default();
            lines.push(format!(
                "contract {key} {}",
                String::from_utf8_lossy(&value)
            ));
        }
    }
    if let Ok(store) = env.js.get_object_store(&config.components.bucket).await {
        let deployed = dedup_host::components::store::deployed(&store, "handler").await;
        lines.push(format!("component handler {deployed:?}"));
    }
    lines.sort();
    lines
}

/// Whether every key `t1-0..n` of team 1's route is completed.
async fn completed(env: &TestEnv, config: &Config, n: usize) -> bool {
    let Ok(kv) = env.js.get_key_value(&config.claims.bucket).await else {
        return false;
    };
    for i in 0..n {
        let key = dedup_host::claim::key::encode("handler", &format!("t1-{i}"));
        let Ok(Some(entry)) = kv.get(key).await else {
            return false;
        };
        let record = dedup_host::claim::ClaimRecord::from_bytes(&entry).unwrap();
        if record.state != dedup_host::claim::ClaimState::Completed {
            return false;
        }
    }
    true
}

async fn publish(env: &TestEnv, subject: &str, id: &str) {
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", id);
    env.js
        .publish_with_headers(subject.to_string(), h, "spin-sleep:0:0".into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Two teams follow the quick start on one server: both leave the source stream at its
/// default and both name their route `handler`. Team 2's `setup`, `setup --plan`, `deploy`
/// and host start are refused, naming both deployments and the fix, while team 1's host runs
/// and its messages keep arriving; team 1 loses nothing and nothing of it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_team_on_the_default_stream_changes_nothing_of_the_first() {
    let env = TestEnv::start().await;
    let (one_path, one) = team(&env, "shipping");
    let (two_path, two) = team(&env, "billing");
    let (mine, theirs) = (two.deployment_name(), one.deployment_name());
    assert_ne!(
        mine, theirs,
        "independent configs get different default names"
    );

    let (code, out) = cli(&one_path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let hostile = guest("hostile");
    let deploy = ["deploy", "--route", "handler", "--component"];
    let (code, out) = cli(
        &one_path,
        &[&deploy[..], &[hostile.to_str().unwrap()]].concat(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let mut config = one.clone();
    config.host.instance_id = Some("team-1".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    publish(&env, "shipping.0", "t1-0").await;
    wait_for(Duration::from_secs(60), "team 1 serves", || async {
        completed(&env, &one, 1).await.then_some(())
    })
    .await;
    let before = snapshot(&env, &one).await;

    // Team 1's messages keep arriving while team 2 runs its commands.
    let total = 40;
    let publisher = {
        let env_js = env.js.clone();
        tokio::spawn(async move {
            for i in 1..total {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", format!("t1-{i}").as_str());
                let subject = format!("shipping.{i}");
                let payload = "spin-sleep:0:0".into();
                let ack = env_js.publish_with_headers(subject, h, payload).await;
                ack.unwrap().await.unwrap();
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    let (code, out) = cli(&two_path, &["setup"]).await;
    assert_ne!(code, 0, "{out}");
    for needed in [&mine, &theirs, "[deployment] name", "dedup-host-handler"] {
        assert!(out.contains(needed), "setup names {needed}: {out}");
    }
    assert!(out.contains("nothing was created or changed"), "{out}");
    let (code, out) = cli(&two_path, &["setup", "--plan"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("REFUSED"), "{out}");
    assert!(out.contains("shared") && out.contains(&theirs), "{out}");
    assert!(out.contains("--share-stream DEDUP_EVENTS"), "{out}");
    // The consumer this plan would rebind is a refusal of its own, naming both deployments
    // and the fix (a new user saw only the stream).
    let line = out
        .lines()
        .position(|l| l.starts_with("REFUSED   consumer dedup-host-handler"))
        .unwrap_or_else(|| panic!("the consumer conflict is listed: {out}"));
    let why: Vec<&str> = out.lines().skip(line).take(8).collect();
    let why = why
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for needed in [&mine, &theirs, "[deployment] name"] {
        assert!(why.contains(needed), "the refusal names {needed}: {out}");
    }
    let (code, out) = cli(&two_path, &["setup", "--apply"]).await;
    assert_ne!(code, 0, "{out}");
    let upper = guest("uppercase");
    let (code, out) = cli(
        &two_path,
        &[&deploy[..], &[upper.to_str().unwrap()]].concat(),
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains(&mine) && out.contains(&theirs), "{out}");
    assert!(out.contains("its component was not changed"), "{out}");
    let (code, out) = cli(&two_path, &["undeploy", "--route", "handler"]).await;
    assert_ne!(code, 0, "{out}");
    let mut config = two.clone();
    config.host.instance_id = Some("team-2".into());
    let refused = dedup_host::serve::start(config)
        .await
        .err()
        .expect("refused");
    let refused = format!("{refused:#}");
    assert!(
        refused.contains(&theirs) && refused.contains(&mine),
        "{refused}"
    );

    // A reload or a re-bind skips `ensure` and binds the route's consumer directly: that
    // path refuses too, before it changes anything.
    let source = env.js.get_stream(&one.source.stream).await.unwrap();
    let rebind = dedup_host::setup::route_consumer(&source, &two, "handler", "billing.*", false)
        .await
        .expect_err("a re-bind with team 2's config is refused");
    let rebind = format!("{rebind:#}");
    assert!(
        rebind.contains(&theirs) && rebind.contains(&mine),
        "{rebind}"
    );

    publisher.await.unwrap();
    assert_eq!(
        before,
        snapshot(&env, &one).await,
        "team 1's things unchanged"
    );
    wait_for(
        Duration::from_secs(60),
        "every team 1 message done",
        || async { completed(&env, &one, total).await.then_some(()) },
    )
    .await;
    let letters = env.messages(&one.dead_letter.stream).await;
    assert!(letters.is_empty(), "no dead letters: {}", letters.len());
    host.shutdown().await.unwrap();
}

/// A route of the `flaky` guest on `in.ren.*` with one output per key, fenced or not.
fn renamed_route(name: &str, fenced: bool) -> String {
    let effects = if fenced { "effects = \"fenced\"" } else { "" };
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "in.ren.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.ren.*.done"]
{effects}
config = {{ succeed_on_attempt = "1", outputs = "1", work_ms = "0" }}
"#
    )
}

/// Renaming a route in the config alone (same subject, new name) is refused by `setup` and at
/// host start, naming the fix, with nothing created and nothing run again;
/// `setup --rename-route old new` then carries the claims, the contract and the consumer's
/// position over: the new name runs only what the old one had not, fenced or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_route_carries_its_history_over_or_is_refused() {
    for fenced in [false, true] {
        let mut env = TestEnv::start().await;
        env.fenced_outputs = fenced;
        let timing = Timing::default();
        let host = env.host(&timing, &renamed_route("old", fenced), "h1").await;
        let done = ["a", "b", "c"];
        for k in done {
            env.publish(&format!("in.ren.{k}"), k, &[], "x").await;
        }
        env.wait_completed("old", &done, Duration::from_secs(60))
            .await;
        host.shutdown().await.unwrap();
        assert_eq!(env.outputs().await.len(), done.len(), "fenced {fenced}");
        // Two more arrive while no host runs.
        let waiting = ["d", "e"];
        for k in waiting {
            env.publish(&format!("in.ren.{k}"), k, &[], "x").await;
        }

        let text = env.config_text(&timing, &renamed_route("new", fenced));
        let path = env.path("renamed.toml");
        std::fs::write(&path, text).unwrap();
        let (code, out) = cli(&path, &["setup"]).await;
        assert_ne!(code, 0, "fenced {fenced}: {out}");
        assert!(
            out.contains("route `new` is new") && out.contains("--rename-route old new"),
            "fenced {fenced}: {out}"
        );
        let mut config = env.config(&timing, &renamed_route("new", fenced));
        config.host.instance_id = Some("h2".into());
        let refused = dedup_host::serve::start(config.clone())
            .await
            .err()
            .expect("refused");
        assert!(
            format!("{refused:#}").contains("--rename-route old new"),
            "fenced {fenced}: {refused:#}"
        );
        let source = env.js.get_stream(SOURCE).await.unwrap();
        let new = format!("{CONSUMER}-new");
        assert!(source.consumer_info(&new).await.is_err(), "no `{new}` yet");
        for k in done {
            assert!(env.claim("new", k).await.is_none(), "fenced {fenced}: {k}");
        }

        let (code, out) = cli(&path, &["setup", "--rename-route", "old", "new"]).await;
        assert_eq!(code, 0, "fenced {fenced}: {out}");
        assert!(out.contains("3 claim record(s) carried over"), "{out}");
        let info = source.consumer_info(&new).await.unwrap();
        assert_eq!(info.num_pending, 2, "starts where `old` stopped: {info:?}");
        let old = format!("{CONSUMER}-old");
        assert!(source.consumer_info(&old).await.is_err(), "`{old}` deleted");

        let host = dedup_host::serve::start(config).await.unwrap();
        env.wait_completed("new", &waiting, Duration::from_secs(60))
            .await;
        env.wait_completed("new", &done, Duration::from_secs(5))
            .await;
        host.shutdown().await.unwrap();
        let outputs = env.outputs().await.len();
        assert_eq!(
            outputs,
            done.len() + waiting.len(),
            "fenced {fenced}: none ran twice"
        );
    }
}

/// A reload that renames a route (adds one over the subject of one it removes) is refused
/// whole, as a start is: applied, it would make a new consumer from the start of the stream
/// and run every retained message again (found by a new user following the rename advice).
#[tokio::test]
async fn a_reload_that_renames_a_route_is_refused_and_reruns_nothing() {
    for fenced in [false, true] {
        let mut env = TestEnv::start().await;
        env.fenced_outputs = fenced;
        let timing = Timing::default();
        let host = env.host(&timing, &renamed_route("old", fenced), "h1").await;
        let done = ["a", "b", "c"];
        for k in done {
            env.publish(&format!("in.ren.{k}"), k, &[], "x").await;
        }
        env.wait_completed("old", &done, Duration::from_secs(60))
            .await;
        let mut renamed = env.config(&timing, &renamed_route("new", fenced));
        renamed.host.instance_id = Some("h1".into());
        let report = host.reload(Ok(renamed)).await;
        assert!(!report.applied, "fenced {fenced}: {report:?}");
        let text = report.problems.join("\n");
        assert!(
            text.contains("route `new` is new") && text.contains("--rename-route old new"),
            "fenced {fenced}: {text}"
        );
        // The old route still serves, and nothing ran again.
        env.publish("in.ren.d", "d", &[], "x").await;
        env.wait_completed("old", &["d"], Duration::from_secs(60))
            .await;
        let source = env.js.get_stream(SOURCE).await.unwrap();
        assert!(
            source
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&format!(
                    "{CONSUMER}-new"
                ))
                .await
                .is_err(),
            "fenced {fenced}: no consumer made for the renamed route"
        );
        host.shutdown().await.unwrap();
        assert_eq!(env.outputs().await.len(), 4, "fenced {fenced}");
    }
}

/// A second team on the same stream and subjects with its own `[source] consumer` and the
/// same route name is refused the route's contract: served, it would share the first team's
/// claim keys, and a key the first team completed would be its duplicate, never run (found
/// by a new user following the refusal's first suggestion).
#[tokio::test]
async fn a_second_team_with_its_own_consumer_is_refused_the_first_teams_contract() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let routes = dedup_host_tests::harness::UPPER_ROUTE;
    let host = env.host(&timing, routes, "team1").await;
    env.publish("in.upper.k1", "k1", &[], "x").await;
    env.wait_completed("upper", &["k1"], Duration::from_secs(60))
        .await;
    let text = env.config_text(&timing, routes).replace(
        &format!("consumer = \"{CONSUMER}\""),
        "consumer = \"team2\"",
    );
    let team2 = Config::parse(&text, Path::new("team2.toml"), env.dir.path().to_path_buf())
        .expect("valid config");
    let store = env
        .js
        .get_key_value(dedup_host::contract::bucket_name(&team2))
        .await
        .unwrap();
    let refused = dedup_host::contract::agree(&store, &team2, &team2.routes[0], "team2")
        .await
        .expect_err("refused");
    let text = refused.to_string();
    assert!(
        text.contains(&format!("recorded for consumer `{CONSUMER}-upper`"))
            && text.contains("`team2-upper`"),
        "{text}"
    );
    let items = dedup_host::provision::provision(&env.js, &team2, true)
        .await
        .unwrap();
    assert!(
        items.iter().any(|i| matches!(&i.found, dedup_host::provision::Found::Differs(d) if d.iter().any(|d| d.contains("recorded for consumer")))),
        "setup names the conflict: {items:?}"
    );
    // The first team's own host keeps agreeing with it.
    let team1 = env.config(&timing, routes);
    dedup_host::contract::agree(&store, &team1, &team1.routes[0], "team1")
        .await
        .expect("the first team agrees with its own contract");
    host.shutdown().await.unwrap();
}

/// The `[deployment]` name recorded as the owner of `stream`, of its consumer `consumer`,
/// and in the contract of route `handler`.
async fn owners(env: &TestEnv, config: &Config, consumer: &str) -> [Option<String>; 3] {
    let key = dedup_host::ownership::OWNER_KEY;
    let mut stream = env.js.get_stream(&config.source.stream).await.unwrap();
    let info = stream.info().await.unwrap();
    let of_stream = info.config.metadata.get(key).cloned();
    let info = stream.consumer_info(consumer).await.unwrap();
    let of_consumer = info.config.metadata.get(key).cloned();
    let store = env
        .js
        .get_key_value(dedup_host::contract::bucket_name(config))
        .await
        .unwrap();
    let (record, _) = dedup_host::contract::read(&store, "handler")
        .await
        .unwrap()
        .expect("recorded");
    [of_stream, of_consumer, record.deployment]
}

/// A deployment that leaves `[deployment] name` unset and adds a source subject gets a new
/// default name: its own former name is recognised by what it owns (its route consumer with
/// the filters it still gives it), never called another deployment by `setup --plan`, and
/// `setup` moves the recorded owner to the new name, saying so; a host then starts.
#[tokio::test]
async fn a_deployment_that_adds_a_subject_keeps_what_it_owns_under_its_new_default_name() {
    let env = TestEnv::start().await;
    let (path, first) = team(&env, "shipping");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let consumer = dedup_host::setup::route_consumer_name(&first, "handler");
    let old = first.deployment_name();
    assert_eq!(
        owners(&env, &first, &consumer).await,
        [Some(old.clone()), Some(old.clone()), Some(old.clone())]
    );

    let text = std::fs::read_to_string(&path).unwrap().replace(
        r#"subjects = ["shipping.*"]"#,
        r#"subjects = ["shipping.*", "returns.*"]"#,
    );
    std::fs::write(&path, text).unwrap();
    let grown = Config::load(&path).expect("valid");
    let new = grown.deployment_name();
    assert_ne!(old, new, "the default name follows the subjects");
    let (code, out) = cli(&path, &["setup", "--plan"]).await;
    assert_eq!(code, 0, "its own stream is not shared: {out}");
    assert!(!out.contains("shared") && !out.contains("REFUSED"), "{out}");
    let (code, out) = cli(&path, &["setup", "--apply"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&old) && out.contains(&new), "says so: {out}");
    assert_eq!(
        owners(&env, &grown, &consumer).await,
        [Some(new.clone()), Some(new.clone()), Some(new.clone())],
        "the owner moved to the new name: {out}"
    );
    let mut config = grown.clone();
    config.host.instance_id = Some("grown".into());
    let host = dedup_host::serve::start(config).await.expect("serves");
    host.shutdown().await.unwrap();
}

/// Team 2 names its own `[source] consumer` but the same route name on the same stream and
/// subjects (so the same default deployment name), and deploys before team 1 has set up (no
/// consumer, no contract yet): the component object itself records who deployed it, so team
/// 2's deploy is refused with both consumers and the fix, and team 1's object stays
/// byte-identical.
#[tokio::test]
async fn a_second_teams_deploy_never_overwrites_the_first_teams_component() {
    let env = TestEnv::start().await;
    let (one_path, one) = team(&env, "shipping");
    let text = std::fs::read_to_string(&one_path)
        .unwrap()
        .replace("[source]\n", "[source]\nconsumer = \"team2\"\n");
    let two_path = env.path("team2.toml");
    std::fs::write(&two_path, text).unwrap();
    let two = Config::load(&two_path).expect("valid");
    assert_eq!(one.deployment_name(), two.deployment_name());

    let deploy = ["deploy", "--route", "handler", "--component"];
    let hostile = guest("hostile");
    let args = [&deploy[..], &[hostile.to_str().unwrap()]].concat();
    let (code, out) = cli(&one_path, &args).await;
    assert_eq!(code, 0, "{out}");
    let store = env
        .js
        .get_object_store(&one.components.bucket)
        .await
        .unwrap();
    let before = dedup_host::objects::read(&store, "handler").await.unwrap();

    let upper = guest("uppercase");
    for command in ["deploy", "undeploy"] {
        let args: Vec<&str> = if command == "deploy" {
            [&deploy[..], &[upper.to_str().unwrap()]].concat()
        } else {
            vec!["undeploy", "--route", "handler"]
        };
        let (code, out) = cli(&two_path, &args).await;
        assert_ne!(code, 0, "{command}: {out}");
        for needed in [
            "dedup-host-handler",
            "team2-handler",
            "its component was not changed",
            "a name of its own",
        ] {
            assert!(out.contains(needed), "{command} names {needed}: {out}");
        }
        let after = dedup_host::objects::read(&store, "handler").await.unwrap();
        assert!(before == after, "{command}: team 1's component unchanged");
    }
    // Team 1 itself deploys over its own component.
    let (code, out) = cli(
        &one_path,
        &[&deploy[..], &[upper.to_str().unwrap()]].concat(),
    )
    .await;
    assert_eq!(code, 0, "{out}");
}
