//! `dedup-host dev --watch` (issue 46): a Rust project made by `dedup-host new`, watched while
//! its host serves live traffic. A save builds, tests and deploys it, and the new version's
//! outputs are printed; a failing case or a broken build deploys nothing, and the version
//! that passed keeps serving.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use dedup_host_tests::guests::{cli, host_binary, workspace_root};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing};

/// The route the watch deploys to, served from the object store.
const ROUTE: &str = r#"
[[routes]]
name = "watched"
subject = "in.watched.*"
allowed_outputs = ["in.watched.*.done"]
"#;

/// A first build of the template compiles its dependencies and Rust's std (minutes on a
/// busy machine); later builds take seconds.
const FIRST_BUILD: Duration = Duration::from_secs(900);
/// A save's build, test and deploy, generously.
const SAVE: Duration = Duration::from_secs(300);

/// `dedup-host dev --watch` stopped (killed) when the test ends, passing or not.
struct Watching(Option<Child>);

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

/// What the watch printed so far.
fn printed(out: &Path) -> String {
    std::fs::read_to_string(out).unwrap_or_default()
}

/// Waits until the watch has printed `needle` `times` times; returns what it printed.
async fn printed_times(out: &Path, needle: &str, times: usize, within: Duration) -> String {
    let what = format!("the watch printing {needle:?} {times} time(s)");
    wait_for(within, &what, || {
        let text = printed(out);
        async move { (text.matches(needle).count() >= times).then_some(text) }
    })
    .await
}

/// Publishes orders until the watch prints an output that contains `want`.
async fn output_printed(env: &TestEnv, out: &Path, want: &str, first: u32) {
    let started = Instant::now();
    for n in first.. {
        let subject = format!("in.watched.{n}");
        env.publish(
            &subject,
            &format!("order-{n}"),
            &[],
            format!("{{\"id\": {n}}}"),
        )
        .await;
        for _ in 0..10 {
            if printed(out)
                .lines()
                .any(|l| l.starts_with("output  ") && l.contains(want))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            started.elapsed() < SAVE,
            "no output with {want} printed: {}",
            printed(out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_is_built_tested_and_deployed_and_a_broken_build_keeps_the_old_version() {
    let env = TestEnv::start().await;
    let dir = env.path("watched");
    let new = Command::new(host_binary())
        .args(["new", "--lang", "rust", "watched", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(new.status.success(), "{new:?}");
    // The cases run under the route's allowed outputs: they use its subjects.
    let cases = dir.join("cases.toml");
    let template = std::fs::read_to_string(&cases).unwrap();
    std::fs::write(&cases, template.replace("orders.created.", "in.watched.")).unwrap();
    let config = dir.join("host.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), ROUTE)).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");

    let out = env.path("watch.out");
    let child = Command::new(host_binary())
        .current_dir(&dir)
        // Kept between runs: the template's first build compiles Rust's std.
        .env(
            "CARGO_TARGET_DIR",
            workspace_root().join("target/dev-watch-guest"),
        )
        .args([
            "dev",
            "--config",
            "host.toml",
            "--watch",
            "--route",
            "watched",
        ])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(env.path("watch.err")).unwrap())
        .spawn()
        .expect("start dedup-host dev --watch");
    let mut watching = Watching(Some(child));

    // The first cycle deploys the template; live traffic shows its greeting.
    printed_times(&out, "watch: deployed ", 1, FIRST_BUILD).await;
    output_printed(&env, &out, "\"greeting\":\"hello\"", 1).await;

    // The handler edited, its case not yet: the case fails and nothing is deployed.
    let lib = dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edited = source.replace("\"hello\"", "\"edited\"");
    assert_ne!(edited, source, "the template's greeting moved");
    std::fs::write(&lib, &edited).unwrap();
    let text = printed_times(&out, "1 case(s) failed; not deployed", 1, SAVE).await;
    assert!(text.contains("FAIL  greets a JSON object"), "{text}");
    assert_eq!(text.matches("watch: deployed ").count(), 1, "{text}");

    // The case follows: deployed, and live traffic shows the new greeting.
    let expected = std::fs::read_to_string(&cases).unwrap();
    std::fs::write(&cases, expected.replace("\"hello\"", "\"edited\"")).unwrap();
    printed_times(&out, "watch: deployed ", 2, SAVE).await;
    output_printed(&env, &out, "\"greeting\":\"edited\"", 1000).await;

    // A broken build is reported, deploys nothing, and the last version keeps serving.
    std::fs::write(&lib, format!("{edited}\nthis is not Rust\n")).unwrap();
    let text = printed_times(&out, "the build failed", 1, SAVE).await;
    assert!(
        text.contains("not deployed, route `watched` still serves sha256:"),
        "{text}"
    );
    env.publish("in.watched.broken", "after-broken", &[], "{\"id\": 0}")
        .await;
    let output = wait_for(
        SAVE,
        "the output of a message sent after the broken build",
        || async {
            let outputs = env.outputs().await;
            let m = outputs
                .into_iter()
                .find(|m| m.subject.as_str() == "in.watched.broken.done")?;
            Some(String::from_utf8_lossy(&m.payload).to_string())
        },
    )
    .await;
    assert!(output.contains("\"greeting\":\"edited\""), "{output}");
    assert_eq!(printed(&out).matches("watch: deployed ").count(), 2);

    // Ctrl-C ends the host and the watch cleanly.
    let mut child = watching.0.take().unwrap();
    signal(&child, "-INT");
    let status = child.wait().unwrap();
    assert!(status.success(), "dev --watch after Ctrl-C: {status}");
}
