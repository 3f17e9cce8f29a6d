//! The test-only switches that undo fixes (`dedup_delivery::revert`) are never silent: any
//! command run with one set says which fix it runs without.

use dedup_host_tests::guests::host_binary;

/// An operator command (not only `run`) names the switch and the fix it undoes on stderr.
#[test]
fn every_command_warns_of_a_test_only_switch_naming_the_fix() {
    let out = std::process::Command::new(host_binary())
        .args(["schema"])
        .env(dedup_delivery::revert::ENV, "rename-carries-history")
        .output()
        .expect("run dedup-host schema");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("test-only switch DEDUP_HOST_TEST_REVERT=rename-carries-history is set")
            && stderr.contains("WITHOUT the fix"),
        "stderr: {stderr}"
    );
    let quiet = std::process::Command::new(host_binary())
        .args(["schema"])
        .env_remove(dedup_delivery::revert::ENV)
        .output()
        .expect("run dedup-host schema");
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("test-only switch"),
        "{quiet:?}"
    );
}
