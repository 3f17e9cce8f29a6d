//! `dedup-host setup`: provisions everything a config needs, then reports it all as matching;
//! a dry run creates nothing; a stream that differs is reported and exits non-zero.

use std::process::Command;

use dedup_host_tests::guests::host_binary;
use dedup_host_tests::harness::{TestEnv, Timing, OUTPUTS, UPPER_ROUTE};
use futures::StreamExt;

/// Runs `dedup-host setup --json` with the env's config; returns the exit code and the
/// items as (kind, name, state).
fn setup(env: &TestEnv, extra: &[&str]) -> (i32, Vec<(String, String, String)>) {
    let path = env.path("setup.toml");
    std::fs::write(&path, env.config_text(&Timing::default(), UPPER_ROUTE)).unwrap();
    let out = Command::new(host_binary())
        .args(["setup", "--json", "--config"])
        .arg(&path)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let items: Vec<serde_json::Value> = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    let items = items
        .iter()
        .map(|i| {
            (
                i["kind"].as_str().unwrap().to_string(),
                i["name"].as_str().unwrap().to_string(),
                i["found"]["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap(), items)
}

async fn stream_names(env: &TestEnv) -> Vec<String> {
    let mut names = env.js.stream_names();
    let mut all = Vec::new();
    while let Some(name) = names.next().await {
        all.push(name.unwrap());
    }
    all.sort();
    all
}

#[tokio::test]
async fn setup_creates_everything_then_finds_it_all_matching() {
    let env = TestEnv::start().await;
    let (code, dry) = setup(&env, &["--dry-run"]);
    assert_eq!(code, 0);
    assert!(dry.iter().all(|(_, _, s)| s == "would_create"), "{dry:?}");
    assert!(
        stream_names(&env).await.is_empty(),
        "a dry run creates nothing"
    );

    let (code, first) = setup(&env, &[]);
    assert_eq!(code, 0, "{first:?}");
    let created: Vec<(&str, &str)> = first
        .iter()
        .filter(|(_, _, s)| s == "created")
        .map(|(k, n, _)| (k.as_str(), n.as_str()))
        .collect();
    for expected in [
        ("stream", "EVENTS"),
        ("stream", "DEAD"),
        ("stream", OUTPUTS),
        ("kv bucket", "claims"),
        ("object store", "dedup-components-EVENTS"),
        ("kv bucket", "dedup-hosts-EVENTS"),
        ("consumer", "hosts-upper"),
        ("consumer", "hosts"),
    ] {
        assert!(created.contains(&expected), "{expected:?} not in {first:?}");
    }
    let (code, second) = setup(&env, &[]);
    assert_eq!(code, 0);
    assert!(second.iter().all(|(_, _, s)| s == "matches"), "{second:?}");
}

#[tokio::test]
async fn setup_reports_a_stream_that_differs_and_exits_non_zero() {
    let env = TestEnv::start().await;
    env.create_stream(OUTPUTS, &["elsewhere.>"]).await;
    let (code, items) = setup(&env, &[]);
    assert_eq!(code, 1, "{items:?}");
    let outputs = items.iter().find(|(_, n, _)| n == OUTPUTS).unwrap();
    assert_eq!(outputs.2, "differs");
    // Everything is checked before anything is made: a run that exits 1 changed nothing.
    let events = items.iter().find(|(_, n, _)| n == "EVENTS").unwrap();
    assert_eq!(events.2, "would_create", "nothing else is provisioned");
    assert_eq!(
        stream_names(&env).await,
        [OUTPUTS],
        "only the stream made before"
    );
}
