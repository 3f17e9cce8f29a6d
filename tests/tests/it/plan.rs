//! `setup --plan` / `--apply` on a live deployment: a wider source stream and a longer output
//! window are made in place while a host process keeps working (nothing lost or doubled), and
//! changes that would lose or weaken what is stored are refused with what to do instead.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::stream::StorageType;
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{stop_gracefully, TestEnv, Timing, OUTPUTS, SOURCE, UPPER_ROUTE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_and_apply_widen_a_live_deployment_and_refuse_what_would_lose_data() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    // Named: the default deployment name follows the source subjects, which this widens.
    let routes = format!("{UPPER_ROUTE}\n[deployment]\nname = \"shop\"\n");
    let host = env.host_process(&timing, &routes, "h1").await;
    let base = env.config_text(&timing, &routes);
    let wider = base
        .replace(
            "subjects = [\"in.*.*\"]\nconsumer",
            "subjects = [\"in.*.*\", \"extra.>\"]\nconsumer",
        )
        .replace("duplicate_window = \"10m\"", "duplicate_window = \"12m\"");
    assert_ne!(wider, base, "the harness config changed shape");
    let path = env.path("wider.toml");
    std::fs::write(&path, &wider).unwrap();

    let keys: Vec<String> = (0..40).map(|i| format!("k-{i}")).collect();
    for key in &keys[..10] {
        env.publish("in.upper.x", key, &[], "abc").await;
    }
    let plan = cli(&path, &["setup", "--plan"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    assert!(
        plan.stdout
            .contains(r#"subjects ["in.*.*"] -> ["in.*.*", "extra.>"]"#)
            && plan.stdout.contains("duplicate window 10m -> 12m")
            && plan.stdout.contains("to apply"),
        "{}",
        plan.stdout
    );
    let mut source = env.js.get_stream(SOURCE).await.unwrap();
    let info = source.info().await.unwrap();
    assert_eq!(info.config.subjects, ["in.*.*"], "--plan changes nothing");

    // The change is applied while messages arrive and the host runs them.
    let publisher = {
        let js = env.js.clone();
        let keys = keys[10..].to_vec();
        tokio::spawn(async move {
            for key in keys {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", key.as_str());
                js.publish_with_headers("in.upper.x", h, "abc".into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let applied = cli(&path, &["setup", "--apply"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    assert_eq!(
        applied.stdout.matches("applied").count(),
        2,
        "{}",
        applied.stdout
    );
    publisher.await.unwrap();
    let info = source.info().await.unwrap();
    assert_eq!(info.config.subjects, ["in.*.*", "extra.>"]);
    let mut outputs = env.js.get_stream(OUTPUTS).await.unwrap();
    let out_info = outputs.info().await.unwrap();
    assert_eq!(out_info.config.duplicate_window, Duration::from_secs(720));
    let again = cli(&path, &["setup", "--plan"]);
    assert!(again.stdout.contains("nothing to change"), "{again:?}");

    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("upper", &keys, Duration::from_secs(60))
        .await;
    env.wait_drained(Duration::from_secs(20)).await;
    let outputs = env.outputs().await;
    let ids: BTreeSet<String> = outputs
        .iter()
        .filter_map(|m| m.headers.get("Nats-Msg-Id").map(|v| v.to_string()))
        .collect();
    assert_eq!(outputs.len(), keys.len(), "one output per key");
    assert_eq!(ids.len(), keys.len());
    stop_gracefully(host);

    // A shorter claim max age and another storage would lose what is stored: refused.
    let lossy = wider
        .replace("[claims]\n", "[claims]\nmax_age = \"1h\"\n")
        .replace(
            "duplicate_window = \"12m\"",
            "duplicate_window = \"12m\"\nstorage = \"memory\"",
        );
    let path = env.path("lossy.toml");
    std::fs::write(&path, &lossy).unwrap();
    let refused = cli(&path, &["setup", "--apply"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stdout.contains("REFUSED   kv bucket")
            && refused
                .stdout
                .contains("keep the longer max age in the config")
            && refused.stdout.contains("REFUSED   stream OUTPUTS")
            && refused.stdout.contains("nats stream backup"),
        "{}",
        refused.stdout
    );
    let out_info = stream_config(&env, OUTPUTS).await;
    assert_eq!(out_info.storage, StorageType::File);
    let bucket = stream_config(&env, &format!("KV_{}", dedup_host_tests::harness::BUCKET)).await;
    assert_eq!(bucket.max_age, Duration::from_secs(24 * 3600));
}

/// A stream's config as the server holds it now.
async fn stream_config(env: &TestEnv, name: &str) -> async_nats::jetstream::stream::Config {
    let mut stream = env.js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().config.clone()
}

/// A deployment that leaves `[deployment] name` unset and widens its source subjects gets a
/// new default name: `setup --plan` says that the next plain `setup` moves what the former
/// name owns to the new one (and that old hosts keep serving), and moves nothing itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_says_the_next_setup_moves_a_former_default_deployment_name() {
    use dedup_host::config::Config;

    let env = TestEnv::start().await;
    // Every source subject routed: no unrouted consumer (hosts of this name rebind theirs).
    let base = env.config_text(&Timing::default(), UPPER_ROUTE).replace(
        "subjects = [\"in.*.*\"]\nconsumer",
        "subjects = [\"in.upper.*\"]\nconsumer",
    );
    assert!(!base.contains("[deployment]"), "a default name");
    let path = env.path("base.toml");
    std::fs::write(&path, &base).unwrap();
    let setup = cli(&path, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let wider = base.replace(
        "subjects = [\"in.upper.*\"]\nconsumer",
        "subjects = [\"in.upper.*\", \"extra.>\"]\nconsumer",
    );
    assert_ne!(wider, base, "the harness config changed shape");
    let wider_path = env.path("wider.toml");
    std::fs::write(&wider_path, &wider).unwrap();
    let (old, new) = (
        Config::load(&path).unwrap().deployment_name(),
        Config::load(&wider_path).unwrap().deployment_name(),
    );
    assert_ne!(old, new, "the default name follows the subjects");
    let consumer = format!("{}-upper", dedup_host_tests::harness::CONSUMER);
    let owner = || async {
        let stream = env.js.get_stream(SOURCE).await.unwrap();
        let info = stream.consumer_info(&consumer).await.unwrap();
        dedup_host::ownership::owner(&info.config.metadata).map(str::to_string)
    };

    let plan = cli(&wider_path, &["setup", "--plan"]);
    assert_eq!(plan.code, 0, "{plan:?}");
    let line = format!("at setup  deployment {old} (deployment.name): owner `{old}` -> `{new}`");
    assert!(plan.stdout.contains(&line), "{}", plan.stdout);
    assert_eq!(
        owner().await.as_deref(),
        Some(old.as_str()),
        "--plan moved nothing"
    );
    let json = cli(&wider_path, &["setup", "--plan", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let moves: Vec<&serde_json::Value> = (v.as_array().unwrap().iter())
        .filter(|c| c["by_setup"] == true)
        .collect();
    assert_eq!(moves.len(), 1, "{v}");
    let risk = moves[0]["risk"].as_str().unwrap();
    for part in [
        "The next plain `dedup-host setup` (not `--apply`)",
        "Hosts still running the old config keep serving",
    ] {
        assert!(risk.contains(part), "`{part}` in {risk}");
    }

    let applied = cli(&wider_path, &["setup", "--apply"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let moved = cli(&wider_path, &["setup"]);
    assert_eq!(moved.code, 0, "{moved:?}");
    assert_eq!(
        owner().await.as_deref(),
        Some(new.as_str()),
        "setup moved it"
    );
}

/// A route moving from window to fenced effects needs its output stream to take atomic
/// batches and rollups: `setup --apply` makes that in place (stored messages stay) once the
/// operator names the stream with `--allow-rollup` (rollups let any client that may publish
/// there purge it), so the README's steps work: apply, restart the hosts with the new config,
/// `--change-route`, and a fenced host commits on the changed stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_lets_an_existing_output_stream_take_fenced_commits_in_place() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let window = env.config_text(&timing, UPPER_ROUTE);
    let path = env.path("window.toml");
    std::fs::write(&path, &window).unwrap();
    let setup = cli(&path, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    env.js
        .publish("out.kept", "stored before".into())
        .await
        .unwrap()
        .await
        .unwrap();

    let fenced = env
        .config_text(&timing, &format!("{UPPER_ROUTE}effects = \"fenced\"\n"))
        .replace(
            "duplicate_window = \"10m\"\nreplicas",
            "duplicate_window = \"10m\"\neffects = \"fenced\"\nreplicas",
        );
    assert_ne!(fenced, window, "the harness config changed shape");
    let fenced_path = env.path("fenced.toml");
    std::fs::write(&fenced_path, &fenced).unwrap();
    // Rollups let any client that may publish to the stream purge it: named, or refused.
    let plan = cli(&fenced_path, &["setup", "--plan"]);
    assert_eq!(plan.code, 1, "{plan:?}");
    let flag = format!("--allow-rollup {OUTPUTS}");
    assert!(
        plan.stdout
            .contains("atomic batches false -> true, rollups false -> true")
            && plan.stdout.contains("REFUSED")
            && plan.stdout.contains("Nats-Rollup: all")
            && plan.stdout.contains(&flag),
        "{}",
        plan.stdout
    );
    // The contract's change (window -> fenced) is named with the command that makes it.
    assert!(
        plan.stdout.contains("next step")
            && plan
                .stdout
                .contains("effects: recorded \"window\", this config \"fenced\"")
            && plan.stdout.contains("--change-route upper"),
        "{}",
        plan.stdout
    );
    let refused = cli(&fenced_path, &["setup", "--apply"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    let outputs = stream_config(&env, OUTPUTS).await;
    assert!(!outputs.allow_atomic_publish && !outputs.allow_rollup);
    let applied = cli(
        &fenced_path,
        &["setup", "--apply", "--allow-rollup", OUTPUTS],
    );
    assert_eq!(applied.code, 0, "{applied:?}");
    assert!(
        applied.stdout.contains("applied") && applied.stdout.contains("Nats-Rollup: all"),
        "the risk is stated: {}",
        applied.stdout
    );
    let outputs = stream_config(&env, OUTPUTS).await;
    assert!(outputs.allow_atomic_publish && outputs.allow_rollup);
    let mut stream = env.js.get_stream(OUTPUTS).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1, "kept");
    let changed = cli(&fenced_path, &["setup", "--change-route", "upper"]);
    assert_eq!(changed.code, 0, "{changed:?}");

    // A fenced host serves the route on the changed stream: one message, committed fenced.
    let config = dedup_host::config::Config::parse(
        &fenced,
        std::path::Path::new("t.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let host = dedup_host::serve::start(config).await.expect("host starts");
    env.publish("in.upper.x", "m-1", &[], "hello").await;
    let (record, _) = dedup_host_tests::harness::wait_for(
        Duration::from_secs(30),
        "m-1 committed fenced",
        || async {
            let found = env.fenced_claim("upper", "m-1").await?;
            (found.0.state == dedup_host::claim::ClaimState::Completed).then_some(found)
        },
    )
    .await;
    assert_eq!(record.batch_outputs, Some(1), "{record:?}");
    let outputs: Vec<_> = env
        .outputs()
        .await
        .into_iter()
        .filter(|m| m.subject.as_str() == "in.upper.x.done")
        .map(|m| m.payload)
        .collect();
    assert_eq!(outputs, vec![bytes::Bytes::from("HELLO")]);
    host.shutdown().await.unwrap();
}
