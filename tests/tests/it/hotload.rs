//! Hot loading: versions swapped under a steady stream, one deploy picked up by two hosts
//! through the object store, withdrawal without loss, file sources, and the compile cache.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::components::{status, store};
use dedup_host::runtime::{Compiled, EngineSettings, Runtime};
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

/// A route served from the object store (no `component`).
const STORE_ROUTE: &str = r#"
[[routes]]
name = "swap"
subject = "in.swap.*"
allowed_outputs = ["in.swap.*.done"]
"#;

/// An empty core module: valid WebAssembly, not a component.
const BROKEN: &[u8] = b"\0asm\x01\0\0\0";

/// The digest `instance` reports serving for route `swap`, and why it refused a version.
async fn served(env: &TestEnv, instance: &str) -> (Option<String>, Option<String>) {
    let kv = env.js.get_key_value("dedup-hosts-EVENTS").await;
    let Ok(kv) = kv else { return (None, None) };
    let hosts = status::read_all(&kv).await.unwrap_or_default();
    let route = hosts
        .into_iter()
        .find(|h| h.instance_id == instance)
        .and_then(|h| h.routes.get("swap").cloned());
    route.map_or((None, None), |r| (r.digest, r.refused))
}

async fn wait_serving(env: &TestEnv, instance: &str, digest: &str) {
    wait_for(
        Duration::from_secs(20),
        "the host serving the new version",
        || async { (served(env, instance).await.0.as_deref() == Some(digest)).then_some(()) },
    )
    .await
}

