//! The guest author's commands, run as a handler author would, in temp directories outside
//! the repository: `new`, `build` and `test` in every language, `wit`, case files with a
//! wrong expectation and a JUnit report, and the README's authoring section as a script.

use std::process::Command;

use dedup_host_tests::guests::{guest, host_binary, workspace_root};
use dedup_host_tests::harness::TestEnv;

fn dedup_host(args: &[&str]) -> (i32, String) {
    let out = Command::new(host_binary())
        .args(args)
        .output()
        .expect("run dedup-host");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn wit_writes_the_package_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("wit");
    let (code, text) = dedup_host(&["wit", "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let repo = workspace_root().join("wit");
    let mut names: Vec<_> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let mut written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    written.sort();
    assert_eq!(names, written, "every file of wit/, and no other");
    for name in names {
        assert_eq!(
            std::fs::read(repo.join(&name)).unwrap(),
            std::fs::read(out.join(&name)).unwrap(),
            "{name:?} differs from wit/"
        );
    }
}

#[test]
fn the_example_and_conformance_guests_pass_their_case_files() {
    for guest_dir in ["uppercase", "ledger", "flaky", "hostile"] {
        let cases = workspace_root().join(format!("guests/rust/{guest_dir}/cases.toml"));
        let (code, text) = dedup_host(&["test", cases.to_str().unwrap()]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(" passed, 0 failed"), "{text}");
    }
    let cases = workspace_root().join("guests/conformance/cases.toml");
    for lang in ["rust", "python", "javascript", "c"] {
        let component = guest(&format!("conformance-{lang}"));
        let (code, text) = dedup_host(&[
            "test",
            cases.to_str().unwrap(),
            "--component",
            component.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{lang}: {text}");
        assert!(text.contains("6 passed, 0 failed"), "{lang}: {text}");
    }
}

macro_rules! new_build_test {
    ($($test:ident => $lang:literal,)*) => {
        $(
            #[test]
            fn $test() {
                new_build_and_test($lang);
            }
        )*
    };
}

new_build_test! {
    a_new_rust_project_builds_and_passes_its_cases => "rust",
    a_new_python_project_builds_and_passes_its_cases => "python",
    a_new_js_project_builds_and_passes_its_cases => "js",
    a_new_c_project_builds_and_passes_its_cases => "c",
}

/// `new`, `build` and `test`, untouched, in a temp directory; then a case with a wrong log
/// expectation fails with expected versus actual.
fn new_build_and_test(lang: &str) {
    let root = tempfile::tempdir().unwrap();
    let name = format!("greeter-{lang}");
    let dir = root.path().join(&name);
    let (code, text) = dedup_host(&["new", "--lang", lang, &name, "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = dedup_host(&["new", "--lang", lang, &name, "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "an existing project is never written over: {text}");
    assert!(text.contains("already exists and is not empty"), "{text}");

    let (code, text) = dedup_host(&["build", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{lang}: {text}");
    let component = dir.join(format!("{name}.wasm"));
    assert!(
        text.contains(&format!("built {}", component.display())),
        "{text}"
    );

    let cases = dir.join("cases.toml");
    let (code, text) = dedup_host(&["test", cases.to_str().unwrap()]);
    assert_eq!(code, 0, "{lang}: {text}");
    assert!(text.contains("3 passed, 0 failed"), "{lang}: {text}");

    let mut wrong = std::fs::read_to_string(&cases).unwrap();
    wrong.push_str(
        "\n[[case]]\nname = \"logs something it does not\"\nsubject = \"a.b\"\npayload = '{}'\n\
         expect.outputs = [{ subject = \"a.b.done\", contains = \"\" }]\n\
         expect.logs = [{ level = \"error\", message = \"greeting\" }]\n",
    );
    std::fs::write(&cases, wrong).unwrap();
    let (code, text) = dedup_host(&["test", cases.to_str().unwrap()]);
    assert_eq!(code, 1, "{lang}: {text}");
    assert!(
        text.contains("FAIL  logs something it does not\n  expected a log line error \"greeting\"")
            && text.contains("actual   info \"greeting\""),
        "{lang}: {text}"
    );
}

#[test]
fn a_missing_project_or_a_bad_name_is_refused_with_the_fix() {
    let root = tempfile::tempdir().unwrap();
    let (code, text) = dedup_host(&["build", root.path().to_str().unwrap()]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("no handler project in") && text.contains("dedup.toml"),
        "{text}"
    );
    let dir = root.path().join("x");
    let (code, text) = dedup_host(&[
        "new",
        "--lang",
        "c",
        "Bad_Name",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("is not a handler name: use"), "{text}");
    assert!(!dir.exists(), "nothing written");
}

#[test]
fn a_missing_toolchain_is_named_with_the_command_that_installs_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("greeter");
    let (code, text) = dedup_host(&[
        "new",
        "--lang",
        "python",
        "greeter",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    // A PATH without the Python toolchain the tests installed (componentize-py).
    let out = Command::new(host_binary())
        .args(["build", dir.to_str().unwrap()])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("missing toolchain: componentize-py")
            && text.contains("install it with:  pip install componentize-py==")
            && text.contains("dedup-host build --install"),
        "{text}"
    );
    assert!(!dir.join("greeter.wasm").exists());
}

macro_rules! readme_script {
    ($($test:ident => $lang:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                the_readme_authoring_section_runs_as_a_script($lang).await;
            }
        )*
    };
}

readme_script! {
    the_readme_quick_start_runs_as_a_script_in_python => "python",
    the_readme_quick_start_runs_as_a_script_in_rust => "rust",
    the_readme_quick_start_runs_as_a_script_in_js => "js",
    the_readme_quick_start_runs_as_a_script_in_c => "c",
}

/// The README's quick start, the newcomer's path, run from an empty folder with only
/// `dedup-host` added to the PATH, against a real nats-server, with the project in `lang`.
async fn the_readme_authoring_section_runs_as_a_script(lang: &str) {
    let script = dedup_host_tests::readme::block("authoring-script");
    assert!(script.contains("new --lang python greeter"), "{script}");
    let script = script.replace("new --lang python", &format!("new --lang {lang}"));

    let env = TestEnv::start().await;
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("empty");
    std::fs::create_dir_all(&folder).unwrap();
    let (success, text) = dedup_host_tests::readme::run(&script, &folder, &env.server().url());
    assert!(success, "{text}");
    assert!(text.contains("3 passed, 0 failed"), "{text}");
    assert!(
        text.contains("deployed greeter.wasm to route `greeter`: sha256:"),
        "{text}"
    );
    assert!(
        text.contains("greeter  orders.created.*  <- store"),
        "{text}"
    );
    assert!(text.contains("stored as sequence 1 of stream"), "{text}");
    assert!(
        text.contains("ORDERS_DONE #1 orders.created.") && text.contains(".done: "),
        "the output, read back with tail: {text}"
    );
    assert!(
        text.contains("DEDUP_DEAD #2 dead letter of `greeter` key `"),
        "the failing message dead-lettered again after its replay: {text}"
    );
    assert!(
        text.contains("verdict           dead-lettered after attempt"),
        "the failing message's story: {text}"
    );
}

/// Issue 46: the quick start run again on a server it has used, in another language, checks
/// only what this run stored (an earlier run's output once met every check), and a run whose
/// host processes nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_proves_itself_again_on_a_used_server() {
    let script = dedup_host_tests::readme::block("authoring-script");
    let env = TestEnv::start().await;
    let work = tempfile::tempdir().unwrap();
    let run = |lang: &str, folder: &str, script: &str| {
        let folder = work.path().join(folder);
        std::fs::create_dir_all(&folder).unwrap();
        let script = script.replace("new --lang python", &format!("new --lang {lang}"));
        dedup_host_tests::readme::run(&script, &folder, &env.server().url())
    };
    let (success, text) = run("rust", "first", &script);
    assert!(success, "the first run: {text}");
    assert!(text.contains("ORDERS_DONE #1 orders.created."), "{text}");

    // Another language on the same server: its own order, processed by its own version.
    let (success, text) = run("c", "second", &script);
    assert!(success, "a second language on a used server: {text}");
    assert!(
        text.contains("ORDERS_DONE #2 orders.created.") && !text.contains("ORDERS_DONE #1 "),
        "only this run's output counts: {text}"
    );

    // A run whose host processes nothing fails at its first check (nothing waits long: no
    // host serves the route at all).
    let host = "dedup-host run --config host.toml & host=$!";
    assert!(script.contains(host), "{script}");
    let idle = script
        .replace(host, "sleep 600 & host=$!")
        .replace("--wait 60s", "--wait 5s");
    let (success, text) = run("c", "idle", &idle);
    assert!(!success, "a run that processed nothing passed: {text}");
    assert!(
        text.contains("stored as sequence") && !text.contains("ORDERS_DONE #"),
        "it failed at the greeting's check: {text}"
    );
}

#[test]
fn every_kind_of_expectation_and_a_wrong_one_with_expected_versus_actual_and_junit() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.toml");
    std::fs::write(dir.path().join("event.txt"), "from a file").unwrap();
    std::fs::write(
        &cases,
        format!(
            r#"
component = "{}"

[[case]]
name = "echo, exact"
subject = "in.x"
payload_file = "event.txt"
expect.outputs = [{{ subject = "in.x.done", payload = "from a file" }}]

[[case]]
name = "echo, substring"
subject = "in.y"
payload = "a longer payload"
expect.outputs = [{{ subject = "in.y.done", contains = "longer" }}]

[[case]]
name = "retry"
subject = "in.r"
payload = "retry:5"
expect.retry = true

[[case]]
name = "trap"
subject = "in.t"
payload = "panic"
expect.trap = "guest trap"

[[case]]
name = "wrong on purpose"
subject = "in.w"
payload = "sleep-reject:0"
expect.outputs = [{{ subject = "in.w.done", payload = "x" }}]
"#,
            guest("hostile").display()
        ),
    )
    .unwrap();
    let junit = dir.path().join("junit.xml");
    let (code, text) = dedup_host(&[
        "test",
        cases.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "a failing case exits 1: {text}");
    assert!(text.contains("4 passed, 1 failed"), "{text}");
    assert!(
        text.contains("FAIL  wrong on purpose\n  expected success with 1 output(s)\n  actual   reject: rejected after sleeping"),
        "{text}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains(r#"tests="5""#) && xml.contains(r#"failures="1""#),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<testcase name="wrong on purpose""#),
        "{xml}"
    );

    // A malformed case file is refused with the case and the fix.
    std::fs::write(
        &cases,
        "[[case]]\nname = \"empty\"\nsubject = \"a\"\nexpect = {}\n",
    )
    .unwrap();
    let (code, text) = dedup_host(&[
        "test",
        cases.to_str().unwrap(),
        "--component",
        guest("hostile").to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        text.contains("case `empty`: no expectation: set one of expect.outputs"),
        "{text}"
    );
}
