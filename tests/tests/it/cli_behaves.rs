//! A command line that behaves like one (issue 46): a closed pipe ends a printing command
//! quietly; a subject argument is checked with an error naming it and the fix; `tail` follows
//! every stream its filter spans; an output subject no stream captures stops `setup`, `run`
//! and `reload`; `dev` refuses a taken port; settled keys show no lease in the console;
//! `dedup-bench --help` prints its usage.

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dedup_host::claim::ClaimState;
use dedup_host_tests::console::ConsoleProcess;
use dedup_host_tests::guests::{cli, guest, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, SOURCE, UPPER_ROUTE};

/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

/// Writes the harness config with `routes` to `<name>.toml` and returns its path.
fn write_config(env: &TestEnv, routes: &str, name: &str) -> PathBuf {
    let path = env.path(&format!("{name}.toml"));
    std::fs::write(&path, env.config_text(&Timing::default(), routes)).expect("write config");
    path
}

/// Waits (generously) for a process to exit; kills it and fails if it does not.
fn wait_exit(child: &mut Child, within: Duration, what: &str) -> ExitStatus {
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

/// What a child wrote on stderr (it has exited).
fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut text);
    }
    text
}

/// A command whose reader went away ended as Unix tools do: killed by SIGPIPE, or exit 0 or
/// 141, and never a panic.
fn assert_quiet(status: ExitStatus, stderr: &str, what: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{what}: {stderr}"
    );
    assert!(
        status.signal() == Some(SIGPIPE) || matches!(status.code(), Some(0 | 141)),
        "{what}: ended by {status:?}, not quietly: {stderr}"
    );
}

