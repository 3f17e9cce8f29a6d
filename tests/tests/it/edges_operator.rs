//! What an operator is told at the edges (issue 42): a reload that hosts refuse by contract
//! exits non-zero naming the host and the reason, and `routes` shows the refusal; a component
//! that can never be served stops `run` and `setup` at start; a host told to stop while its
//! server is gone stops within `host.drain_timeout` and says what it could not ack.

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_host::claim::ClaimState;
use dedup_host_tests::guests::{cli, guest, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, CONSUMER, SOURCE};

/// An exclusive route of the `hostile` guest on `in.ex.*` (its contract records partitions).
fn exclusive(extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"ex\"\nsubject = \"in.ex.*\"\ncomponent = \"{{guest:hostile}}\"\nexclusive_by = {{ subject_token = 2 }}\nallowed_outputs = [\"in.ex.*.done\"]\n{extra}\n"
    )
}

/// Writes the config of host `id` (with `host_extra` lines in `[host]`) and returns its path.
fn write_config(env: &TestEnv, routes: &str, id: &str, host_extra: &str) -> std::path::PathBuf {
    let text = env.config_text(&Timing::default(), routes).replace(
        "[host]\n",
        &format!("[host]\ninstance_id = \"{id}\"\n{host_extra}"),
    );
    let path = env.path(&format!("{id}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// Starts `dedup-host run` with its stderr collected; returns once `route`'s consumer exists.
async fn run_host(env: &TestEnv, config: &Path, route: &str) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup-host run");
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().expect("stderr");
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            eprint!("{text}");
            sink.lock().unwrap().push_str(&text);
        }
    });
    wait_for(Duration::from_secs(60), "the route's consumer", || async {
        let stream = env.js.get_stream(SOURCE).await.ok()?;
        stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&format!(
                "{CONSUMER}-{route}"
            ))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    (child, log)
}

