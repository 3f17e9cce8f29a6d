//! Compile once (issue 46): `test` and `deploy` share one content-addressed compile cache in
//! the project folder, so a second `test` of an unchanged component and a `deploy` after
//! `test` compile nothing (each load logs whether it compiled); a changed component compiles
//! again.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dedup_host_tests::bench::hotload::with_custom_section;
use dedup_host_tests::guests::{cli, guest, host_binary};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing};

/// A route served from the object store.
const CACHED_ROUTE: &str = r#"
[[routes]]
name = "cached"
subject = "in.cached.*"
allowed_outputs = ["in.cached.*.done"]
"#;

/// Shows the compile log line.
const LOG: (&str, &str) = ("RUST_LOG", "dedup_host::cli::compile=info");

/// Runs `dedup-host ARGS` in `dir`, logging compiles; returns its exit code and output.
fn run_in(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(host_binary())
        .current_dir(dir)
        .env(LOG.0, LOG.1)
        .args(args)
        .output()
        .expect("run dedup-host");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

const COMPILED: &str = "compiled `";
const NOTHING: &str = "loaded from the compile cache (this version was compiled earlier on this machine), nothing compiled now";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_test_and_a_deploy_after_test_compile_nothing() {
    let env = TestEnv::start().await;
    let dir = env.path("project");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest("hostile"), dir.join("handler.wasm")).unwrap();
    std::fs::write(
        dir.join("cases.toml"),
        "component = \"handler.wasm\"\n\n[[case]]\nname = \"echo\"\nsubject = \"in.x\"\n\
         payload = \"hello\"\nexpect.outputs = [{ subject = \"in.x.done\", payload = \"hello\" }]\n",
    )
    .unwrap();

    let (code, first) = run_in(&dir, &["test", "cases.toml"]);
    assert_eq!(code, 0, "{first}");
    assert!(
        first.contains(COMPILED) && !first.contains(NOTHING),
        "{first}"
    );
    let (code, second) = run_in(&dir, &["test", "cases.toml"]);
    assert_eq!(code, 0, "{second}");
    assert!(
        second.contains(NOTHING) && !second.contains(COMPILED),
        "the second test of an unchanged component: {second}"
    );

    // A new version whose code is the same (a custom section added: a new digest) compiles,
    // but its functions come from Cranelift's cache beside the compile cache: almost none
    // is added. An edited Python or JavaScript handler is this case for its interpreter.
    let functions = dir.join(".dedup-host/cache/functions");
    let count = || std::fs::read_dir(&functions).map_or(0, |d| d.count());
    let before = count();
    assert!(
        before > 0,
        "no compiled function kept in {}",
        functions.display()
    );
    let same_code = with_custom_section(&std::fs::read(guest("hostile")).unwrap(), 1);
    std::fs::write(dir.join("handler.wasm"), same_code).unwrap();
    let (code, third) = run_in(&dir, &["test", "cases.toml"]);
    assert_eq!(code, 0, "{third}");
    assert!(third.contains(COMPILED), "a new digest compiles: {third}");
    // A few entries are new (the component's own glue: 36 of 440 here), not the guest's code.
    let added = count() - before;
    assert!(
        added < before / 4,
        "{added} functions compiled again of {before}: the function cache missed"
    );

    // `deploy` with a config in the same folder: the hosts' cache, which `test` filled.
    let config = dir.join("host.toml");
    std::fs::write(&config, env.config_text(&Timing::default(), CACHED_ROUTE)).unwrap();
    let setup = cli(&config, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let args = [
        "deploy",
        "--config",
        "host.toml",
        "--route",
        "cached",
        "--component",
        "handler.wasm",
    ];
    let (code, deploy) = run_in(&dir, &args);
    assert_eq!(code, 0, "{deploy}");
    assert!(
        deploy.contains(NOTHING) && !deploy.contains(COMPILED),
        "a deploy after test: {deploy}"
    );

    // A changed component (other bytes) compiles again.
    std::fs::copy(guest("uppercase"), dir.join("handler.wasm")).unwrap();
    let (code, deploy) = run_in(&dir, &args);
    assert_eq!(code, 0, "{deploy}");
    assert!(
        deploy.contains(COMPILED) && !deploy.contains(NOTHING),
        "a changed component: {deploy}"
    );

    // A host started from the same folder runs the deployed version from the entry `deploy`
    // wrote: the hosts' engine (its instance pool sized from the routes' limits) keeps the code
    // settings of the authoring commands' engine, so nothing compiles again.
    let log = dir.join("host.log");
    let host = Command::new(host_binary())
        .current_dir(&dir)
        .env("RUST_LOG", "dedup_host::components=info")
        .args(["run", "--config", "host.toml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start dedup-host run");
    let _host = Killed(host);
    let loaded = wait_for(
        Duration::from_secs(120),
        "the host loading route `cached`",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move {
                text.lines()
                    .any(|l| l.contains("route `cached`:"))
                    .then_some(text)
            }
        },
    )
    .await;
    assert!(
        loaded.contains(HOST_NOTHING) && !loaded.contains(HOST_COMPILED),
        "a host loading the version `deploy` compiled: {loaded}"
    );
}

const HOST_COMPILED: &str = "route `cached`: compiled `";
const HOST_NOTHING: &str = "loaded from the compile cache (this version was compiled earlier on this machine), nothing compiled now";

/// A child process killed when the test ends, passing or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}
