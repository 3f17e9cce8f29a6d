//! The exit-code table of the book (docs/src/reference/exit-codes.md) is what the binary does:
//! every documented code has a case here, run against a real nats-server, and every case exits
//! with the code its row documents.

use std::collections::BTreeSet;
use std::process::Command;

use dedup_host_tests::guests::{cli, host_binary, workspace_root};
use dedup_host_tests::harness::{TestEnv, Timing};

const PAGE: &str = "docs/src/reference/exit-codes.md";

const ROUTE: &str = r#"
[[routes]]
name = "orders"
subject = "in.orders.*"
component = "{guest:uppercase}"
key = { subject_token = 2 }
allowed_outputs = ["in.orders.*.done"]
"#;

/// The codes the page's table documents.
fn documented() -> BTreeSet<i32> {
    let page = std::fs::read_to_string(workspace_root().join(PAGE)).unwrap();
    page.lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

/// Runs `dedup-host args...` and returns its exit code and output.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(host_binary()).args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_exit_code_is_what_its_case_exits_with() {
    let env = TestEnv::start().await;
    let url = env.server().url();
    let config = env.path("host.toml");
    let text = env.config_text(&Timing::default(), ROUTE);
    std::fs::write(&config, &text).unwrap();
    let changed = env.path("changed.toml");
    std::fs::write(
        &changed,
        text.replace("[source]\n", "[source]\nduplicate_window = \"3m\"\n"),
    )
    .unwrap();
    let forever = TestEnv::start().await;
    let forever_config = forever.path("host.toml");
    std::fs::write(
        &forever_config,
        forever
            .config_text(&Timing::default(), ROUTE)
            .replace("[source]\n", "[source]\ndedup = \"forever\"\n"),
    )
    .unwrap();
    let publish = |url: &str, id: &str| {
        run(&[
            "publish",
            "--nats-url",
            url,
            "--subject",
            "in.orders.o-1",
            "--msg-id",
            id,
            "--payload",
            "hi",
        ])
    };
    let forever_url = forever.server().url();

    let mut cases: Vec<(&str, i32, (i32, String))> = Vec::new();
    let setup = cli(&config, &["setup"]);
    cases.push((
        "setup on an empty server",
        0,
        (setup.code, setup.stdout + &setup.stderr),
    ));
    cases.push(("publish a new message", 0, publish(&url, "m-1")));
    cases.push(("publish the same message id again", 3, publish(&url, "m-1")));
    let differs = cli(&changed, &["setup"]);
    cases.push((
        "setup when the stream differs",
        1,
        (differs.code, differs.stdout + &differs.stderr),
    ));
    let missing = env.path("missing.toml");
    cases.push((
        "a config file that does not exist",
        2,
        run(&["setup", "--config", missing.to_str().unwrap()]),
    ));
    cases.push(("an unknown flag", 2, run(&["setup", "--no-such-flag"])));
    // A port nobody listens on, taken the moment before: freed, and asked at once.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("nats://{}", listener.local_addr().unwrap())
    };
    cases.push(("a server it cannot reach", 2, publish(&closed, "m-2")));
    let forever_setup = cli(&forever_config, &["setup"]);
    assert_eq!(
        forever_setup.code, 0,
        "{}{}",
        forever_setup.stdout, forever_setup.stderr
    );
    cases.push(("forever: a first message", 0, publish(&forever_url, "f-1")));
    cases.push((
        "forever: another message on the same subject",
        4,
        publish(&forever_url, "f-2"),
    ));

    let documented = documented();
    let mut covered = BTreeSet::new();
    for (what, expected, (code, out)) in &cases {
        assert!(
            documented.contains(expected),
            "{what}: exit {expected} is not in {PAGE}'s table {documented:?}"
        );
        assert_eq!(code, expected, "{what}: {out}");
        covered.insert(*expected);
    }
    assert_eq!(covered, documented, "every documented code has a case");
}
