//! What an operator is told at the edges (issue 42): a reload that hosts refuse by contract
//! exits non-zero naming the host and the reason, and `routes` shows the refusal; a component
//! that can never be served stops `run` and `setup` at start; a host told to stop while its
//! server is gone stops within `host.drain_timeout` and says what it could not ack. And what
//! a new user reads: exit codes (1 refused, 2 could not run), the `dead-letters list` and
//! `inspect` tables, and `dev`'s default log level.

use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedup_host::claim::ClaimState;
use dedup_host_tests::guests::{cli, guest, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, CONSUMER, DEAD, SOURCE};

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
    start_host(env, "run", config, route).await
}

/// Starts `dedup-host <command>` (`run` or `dev`) with `RUST_LOG` as the test has it for
/// `run` and unset for `dev`; its stderr collected; returns once `route`'s consumer exists.
async fn start_host(
    env: &TestEnv,
    command: &str,
    config: &Path,
    route: &str,
) -> (Child, Arc<Mutex<String>>) {
    let mut command = {
        let mut c = Command::new(host_binary());
        if command == "dev" {
            c.env_remove("RUST_LOG");
        }
        c.args([command, "--config"]);
        c
    };
    let mut child = command
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

/// A route `name` of the `hostile` guest on `in.mv.*` (its payload names what it does).
fn mv_route(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nsubject = \"in.mv.*\"\ncomponent = \"{{guest:hostile}}\"\nallowed_outputs = [\"in.mv.*.done\"]\n{extra}\n"
    )
}

