//! `dedup-host dev --watch` (issue 46): a Rust project made by `dedup-host new`, watched while
//! its host serves live traffic. A save builds, tests and deploys it, and the new version's
//! outputs are printed; a failing case or a broken build deploys nothing, and the version
//! that passed keeps serving. A watch restarted on the version the route serves deploys
//! nothing and names the version served; Ctrl-C during a build ends it at once; a route not
//! named like the project must be named with `--route`; a reader that goes away (`| head -1`)
//! stops it cleanly; a save of the config rebuilds nothing; a folder that does not exist is
//! named.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
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

/// A build script that holds the build until the file `release` exists (15 minutes at most):
/// a build still running when Ctrl-C comes.
const HELD_BUILD: &str = r#"
fn main() {
    let started = std::time::Instant::now();
    // Also released once the test's folder is gone: a release written just before the
    // folder was removed would otherwise be missed, and the build hold the cargo lock of the
    // next watch test for 15 minutes.
    let release = std::path::Path::new(RELEASE);
    let held = || !release.exists() && release.parent().is_some_and(|p| p.exists());
    while held() && started.elapsed().as_secs() < 900 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
"#;

/// Creates the file that releases [`HELD_BUILD`] when dropped, so no build outlives the test.
struct Release(std::path::PathBuf);

impl Drop for Release {
    fn drop(&mut self) {
        std::fs::write(&self.0, "").ok();
    }
}

/// Starts `dedup-host dev --config host.toml --watch` in `dir` with `args` after it; what it
/// prints goes to `out`.
fn start_watch(dir: &Path, out: &Path, args: &[&str]) -> Watching {
    let child = Command::new(host_binary())
        .current_dir(dir)
        // Kept between runs: the template's first build compiles Rust's std.
        .env(
            "CARGO_TARGET_DIR",
            workspace_root().join("target/dev-watch-guest"),
        )
        .args(["dev", "--config", "host.toml", "--watch"])
        .args(args)
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::fs::File::create(out.with_extension("err")).unwrap())
        .spawn()
        .expect("start dedup-host dev --watch");
    Watching(Some(child))
}

/// Waits until the watch exits on its own; its status.
async fn exited(watching: &mut Watching, within: Duration, what: &str) -> ExitStatus {
    let child = watching.0.as_mut().unwrap();
    let status = wait_for(within, what, || {
        let status = child.try_wait().unwrap();
        async move { status }
    })
    .await;
    watching.0 = None;
    status
}

