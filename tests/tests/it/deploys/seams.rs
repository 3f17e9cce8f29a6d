//! Candidates where they meet the other modes and changes: a canary on a fenced exclusive
//! route through a reload, a candidate file in a shared component directory, and a route added
//! by a reload. (A canary on a claim-after route is refused: `edges_candidates`.)

use super::*;

/// The ledger with fenced effects, one account at a time.
const FENCED_EXCLUSIVE: &str = r#"
[[routes]]
name = "ledger"
subject = "in.ledger.*"
allowed_outputs = ["ledger.entries.>"]
effects = "fenced"
exclusive_by = { json_pointer = "/account" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_on_a_fenced_exclusive_route_survives_a_reload_and_promotes_in_order() {
    canary_reload_promote(FENCED_EXCLUSIVE, true).await;
}

/// A healthy canary of half the keys on `routes`, a reload of every host mid-traffic (the
/// candidate keeps running), then `promote`: every key has exactly one entry, from one version,
/// and (on an exclusive route) each account's entries are in publish order.
async fn canary_reload_promote(routes: &'static str, fenced: bool) {
    let d = Deployment::start_with(&["host-a", "host-b"], routes, fenced).await;
    let deployed = ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "50%",
            &path("ledger-next"),
            "--wait",
            "60s",
        ],
    );
    assert!(
        deployed.contains("all 2 live host(s) have candidate"),
        "{deployed}"
    );
    let candidate = status_candidate(&d).await;
    d.publish(0..200, |i| 2 * i64::from(i) + 2).await;
    // Reload every host with a changed route (its payload limit) while the batch runs.
    for name in d.hosts.keys() {
        let file = d.env.path(&format!("{name}.toml"));
        let text = std::fs::read_to_string(&file).unwrap().replace(
            "name = \"ledger\"\n",
            "name = \"ledger\"\nmax_payload_bytes = \"512KiB\"\n",
        );
        std::fs::write(&file, text).unwrap();
    }
    let reloaded = ok(&d.config, &["reload"]);
    assert!(reloaded.contains("of 2 live; 0 refused"), "{reloaded}");
    d.publish(200..400, |i| 2 * i64::from(i) + 2).await;
    d.wait_candidate(&candidate).await;
    d.wait_settled(400).await;
    let promoted = ok(
        &d.config,
        &["promote", "--route", "ledger", "--wait", "60s"],
    );
    assert!(promoted.contains(&candidate), "{promoted}");
    d.publish(400..500, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(500).await;
    assert!(letters.is_empty(), "{letters:?}");
    let index = |e: &Entry| e.tx["tx-".len()..].parse::<u32>().unwrap();
    let txs: BTreeSet<u32> = outputs.iter().map(index).collect();
    assert_eq!((outputs.len(), txs.len()), (500, 500), "every key once");
    let after_reload = outputs
        .iter()
        .filter(|e| (200..400).contains(&index(e)) && e.next)
        .count();
    assert!(
        after_reload > 20,
        "the canary ran {after_reload} of 200 keys after the reload"
    );
    assert!(
        outputs.iter().filter(|e| index(e) >= 400).all(|e| e.next),
        "promoted: every later key on it"
    );
    if routes.contains("exclusive_by") {
        // One account at a time, in publish order: each account's entries ascend.
        let mut last: BTreeMap<u32, u32> = BTreeMap::new();
        for e in &outputs {
            let i = index(e);
            if let Some(prev) = last.insert(i % 7, i) {
                assert!(prev < i, "account {} ran tx-{i} after tx-{prev}", i % 7);
            }
        }
    }
    d.stop();
}

