//! The guest author's commands, run as a handler author would: `dedup-host wit` and
//! `dedup-host test` with case files, a wrong expectation, and a JUnit report.

use std::process::Command;

use dedup_host_tests::guests::{guest, host_binary, workspace_root};

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
fn the_example_guests_pass_their_case_files() {
    for guest_dir in ["uppercase", "ledger"] {
        let cases = workspace_root().join(format!("guests/rust/{guest_dir}/cases.toml"));
        let (code, text) = dedup_host(&["test", cases.to_str().unwrap()]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(" passed, 0 failed"), "{text}");
    }
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