/// Makes the template project `watched` in `dir`, with cases on the route's subjects.
fn new_project(dir: &Path) {
    let new = Command::new(host_binary())
        .args(["new", "--lang", "rust", "watched", "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(new.status.success(), "{new:?}");
    // The cases run under the route's allowed outputs: they use its subjects.
    let cases = dir.join("cases.toml");
    let template = std::fs::read_to_string(&cases).unwrap();
    std::fs::write(&cases, template.replace("orders.created.", "in.watched.")).unwrap();
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
    new_project(&dir);
    let cases = dir.join("cases.toml");
    let config = dir.join("host.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), ROUTE)).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");

    let out = env.path("watch.out");
    let mut watching = start_watch(&dir, &out, &["--route", "watched"]);

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
    // The compiler's error comes first, on the same stream as the line that says it failed.
    std::fs::write(&lib, format!("{edited}\nthis is not Rust\n")).unwrap();
    let text = printed_times(&out, "the build failed", 1, SAVE).await;
    assert!(
        text.contains("not deployed, route `watched` still serves version "),
        "{text}"
    );
    let failed = text.find("the build failed").unwrap();
    let broken = text[..failed].rfind("changed: building").unwrap();
    assert!(
        text[broken..failed].contains("this is not Rust"),
        "the compiler's output is not above the failure on stdout: {text}"
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

    // Restarted on the source the route serves: its first build is not deployed again.
    std::fs::write(&lib, &edited).unwrap();
    let out = env.path("rewatch.out");
    let mut watching = start_watch(&dir, &out, &[]);
    let text = printed_times(&out, "the component did not change", 1, SAVE).await;
    assert!(!text.contains("watch: deployed "), "{text}");

    // Ctrl-C while a build runs (held by a build script) ends `dev` without waiting for it.
    let release = Release(env.path("release-build"));
    let script = HELD_BUILD.replace("RELEASE", &format!("{:?}", release.0));
    std::fs::write(dir.join("build.rs"), script).unwrap();
    printed_times(&out, "build.rs changed: building", 1, SAVE).await;
    signal(watching.0.as_ref().unwrap(), "-INT");
    let status = exited(
        &mut watching,
        SAVE,
        "dev --watch to exit on Ctrl-C during a build",
    )
    .await;
    assert!(status.success(), "dev --watch after Ctrl-C: {status}");
    drop(release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_not_named_like_the_project_must_be_given_with_route() {
    let env = TestEnv::start().await;
    let dir = env.path("watched");
    new_project(&dir);
    let shared = r#"
[[routes]]
name = "shared"
subject = "in.watched.*"
"#;
    std::fs::write(
        dir.join("host.toml"),
        env.config_text(&Timing::default(), shared),
    )
    .unwrap();
    let out = env.path("watch.out");
    let mut watching = start_watch(&dir, &out, &[]);
    let what = "dev --watch to refuse a route not named like the project";
    let status = exited(&mut watching, Duration::from_secs(120), what).await;
    let err = printed(&out.with_extension("err"));
    assert!(!status.success(), "{status}: {err}");
    assert!(err.contains("--route NAME"), "{err}");
    assert!(err.contains("[\"shared\"]"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_reader_goes_away_stops_cleanly_instead_of_panicking() {
    use std::io::BufRead as _;
    let env = TestEnv::start().await;
    let dir = env.path("watched");
    new_project(&dir);
    let config = dir.join("host.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), ROUTE)).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let err = env.path("piped.err");
    let mut child = Command::new(host_binary())
        .current_dir(&dir)
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
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start dedup-host dev --watch");
    // `dev --watch | head -1`: one line read, then the reader is gone.
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("watch: "), "{first}");
    let mut watching = Watching(Some(child));
    let what = "dev --watch to stop once its reader has gone";
    let status = exited(&mut watching, FIRST_BUILD, what).await;
    let err = printed(&err);
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("stdout was closed"), "{err}");
}

/// How many builds the watch started.
fn builds(text: &str) -> usize {
    (text.lines())
        .filter(|l| l.starts_with("watch: ") && l.ends_with("building"))
        .count()
}

/// The digest in the watch's last `watch: deployed … : sha256:…` line.
fn deployed_digest(text: &str) -> String {
    let line = (text.lines().rev())
        .find(|l| l.starts_with("watch: deployed "))
        .expect("a deployed line");
    line.rsplit(' ').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_restarted_on_the_served_source_deploys_nothing_and_names_the_version() {
    let env = TestEnv::start().await;
    let dir = env.path("watched");
    new_project(&dir);
    let config = dir.join("host.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), ROUTE)).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let out = env.path("watch.out");
    let mut watching = start_watch(&dir, &out, &[]);
    let text = printed_times(&out, "watch: deployed ", 1, FIRST_BUILD).await;
    let digest = deployed_digest(&text);
    let mut child = watching.0.take().unwrap();
    signal(&child, "-INT");
    let status = child.wait().unwrap();
    assert!(status.success(), "dev --watch after Ctrl-C: {status}");

    // The store already serves this build: it is not deployed again, and the line names
    // the version by its short digest.
    let out = env.path("rewatch.out");
    let _watching = start_watch(&dir, &out, &[]);
    let text = printed_times(&out, "the component did not change", 1, SAVE).await;
    assert!(!text.contains("watch: deployed "), "{text}");
    let short = &digest.strip_prefix("sha256:").expect("a sha256 digest")[..12];
    let line = (text.lines())
        .find(|l| l.contains("the component did not change"))
        .unwrap();
    assert!(
        line.ends_with(&format!("route `watched` still serves version {short}")),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_save_rebuilds_nothing_and_a_cases_save_runs_the_cases_again() {
    let env = TestEnv::start().await;
    let dir = env.path("watched");
    new_project(&dir);
    let config = dir.join("host.toml");
    let config_text = env.config_text(&Timing::default(), ROUTE);
    std::fs::write(&config, &config_text).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let out = env.path("watch.out");
    let _watching = start_watch(&dir, &out, &[]);
    printed_times(&out, "watch: deployed ", 1, FIRST_BUILD).await;
    let before = builds(&printed(&out));

    // The config is read once, at start: a save of it says so and builds nothing.
    std::fs::write(&config, format!("{config_text}\n# edited\n")).unwrap();
    let text = printed_times(&out, "restart `dedup-host dev` to apply it", 1, SAVE).await;
    assert!(
        text.contains("host.toml changed: the config is read once"),
        "{text}"
    );

    // A save of the cases runs them again (the build, unchanged, deploys nothing).
    let cases = dir.join("cases.toml");
    let expected = std::fs::read_to_string(&cases).unwrap();
    std::fs::write(&cases, format!("{expected}\n# edited\n")).unwrap();
    let text = printed_times(&out, "the component did not change", 1, SAVE).await;
    assert!(
        text.contains("watch: cases.toml changed: building"),
        "{text}"
    );
    assert_eq!(
        builds(&text),
        before + 1,
        "only the cases' save built: {text}"
    );
    assert_eq!(text.matches(" passed, 0 failed").count(), 2, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_folder_that_does_not_exist_names_it() {
    let env = TestEnv::start().await;
    let dir = env.path("project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("host.toml"),
        env.config_text(&Timing::default(), ROUTE),
    )
    .unwrap();
    let missing = env.path("no-such-project");
    let out = env.path("watch.out");
    let mut watching = start_watch(&dir, &out, &[missing.to_str().unwrap()]);
    let what = "dev --watch to refuse a folder that does not exist";
    let status = exited(&mut watching, Duration::from_secs(120), what).await;
    let err = printed(&out.with_extension("err"));
    assert!(!status.success(), "{status}: {err}");
    assert!(
        err.contains(&format!("`{}` does not exist", missing.display())),
        "{err}"
    );
    assert!(!err.contains("no handler project"), "{err}");
}
