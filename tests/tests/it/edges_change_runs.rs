//! Issue 42 leftovers: two `setup --change-route` runs on one route never move at once (the
//! change mark names its run and holds a lease the run renews), replay and purge wait for a
//! running change, and a host reports a contract refusal once.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host::contract;
use dedup_host_tests::guests::{cli, host_binary, CliRun};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, BUCKET, DEAD};

use super::edges_change::{host, publish, record_in, recorded, refused, side};

/// `dedup-host <args>` with config `path`, off the async runtime.
async fn run(path: &Path, args: &[&str]) -> CliRun {
    let path = path.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&path, &args)
    })
    .await
    .unwrap()
}

/// The change mark route `mv`'s contract record carries, if any.
async fn mark(env: &TestEnv, config: &dedup_host::config::Config) -> Option<contract::Changing> {
    let store = env
        .js
        .get_key_value(contract::bucket_name(config))
        .await
        .unwrap();
    contract::lookup_marked(&store, "mv").await.unwrap().1
}

/// A change of route `mv` to another claim bucket, held after it copied its first claim
/// record (test switch): a second change run is refused naming the first (its id and pid),
/// and so are `dead-letters replay` and `purge` of the route's letters; the first is then
/// paused (SIGSTOP) until its lease lapses, and the second run takes the change over and
/// finishes it; the first, resumed, finds its mark gone and stops without touching the
/// record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_change_run_waits_for_the_first_and_takes_over_once_its_lease_lapsed() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "", "claims-next");
    let first = host(&env, &old, "old-1").await;
    publish(&env, "k1", "a").await;
    publish(&env, "k2", "a").await;
    env.publish("in.mv.x", "k3-a", &[("Key", "k3")], "reject:0")
        .await;
    env.wait_completed("mv", &["k1", "k2"], Duration::from_secs(60))
        .await;
    wait_for(Duration::from_secs(60), "k3 dead-lettered", || async {
        let record = record_in(&env, BUCKET, "k3").await?;
        let mut dead = env.js.get_stream(DEAD).await.ok()?;
        let lettered = dead.info().await.ok()?.state.messages > 0;
        (record.state == ClaimState::Failed && record.permanent && lettered).then_some(())
    })
    .await;
    env.wait_drained(Duration::from_secs(60)).await;
    first.shutdown().await.unwrap();
    // A host of the new config (it creates the new claim bucket) refuses the route.
    let waiting = host(&env, &new, "new-1").await;
    refused(&env, &new.config, "new-1").await;

    let hold = env.path("hold-the-change");
    std::fs::write(&hold, "held").unwrap();
    let mut held = Command::new(host_binary())
        .args(["setup", "--config"])
        .arg(&new.path)
        .args(["--change-route", "mv", "--json"])
        .env("DEDUP_HOST_TEST_HOLD_CHANGE", &hold)
        .env("DEDUP_HOST_TEST_CHANGE_LEASE_MS", "10000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        Duration::from_secs(60),
        "the held run copying its first record",
        || async {
            for key in ["k1", "k2", "k3"] {
                if record_in(&env, "claims-next", key).await.is_some() {
                    return Some(());
                }
            }
            None
        },
    )
    .await;
    let holder = mark(&env, &old.config)
        .await
        .and_then(|m| m.run)
        .expect("the held run's mark names it");
    assert_eq!(holder.pid, held.id(), "{holder:?}");

    let second = run(&new.path, &["setup", "--change-route", "mv", "--json"]).await;
    assert_eq!(
        second.code, 1,
        "refused while the first run holds: {second:?}"
    );
    assert!(
        second.stderr.contains(&holder.id)
            && second.stderr.contains(&format!("pid {}", holder.pid))
            && second.stderr.contains("lease until"),
        "names the other run: {second:?}"
    );
    for command in ["replay", "purge"] {
        let letters = run(
            &new.path,
            &["dead-letters", command, "--route", "mv", "--all"],
        )
        .await;
        assert_eq!(letters.code, 1, "{command} refused: {letters:?}");
        assert!(
            letters.stderr.contains(&holder.id),
            "{command} names the run: {letters:?}"
        );
    }
    assert_eq!(
        recorded(&env, &old.config).await.1,
        format!("bucket {BUCKET}")
    );

    // The first run stops renewing; once its lease lapsed, the next run takes over.
    signal_pid(held.id(), "-STOP");
    let finished = wait_for(
        Duration::from_secs(120),
        "a run taking the change over",
        || async {
            let again = run(&new.path, &["setup", "--change-route", "mv", "--json"]).await;
            if again.code == 0 {
                return Some(again);
            }
            assert!(again.stderr.contains(&holder.id), "{again:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            None
        },
    )
    .await;
    assert!(finished.stdout.contains("\"changed\""), "{finished:?}");
    assert_eq!(recorded(&env, &new.config).await.1, "bucket claims-next");
    for key in ["k1", "k2", "k3"] {
        assert!(
            record_in(&env, "claims-next", key).await.is_some(),
            "{key} moved"
        );
    }
    assert_eq!(mark(&env, &new.config).await, None, "the mark is cleared");

    // The first run, resumed, finds its mark gone and stops, changing nothing.
    std::fs::remove_file(&hold).unwrap();
    signal_pid(held.id(), "-CONT");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            let status = held.wait().unwrap();
            let mut err = String::new();
            std::io::Read::read_to_string(held.stderr.as_mut().unwrap(), &mut err).unwrap();
            (status, err)
        }),
    )
    .await
    .expect("the resumed run ends")
    .unwrap();
    assert!(!out.0.success(), "{out:?}");
    assert!(out.1.contains("could not renew its mark"), "{out:?}");
    assert_eq!(recorded(&env, &new.config).await.1, "bucket claims-next");
    assert_eq!(mark(&env, &new.config).await, None, "left alone");
    waiting.shutdown().await.unwrap();
}

