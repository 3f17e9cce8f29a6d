//! What a new user's trial (the binary and the README, two teams on one server) found at the
//! edges: `routes` names a route that is another deployment's, a refused `setup` says what
//! fixes it, a config that does not load exits 2 for every command, and a rename that stopped
//! part-way keeps hosts off the old route.

use std::process::{Command, Stdio};
use std::time::Duration;

use dedup_host::claim::ClaimState;
use dedup_host_tests::guests::{cli, guest, host_binary};
use dedup_host_tests::harness::{signal, wait_for, TestEnv, Timing};

use super::{mv_route, settled, team, wait_exit, write_config};

/// A second team's `routes` on the default stream, where the first team's host serves a
/// route of the same name, says per route that it is the other deployment's (both names)
/// and what to do, and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_teams_routes_names_the_other_deployment() {
    let env = TestEnv::start().await;
    let (one, two) = (team(&env, "shipping"), team(&env, "billing"));
    let (first, second) = (
        dedup_host::config::Config::load(&one).unwrap(),
        dedup_host::config::Config::load(&two).unwrap(),
    );
    let (d1, d2) = (first.deployment_name(), second.deployment_name());
    assert_ne!(d1, d2);
    let hostile = guest("hostile").display().to_string();
    let deployed = cli(
        &one,
        &["deploy", "--route", "handler", "--component", &hostile],
    );
    assert_eq!(deployed.code, 0, "{deployed:?}");
    let setup = cli(&one, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let mut host = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&one)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start team 1's host");
    wait_for(Duration::from_secs(60), "team 1's host serving", || async {
        let out = cli(&one, &["routes", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
        let hosts = v["routes"][0]["hosts"].as_object()?.clone();
        hosts
            .values()
            .any(|h| h["digest"].is_string())
            .then_some(())
    })
    .await;
    let mine = cli(&one, &["routes"]);
    assert_eq!(mine.code, 0, "team 1's own route: {mine:?}");
    assert!(!mine.stdout.contains("ANOTHER DEPLOYMENT"), "{mine:?}");

    let theirs = cli(&two, &["routes"]);
    assert_eq!(theirs.code, 1, "{theirs:?}");
    let warning = format!(
        "ANOTHER DEPLOYMENT'S: route `handler` is deployment `{d1}`'s on this server, not this config's (deployment `{d2}`)"
    );
    assert!(theirs.stdout.contains(&warning), "{theirs:?}");
    for part in [
        "consumer `dedup-host-handler` belongs to deployment",
        "serve deployment",
        "[deployment] name",
        "its own `[source] stream`",
    ] {
        assert!(theirs.stdout.contains(part), "`{part}` in {theirs:?}");
    }
    assert!(
        theirs.stderr.contains("refused: route `handler`"),
        "{theirs:?}"
    );
    let json = cli(&two, &["routes", "--json"]);
    assert_eq!(json.code, 1, "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let other = &v["routes"][0]["other_deployment"];
    assert_eq!(other["owner"], d1.as_str(), "{v}");
    assert_eq!(other["mine"], d2.as_str(), "{v}");

    signal(&host, "-TERM");
    wait_exit(&mut host, Duration::from_secs(60), "team 1's host");
}

/// A config file that does not load is a command that cannot run: exit 2 for every command
/// that reads one, `reload` and `routes` alike, naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_does_not_load_exits_2_for_every_command() {
    let env = TestEnv::start().await;
    let good = write_config(&env, &mv_route("mv", ""), "op-broken", "");
    let text = std::fs::read_to_string(&good).unwrap();
    let unparsable = env.path("unparsable.toml");
    std::fs::write(&unparsable, format!("{text}\n[[routes]\nname = ")).unwrap();
    let invalid = env.path("invalid.toml");
    std::fs::write(
        &invalid,
        text.replace("subject = \"in.mv.*\"", "subject = \"\""),
    )
    .unwrap();
    let commands: [&[&str]; 9] = [
        &["routes"],
        &["reload"],
        &["setup"],
        &["setup", "--plan"],
        &["audit"],
        &["dead-letters", "list"],
        &["inspect", "--route", "mv", "--key", "k"],
        &["undeploy", "--route", "mv"],
        &["promote", "--route", "mv"],
    ];
    for config in [&unparsable, &invalid] {
        for args in commands {
            let out = cli(config, args);
            assert_eq!(out.code, 2, "{args:?} with {config:?}: {out:?}");
            assert!(
                out.stderr.contains("dedup-host: error:"),
                "{args:?}: {out:?}"
            );
        }
    }
}

/// A rename marks route `old` as changing before its probe, and a rename that stops after
/// its checks (here: the claim bucket refuses the copied record) leaves the mark, since it
/// may have moved part of what it moves: a host of the old config started after it does not
/// serve `old` (it reports the change under way) until the rename is finished or cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_after_a_rename_stopped_part_way_does_not_serve_the_old_route() {
    use dedup_host_tests::harness::BUCKET;

    let env = TestEnv::start().await;
    let host = env
        .host(&Timing::default(), &mv_route("old", ""), "op-mark")
        .await;
    settled(&env, "old", "a", "spin-sleep:0:0", ClaimState::Completed).await;
    host.shutdown().await.unwrap();
    // The claim bucket takes no more records: the rename's copy of `a` to `new` fails.
    let mut claims = env.js.get_stream(format!("KV_{BUCKET}")).await.unwrap();
    let info = claims.info().await.unwrap().clone();
    let mut full = info.config.clone();
    full.max_messages = info.state.messages as i64;
    env.js.update_stream(&full).await.expect("cap the bucket");

    let renamed = write_config(&env, &mv_route("new", ""), "op-mark-new", "");
    let rename = cli(&renamed, &["setup", "--rename-route", "old", "new"]);
    assert_ne!(rename.code, 0, "the copy failed: {rename:?}");
    assert!(
        rename.stderr.contains("copying a claim record"),
        "{rename:?}"
    );

    let config = write_config(&env, &mv_route("old", ""), "op-mark-late", "");
    let late = env
        .host(&Timing::default(), &mv_route("old", ""), "op-mark-late")
        .await;
    let refused = wait_for(
        Duration::from_secs(60),
        "the late host's refusal",
        || async {
            let out = cli(&config, &["routes", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&out.stdout).ok()?;
            v["routes"][0]["hosts"]["op-mark-late"]["contract_refused"]
                .as_str()
                .map(str::to_string)
        },
    )
    .await;
    assert!(refused.contains("is being changed"), "{refused}");
    late.shutdown().await.unwrap();
}

/// A second team's refused `setup` on the default stream ends with what fixes a conflict
/// with the first team's deployment, not a `--plan`/`--apply` that cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_teams_refused_setup_says_what_fixes_it() {
    let env = TestEnv::start().await;
    let (one, two) = (team(&env, "shipping"), team(&env, "billing"));
    let setup = cli(&one, &["setup"]);
    assert_eq!(setup.code, 0, "{setup:?}");
    let refused = cli(&two, &["setup"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    let closing = refused.stderr.lines().last().unwrap_or_default();
    assert!(
        closing.contains("nothing was created or changed")
            && closing.contains("which `--plan`/`--apply` cannot change")
            && closing.contains("`[deployment] name`")
            && closing.contains("its own `[source] stream`"),
        "{closing}"
    );
    assert!(
        !closing.contains("shows the changes that fix them"),
        "no promise that --plan fixes a conflict: {closing}"
    );
}
