//! Two deployments on one server, with different source streams and the same route names,
//! share nothing by default: claims, dead letters, host status and reloads are each their own,
//! and every operator command sees only its own config's routes.

use std::path::PathBuf;
use std::time::Duration;

use dedup_host_tests::guests::guest;
use dedup_host_tests::harness::{wait_for, TestEnv};

/// A deployment on source stream `stream` capturing `<prefix>.*`, with one route `r` that
/// runs the hostile guest; every other name is left to its default.
fn deployment(env: &TestEnv, stream: &str, prefix: &str) -> (PathBuf, dedup_host::config::Config) {
    let text = format!(
        r#"
[nats]
urls = ["{url}"]

[source]
stream = "{stream}"
subjects = ["{prefix}.*"]
ack_wait = "2s"

[claims]
lease = "2s"
heartbeat = "500ms"
storage = "memory"

[[routes]]
name = "r"
subject = "{prefix}.*"
component = "{component}"
"#,
        url = env.server().url(),
        component = guest("hostile").display()
    );
    let path = env.path(&format!("{stream}.toml"));
    std::fs::write(&path, &text).unwrap();
    let config = dedup_host::config::Config::load(&path).expect("valid");
    (path, config)
}

fn cli(config: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let run = dedup_host_tests::guests::cli(config, args);
    (run.code, run.stdout, run.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_on_one_server_see_only_their_own() {
    let env = TestEnv::start().await;
    let (a_path, a) = deployment(&env, "SHOP", "shop");
    let (b_path, b) = deployment(&env, "PAY", "pay");
    assert_eq!(a.claims.bucket, "dedup-claims-SHOP");
    assert_ne!(a.dead_letter.stream, b.dead_letter.stream);
    let mut hosts = Vec::new();
    for (config, id) in [(&a, "host-a"), (&b, "host-b")] {
        let mut config = config.clone();
        config.host.instance_id = Some(id.into());
        hosts.push(dedup_host::serve::start(config).await.unwrap());
    }
    for subject in ["shop.x", "pay.y"] {
        let (id, payload) = ("same-id", "reject:5");
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", id);
        env.js
            .publish_with_headers(subject.to_string(), h, payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    wait_for(Duration::from_secs(30), "one letter each", || async {
        let a_letters = env.messages(&a.dead_letter.stream).await.len();
        let b_letters = env.messages(&b.dead_letter.stream).await.len();
        (a_letters == 1 && b_letters == 1).then_some(())
    })
    .await;

    // Same route name, same key: two claims, one in each deployment's bucket.
    for config in [&a, &b] {
        let kv = env.js.get_key_value(&config.claims.bucket).await.unwrap();
        assert!(
            kv.get("r.k.same-id").await.unwrap().is_some(),
            "{}",
            config.claims.bucket
        );
    }
    let (code, out, err) = cli(&a_path, &["dead-letters", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["subject"], "shop.x");

    let (code, out, err) = cli(
        &a_path,
        &["dead-letters", "replay", "--all", "--dry-run", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("shop.x") && !out.contains("pay.y"), "{out}");
    let (code, _, err) = cli(&a_path, &["dead-letters", "replay", "--sequence", "99"]);
    assert_ne!(code, 0, "an unknown letter is an error");
    assert!(
        err.contains("no dead letter of this config's routes has sequence [99]"),
        "{err}"
    );
    let (code, _, err) = cli(&a_path, &["dead-letters", "list", "--route", "other"]);
    assert_ne!(code, 0);
    assert!(err.contains("route `other` is not in this config"), "{err}");

    let (code, out, err) = cli(&a_path, &["audit", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let audit: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(audit["messages"], 1, "only SHOP's message: {audit}");

    // In-process hosts do not answer reloads; the command counts the live hosts of its own
    // deployment only (host-b reports in another bucket).
    let (_, _, err) = cli(&a_path, &["reload", "--json"]);
    assert!(err.contains("of 1 live"), "{err}");
    let _ = b_path;
    for host in hosts {
        host.shutdown().await.unwrap();
    }
}

/// With `components.dir`, `routes` names the directory's file the host serves, and `deploy`
/// refuses (it would upload to a store no host reads) with the file to copy to instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_deploy_know_the_component_directory() {
    let env = TestEnv::start().await;
    let (path, _) = deployment(&env, "DIRS", "dirs");
    let text = std::fs::read_to_string(&path).unwrap();
    let component = format!("component = \"{}\"\n", guest("hostile").display());
    let text = text.replace(&component, "") + "\n[components]\ndir = \"wasm\"\n";
    std::fs::write(&path, text).unwrap();
    std::fs::create_dir(env.path("wasm")).unwrap();
    std::fs::copy(guest("hostile"), env.path("wasm/r.wasm")).unwrap();

    let (code, stdout, stderr) = cli(&path, &["routes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("<- directory file") && stdout.contains("r.wasm"),
        "{stdout}"
    );
    assert!(!stdout.contains("nothing deployed"), "{stdout}");

    let hostile = guest("hostile");
    let (code, _, stderr) = cli(
        &path,
        &[
            "deploy",
            "--route",
            "r",
            "--component",
            hostile.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains(
            "served from the component directory (`components.dir`): copy the component to"
        ),
        "{stderr}"
    );
}
