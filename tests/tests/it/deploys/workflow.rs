//! The workflow itself: shadow, canary with rollback, promotion through a killed host, the
//! commands' refusals, and the README's section as a script.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_candidate_is_compared_on_every_host_and_nothing_of_it_is_stored() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    // The same version in shadow: no difference.
    let same = digest_of(&ok(
        &d.config,
        &["deploy", "--route", "ledger", "--shadow", &path("ledger")],
    ));
    d.wait_candidate(&same).await;
    d.publish(0..1000, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(1000).await;
    let report = wait_compared(&d.config, 1000).await;
    let counts = &report["report"]["counts"];
    assert_eq!(counts["differences"], 0, "{report:#}");
    assert!(counts["compared"].as_u64().unwrap() > 0, "{report:#}");
    assert_eq!(counts["matches"], counts["compared"], "{report:#}");

    // The next version in shadow: a field added to every entry, odd amounts refused.
    let next = d.shadow_next().await;
    d.publish(1000..1200, |i| i64::from(i) + 1).await;
    let (outputs, letters) = d.wait_settled(1200).await;
    let report = wait_compared(&d.config, 200).await;
    let counts = &report["report"]["counts"];
    assert!(
        counts["kinds"]["payload"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert!(
        counts["kinds"]["outcome"].as_u64().unwrap() > 0,
        "{report:#}"
    );
    assert_eq!(
        counts["differences"].as_u64().unwrap(),
        counts["compared"].as_u64().unwrap(),
        "every entry differs: {report:#}"
    );
    let first = &report["report"]["first"];
    let payload = &first["payload"];
    assert_eq!(
        payload["differences"][0], "outputs[0].payload/currency",
        "{report:#}"
    );
    assert!(!payload["live"]["outputs"][0]["payload"]
        .as_str()
        .unwrap()
        .contains("currency"));
    assert!(payload["candidate"]["outputs"][0]["payload"]
        .as_str()
        .unwrap()
        .contains("\"currency\":\"EUR\""));
    assert_eq!(
        first["outcome"]["candidate"]["outcome"], "reject",
        "{report:#}"
    );
    let printed = ok(&d.config, &["diff", "--route", "ledger"]);
    eprintln!("{printed}");
    assert!(
        printed.contains("payload") && printed.contains("currency"),
        "{printed}"
    );

    // Nothing of the candidate's is stored: the live outputs are exactly a run without it.
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(outputs.len(), 1200);
    assert!(
        outputs.iter().all(|e| !e.next),
        "a candidate output was stored"
    );
    let txs: BTreeSet<&str> = outputs.iter().map(|e| e.tx.as_str()).collect();
    assert_eq!(txs.len(), 1200, "one output per key");
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains(&format!("candidate {next} shadow")),
        "{listing}"
    );
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_rejects_half_its_keys_is_rolled_back_on_every_host() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let next = digest_of(&ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "20%",
            &path("ledger-next"),
        ],
    ));
    d.wait_candidate(&next).await;
    // Rolled back on every host: none runs it any more.
    d.reject_until_rolled_back(600).await;
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains("ROLLED BACK") && listing.contains("rejects"),
        "{listing}"
    );
    // The live version handles the rest.
    d.publish(600..800, |i| i64::from(i) + 1).await;
    let (outputs, letters) = d.wait_settled(800).await;
    let mut settled: BTreeMap<String, u32> = BTreeMap::new();
    for e in &outputs {
        *settled.entry(e.tx.replace("tx-", "k-")).or_default() += 1;
    }
    for l in &letters {
        *settled.entry(l.key.clone()).or_default() += 1;
        assert_eq!(
            l.digest, next,
            "a reject of the candidate's carries its digest: {l:?}"
        );
    }
    assert_eq!(settled.len(), 800, "every key settled");
    assert!(
        settled.values().all(|n| *n == 1),
        "a key with effects from both versions"
    );
    let after: Vec<&Entry> = outputs
        .iter()
        .filter(|e| e.tx["tx-".len()..].parse::<u32>().unwrap() >= 600)
        .collect();
    assert_eq!(after.len(), 200);
    assert!(
        after.iter().all(|e| !e.next),
        "the candidate ran after its rollback"
    );
    assert!(!letters.is_empty() && outputs.iter().any(|e| e.next));
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_promoted_through_a_killed_host_runs_every_key_once() {
    let mut d = Deployment::start(&["host-a", "host-b"]).await;
    let next = digest_of(&ok(
        &d.config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "30%",
            &path("ledger-next"),
        ],
    ));
    d.wait_candidate(&next).await;
    d.publish(0..150, |i| 2 * i64::from(i) + 2).await;
    signal(&d.hosts["host-a"], "-KILL");
    d.hosts.remove("host-a").unwrap().wait().unwrap();
    d.publish(150..300, |i| 2 * i64::from(i) + 2).await;
    let c = d.env.host_process(&d.timing, d.routes, "host-c").await;
    d.hosts.insert("host-c".into(), c);
    d.wait_settled(300).await;
    let promoted = ok(&d.config, &["promote", "--route", "ledger"]);
    assert!(promoted.contains(&next), "{promoted}");
    d.wait_hosts(
        |r| r.digest.as_deref() == Some(next.as_str()) && r.candidate.is_none(),
        "every host serving the promoted version",
    )
    .await;
    d.publish(300..400, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(400).await;
    assert!(letters.is_empty(), "{letters:?}");
    let txs: BTreeSet<&str> = outputs.iter().map(|e| e.tx.as_str()).collect();
    assert_eq!(
        (outputs.len(), txs.len()),
        (400, 400),
        "every key exactly once"
    );
    let canary = outputs.iter().take(300).filter(|e| e.next).count();
    assert!(
        (30..=150).contains(&canary),
        "the canary ran {canary} of 300 keys"
    );
    let late = outputs
        .iter()
        .filter(|e| e.tx["tx-".len()..].parse::<u32>().unwrap() >= 300);
    assert!(
        late.clone().all(|e| e.next),
        "promoted: every later key on it"
    );
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains(&format!("ledger {next}")) || listing.contains(&next),
        "{listing}"
    );
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_commands_refuse_bad_input_with_the_reason_and_the_fix() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let config = env.path("host.toml");
    std::fs::write(&config, env.config_text(&timing, LEDGER)).unwrap();
    let refused = |args: &[&str], expect: &[&str]| {
        let (success, text) = cli(&config, args);
        assert!(!success, "dedup-host {args:?} succeeded: {text}");
        for e in expect {
            assert!(text.contains(e), "dedup-host {args:?}: `{e}` not in {text}");
        }
    };
    let next = path("ledger-next");
    refused(
        &["deploy", "--route", "ledger", "--shadow", &next],
        &["no live version", "--component FILE"],
    );
    ok(
        &config,
        &[
            "deploy",
            "--route",
            "ledger",
            "--component",
            &path("ledger"),
        ],
    );
    refused(
        &["diff", "--route", "nope"],
        &["no route `nope`", "[[routes]]"],
    );
    refused(&["promote", "--route", "nope"], &["no route `nope`"]);
    refused(
        &["diff", "--route", "ledger"],
        &["no candidate", "--shadow FILE"],
    );
    refused(
        &["promote", "--route", "ledger"],
        &["no candidate", "deploy"],
    );
    refused(&["abort", "--route", "ledger"], &["no candidate"]);
    refused(
        &["deploy", "--route", "ledger", "--canary", "0%", &next],
        &["1% to 99%"],
    );
    refused(
        &["deploy", "--route", "ledger", "--canary", "100%", &next],
        &["1% to 99%"],
    );
    refused(
        &[
            "deploy",
            "--route",
            "ledger",
            "--canary",
            "20%",
            &path("ledger"),
        ],
        &["serves already"],
    );
    let broken = env.path("broken.wasm");
    std::fs::write(&broken, b"\0asm\x01\0\0\0").unwrap();
    refused(
        &[
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            &broken.display().to_string(),
        ],
        &["broken.wasm"],
    );
    refused(
        &[
            "deploy", "--route", "ledger", "--shadow", &next, "--ignore", "ran_ms",
        ],
        &["JSON pointer", "/field"],
    );
    // Abort drops a candidate.
    ok(&config, &["deploy", "--route", "ledger", "--shadow", &next]);
    assert!(ok(&config, &["routes"]).contains("candidate sha256:"));
    ok(&config, &["abort", "--route", "ledger"]);
    assert!(!ok(&config, &["routes"]).contains("candidate sha256:"));
}