/// Waits (generously) for a process to exit; kills it and fails if it does not.
fn wait_exit(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refused_by_contract_exits_non_zero_and_routes_shows_the_refusal() {
    let env = TestEnv::start().await;
    let config = write_config(&env, &exclusive(""), "op-a", "");
    let (mut host, _log) = run_host(&env, &config, "ex").await;
    wait_for(Duration::from_secs(60), "the route served", || async {
        let out = cli(&config, &["routes", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
        v["routes"][0]["hosts"]["op-a"]["digest"]
            .is_string()
            .then_some(())
    })
    .await;

    // The same host, its config now differing from the route's recorded contract.
    write_config(&env, &exclusive("partitions = 8"), "op-a", "");
    let reload = cli(&config, &["reload"]);
    assert_ne!(reload.code, 0, "a refused reload fails: {reload:?}");
    assert!(
        reload.stderr.contains("host `op-a` refused")
            && reload
                .stderr
                .contains("partitions: recorded 16, this config 8"),
        "names the host and why: {reload:?}"
    );
    assert!(reload.stderr.contains("1 refused"), "{reload:?}");

    let table = wait_for(
        Duration::from_secs(30),
        "the refusal in `routes`",
        || async {
            let out = cli(&config, &["routes"]);
            out.stdout.contains("NOT SERVED").then_some(out.stdout)
        },
    )
    .await;
    assert!(
        table.contains("op-a  NOT SERVED (contract refused)")
            && table.contains("partitions: recorded 16, this config 8"),
        "{table}"
    );
    // A refused route fails `routes`, which names the host, the route and why.
    let text = cli(&config, &["routes"]);
    assert_ne!(text.code, 0, "a refused route fails `routes`: {text:?}");
    assert!(
        text.stderr
            .contains("host `op-a` refuses route `ex` by contract")
            && text.stderr.contains("1 refused"),
        "{text:?}"
    );
    let json = cli(&config, &["routes", "--json"]);
    assert_ne!(json.code, 0, "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let refused = v["routes"][0]["hosts"]["op-a"]["contract_refused"]
        .as_str()
        .unwrap_or_default();
    assert!(
        refused.contains("partitions: recorded 16, this config 8"),
        "{v}"
    );
    let listed = v["refused"].as_array().expect("a `refused` list");
    assert_eq!(listed.len(), 1, "{v}");
    assert!(listed[0].as_str().unwrap().contains("route `ex`"), "{v}");

    signal(&host, "-TERM");
    wait_exit(&mut host, Duration::from_secs(60), "the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_can_never_be_served_stops_run_and_setup_at_start() {
    let env = TestEnv::start().await;
    let not_wasm = env.path("notes.wasm");
    std::fs::write(&not_wasm, "these are notes, not a component").unwrap();
    let core = env.path("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let upper = guest("uppercase");
    let cases = [
        (&not_wasm, "", "not a WebAssembly file", "dedup-host build"),
        (
            &core,
            "",
            "core WebAssembly module",
            "wasm-tools component new",
        ),
        (
            &upper,
            "limits = { memory_bytes = 0 }",
            "cannot be instantiated within route `bad`'s limits",
            "raise the limit",
        ),
    ];
    for (i, (file, extra, why, fix)) in cases.into_iter().enumerate() {
        let routes = format!(
            "[[routes]]\nname = \"bad\"\nsubject = \"in.bad.*\"\ncomponent = \"{}\"\nallowed_outputs = [\"in.bad.*.done\"]\n{extra}\n",
            file.display()
        );
        let config = write_config(&env, &routes, &format!("bad-{i}"), "");
        let mut run = Command::new(host_binary())
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_exit(
            &mut run,
            Duration::from_secs(60),
            "`run` of a bad component",
        );
        let mut stderr = String::new();
        run.stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let setup = cli(&config, &["setup", "--dry-run"]);
        for (what, code, text) in [
            ("run", status.code().unwrap_or(-1), &stderr),
            ("setup --dry-run", setup.code, &setup.stderr),
        ] {
            assert_ne!(code, 0, "{what} refuses case {i}: {text}");
            let file = file.display().to_string();
            for part in ["route `bad`", file.as_str(), why, fix] {
                assert!(text.contains(part), "{what}, case {i}: `{part}` in {text}");
            }
            assert!(!text.contains("previous"), "{what}, case {i}: {text}");
        }
    }
    assert!(
        env.js.get_stream(SOURCE).await.is_err(),
        "a refused setup creates nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_told_to_stop_while_its_server_is_gone_stops_within_its_drain_timeout() {
    let mut env = TestEnv::start().await;
    let routes = "[[routes]]\nname = \"slow\"\nsubject = \"in.slow.*\"\ncomponent = \"{guest:hostile}\"\nallowed_outputs = [\"in.slow.*.done\"]\n";
    let config = write_config(&env, routes, "drainer", "drain_timeout = \"3s\"\n");
    // The drain bound must exceed the grace for in-flight work it includes.
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("shutdown_grace = \"5s\"", "shutdown_grace = \"2s\"");
    std::fs::write(&config, text).unwrap();
    let (mut host, log) = run_host(&env, &config, "slow").await;
    let keys = ["k0", "k1", "k2"];
    for key in keys {
        env.publish(&format!("in.slow.{key}"), key, &[], "sleep:30000")
            .await;
    }
    wait_for(
        Duration::from_secs(60),
        "three claims in progress",
        || async {
            for key in keys {
                let claim = env.claim("slow", key).await?;
                (claim.state == ClaimState::InProgress).then_some(())?;
            }
            Some(())
        },
    )
    .await;

    env.servers.nodes[0].kill();
    signal(&host, "-TERM");
    // Generous: the bound is 3 s; the host used to stay for many minutes.
    let status = wait_exit(&mut host, Duration::from_secs(60), "the draining host");
    assert!(!status.success(), "a drain that gave up exits non-zero");
    let log = wait_for(Duration::from_secs(10), "the host's last words", || async {
        let text = log.lock().unwrap().clone();
        text.contains("were not acked").then_some(text)
    })
    .await;
    // With the server gone the leases lapse and the work stops within the grace; the flush
    // to the gone server then outlives the drain bound, and the host says what it left.
    assert!(
        log.contains("delivery(ies) still in flight were not acked"),
        "says what it left: {log}"
    );
    assert!(log.contains("host.drain_timeout"), "{log}");
}