/// Runs `dedup-host <args[0]> --config CONFIG <args[1..]>` with a stdout nobody reads.
fn with_closed_stdout(config: &Path, args: &[&str]) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader); // the first write meets a broken pipe
    let out = Command::new(host_binary())
        .arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .stdout(writer)
        .output()
        .expect("run dedup-host");
    (out.status, String::from_utf8_lossy(&out.stderr).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printing_command_whose_reader_is_gone_ends_quietly() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "pipe");
    let host = env.host(&Timing::default(), UPPER_ROUTE, "pipe").await;
    env.publish("in.upper.a", "a", &[], "hello").await;
    wait_for(Duration::from_secs(60), "key a completed", || async {
        let record = env.claim("upper", "a").await?;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    let commands: [&[&str]; 7] = [
        &["routes"],
        &["routes", "--json"],
        &["inspect", "--route", "upper", "--key", "a"],
        &["audit", "--json"],
        &["dead-letters", "list", "--json"],
        &["tail", "--all", "--count", "1", "in.upper.>"],
        &[
            "tail", "--route", "upper", "--all", "--count", "1", "--json",
        ],
    ];
    for args in commands {
        let (status, stderr) = with_closed_stdout(&config, args);
        assert_quiet(status, &stderr, &format!("{args:?}"));
    }
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_every_stream_its_filter_spans_and_stops_quietly_when_its_reader_goes() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "tail");
    env.create_stream("MKA", &["mk.a"]).await;
    env.create_stream("MKB", &["mk.b"]).await;
    env.publish("mk.a", "a-0", &[], "in A").await;
    env.publish("mk.b", "b-0", &[], "in B").await;

    // `mk.>` spans both streams: both messages, one from each.
    let both = cli(
        &config,
        &[
            "tail", "mk.>", "--all", "--count", "2", "--wait", "30s", "--json",
        ],
    );
    assert_eq!(both.code, 0, "{both:?}");
    let mut streams: Vec<String> = both
        .stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            v["stream"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    streams.sort();
    assert_eq!(streams, ["MKA", "MKB"], "{both:?}");

    // Far more than a pipe holds: the reader takes one line and goes away mid-stream.
    for i in 1..=300 {
        env.publish("mk.a", &format!("a-{i}"), &[], "x".repeat(1000))
            .await;
    }
    let mut tail = Command::new(host_binary())
        .args(["tail", "--config"])
        .arg(&config)
        .args(["mk.>", "--all", "--count", "302"])
        .env_remove("RUST_LOG") // stderr is read only at the end
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tail");
    let mut first = String::new();
    BufReader::new(tail.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read one line");
    assert!(first.contains('#'), "a message line: {first}");
    // The reader (and the pipe's read end) is dropped here.
    let status = wait_exit(&mut tail, Duration::from_secs(60), "tail");
    assert_quiet(status, &stderr_of(&mut tail), "tail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_ends_when_its_reader_goes_even_if_no_further_message_comes() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "tail-idle");
    env.create_stream("IDLE", &["idle.>"]).await;
    env.publish("idle.a", "a-0", &[], "the only message").await;
    // `tail … | head -1`: one line, then nothing more is ever stored. Before, tail noticed
    // the closed pipe only at its next write, so it followed an idle stream for ever.
    let mut tail = Command::new(host_binary())
        .args(["tail", "--config"])
        .arg(&config)
        .args(["idle.>", "--all"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tail");
    let mut first = String::new();
    BufReader::new(tail.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read one line");
    assert!(first.contains("idle.a"), "a message line: {first}");
    let status = wait_exit(
        &mut tail,
        Duration::from_secs(60),
        "tail after its reader went",
    );
    assert_quiet(status, &stderr_of(&mut tail), "tail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subject_argument_is_checked_naming_the_argument_and_the_fix() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "subjects");
    // A stream captures what the mistyped filter means: without the check, `tail` would
    // wait for nothing and exit 1.
    env.create_stream("SHOP", &["shop.>"]).await;
    let tail = cli(
        &config,
        &[
            "tail",
            "shop.confirmations.C-*",
            "--count",
            "1",
            "--wait",
            "3s",
        ],
    );
    assert_eq!(tail.code, 2, "{tail:?}");
    assert!(
        tail.stderr.contains("SUBJECT")
            && tail.stderr.contains("`shop.confirmations.C-*`")
            && tail.stderr.contains("write `shop.confirmations.*`"),
        "{tail:?}"
    );

    let publish = cli(
        &config,
        &[
            "publish",
            "--subject",
            "orders.*",
            "--msg-id",
            "o-1",
            "--payload",
            "p",
        ],
    );
    assert_eq!(publish.code, 2, "{publish:?}");
    assert!(
        publish.stderr.contains("--subject")
            && publish.stderr.contains("not one subject")
            && publish.stderr.contains("`orders.x`"),
        "{publish:?}"
    );

    let upper = guest("uppercase").display().to_string();
    let invoke = Command::new(host_binary())
        .args(["invoke", "--component", &upper, "--subject", "a..b"])
        .args(["--payload", "p"])
        .output()
        .expect("run dedup-host invoke");
    let stderr = String::from_utf8_lossy(&invoke.stderr);
    assert_eq!(invoke.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--subject") && stderr.contains("a token is empty"),
        "{stderr}"
    );
}

/// Route `lost`, whose one output subject `nowhere.>` no stream captures.
const LOST_ROUTE: &str = r#"
[[routes]]
name = "lost"
subject = "in.lost.*"
component = "{guest:hostile}"
allowed_outputs = ["nowhere.>"]
"#;

/// Says route `lost`, its subject and the fix.
fn names_the_uncaptured_output(text: &str) -> bool {
    text.contains("route `lost`")
        && text.contains("`nowhere.>` is captured by no stream")
        && text.contains("[[output_streams]]")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_subject_no_stream_captures_stops_setup_run_and_reload() {
    let env = TestEnv::start().await;
    let routes = format!("{UPPER_ROUTE}{LOST_ROUTE}");
    let config = write_config(&env, &routes, "lost");

    let setups: [&[&str]; 2] = [&["setup", "--dry-run"], &["setup"]];
    for args in setups {
        let setup = cli(&config, args);
        assert_eq!(setup.code, 2, "{args:?}: {setup:?}");
        assert!(
            names_the_uncaptured_output(&setup.stderr),
            "{args:?}: {setup:?}"
        );
    }
    assert!(
        env.js.get_stream(SOURCE).await.is_err(),
        "`setup` created nothing"
    );

    let mut run = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG") // stderr is read only at the end
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup-host run");
    let status = wait_exit(&mut run, Duration::from_secs(60), "`run`");
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(names_the_uncaptured_output(&stderr), "{stderr}");
    assert!(
        env.js.get_stream(SOURCE).await.is_err(),
        "`run` created nothing"
    );

    // Declared in the config, the output stream counts before `setup` creates it.
    let declared = env.config_text(&Timing::default(), &routes).replace(
        "[[output_streams]]",
        "[[output_streams]]\nname = \"NOWHERE\"\nsubjects = [\"nowhere.>\"]\nduplicate_window = \"10m\"\n\n[[output_streams]]",
    );
    let declared_path = env.path("declared.toml");
    std::fs::write(&declared_path, declared).unwrap();
    let dry = cli(&declared_path, &["setup", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");

    // A reload that adds the route is refused whole; the running config keeps serving.
    let host = env.host(&Timing::default(), UPPER_ROUTE, "lost-h").await;
    let report = host
        .reload(Ok(env.config(&Timing::default(), &routes)))
        .await;
    assert!(!report.applied, "{report:?}");
    let problems = report.problems.join("\n");
    assert!(names_the_uncaptured_output(&problems), "{problems}");
    assert!(problems.contains("dedup-host setup"), "{problems}");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_no_lease_for_a_settled_key() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "console");
    let host = env.host(&Timing::default(), UPPER_ROUTE, "console-h").await;
    env.publish("in.upper.done-key", "done-key", &[], "hello")
        .await;
    wait_for(Duration::from_secs(60), "the key completed", || async {
        let record = env.claim("upper", "done-key").await?;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    let console = ConsoleProcess::start(&config, None);
    let addr = console.addr;
    let page = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect to the console");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        std::io::Write::write_all(
            &mut s,
            format!("GET /keys?q=done-key HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read the page");
        text
    })
    .await
    .unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("completed"), "the key's story: {page}");
    for lease in ["lease expires", "fencing token"] {
        assert!(
            !page.contains(lease),
            "no `{lease}` for a settled key: {page}"
        );
    }
    drop(console);
    host.shutdown().await.unwrap();
}

#[test]
fn dev_refuses_a_taken_port_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dev.toml");
    std::fs::write(
        &config,
        "[source]\nsubjects = [\"dv.*\"]\n\n[[routes]]\nname = \"dv\"\nsubject = \"dv.*\"\n",
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dev = |extra: &[&str]| {
        Command::new(host_binary())
            .current_dir(dir.path())
            .env_remove("DEDUP_HOST_NATS_URL")
            .args(["dev", "--config"])
            .arg(&config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start dedup-host dev")
    };
    let mut refused = dev(&["--port", &port.to_string()]);
    let status = wait_exit(
        &mut refused,
        Duration::from_secs(30),
        "`dev` on a taken port",
    );
    let stderr = stderr_of(&mut refused);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("port {port} is taken"))
            && stderr.contains("--port N")
            && stderr.contains("--any-port"),
        "{stderr}"
    );

    // Asked for any free port, it starts there and says where.
    let mut free = dev(&["--any-port"]);
    let mut started = String::new();
    let mut lines = BufReader::new(free.stderr.take().expect("stderr")).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("started nats-server at") {
            started = line;
            break;
        }
    }
    assert!(
        started.contains("nats://127.0.0.1:") && !started.contains(&format!(":{port} ")),
        "{started}"
    );
    // Stopped once it serves (its signal handlers are in place then).
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("running as") {
            break;
        }
    }
    signal(&free, "-TERM");
    // Keep reading, so a full pipe never blocks its shutdown.
    std::thread::spawn(move || lines.for_each(drop));
    let status = wait_exit(&mut free, Duration::from_secs(60), "`dev --any-port`");
    assert!(status.success(), "{status:?}");
    drop(taken);
}

#[test]
fn dedup_bench_help_prints_its_usage_not_an_error() {
    let bench = env!("CARGO_BIN_EXE_dedup-bench");
    let help = Command::new(bench)
        .arg("--help")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run dedup-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&help.stdout),
        String::from_utf8_lossy(&help.stderr),
    );
    assert!(help.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("Usage: dedup-bench BENCHMARK") && stdout.contains("pipeline"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("Error") && !stderr.contains("backtrace"),
        "{stderr}"
    );

    let unknown = Command::new(bench)
        .arg("nope")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run dedup-bench");
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert_eq!(unknown.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("dedup-bench: error: unknown benchmark `nope`")
            && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_without_a_message_id_names_it_by_its_content_so_a_retry_is_a_duplicate() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "fresh-id");
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let publish = |payload: &str, extra: &[&str]| {
        let mut args = vec![
            "publish",
            "--subject",
            "in.upper.fresh",
            "--payload",
            payload,
        ];
        args.extend_from_slice(extra);
        cli(&config, &args)
    };
    let first = publish("p", &[]);
    assert_eq!(first.code, 0, "{first:?}");
    let id = (first.stdout.split('`'))
        .find(|word| word.starts_with("msg-"))
        .unwrap_or_else(|| panic!("no message id printed: {first:?}"))
        .to_string();
    assert!(
        first.stdout.contains("derived from the message"),
        "{first:?}"
    );
    // The same command again (a retry after a lost acknowledgement) is a duplicate.
    let again = publish("p", &[]);
    assert_eq!(again.code, 3, "{again:?}");
    assert!(again.stdout.contains(&format!("`{id}`")), "{again:?}");
    // Another body is another message; another id sends the same body as a new one.
    let other = publish("q", &[]);
    assert_eq!(other.code, 0, "{other:?}");
    assert!(!other.stdout.contains(&id), "{other:?}");
    let renamed = publish("p", &["--msg-id", "by-hand"]);
    assert_eq!(renamed.code, 0, "{renamed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_that_gets_fewer_messages_than_its_count_says_how_many_and_how_long_it_waited() {
    let env = TestEnv::start().await;
    let config = write_config(&env, UPPER_ROUTE, "short");
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    env.publish("in.upper.one", "one", &[], "only one").await;
    let tail = cli(
        &config,
        &[
            "tail",
            "in.upper.>",
            "--all",
            "--count",
            "3",
            "--wait",
            "2s",
        ],
    );
    assert_eq!(tail.code, 1, "{tail:?}");
    assert_eq!(tail.stdout.lines().count(), 1, "{tail:?}");
    assert!(
        tail.stderr.contains("1 of 3 message(s) arrived within 2s")
            && tail.stderr.contains("--wait"),
        "{tail:?}"
    );
}
