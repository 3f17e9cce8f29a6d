//! Routes that change while hosts run: a reload under traffic, a refused reload, a reload
//! through NATS reaching two host processes, and components from a watched directory.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

fn route(name: &str, guest_name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nsubject = \"in.{name}.*\"\ncomponent = \"{{guest:{guest_name}}}\"\nallowed_outputs = [\"in.{name}.*.done\"]\n{extra}\n"
    )
}

/// The config of the reloading host (the harness sets its instance id).
fn config(env: &TestEnv, routes: &str) -> Config {
    let mut config = env.config(&Timing::default(), routes);
    config.host.instance_id = Some("reloading".into());
    config
}

/// Outputs per subject.
async fn outputs(env: &TestEnv) -> HashMap<String, usize> {
    let mut per = HashMap::new();
    for m in env.messages(OUTPUTS).await {
        *per.entry(m.subject.to_string()).or_default() += 1;
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_removes_and_tightens_routes_under_steady_traffic() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let before = [
        route("r1", "uppercase", ""),
        route("r2", "uppercase", ""),
        route("r3", "hostile", ""),
    ]
    .concat();
    let host = env.host(&timing, &before, "reloading").await;
    let big = "x".repeat(500);
    env.publish("in.r3.probe-before", "probe-before", &[], big.clone())
        .await;
    // The probe runs under the old limit before the reload: beside CPU hogs, loading the
    // hostile component took longer than the half second below, the probe then met the
    // tightened limit and was dead-lettered, and the test waited for one dead letter of two.
    wait_for(
        Duration::from_secs(60),
        "the probe run before the reload",
        || async {
            outputs(&env)
                .await
                .contains_key("in.r3.probe-before.done")
                .then_some(())
        },
    )
    .await;

    // Steady traffic on the three routes while the reload happens.
    let publisher = {
        let js = env.js.clone();
        tokio::spawn(async move {
            for i in 0..150 {
                for r in ["r1", "r2", "r3"] {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", format!("{r}-{i}").as_str());
                    js.publish_with_headers(format!("in.{r}.e{i}"), h, "steady".into())
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = [
        route("r1", "uppercase", ""),
        route("r3", "hostile", "max_payload_bytes = 100"),
        route("r4", "uppercase", ""),
    ]
    .concat();
    let report = host.reload(Ok(config(&env, &after))).await;
    assert!(report.applied, "{report:?}");
    assert_eq!(
        (report.diff.added, report.diff.removed, report.diff.changed),
        (vec!["r4".into()], vec!["r2".into()], vec!["r3".into()])
    );
    assert!(report.diff.restart_needed.is_empty());
    publisher.await.unwrap();

    // The tightened route enforces its limit on the next message.
    env.publish("in.r3.probe-after", "probe-after", &[], big)
        .await;
    env.publish("in.r4.new", "r4-0", &[], "added").await;
    // The changed route hands back what it had pulled (naked, or redelivered after the ack
    // wait); what this checks is that nothing is lost.
    wait_for(
        Duration::from_secs(120),
        "r1, r3 and r4 settled",
        || async {
            let per = outputs(&env).await;
            let done = (0..150).all(|i| {
                per.contains_key(&format!("in.r1.e{i}.done"))
                    && per.contains_key(&format!("in.r3.e{i}.done"))
            });
            let probe = env.messages(DEAD).await.len() == 1;
            (done && probe && per.contains_key("in.r4.new.done")).then_some(())
        },
    )
    .await;
    let letters = env.messages(DEAD).await;
    assert_eq!(
        letters.len(),
        1,
        "only the probe over the new limit is dead-lettered"
    );
    let reason = letters[0].headers.get("Dedup-Reason").unwrap().to_string();
    assert!(reason.contains("max_payload_bytes of 100"), "{reason}");
    assert!(outputs(&env).await.contains_key("in.r3.probe-before.done"));

    // The removed route's events wait; they run once it is back.
    let r2_done_while_removed = outputs(&env)
        .await
        .keys()
        .filter(|s| s.starts_with("in.r2."))
        .count();
    assert!(
        r2_done_while_removed < 150,
        "some r2 events arrived after its removal"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        outputs(&env)
            .await
            .keys()
            .filter(|s| s.starts_with("in.r2."))
            .count(),
        r2_done_while_removed,
        "a removed route runs nothing"
    );
    let back = [after, route("r2", "uppercase", "")].concat();
    let report = host.reload(Ok(config(&env, &back))).await;
    assert_eq!(report.diff.added, ["r2"]);
    wait_for(
        Duration::from_secs(30),
        "r2's waiting events processed",
        || async {
            let per = outputs(&env).await;
            (0..150)
                .all(|i| per.contains_key(&format!("in.r2.e{i}.done")))
                .then_some(())
        },
    )
    .await;
    env.wait_drained(Duration::from_secs(30)).await;
    let per = outputs(&env).await;
    let doubled: Vec<_> = per.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "exactly once: {doubled:?}");
    assert_eq!(
        env.messages(DEAD).await.len(),
        1,
        "nothing dead-lettered by the reloads"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_reload_changes_nothing_and_reports_every_problem() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let routes = route("r1", "uppercase", "");
    let host = env.host(&timing, &routes, "steadfast").await;
    let broken = env
        .config_text(&timing, &routes)
        .replace("subject = \"in.r1.*\"", "subject = \"\"")
        .replace("concurrency = 16", "concurrency = 0");
    let refused = Config::parse(&broken, std::path::Path::new("broken.toml"), env.path(""));
    let report = host.reload(refused).await;
    assert!(!report.applied);
    assert!(report.problems.len() >= 2, "{:?}", report.problems);
    assert!(report
        .problems
        .iter()
        .any(|p| p.starts_with("routes[0].subject")));
    assert!(report
        .problems
        .iter()
        .any(|p| p.starts_with("host.concurrency")));

    env.publish("in.r1.x", "m1", &[], "still served").await;
    wait_for(
        Duration::from_secs(20),
        "the old config still serving",
        || async {
            outputs(&env)
                .await
                .contains_key("in.r1.x.done")
                .then_some(())
        },
    )
    .await;
    let path = env.path("routes.toml");
    std::fs::write(&path, env.config_text(&timing, &routes)).unwrap();
    let listed = wait_for(Duration::from_secs(20), "the refusal reported", || async {
        let out = Command::new(host_binary())
            .args(["routes", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        text.contains("refused the last config reload")
            .then_some(text)
    })
    .await;
    assert!(
        listed.contains("routes[0].subject") && listed.contains("host.concurrency"),
        "{listed}"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_host_reload_reaches_every_host() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let one = route("r1", "uppercase", "");
    let mut hosts = vec![
        env.host_process(&timing, &one, "reload-a").await,
        env.host_process(&timing, &one, "reload-b").await,
    ];
    // Both hosts report themselves before the reload is sent.
    let js = env.js.clone();
    wait_for(Duration::from_secs(20), "two live hosts", || async {
        let kv = js.get_key_value("dedup-hosts-EVENTS").await.ok()?;
        let mut keys = kv.keys().await.ok()?;
        let mut n = 0;
        while let Some(Ok(_)) = futures::StreamExt::next(&mut keys).await {
            n += 1;
        }
        (n == 2).then_some(())
    })
    .await;
    let two = [one.clone(), route("r2", "uppercase", "")].concat();
    for id in ["reload-a", "reload-b"] {
        let text = env
            .config_text(&timing, &two)
            .replace("[host]\n", &format!("[host]\ninstance_id = \"{id}\"\n"));
        std::fs::write(env.path(&format!("{id}.toml")), text).unwrap();
    }
    let out = Command::new(host_binary())
        .args(["reload", "--json", "--config"])
        .arg(env.path("reload-a.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut ids: Vec<_> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(a["diff"]["added"], serde_json::json!(["r2"]), "{a}");
            a["instance_id"].as_str().unwrap().to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["reload-a", "reload-b"]);
    for i in 0..20 {
        env.publish(&format!("in.r2.e{i}"), &format!("r2-{i}"), &[], "x")
            .await;
    }
    wait_for(
        Duration::from_secs(20),
        "the added route serving",
        || async { (outputs(&env).await.len() == 20).then_some(()) },
    )
    .await;
    for host in &mut hosts {
        Command::new("kill")
            .args(["-TERM", &host.id().to_string()])
            .status()
            .unwrap();
        host.wait().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_directory_serves_new_replaced_and_removed_files_and_waits_for_half_written_ones(
) {
    let env = TestEnv::start().await;
    let dir = env.path("components");
    std::fs::create_dir(&dir).unwrap();
    let routes =
        "[[routes]]\nname = \"d1\"\nsubject = \"in.d1.*\"\nallowed_outputs = [\"in.d1.*.done\"]\n";
    let mut config = env.config(&Timing::default(), routes);
    config.components.dir = Some(dir.clone());
    // Far longer than the pause between the two halves below, even on a loaded machine.
    config.components.poll_interval = Duration::from_millis(1500);
    let host = dedup_host::serve::start(config).await.unwrap();
    let serving = |host: &dedup_host::serve::RunningHost| {
        let text = host.metrics().encode();
        text.lines()
            .find(|l| l.starts_with("dedup_serving_info{route=\"d1\""))
            .map(str::to_string)
    };
    assert!(serving(&host).is_none());

    // A new file, written in two halves: never offered half-written (no refusal).
    let upper = std::fs::read(guest("uppercase")).unwrap();
    let file = dir.join("d1.wasm");
    std::fs::write(&file, &upper[..upper.len() / 2]).unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    std::fs::write(&file, &upper).unwrap();
    let digest = dedup_host::runtime::digest(&upper);
    wait_for(Duration::from_secs(20), "the new file served", || async {
        serving(&host)?.contains(&digest).then_some(())
    })
    .await;
    let text = host.metrics().encode();
    assert!(
        text.contains("dedup_refusals_total{route=\"d1\"} 0"),
        "{text}"
    );
    env.publish("in.d1.a", "a", &[], "one").await;
    wait_for(Duration::from_secs(20), "served by uppercase", || async {
        outputs(&env)
            .await
            .contains_key("in.d1.a.done")
            .then_some(())
    })
    .await;

    // Replaced.
    let hostile = std::fs::read(guest("hostile")).unwrap();
    std::fs::write(dir.join("d1.wasm.tmp"), &hostile).unwrap();
    std::fs::rename(dir.join("d1.wasm.tmp"), &file).unwrap();
    let digest = dedup_host::runtime::digest(&hostile);
    wait_for(
        Duration::from_secs(20),
        "the replaced file served",
        || async { serving(&host)?.contains(&digest).then_some(()) },
    )
    .await;

    // Removed: withdrawn, its messages wait.
    std::fs::remove_file(&file).unwrap();
    wait_for(
        Duration::from_secs(20),
        "the removed file withdrawn",
        || async { serving(&host).is_none().then_some(()) },
    )
    .await;
    env.publish("in.d1.b", "b", &[], "two").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !outputs(&env).await.contains_key("in.d1.b.done"),
        "nothing runs it while withdrawn"
    );
    std::fs::write(&file, &upper).unwrap();
    wait_for(
        Duration::from_secs(20),
        "the waiting message runs on the returned file",
        || async {
            outputs(&env)
                .await
                .contains_key("in.d1.b.done")
                .then_some(())
        },
    )
    .await;
    host.shutdown().await.unwrap();
}