fn bytes(name: &str) -> Vec<u8> {
    std::fs::read(guest(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_versions_under_a_steady_stream_runs_every_event_once_on_a_valid_version() {
    let env = TestEnv::start().await;
    let config = env.config(&Timing::default(), STORE_ROUTE);
    let bucket = store::open(&env.js, &config).await.unwrap();
    let upper = store::deploy(&bucket, "swap", &bytes("uppercase"))
        .await
        .unwrap();
    let host = env.host(&Timing::default(), STORE_ROUTE, "h").await;
    wait_serving(&env, "h", &upper).await;

    // A steady stream while versions change: uppercase and an echoing guest alternate, with
    // one broken version in between.
    const EVENTS: usize = 600;
    let js = env.js.clone();
    let publisher = tokio::spawn(async move {
        for i in 0..EVENTS {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("e{i}").as_str());
            js.publish_with_headers(format!("in.swap.e{i}"), h, format!("event {i}").into())
                .await
                .unwrap()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let echo = bytes("hostile");
    let mut valid = BTreeSet::from([upper.clone()]);
    let plan: [&[u8]; 6] = [
        &echo,
        BROKEN,
        &bytes("uppercase"),
        &echo,
        &bytes("uppercase"),
        &echo,
    ];
    for version in plan {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let digest = store::deploy(&bucket, "swap", version).await.unwrap();
        if version == BROKEN {
            let refused = wait_for(
                Duration::from_secs(20),
                "the broken version refused",
                || async { served(&env, "h").await.1 },
            )
            .await;
            assert!(refused.contains("core WebAssembly module"), "{refused}");
            assert_ne!(served(&env, "h").await.0.as_deref(), Some(digest.as_str()));
        } else {
            valid.insert(digest.clone());
            wait_serving(&env, "h", &digest).await;
        }
    }
    publisher.await.unwrap();

    let outputs = wait_for(Duration::from_secs(60), "an output per event", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() >= EVENTS).then_some(m)
    })
    .await;
    env.wait_drained(Duration::from_secs(20)).await;
    let mut by_subject: BTreeMap<String, String> = BTreeMap::new();
    for m in &outputs {
        let payload = String::from_utf8_lossy(&m.payload).into_owned();
        assert!(
            by_subject.insert(m.subject.to_string(), payload).is_none(),
            "one output per event"
        );
    }
    let (mut upper_cased, mut echoed) = (0, 0);
    for i in 0..EVENTS {
        let payload = &by_subject[&format!("in.swap.e{i}.done")];
        match payload.as_str() {
            p if p == format!("EVENT {i}") => upper_cased += 1,
            p if p == format!("event {i}") => echoed += 1,
            other => panic!("event {i}: unexpected output `{other}`"),
        }
        let record = env.claim("swap", &format!("e{i}")).await.unwrap();
        assert_eq!(
            (record.state, record.attempt),
            (ClaimState::Completed, 1),
            "e{i}"
        );
        assert!(
            valid.contains(&record.digest),
            "e{i} ran on {}",
            record.digest
        );
    }
    assert!(
        upper_cased > 0 && echoed > 0,
        "the outputs show the switch: {upper_cased} / {echoed}"
    );
    assert!(env.messages(DEAD).await.is_empty(), "no message failed");
    let stats = host.shutdown().await.unwrap();
    assert_eq!(
        (stats.processed, stats.retried, stats.dead_lettered),
        (EVENTS as u64, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_pick_up_one_deploy_and_a_withdrawn_route_loses_nothing() {
    let env = TestEnv::start().await;
    let timing = Timing::default();
    let config_file = env.path("host.toml");
    std::fs::write(&config_file, env.config_text(&timing, STORE_ROUTE)).unwrap();
    let a = env.host(&timing, STORE_ROUTE, "host-a").await;
    let b = env.host(&timing, STORE_ROUTE, "host-b").await;
    assert_eq!(served(&env, "host-a").await.0, None, "nothing deployed yet");

    let cli = |args: &[&str]| {
        let out = Command::new(host_binary())
            .args(args)
            .arg("--config")
            .arg(&config_file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "dedup-host {args:?} failed: {text}");
        text
    };
    let component = guest("uppercase").display().to_string();
    let deployed = cli(&["deploy", "--route", "swap", "--component", &component]);
    let digest = deployed.trim().rsplit(' ').next().unwrap().to_string();
    assert!(digest.starts_with("sha256:"), "{deployed}");
    wait_serving(&env, "host-a", &digest).await;
    wait_serving(&env, "host-b", &digest).await;
    let listing = cli(&["routes"]);
    assert!(listing.contains(&format!("host-a  {digest}")), "{listing}");
    assert!(listing.contains(&format!("host-b  {digest}")), "{listing}");

    env.publish("in.swap.one", "one", &[], "one").await;
    wait_for(Duration::from_secs(20), "the first output", || async {
        (env.messages(OUTPUTS).await.len() == 1).then_some(())
    })
    .await;

    // Withdrawn: both hosts stop consuming; a message published meanwhile waits, unprocessed.
    cli(&["undeploy", "--route", "swap"]);
    for h in ["host-a", "host-b"] {
        wait_for(Duration::from_secs(20), "the host not serving", || async {
            served(&env, h).await.0.is_none().then_some(())
        })
        .await;
    }
    env.publish("in.swap.two", "two", &[], "two").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.messages(OUTPUTS).await.len(),
        1,
        "not consumed while withdrawn"
    );
    assert_eq!(env.claim("swap", "two").await, None, "not even claimed");

    // Deployed again: the waiting message is processed.
    cli(&["deploy", "--route", "swap", "--component", &component]);
    let outputs = wait_for(Duration::from_secs(20), "the waiting message", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() == 2).then_some(m)
    })
    .await;
    assert_eq!(&outputs[1].payload[..], b"TWO");
    let (sa, sb) = (a.shutdown().await.unwrap(), b.shutdown().await.unwrap());
    assert_eq!(sa.processed + sb.processed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_component_file_is_swapped_in_and_a_broken_one_refused() {
    let env = TestEnv::start().await;
    let file = env.path("handler.wasm");
    std::fs::copy(guest("uppercase"), &file).unwrap();
    let routes = r#"
[[routes]]
name = "swap"
subject = "in.swap.*"
component = "handler.wasm"
allowed_outputs = ["in.swap.*.done"]
"#;
    let text = env
        .config_text(&Timing::default(), routes)
        .replace("[host]\n", "[host]\ninstance_id = \"h\"\n")
        + "\n[components]\npoll_interval = \"100ms\"\n";
    let config =
        dedup_host::config::Config::parse(&text, Path::new("t.toml"), env.dir.path().into())
            .unwrap();
    let host = dedup_host::serve::start(config).await.unwrap();
    let upper = dedup_host::runtime::digest(&bytes("uppercase"));
    wait_serving(&env, "h", &upper).await;

    std::fs::write(&file, BROKEN).unwrap();
    let refused = wait_for(
        Duration::from_secs(20),
        "the broken file refused",
        || async { served(&env, "h").await.1 },
    )
    .await;
    assert!(
        refused.contains("handler.wasm"),
        "names the file: {refused}"
    );
    env.publish("in.swap.a", "a", &[], "still upper").await;
    std::fs::copy(guest("hostile"), &file).unwrap();
    let echo = dedup_host::runtime::digest(&bytes("hostile"));
    wait_serving(&env, "h", &echo).await;
    env.publish("in.swap.b", "b", &[], "now echoed").await;
    let outputs = wait_for(Duration::from_secs(20), "two outputs", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() == 2).then_some(m)
    })
    .await;
    let payloads: BTreeSet<&[u8]> = outputs.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(
        payloads,
        BTreeSet::from([&b"STILL UPPER"[..], &b"now echoed"[..]])
    );
    host.shutdown().await.unwrap();
}

#[test]
fn an_unchanged_component_is_not_compiled_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let start = || {
        Runtime::new(&EngineSettings::default())
            .unwrap()
            .with_cache(&cache)
            .unwrap()
    };
    let first = start().load_file(&guest("uppercase")).unwrap();
    assert_eq!(first.compiled(), Compiled::Fresh);
    let entries: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(entries.len(), 1, "one cache entry");

    // A new runtime, as after a restart: taken from the cache, and it runs.
    let runtime = start();
    let again = runtime.load_file(&guest("uppercase")).unwrap();
    assert_eq!(again.compiled(), Compiled::Cached);
    assert_eq!(again.digest(), first.digest());
    let other = runtime.load_file(&guest("flaky")).unwrap();
    assert_eq!(
        other.compiled(),
        Compiled::Fresh,
        "a different component is compiled"
    );

    // A corrupt entry is thrown away and the component compiled again.
    let entry = entries[0].as_ref().unwrap().path();
    std::fs::write(&entry, b"garbage").unwrap();
    let recompiled = start().load_file(&guest("uppercase")).unwrap();
    assert_eq!(recompiled.compiled(), Compiled::Fresh);
    assert_eq!(
        start().load_file(&guest("uppercase")).unwrap().compiled(),
        Compiled::Cached
    );
}
