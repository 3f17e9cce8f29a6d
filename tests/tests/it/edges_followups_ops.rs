//! Issue 42, review follow-ups of 5c248eb, the operator's side: a key accepted as settled with
//! `setup --change-route R --accept-dead KEY` (dead-lettered after its window outputs may have
//! been stored) is recorded as accepted when its record moves, the change lists it, and
//! `dead-letters replay --route R --all` (the command a refusal recommends) refuses its letter
//! unless `--force`: a run under fenced effects would publish those outputs again.

use std::path::Path;
use std::time::Duration;

use dedup_host::claim::{key, ClaimState};
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{wait_for, TestEnv, BUCKET, DEAD, SOURCE};

use super::edges_change::{host, record_in, recorded, rewrite, side};

/// The `dedup-host` command `args` with config `path`: (exit 0, stdout, stderr).
async fn run(path: &Path, args: &[&str]) -> (bool, String, String) {
    let path = path.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&path, &args)
    })
    .await
    .unwrap();
    (run.code == 0, run.stdout, run.stderr)
}

/// The JSON value a `--json` run printed.
fn json(out: &str) -> serde_json::Value {
    let start = out.find(['{', '[']).expect("JSON");
    serde_json::from_str(out[start..].trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Messages stored in stream `name` so far.
async fn stored(env: &TestEnv, name: &str) -> u64 {
    let mut stream = env.js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// The one action a replay's JSON reports for key `k1`: (action, detail).
fn k1_action(out: &str) -> (String, String) {
    let actions = json(out);
    let mine: Vec<_> = actions
        .as_array()
        .expect("a list of actions")
        .iter()
        .filter(|a| a["key"] == "k1")
        .collect();
    assert_eq!(mine.len(), 1, "{out}");
    (
        mine[0]["action"].as_str().unwrap().to_string(),
        mine[0]["detail"].as_str().unwrap().to_string(),
    )
}

/// Window -> fenced with k1 dead-lettered after its window output: `--accept-dead` moves its
/// record marked as accepted and the change lists it; `dead-letters replay --route mv --all`
/// then refuses k1's letter (nothing published, the record untouched) and replays it only
/// with `--force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_refuses_a_key_accepted_as_settled_unless_forced() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let first = host(&env, &old, "old-1").await;
    env.publish("in.mv.x", "k1-a", &[("Key", "k1")], "reject:0")
        .await;
    wait_for(Duration::from_secs(60), "k1 dead-lettered", || async {
        let record = record_in(&env, BUCKET, "k1").await?;
        let lettered = stored(&env, DEAD).await > 0;
        (record.state == ClaimState::Failed && record.permanent && lettered).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(60)).await;
    first.shutdown().await.unwrap();
    // As if its window output had been stored before the reject (a partial publish).
    rewrite(&env, BUCKET, "k1", |r| {
        r.effects_by = Some(r.digest.clone())
    })
    .await;

    let claim_key = key::encode("mv", "k1");
    let (changed, out, err) = run(
        &new.path,
        &[
            "setup",
            "--change-route",
            "mv",
            "--accept-dead",
            &claim_key,
            "--json",
        ],
    )
    .await;
    assert!(changed, "{out}{err}");
    assert_eq!(recorded(&env, &new.config).await.0, "Fenced");
    assert_eq!(
        json(&out)["accepted_dead"],
        serde_json::json!([claim_key]),
        "the change lists the accepted key: {out}"
    );
    let (moved, revision) = env.fenced_claim("mv", "k1").await.expect("k1 moved");
    assert!(moved.is_accepted_dead(), "{moved:?}");

    let sent = stored(&env, SOURCE).await;
    let replay = ["dead-letters", "replay", "--route", "mv", "--all", "--json"];
    let (replayed, out, err) = run(&new.path, &replay).await;
    let (action, detail) = k1_action(&out);
    assert_eq!(action, "refused", "{out}{err}");
    assert!(detail.contains("--force"), "{detail}");
    // A refused letter was asked for and not done: the command says how many, exits non-zero.
    assert!(!replayed, "{out}{err}");
    assert!(err.contains("1 letter(s) refused"), "{err}");
    assert_eq!(stored(&env, SOURCE).await, sent, "nothing replayed");
    let (after, same) = env.fenced_claim("mv", "k1").await.unwrap();
    assert_eq!((after, same), (moved, revision), "the key was not reset");

    let forced = [&replay[..], &["--force"]].concat();
    let (replayed, out, err) = run(&new.path, &forced).await;
    assert_eq!(k1_action(&out).0, "replayed", "{out}{err}");
    assert!(replayed, "{out}{err}");
    assert_eq!(stored(&env, SOURCE).await, sent + 1, "replayed once");
}