/// Sends `sig` to process `pid`.
fn signal_pid(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// A host whose config differs from route `mv`'s contract logs the refusal once, however
/// often it checks the record again with the same outcome (the contract watch checks it at
/// start and on every change of the record); a new reason is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_logs_a_contract_refusal_once() {
    let env = TestEnv::start().await;
    let old = side(&env, "old", "", BUCKET);
    let new = side(&env, "new", "effects = \"fenced\"", BUCKET);
    let setup = run(&old.path, &["setup"]).await;
    assert_eq!(setup.code, 0, "{setup:?}");
    let mut child = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&new.path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        })
    };
    let logged = |text: String| {
        let lines = lines.clone();
        move || {
            let found = lines.lock().unwrap().iter().any(|l| l.contains(&text));
            std::future::ready(found.then_some(()))
        }
    };
    let count = |text: &str| {
        (lines.lock().unwrap().iter())
            .filter(|l| l.contains("differs from its contract") && l.contains(text))
            .count()
    };
    wait_for(
        Duration::from_secs(60),
        "the refusal logged",
        logged("recorded by setup;".into()),
    )
    .await;
    let store = env
        .js
        .get_key_value(contract::bucket_name(&old.config))
        .await
        .unwrap();
    let touch = |by: &'static str, ms: u64| {
        let store = store.clone();
        async move {
            let (mut record, revision) = contract::read(&store, "mv").await.unwrap().unwrap();
            record.recorded_by = by.into();
            record.recorded_ms = ms;
            store
                .update("mv", contract::encode(&record, None), revision)
                .await
                .unwrap();
        }
    };
    // A new reason (who recorded it) is logged: the watch runs.
    touch("touch-one", 1).await;
    wait_for(
        Duration::from_secs(60),
        "the first touch logged",
        logged("recorded by touch-one;".into()),
    )
    .await;
    // The same reason again, then a new one: once the new one is logged, the watch has
    // checked the record after the second touch too.
    touch("touch-one", 2).await;
    touch("touch-three", 3).await;
    wait_for(
        Duration::from_secs(60),
        "the third touch logged",
        logged("recorded by touch-three;".into()),
    )
    .await;
    signal(&child, "-TERM");
    let _ = child.wait();
    reader.join().unwrap();
    assert_eq!(
        count("recorded by setup;"),
        1,
        "{:#?}",
        lines.lock().unwrap()
    );
    assert_eq!(
        count("recorded by touch-one;"),
        1,
        "{:#?}",
        lines.lock().unwrap()
    );
    assert_eq!(
        count("recorded by touch-three;"),
        1,
        "{:#?}",
        lines.lock().unwrap()
    );
}