/// The README's "Changing a handler safely" block, run as a script from a folder holding only
/// the two versions and the ledger's case file, with `dedup-host` on the PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_safe_deploy_section_runs_as_a_script() {
    let script = dedup_host_tests::readme::block("deploys-script");
    let env = TestEnv::start().await;
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("ledger");
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["ledger", "ledger-next"] {
        std::fs::copy(guest(name), folder.join(format!("{name}.wasm"))).unwrap();
    }
    let cases = workspace_root().join("guests/rust/ledger/cases.toml");
    std::fs::copy(cases, folder.join("cases.toml")).unwrap();
    let (success, text) = dedup_host_tests::readme::run(&script, &folder, &env.server().url());
    assert!(success, "{text}");
    for expected in [
        " passed, 0 failed",
        "as a shadow candidate beside sha256:",
        "live host(s) have candidate sha256:",
        "route `ledger`: candidate sha256:",
        "as a canary 20% candidate",
        "canary 20% since",
        "promoted the candidate of route `ledger`",
        "and no candidate",
    ] {
        assert!(text.contains(expected), "`{expected}` not in:\n{text}");
    }
    let entries = env.messages("LEDGER").await;
    assert_eq!(entries.len(), 3, "the live version's outputs, once each");
    assert!(entries
        .iter()
        .all(|m| !String::from_utf8_lossy(&m.payload).contains("currency")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_live_run_tells_noise_from_the_candidates_own_differences() {
    // With `work_ms`, every entry carries when it ran: different on every run.
    let timed: &'static str =
        Box::leak(format!("{LEDGER}config = {{ work_ms = \"1\" }}\n").into_boxed_str());
    let d = Deployment::start_with(&["host-a", "host-b"], timed, false).await;
    let shadow = |file: &str| {
        let args = [
            "deploy",
            "--route",
            "ledger",
            "--shadow",
            file,
            "--secondary",
        ];
        let printed = ok(&d.config, &[&args[..], &["--wait", "60s"]].concat());
        assert!(printed.contains("live host(s) have candidate"), "{printed}");
    };
    // The live version against itself: its only differences are the run times, noise.
    shadow(&path("ledger"));
    d.publish(0..100, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(100).await;
    let report = wait_compared(&d.config, 100).await;
    let counts = &report["report"]["counts"];
    assert_eq!(counts["differences"], 0, "{report:#}");
    assert!(counts["noise"].as_u64().unwrap() > 0, "{report:#}");
    // The next version: its own difference is reported, the run times are not.
    shadow(&path("ledger-next"));
    d.publish(100..200, |i| 2 * i64::from(i) + 2).await;
    d.wait_settled(200).await;
    let report = wait_compared(&d.config, 100).await;
    let counts = &report["report"]["counts"];
    assert!(counts["differences"].as_u64().unwrap() > 0, "{report:#}");
    let first = &report["report"]["first"]["payload"]["differences"];
    assert_eq!(
        first,
        &serde_json::json!(["outputs[0].payload/currency"]),
        "{report:#}"
    );
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_without_regressions_is_promoted_automatically_on_every_host() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let args = [
        "deploy",
        "--route",
        "ledger",
        "--canary",
        "50%",
        &path("ledger-next"),
        "--auto-promote",
        "20",
        "--wait",
        "60s",
    ];
    let printed = ok(&d.config, &args);
    let next = printed
        .lines()
        .find(|l| l.starts_with("deployed"))
        .map(digest_of)
        .unwrap();
    d.publish(0..200, |i| 2 * i64::from(i) + 2).await;
    d.wait_hosts(
        |r| r.digest.as_deref() == Some(next.as_str()) && r.candidate.is_none(),
        "every host serving the promoted version",
    )
    .await;
    d.publish(200..300, |i| 2 * i64::from(i) + 2).await;
    let (outputs, letters) = d.wait_settled(300).await;
    assert!(letters.is_empty(), "{letters:?}");
    let txs: BTreeSet<&str> = outputs.iter().map(|e| e.tx.as_str()).collect();
    assert_eq!((outputs.len(), txs.len()), (300, 300), "every key once");
    let late = |e: &&Entry| e.tx["tx-".len()..].parse::<u32>().unwrap() >= 200;
    assert!(outputs.iter().filter(late).all(|e| e.next));
    let listing = ok(&d.config, &["routes"]);
    assert!(
        listing.contains(&format!("/ledger {next}")),
        "deployed: {listing}"
    );
    d.stop();
}