/// The digest of the candidate every host reports running.
async fn status_candidate(d: &Deployment) -> String {
    wait_for(
        Duration::from_secs(60),
        "a candidate on the hosts",
        || async {
            let kv = d.env.js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
            let all = status::read_all(&kv).await.ok()?;
            let c = all
                .iter()
                .find_map(|h| h.routes.get("ledger")?.candidate.clone())?;
            Some(c.split(' ').next()?.to_string())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_file_in_a_shared_component_directory_is_rolled_back_and_promoted_there() {
    let env = TestEnv::start().await;
    let dir = env.path("handlers");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("ledger"), dir.join("ledger.wasm")).unwrap();
    let routes: &'static str = Box::leak(
        format!("{LEDGER}\n[components]\ndir = \"{}\"\n", dir.display()).into_boxed_str(),
    );
    let d = Deployment::launch(env, &["host-a", "host-b"], routes).await;
    d.wait_live().await;
    let next = dedup_host::runtime::digest(&std::fs::read(guest("ledger-next")).unwrap());
    // A canary of a fifth of the keys that rejects odd amounts: rolled back, on the files.
    std::fs::write(
        dir.join("ledger.candidate.toml"),
        "mode = \"canary\"\npercent = 20\n",
    )
    .unwrap();
    std::fs::copy(guest("ledger-next"), dir.join("ledger.candidate.wasm")).unwrap();
    d.wait_candidate(&next).await;
    assert!(ok(&d.config, &["routes"]).contains(&format!("candidate {next} canary")));
    // Rolled back on every host: none runs it any more.
    d.reject_until_rolled_back(400).await;
    assert!(!dir.join("ledger.candidate.wasm").exists());
    assert!(dir.join("ledger.candidate.wasm.rolled-back").exists());
    let why = std::fs::read_to_string(dir.join("ledger.candidate.rolled-back.txt")).unwrap();
    assert!(why.contains("rejects"), "{why}");
    // Again in shadow (no settings file), compared, then promoted with the command.
    std::fs::remove_file(dir.join("ledger.candidate.toml")).unwrap();
    std::fs::copy(guest("ledger-next"), dir.join("ledger.candidate.wasm")).unwrap();
    d.wait_candidate(&next).await;
    d.publish(400..500, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(500).await;
    let report = wait_compared(&d.config, 1).await;
    assert!(
        report["report"]["counts"]["kinds"]["payload"]
            .as_u64()
            .unwrap_or(0)
            > 0
            || report["report"]["counts"]["skipped"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    let promoted = ok(
        &d.config,
        &["promote", "--route", "ledger", "--wait", "60s"],
    );
    assert!(promoted.contains(&next), "{promoted}");
    d.publish(500..600, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(600).await;
    let mut settled: BTreeMap<String, u32> = BTreeMap::new();
    for e in &outputs {
        *settled.entry(e.tx.replace("tx-", "k-")).or_default() += 1;
    }
    for l in &letters {
        *settled.entry(l.key.clone()).or_default() += 1;
        assert_eq!(l.digest, next, "only the candidate rejects: {l:?}");
    }
    assert_eq!(settled.len(), 600, "every key settled");
    assert!(settled.values().all(|n| *n == 1), "a key settled twice");
    let index = |e: &&Entry| e.tx["tx-".len()..].parse::<u32>().unwrap();
    assert!(outputs.iter().filter(|e| index(e) >= 500).all(|e| e.next));
    assert!(outputs
        .iter()
        .filter(|e| (400..500).contains(&index(e)))
        .all(|e| !e.next));
    // Bad input about file candidates names the file to use.
    let (success, text) = cli(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            &path("ledger-next"),
        ],
    );
    assert!(!success && text.contains("ledger.candidate.wasm"), "{text}");
    let (success, text) = cli(&d.config, &["abort", "--route", "ledger"]);
    assert!(!success && text.contains("no candidate"), "{text}");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_added_by_a_reload_runs_the_candidate_stored_for_it() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let second = LEDGER
        .replace("\"ledger\"", "\"ledger2\"")
        .replace("in.ledger.*", "in.ledger2.*");
    let both = format!("{LEDGER}{second}");
    let cli_config = d.env.path("cli.toml");
    std::fs::write(&cli_config, d.env.config_text(&d.timing, &both)).unwrap();
    ok(
        &cli_config,
        &[
            "deploy",
            "--route",
            "ledger2",
            "--component",
            &path("ledger"),
        ],
    );
    let next = ok(
        &cli_config,
        &[
            "deploy",
            "--route",
            "ledger2",
            "--canary",
            "50%",
            &path("ledger-next"),
        ],
    );
    let next = digest_of(&next);
    for name in d.hosts.keys() {
        let file = d.env.path(&format!("{name}.toml"));
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("{text}{second}")).unwrap();
    }
    let reloaded = ok(&d.config, &["reload"]);
    assert!(reloaded.contains("of 2 live; 0 refused"), "{reloaded}");
    wait_for(
        Duration::from_secs(60),
        "both hosts running ledger2's candidate",
        || async {
            let kv = d.env.js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
            let all = status::read_all(&kv).await.ok()?;
            let running = all
                .iter()
                .filter(|h| d.hosts.contains_key(&h.instance_id))
                .filter_map(|h| h.routes.get("ledger2")?.candidate.clone())
                .filter(|c| c.starts_with(&next))
                .count();
            (running == 2).then_some(())
        },
    )
    .await;
    for i in 0..100 {
        let payload = format!(r#"{{"account":"b","amount":2,"transaction_id":"tx-{i}"}}"#);
        let subject = format!("in.ledger2.{i}");
        d.env
            .publish(&subject, &format!("k2-{i}"), &[], payload.into_bytes())
            .await;
    }
    let (outputs, _) = d.wait_settled(100).await;
    assert!(outputs.iter().any(|e| e.next), "the candidate ran no key");
    assert!(
        outputs.iter().any(|e| !e.next),
        "the live version ran no key"
    );
    d.stop();
}
