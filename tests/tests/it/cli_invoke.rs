//! `dedup-host invoke`, run as a process.

use std::process::{Command, Output};

use dedup_host_tests::guests::{guest, host_binary};

fn invoke(args: &[&str]) -> Output {
    Command::new(host_binary())
        .arg("invoke")
        .args(args)
        .output()
        .expect("run dedup-host")
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn invoke_prints_outputs_for_each_example_guest() {
    let upper = guest("uppercase");
    let out = invoke(&[
        "--component",
        upper.to_str().unwrap(),
        "--subject",
        "a.b",
        "--payload",
        "hi",
    ]);
    assert_ok(&out);
    let report = json(&out);
    assert_eq!(report["outcome"], "success");
    assert_eq!(report["outputs"][0]["subject"], "a.b.done");
    assert_eq!(report["outputs"][0]["payload"], "HI");
    assert_eq!(report["logs"][0]["level"], "debug");

    let ledger = guest("ledger");
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("adj.json");
    std::fs::write(
        &body,
        r#"{"account":"acc-7","amount":100,"transaction_id":"t1"}"#,
    )
    .unwrap();
    let out = invoke(&[
        "--component",
        ledger.to_str().unwrap(),
        "--subject",
        "ledger.adjust",
        "--payload-file",
        body.to_str().unwrap(),
        "--header",
        "Nats-Msg-Id=t1",
        "--key",
        "t1",
    ]);
    assert_ok(&out);
    assert_eq!(
        json(&out)["outputs"][0]["subject"],
        "ledger.entries.acc-7.t1"
    );

    let flaky = guest("flaky");
    let args = [
        "--component",
        flaky.to_str().unwrap(),
        "--subject",
        "j",
        "--payload",
        "",
        "--config",
        "succeed_on_attempt=2",
    ];
    let out = invoke(&[&args[..], &["--attempt", "1"]].concat());
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["outcome"], "retry");
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not succeed (retry)"));
    let out = invoke(&[&args[..], &["--attempt", "2"]].concat());
    assert_ok(&out);
}

#[test]
fn invoke_reports_reject_and_trap_with_a_non_zero_exit() {
    let ledger = guest("ledger");
    let out = invoke(&[
        "--component",
        ledger.to_str().unwrap(),
        "--subject",
        "l",
        "--payload",
        "{",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report = json(&out);
    assert_eq!(report["outcome"], "reject");
    assert!(report["reason"]
        .as_str()
        .unwrap()
        .contains("malformed adjustment"));

    let hostile = guest("hostile");
    let out = invoke(&[
        "--component",
        hostile.to_str().unwrap(),
        "--subject",
        "h",
        "--payload",
        "panic",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report = json(&out);
    assert_eq!(report["outcome"], "trap");
    assert!(report["reason"]
        .as_str()
        .unwrap()
        .contains("guest panicked on purpose"));
}

#[test]
fn invoke_explains_wrong_arguments() {
    let upper = guest("uppercase");
    let upper = upper.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--component", upper, "--subject", "s"], "--payload"),
        (
            &[
                "--component",
                upper,
                "--subject",
                "s",
                "--payload",
                "x",
                "--payload-file",
                "f",
            ],
            "cannot be used with",
        ),
        (
            &[
                "--component",
                upper,
                "--subject",
                "s",
                "--payload",
                "x",
                "--header",
                "novalue",
            ],
            "is not KEY=VALUE",
        ),
        (
            &[
                "--component",
                upper,
                "--subject",
                "s",
                "--payload",
                "x",
                "--attempt",
                "0",
            ],
            "--attempt",
        ),
        (
            &[
                "--component",
                "/nope.wasm",
                "--subject",
                "s",
                "--payload",
                "x",
            ],
            "/nope.wasm",
        ),
        (
            &[
                "--component",
                upper,
                "--subject",
                "s",
                "--payload-file",
                "/nope.json",
            ],
            "--payload-file `/nope.json`",
        ),
    ];
    for (args, expected) in cases {
        let out = invoke(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: stderr should mention `{expected}`: {stderr}"
        );
    }
}

/// A command that prints and exits ends quietly when its reader has gone (`... | head -1`),
/// as Unix tools do, instead of panicking on a broken pipe (found by a new user).
#[test]
fn a_printing_command_whose_reader_is_gone_ends_quietly_on_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // nobody will read: the first write meets a broken pipe
    let out = Command::new(host_binary())
        .args(["wit", "--out"])
        .arg(dir.path())
        .stdout(writer)
        .output()
        .expect("run dedup-host");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc_sigpipe()),
        "ended by SIGPIPE, not {:?}: {stderr}",
        out.status
    );
}

/// SIGPIPE's number on Linux.
fn libc_sigpipe() -> i32 {
    13
}