/// Publishes `payload` under key `key` on `in.mv.<key>` and waits until its claim is `state`.
async fn settled(env: &TestEnv, route: &str, key: &str, payload: &str, state: ClaimState) {
    env.publish(&format!("in.mv.{key}"), key, &[], payload.to_string())
        .await;
    wait_for(
        Duration::from_secs(60),
        &format!("{key} settled"),
        || async {
            let claim = env.claim(route, key).await?;
            (claim.state == state).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_exit_1_and_commands_that_cannot_run_exit_2() {
    let env = TestEnv::start().await;
    let config = write_config(&env, &mv_route("old", ""), "op-refuse", "");
    let host = env
        .host(&Timing::default(), &mv_route("old", ""), "op-refuse")
        .await;
    settled(&env, "old", "bad", "reject:5", ClaimState::Failed).await;
    wait_for(Duration::from_secs(30), "the dead letter", || async {
        (env.messages(DEAD).await.len() == 1).then_some(())
    })
    .await;

    // Checked against the server and refused: 1, nothing changed.
    let unknown = cli(&config, &["dead-letters", "replay", "--sequence", "99"]);
    assert_eq!(unknown.code, 1, "a letter not ours is refused: {unknown:?}");
    assert!(
        unknown.stderr.contains("refused")
            && unknown
                .stderr
                .contains("no dead letter of this config's routes has sequence [99]"),
        "{unknown:?}"
    );
    let purge = cli(&config, &["dead-letters", "purge", "--sequence", "99"]);
    assert_eq!(purge.code, 1, "{purge:?}");
    let changed = write_config(
        &env,
        &mv_route("old", "key = { subject_token = 2 }"),
        "op-change",
        "",
    );
    let change = cli(&changed, &["setup", "--change-route", "old"]);
    assert_eq!(change.code, 1, "a change of a served route: {change:?}");
    assert!(change.stderr.contains("still served"), "{change:?}");
    let renamed = write_config(&env, &mv_route("new", ""), "op-rename", "");
    let rename = cli(&renamed, &["setup", "--rename-route", "old", "new"]);
    assert_eq!(rename.code, 1, "a rename of a served route: {rename:?}");
    assert!(rename.stderr.contains("still served"), "{rename:?}");

    // Could not run as asked (the config does not name it, no server): 2.
    let route = cli(&config, &["dead-letters", "list", "--route", "nope"]);
    assert_eq!(route.code, 2, "a route the config lacks: {route:?}");
    assert!(route.stderr.contains("route `nope` is not in this config"));
    let gone = cli(&renamed, &["setup", "--change-route", "nope"]);
    assert_eq!(gone.code, 2, "{gone:?}");

    // The refusals changed nothing: the letter is still there, the route still `old`.
    assert_eq!(env.messages(DEAD).await.len(), 1);
    let list = cli(&config, &["dead-letters", "list", "--json"]);
    assert_eq!(list.code, 0, "{list:?}");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_list_has_a_header_and_inspect_shows_a_settled_key_without_a_lease() {
    let env = TestEnv::start().await;
    let config = write_config(&env, &mv_route("mv", ""), "op-read", "");
    let host = env
        .host(&Timing::default(), &mv_route("mv", ""), "op-read")
        .await;
    settled(&env, "mv", "fine", "hello", ClaimState::Completed).await;
    settled(&env, "mv", "bad", "reject:5", ClaimState::Failed).await;
    wait_for(Duration::from_secs(30), "the dead letter", || async {
        (env.messages(DEAD).await.len() == 1).then_some(())
    })
    .await;

    let list = cli(&config, &["dead-letters", "list"]);
    assert_eq!(list.code, 0, "{list:?}");
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one letter: {list:?}");
    for column in ["SEQUENCE", "ROUTE", "KEY", "ATTEMPT", "SUBJECT", "REASON"] {
        assert!(lines[0].contains(column), "`{column}` in {:?}", lines[0]);
    }
    assert!(
        lines[1].contains(" mv ") && lines[1].contains(" bad ") && lines[1].contains("in.mv.bad"),
        "{:?}",
        lines[1]
    );
    // `--json` stays a bare array of letters, for scripts.
    let json = cli(&config, &["dead-letters", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["key"], "bad", "{v}");

    let done = cli(&config, &["inspect", "--route", "mv", "--key", "fine"]);
    assert_eq!(done.code, 0, "{done:?}");
    assert!(
        done.stdout.contains("  state           completed"),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout.contains("  completed       "),
        "{}",
        done.stdout
    );
    assert!(
        done.stdout.contains("  outputs         1"),
        "{}",
        done.stdout
    );
    let dead = cli(&config, &["inspect", "--route", "mv", "--key", "bad"]);
    assert!(dead.stdout.contains("failed for good"), "{}", dead.stdout);
    for table in [&done.stdout, &dead.stdout] {
        for lease in ["lease expires", "owner", "fencing token"] {
            assert!(
                !table.contains(lease),
                "no `{lease}` for a settled key: {table}"
            );
        }
    }
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_logs_version_swaps_but_not_every_message_when_rust_log_is_unset() {
    let env = TestEnv::start().await;
    let config = write_config(&env, &mv_route("mv", ""), "op-dev", "");
    let (mut dev, log) = start_host(&env, "dev", &config, "mv").await;
    settled(&env, "mv", "one", "hello", ClaimState::Completed).await;
    signal(&dev, "-TERM");
    let status = wait_exit(&mut dev, Duration::from_secs(60), "`dev`");
    assert!(status.success(), "{status:?}");
    let log = wait_for(Duration::from_secs(10), "`dev`'s log", || async {
        let text = log.lock().unwrap().clone();
        text.contains("now serving a new version").then_some(text)
    })
    .await;
    assert!(
        !log.contains("message settled") && !log.contains(" INFO message"),
        "no line per message by default: {log}"
    );
}

/// A team's config as the quick start writes it: the default source stream, one route named
/// `handler` on `<prefix>.*` served from the object store.
fn team(env: &TestEnv, prefix: &str) -> std::path::PathBuf {
    let text = format!(
        "[nats]\nurls = [\"{url}\"]\n\n[source]\nsubjects = [\"{prefix}.*\"]\nack_wait = \"2s\"\n\n[claims]\nlease = \"2s\"\nheartbeat = \"500ms\"\nstorage = \"memory\"\n\n[[routes]]\nname = \"handler\"\nsubject = \"{prefix}.*\"\n",
        url = env.server().url(),
    );
    let path = env.path(&format!("{prefix}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// `run` exited 1 as a refusal, and every line of the refusal (it may list several
/// conflicts, one a line) starts with `dedup-host: refused: `.
fn assert_refused(run: &dedup_host_tests::guests::CliRun, what: &str) {
    assert_eq!(run.code, 1, "{what} is a refusal: {run:?}");
    let lines: Vec<&str> = (run.stderr.lines())
        .skip_while(|l| !l.starts_with("dedup-host: refused: "))
        .collect();
    assert!(!lines.is_empty(), "{what} says it was refused: {run:?}");
    for line in lines {
        assert!(
            line.starts_with("dedup-host: refused: "),
            "{what}: every line of the refusal is prefixed: {line:?} in {run:?}"
        );
    }
}

/// A second team's `deploy` and `undeploy` of a route another deployment's component holds,
/// and its `run` while the first team's consumer and contract exist, are refusals: exit 1,
/// every line of the (multi-line) refusal prefixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_teams_deploy_undeploy_and_run_exit_1_with_every_line_prefixed() {
    let env = TestEnv::start().await;
    let (one, two) = (team(&env, "shipping"), team(&env, "billing"));
    let hostile = guest("hostile").display().to_string();
    let deploy = ["deploy", "--route", "handler", "--component", &hostile];

    // Team 1 deployed its component before setting up: the object records it as theirs.
    let deployed = cli(&one, &deploy);
    assert_eq!(deployed.code, 0, "{deployed:?}");
    let refused = cli(&two, &deploy);
    assert_refused(&refused, "a deploy over another deployment's component");
    assert!(refused.stderr.contains("its component was not changed"));
    let refused = cli(&two, &["undeploy", "--route", "handler"]);
    assert_refused(&refused, "an undeploy of another deployment's component");

    // Team 1 set up: its consumer and contract refuse team 2's commands and host.
    let setup = cli(&one, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let refused = cli(&two, &deploy);
    assert_refused(&refused, "a deploy over another deployment's consumer");
    let mut run = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&two)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dedup-host run");
    let status = wait_exit(&mut run, Duration::from_secs(60), "team 2's run");
    let mut stderr = String::new();
    run.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let run = dedup_host_tests::guests::CliRun {
        code: status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr,
    };
    assert_refused(&run, "a host of another deployment's consumer");
    assert!(
        run.stderr.contains("belongs to deployment"),
        "names the owner: {run:?}"
    );
}

/// A rename refused because a key of the old route is unsettled exits 1, and leaves the old
/// route's contract record without the `changing` mark it wrote before its checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_refused_for_unsettled_keys_exits_1_and_clears_its_mark() {
    use dedup_host::claim::key;
    use dedup_host_tests::harness::BUCKET;

    let env = TestEnv::start().await;
    let host = env
        .host(&Timing::default(), &mv_route("old", ""), "op-ren")
        .await;
    settled(&env, "old", "a", "spin-sleep:0:0", ClaimState::Completed).await;
    host.shutdown().await.unwrap();
    // Key `z` was left in progress by a host that died mid-run.
    let mut unsettled = env.claim("old", "a").await.unwrap();
    unsettled.state = ClaimState::InProgress;
    unsettled.outputs.clear();
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    kv.put(key::encode("old", "z"), unsettled.to_bytes())
        .await
        .unwrap();

    let renamed = write_config(&env, &mv_route("new", ""), "op-ren-new", "");
    let rename = cli(&renamed, &["setup", "--rename-route", "old", "new"]);
    assert_refused(&rename, "a rename with an unsettled key");
    assert!(
        rename.stderr.contains("1 unsettled claim key(s)"),
        "{rename:?}"
    );
    let config = env.config(&Timing::default(), &mv_route("old", ""));
    let contracts = (env.js)
        .get_key_value(dedup_host::contract::bucket_name(&config))
        .await
        .unwrap();
    let record = contracts.get("old").await.unwrap().expect("old's contract");
    assert!(
        !dedup_host::contract::is_marked(&record),
        "the refused rename cleared its mark: {}",
        String::from_utf8_lossy(&record)
    );
}

mod trial;
