//! The command line's review findings (issue 46): `publish` refuses the server's and the hosts'
//! namespaces by name; an output wildcard streams capture only in part stops `setup` and a
//! host start, naming a subject no stream captures; a user who may not list the server's
//! streams is warned, not refused; `dev --port 0` takes any free port and says which;
//! `dev --demo | head` ends quietly and takes its nats-server with it.

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dedup_host::config::Config;
use dedup_host_tests::guests::{cli, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing, UPPER_ROUTE};
use dedup_host_tests::nats::NatsServer;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_refuses_the_servers_namespaces_by_name() {
    let env = TestEnv::start().await;
    let config = env.path("ns.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), UPPER_ROUTE)).unwrap();
    env.create_stream("VICTIM", &["victim.>"]).await;
    for (subject, prefix) in [
        ("$JS.API.STREAM.DELETE.VICTIM", "$JS."),
        ("$KV.dedup-claims.k", "$KV."),
        ("$SYS.REQ.SERVER.PING", "$SYS."),
        ("_INBOX.x", "_INBOX."),
    ] {
        let args = [
            "publish",
            "--subject",
            subject,
            "--msg-id",
            "m",
            "--payload",
            "",
        ];
        let out = cli(&config, &args);
        assert_eq!(out.code, 2, "{subject}: {out:?}");
        assert!(
            out.stderr.contains("--subject")
                && out
                    .stderr
                    .contains(&format!("`{subject}` is in `{prefix}`")),
            "{subject}: {out:?}"
        );
    }
    assert!(
        env.js.get_stream("VICTIM").await.is_ok(),
        "the stream is still there"
    );
}

/// Route `part`, whose output wildcard `part.>` the stream `PART` captures only in part.
const PART_ROUTE: &str = r#"
[[routes]]
name = "part"
subject = "in.part.*"
component = "{guest:hostile}"
allowed_outputs = ["part.>"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_wildcard_captured_only_in_part_stops_setup_and_a_host_start() {
    let env = TestEnv::start().await;
    env.create_stream("PART", &["part.a.>", "part.b"]).await;
    let config = env.path("part.toml");
    let routes = format!("{UPPER_ROUTE}{PART_ROUTE}");
    std::fs::write(&config, env.config_text(&Timing::default(), &routes)).unwrap();
    let named = |text: &str| {
        text.contains("route `part`")
            && text.contains("`part.>` is captured only in part")
            && text.contains("[\"PART\"]")
            && text.contains("no stream captures `part.x`")
    };
    let setup = cli(&config, &["setup", "--dry-run"]);
    assert_eq!(setup.code, 2, "{setup:?}");
    assert!(named(&setup.stderr), "{setup:?}");

    let start = dedup_host::serve::start(env.config(&Timing::default(), &routes)).await;
    let e = format!("{:#}", start.err().expect("the host start is refused"));
    assert!(named(&e), "{e}");

    // Captured whole by a stream of `part.>`.
    env.js.delete_stream("PART").await.unwrap();
    env.create_stream("PART_ALL", &["part.>"]).await;
    let setup = cli(&config, &["setup", "--dry-run"]);
    assert_eq!(setup.code, 0, "{setup:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_list_streams_is_warned_naming_the_subject_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server_conf = dir.path().join("server.conf");
    std::fs::write(
        &server_conf,
        r#"
authorization {
  users = [
    { user: admin, password: pw }
    { user: svc, password: pw, permissions: { publish: { deny: ["$JS.API.STREAM.LIST"] } } }
  ]
}
"#,
    )
    .unwrap();
    let server = NatsServer::start_with(&["-c", server_conf.to_str().unwrap()]);
    // Another team's stream captures the outputs: this user cannot see it listed.
    let admin = async_nats::ConnectOptions::with_user_and_password("admin".into(), "pw".into())
        .connect(server.url())
        .await
        .unwrap();
    let admin = async_nats::jetstream::new(admin);
    admin
        .create_stream(async_nats::jetstream::stream::Config {
            name: "ELSEWHERE".into(),
            subjects: vec!["elsewhere.>".into()],
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    let text = format!(
        r#"
[nats]
urls = ["{url}"]
user = "svc"
password = "pw"

[source]
subjects = ["f9.*"]

[[routes]]
name = "f9"
subject = "f9.*"
allowed_outputs = ["elsewhere.>"]
"#,
        url = server.url()
    );
    let config = dir.path().join("svc.toml");
    std::fs::write(&config, &text).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    assert!(
        setup
            .stderr
            .contains("warning: route `f9`: allowed_outputs subject `elsewhere.>`")
            && setup.stderr.contains("not checked")
            && setup.stderr.contains("$JS.API.STREAM.LIST"),
        "{setup:?}"
    );

    // A host start (which checks the same) serves.
    let config = Config::parse(&text, &config, dir.path().to_path_buf()).unwrap();
    let host = dedup_host::serve::start(config)
        .await
        .expect("the host starts");
    host.shutdown().await.unwrap();
}

/// Starts `dedup-host dev ARGS` in `dir` with a config naming no server.
fn dev(dir: &Path, args: &[&str]) -> Child {
    let config = dir.join("dev.toml");
    std::fs::write(
        &config,
        "[source]\nsubjects = [\"dv.*\"]\n\n[[routes]]\nname = \"dv\"\nsubject = \"dv.*\"\n",
    )
    .unwrap();
    Command::new(host_binary())
        .current_dir(dir)
        .env_remove("DEDUP_HOST_NATS_URL")
        .args(["dev", "--config"])
        .arg(&config)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup-host dev")
}

#[test]
fn dev_port_0_takes_any_free_port_and_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut free = dev(dir.path(), &["--port", "0"]);
    let mut lines = BufReader::new(free.stderr.take().expect("stderr")).lines();
    let started = (lines.by_ref().map_while(Result::ok))
        .find(|l| l.contains("started nats-server at") || l.contains("error"))
        .unwrap_or_default();
    let port: u16 = started
        .split("nats://127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no URL with a port: {started}"));
    assert_ne!(port, 0, "{started}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "{started}"
    );
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("running as") {
            break;
        }
    }
    signal(&free, "-TERM");
    std::thread::spawn(move || lines.for_each(drop));
    let status = wait_exit(&mut free, Duration::from_secs(60), "`dev --port 0`");
    assert!(status.success(), "{status:?}");
}

/// The processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cwd = std::fs::read_link(entry.path().join("cwd"));
        if cwd.is_ok_and(|cwd| cwd == dir) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_demo_whose_reader_is_gone_ends_quietly_with_its_nats_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Command::new(host_binary())
        .current_dir(dir.path())
        .env_remove("DEDUP_HOST_NATS_URL")
        .env_remove("RUST_LOG")
        .args(["dev", "--demo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedup-host dev --demo");
    let mut first = String::new();
    BufReader::new(demo.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("read one line");
    assert!(!first.is_empty(), "the demo's first line");
    // The reader (and the pipe's read end) is dropped here: `dev --demo | head -1`.
    let mut stderr = demo.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = wait_exit(&mut demo, Duration::from_secs(120), "`dev --demo`");
    let stderr = reader.join().unwrap();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    assert!(
        status.signal() == Some(13) || matches!(status.code(), Some(0 | 141)),
        "ended by {status:?}, not quietly: {stderr}"
    );
    let gone = wait_for(Duration::from_secs(30), "its nats-server gone", || async {
        processes_in(dir.path()).is_empty().then_some(())
    });
    gone.await;
}
