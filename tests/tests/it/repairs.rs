//! The operator's commands against a real deployment: `inspect`, `dead-letters` list, replay
//! and purge after a fix, and the `audit` with each anomaly class fabricated.

use std::process::Command;
use std::time::Duration;

use dedup_host::claim::{key, ClaimRecord, ClaimState};
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, DEAD, OUTPUTS, SOURCE};

use super::operations::ROUTES;

fn cli(env: &TestEnv, routes: &str, args: &[&str]) -> (i32, String) {
    let path = env.path("ops.toml");
    std::fs::write(&path, env.config_text(&Timing::default(), routes)).unwrap();
    let out = Command::new(host_binary())
        .arg(args[0])
        .arg("--config")
        .arg(&path)
        .args(&args[1..])
        .output()
        .expect("run dedup-host");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("error:"), "{args:?}: {stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
    )
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_a_completed_a_retried_a_dead_lettered_and_an_unknown_key() {
    let env = TestEnv::start().await;
    let timing = Timing {
        backoff: r#"["60s"]"#,
        ..Timing::default()
    };
    let host = env.host(&timing, ROUTES, "inspected").await;
    env.publish("in.upper.a", "m1", &[("Idem-Key", "done-key")], "hi")
        .await;
    env.publish("in.bad.r", "retried-key", &[], "retry:1").await;
    env.publish("in.bad.d", "dead-key", &[], "sleep-reject:0")
        .await;
    env.wait_completed("upper", &["done-key"], Duration::from_secs(20))
        .await;
    wait_for(
        Duration::from_secs(20),
        "the retry and the rejection recorded",
        || async {
            let r = env.claim("bad", "retried-key").await?;
            let d = env.claim("bad", "dead-key").await?;
            (r.state == ClaimState::Failed && d.permanent).then_some(())
        },
    )
    .await;
    host.shutdown().await.unwrap();

    let story = |route: &str, flag: &str, k: &str| {
        json(
            &cli(
                &env,
                ROUTES,
                &["inspect", "--route", route, flag, k, "--json"],
            )
            .1,
        )
    };
    let done = story("upper", "--key", "done-key");
    assert!(
        done["verdict"]
            .as_str()
            .unwrap()
            .starts_with("completed on attempt 1 with 1 output(s), all present"),
        "{done}"
    );
    assert_eq!(done["claim"]["state"], "completed");
    assert_eq!(done["outputs"][0]["present"], true);
    assert_eq!(done["outputs"][0]["stream"], OUTPUTS);
    assert_eq!(done["source_sequences"], serde_json::json!([1]));
    assert!(done["claim"]["fencing_token"].as_u64().is_some());
    let by_sequence = story("upper", "--sequence", "1");
    assert_eq!(by_sequence["key"], "done-key");

    let retried = story("bad", "--key", "retried-key");
    assert!(
        retried["verdict"]
            .as_str()
            .unwrap()
            .starts_with("attempt 1 failed, will be retried in"),
        "{retried}"
    );
    assert_eq!(retried["dead_letters"], serde_json::json!([]));

    let dead = story("bad", "--key", "dead-key");
    assert!(
        dead["verdict"]
            .as_str()
            .unwrap()
            .starts_with("dead-lettered after attempt 1: rejected after sleeping"),
        "{dead}"
    );
    assert_eq!(dead["dead_letters"][0]["reason"], "rejected after sleeping");
    assert_eq!(dead["dead_letters"][0]["source_sequence"], 3);

    let unknown = story("upper", "--key", "never-seen");
    assert!(
        unknown["verdict"].as_str().unwrap().starts_with("unknown"),
        "{unknown}"
    );
    assert!(unknown["claim"].is_null());
    let (code, table) = cli(
        &env,
        ROUTES,
        &["inspect", "--route", "upper", "--key", "done-key"],
    );
    assert_eq!(code, 0);
    assert!(table.contains("verdict           completed"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_fix_completes_dead_lettered_keys_once_even_when_run_twice() {
    replay_after_a_fix("before", "window").await;
}

/// A fenced route's replay resets a claim subject that may hold two records (the commit
/// purges nothing): the reset rolls it up and the re-run commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_fix_completes_a_fenced_routes_keys_once() {
    replay_after_a_fix("before", "fenced").await;
}

/// A claim-after route's replay settles the key it reset (it used to conflict with the reset
/// record, count a duplicate and leave the key reset, so a second replay ran it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_fix_completes_a_claim_after_routes_keys_once() {
    replay_after_a_fix("after", "window").await;
}

async fn replay_after_a_fix(claim: &str, effects: &str) {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = effects == "fenced";
    let component = env.path("fixme.wasm");
    std::fs::copy(guest("hostile"), &component).unwrap();
    let routes = format!(
        r#"
[[routes]]
name = "fixme"
subject = "in.fixme.*"
component = "{}"
allowed_outputs = ["in.fixme.*.done"]
claim = "{claim}"
effects = "{effects}"
limits = {{ deadline = "1s" }}
"#,
        component.display()
    );
    let host = env.host(&Timing::default(), &routes, "replayer").await;
    for i in 0..3 {
        env.publish(
            &format!("in.fixme.e{i}"),
            &format!("f{i}"),
            &[("Customer", "c1")],
            format!("sleep-reject:{i}"),
        )
        .await;
    }
    wait_for(Duration::from_secs(20), "three dead letters", || async {
        (env.messages(DEAD).await.len() == 3).then_some(())
    })
    .await;
    let (_, listed) = cli(
        &env,
        &routes,
        &["dead-letters", "list", "--route", "fixme", "--json"],
    );
    let listed = json(&listed);
    assert_eq!(listed.as_array().unwrap().len(), 3);
    assert_eq!(listed[0]["reason"], "rejected after sleeping");

    // The fix: a handler that succeeds on the same payloads.
    std::fs::copy(guest("uppercase"), &component).unwrap();
    wait_for(
        Duration::from_secs(20),
        "the fixed version served",
        || async {
            let digest = dedup_host::runtime::digest(&std::fs::read(guest("uppercase")).ok()?);
            let m = host.metrics().encode();
            m.contains(&format!("digest=\"{digest}\"")).then_some(())
        },
    )
    .await;
    let letters = |verb: &str, extra: &[&str]| {
        let mut args = vec!["dead-letters", verb, "--route", "fixme", "--all", "--json"];
        args.extend_from_slice(extra);
        let (code, out) = cli(&env, &routes, &args);
        assert_eq!(code, 0, "{out}");
        let actions: Vec<String> = json(&out)
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["action"].as_str().unwrap().to_string())
            .collect();
        actions
    };
    assert_eq!(letters("replay", &["--dry-run"]), ["would replay"; 3]);
    assert!(
        env.claim("fixme", "f0").await.unwrap().permanent,
        "a dry run writes nothing"
    );
    assert_eq!(letters("replay", &[]), ["replayed"; 3]);
    let second = letters("replay", &[]);
    assert!(
        second
            .iter()
            .all(|a| a == "skipped" || a == "already replayed"),
        "{second:?}"
    );
    env.wait_completed("fixme", &["f0", "f1", "f2"], Duration::from_secs(20))
        .await;
    assert_eq!(
        letters("replay", &[]),
        ["skipped"; 3],
        "completed keys are not replayed"
    );
    env.wait_drained(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outputs = env.outputs().await;
    let mut payloads: Vec<_> = outputs
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).to_string())
        .collect();
    payloads.sort();
    assert_eq!(
        payloads,
        ["SLEEP-REJECT:0", "SLEEP-REJECT:1", "SLEEP-REJECT:2"],
        "each key completed exactly once"
    );
    let replayed = env.messages(SOURCE).await;
    assert_eq!(
        replayed.len(),
        6,
        "three originals, three replays (the repeat was deduplicated or skipped)"
    );
    assert_eq!(
        replayed[3].headers.get("Customer").map(|v| v.as_str()),
        Some("c1"),
        "original headers restored"
    );
    assert!(replayed[3].headers.get("Dedup-Reason").is_none());

    assert_eq!(letters("purge", &[]), ["purged"; 3]);
    assert!(env.messages(DEAD).await.is_empty());
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_is_clean_after_a_workload_and_names_each_fabricated_anomaly() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), ROUTES, "audited").await;
    for i in 0..40 {
        env.publish(
            &format!("in.upper.e{i}"),
            &format!("m{i}"),
            &[("Idem-Key", &format!("k{i}"))],
            "x",
        )
        .await;
        if i % 4 == 0 {
            env.publish(
                &format!("in.upper.e{i}"),
                &format!("m{i}-again"),
                &[("Idem-Key", &format!("k{i}"))],
                "x",
            )
            .await;
        }
    }
    env.publish("in.bad.d", "dead", &[], "reject:no").await;
    env.publish("in.other.x", "nobody", &[], "x").await;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    env.wait_completed("upper", &keys, Duration::from_secs(30))
        .await;
    env.wait_drained(Duration::from_secs(30)).await;
    host.shutdown().await.unwrap();

    let (code, clean) = cli(&env, ROUTES, &["audit", "--json"]);
    let clean = json(&clean);
    assert_eq!(clean["anomalies"], serde_json::json!([]), "{clean}");
    assert_eq!(code, 0);
    assert_eq!(clean["messages"], 52);
    assert_eq!(clean["keys"], 41);
    assert_eq!(clean["completed"], 40);
    assert_eq!(
        clean["dead_lettered"], 2,
        "the rejection and the unrouted message"
    );
    assert_eq!(clean["duplicates"], 10);

    // Fabricate one of each anomaly.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let outputs = env.js.get_stream(OUTPUTS).await.unwrap();
    let record = |k: &str| {
        let kv = kv.clone();
        let k = key::encode("upper", k);
        async move {
            let e = kv.entry(&k).await.unwrap().unwrap();
            (ClaimRecord::from_bytes(&e.value).unwrap(), e.revision, k)
        }
    };
    // k1: its output deleted.
    let (r1, _, _) = record("k1").await;
    outputs
        .delete_message(r1.outputs[0].sequence)
        .await
        .unwrap();
    // k2: left in progress with a lapsed lease, nothing left to deliver it.
    let (mut r2, rev, k2) = record("k2").await;
    r2.state = ClaimState::InProgress;
    r2.lease_expires_ms = 1;
    kv.update(&k2, r2.to_bytes(), rev).await.unwrap();
    // An output nobody claimed.
    let mut h = async_nats::HeaderMap::new();
    h.insert(
        "Nats-Msg-Id",
        format!("{}#0", key::encode("upper", "ghost")).as_str(),
    );
    env.js
        .publish_with_headers("out.ghost", h, "boo".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // k3: its output stored twice (after a shortened duplicate window).
    let (r3, _, k3) = record("k3").await;
    let mut config = outputs.cached_info().config.clone();
    config.duplicate_window = Duration::from_millis(100);
    env.js.update_stream(config).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", format!("{k3}#0").as_str());
    let again = env
        .js
        .publish_with_headers("in.upper.e3.done", h, "X".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!again.duplicate && again.sequence != r3.outputs[0].sequence);
    // The dead-lettered key's record removed.
    kv.purge(key::encode("bad", "dead")).await.unwrap();
    // k5: acknowledged, but its record gone and no dead letter.
    let (_, _, k5) = record("k5").await;
    kv.purge(&k5).await.unwrap();

    let (code, report) = cli(&env, ROUTES, &["audit", "--json"]);
    let report = json(&report);
    assert_eq!(code, 1, "anomalies exit non-zero");
    let classes: std::collections::BTreeSet<_> = report["anomalies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["class"].as_str().unwrap().to_string(),
                a["key"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for expected in [
        ("completed_without_outputs", key::encode("upper", "k1")),
        ("stuck_claim", k2.clone()),
        (
            "outputs_without_completed_record",
            key::encode("upper", "ghost"),
        ),
        ("output_published_twice", k3.clone()),
        (
            "dead_letter_without_failed_record",
            key::encode("bad", "dead"),
        ),
        ("lost", k5.clone()),
    ] {
        let expected = (expected.0.to_string(), expected.1);
        assert!(
            classes.contains(&expected),
            "{expected:?} missing from {classes:#?}"
        );
    }
}
