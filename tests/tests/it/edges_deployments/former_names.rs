//! A deployment's former default name (`auto-`, which follows the source subjects): hosts
//! of the old config keep serving while `setup` moves what it owns to the new name, and a
//! name is proved this config's own only by everything it owns, never by one shared
//! consumer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::harness::{wait_for, TestEnv};

use super::{cli, completed, owners, publish, team};

/// `path`'s config with the source subject `returns.*` added (a new default name), written
/// beside it.
fn grown(env: &TestEnv, path: &Path) -> (PathBuf, Config) {
    let grown_path = env.path("grown.toml");
    let text = std::fs::read_to_string(path).unwrap().replace(
        r#"subjects = ["shipping.*"]"#,
        r#"subjects = ["shipping.*", "returns.*"]"#,
    );
    std::fs::write(&grown_path, text).unwrap();
    let grown = Config::load(&grown_path).expect("valid");
    (grown_path, grown)
}

/// Whether host `instance` reports route `handler` refused by its contract.
async fn contract_refused(env: &TestEnv, config: &Config, instance: &str) -> Option<String> {
    let store = dedup_host::components::status::open(&env.js, config)
        .await
        .unwrap();
    let hosts = dedup_host::components::status::read_all(&store)
        .await
        .unwrap();
    hosts
        .iter()
        .find(|h| h.instance_id == instance)
        .and_then(|h| h.routes.get("handler"))
        .and_then(|r| r.contract_refused.clone())
}

/// A rolling restart onto a config that adds a source subject (a new default name) puts
/// hosts of both configs side by side: a host start of the new config moves nothing (only
/// an explicit `setup` does, or the two would move it back and forth), and once `setup`
/// moves the contract to the new name, the hosts still running the old config recognise it
/// as their own (same route consumer, same claim keys) and keep serving, refusing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_the_old_config_keep_serving_when_setup_moves_their_default_name() {
    let env = TestEnv::start().await;
    let (path, first) = team(&env, "shipping");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let hostile = dedup_host_tests::guests::guest("hostile");
    let deploy = ["deploy", "--route", "handler", "--component"];
    let (code, out) = cli(&path, &[&deploy[..], &[hostile.to_str().unwrap()]].concat()).await;
    assert_eq!(code, 0, "{out}");
    let consumer = dedup_host::setup::route_consumer_name(&first, "handler");
    let old = first.deployment_name();
    let mut hosts = Vec::new();
    for id in ["old-1", "old-2"] {
        let mut config = first.clone();
        config.host.instance_id = Some(id.into());
        hosts.push(dedup_host::serve::start(config).await.unwrap());
    }
    publish(&env, "shipping.0", "t1-0").await;
    wait_for(Duration::from_secs(60), "the old hosts serve", || async {
        completed(&env, &first, 1).await.then_some(())
    })
    .await;

    let (grown_path, grown) = grown(&env, &path);
    let new = grown.deployment_name();
    assert_ne!(old, new);
    let (code, out) = cli(&grown_path, &["setup", "--apply"]).await;
    assert_eq!(code, 0, "{out}");

    // A host of the new config starts beside them and moves nothing.
    let mut config = grown.clone();
    config.host.instance_id = Some("new-1".into());
    let started = dedup_host::serve::start(config).await.expect("serves");
    assert_eq!(
        owners(&env, &first, &consumer).await,
        [Some(old.clone()), Some(old.clone()), Some(old.clone())],
        "a host start moves no owner"
    );
    started.shutdown().await.unwrap();

    let (code, out) = cli(&grown_path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        owners(&env, &grown, &consumer).await,
        [Some(new.clone()), Some(new.clone()), Some(new.clone())],
        "setup moved the owner: {out}"
    );
    // Only the old config's hosts run: every message is still served.
    let total = 10;
    for i in 1..total {
        publish(&env, &format!("shipping.{i}"), &format!("t1-{i}")).await;
    }
    wait_for(
        Duration::from_secs(60),
        "the old hosts serve after the move",
        || async { completed(&env, &first, total).await.then_some(()) },
    )
    .await;
    for id in ["old-1", "old-2"] {
        let refused = contract_refused(&env, &first, id).await;
        assert_eq!(refused, None, "{id} refuses nothing");
    }
    for host in hosts {
        host.shutdown().await.unwrap();
    }
}

/// The owner recorded on consumer `name` of the source stream.
async fn consumer_owner(env: &TestEnv, config: &Config, name: &str) -> Option<String> {
    let stream = env.js.get_stream(&config.source.stream).await.unwrap();
    let info = stream.consumer_info(name).await.unwrap();
    info.config
        .metadata
        .get(dedup_host::ownership::OWNER_KEY)
        .cloned()
}

/// Team 2 shares one route (its consumer name and filter) with team 1 and adds one of its
/// own: that one shared consumer does not prove team 1's default name to be team 2's
/// former one, so team 2's `setup` (and the move itself) never re-owns team 1's other
/// consumer, its stream or its contracts.
#[tokio::test]
async fn a_team_sharing_one_route_never_takes_the_other_consumers_of_the_first() {
    let env = TestEnv::start().await;
    let (one_path, _) = team(&env, "shipping");
    let text = std::fs::read_to_string(&one_path).unwrap().replace(
        r#"subjects = ["shipping.*"]"#,
        r#"subjects = ["shipping.*", "orders.*"]"#,
    ) + "\n[[routes]]\nname = \"other\"\nsubject = \"orders.*\"\n";
    std::fs::write(&one_path, text).unwrap();
    let one = Config::load(&one_path).expect("valid");
    let (code, out) = cli(&one_path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let theirs = one.deployment_name();

    let text = std::fs::read_to_string(&one_path)
        .unwrap()
        .replace(r#""orders.*"]"#, r#""billing.*"]"#)
        .replace(
            "name = \"other\"\nsubject = \"orders.*\"",
            "name = \"extra\"\nsubject = \"billing.*\"",
        );
    let two_path = env.path("team2.toml");
    std::fs::write(&two_path, text).unwrap();
    let two = Config::load(&two_path).expect("valid");
    assert_ne!(two.deployment_name(), theirs);
    let handler = dedup_host::setup::route_consumer_name(&one, "handler");
    let other = dedup_host::setup::route_consumer_name(&one, "other");
    assert_eq!(
        handler,
        dedup_host::setup::route_consumer_name(&two, "handler")
    );

    let (_, setup) = cli(&two_path, &["setup"]).await;
    let moved = dedup_host::ownership::migrate(&env.js, &two).await.unwrap();
    assert!(moved.is_empty(), "nothing moved: {moved:?} ({setup})");
    for name in [&handler, &other] {
        assert_eq!(
            consumer_owner(&env, &one, name).await.as_deref(),
            Some(theirs.as_str()),
            "{name} stays team 1's: {setup}"
        );
    }
    assert_eq!(
        owners(&env, &one, &handler).await,
        [
            Some(theirs.clone()),
            Some(theirs.clone()),
            Some(theirs.clone())
        ],
        "{setup}"
    );
}

/// The contracts bucket of `config` and the stored bytes of route `handler`'s contract.
async fn stored(env: &TestEnv, config: &Config) -> (async_nats::jetstream::kv::Store, Vec<u8>) {
    let store = env
        .js
        .get_key_value(dedup_host::contract::bucket_name(config))
        .await
        .unwrap();
    let value = store.get("handler").await.unwrap().expect("recorded");
    (store, value.to_vec())
}

/// Moving a former default name keeps a contract change under way (`setup --change-route`
/// marked the record): the record it writes carries the mark, so a host starting meanwhile
/// still waits for the change to end.
#[tokio::test]
async fn moving_a_former_default_name_keeps_a_contract_change_mark() {
    let env = TestEnv::start().await;
    let (path, first) = team(&env, "shipping");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let (store, _) = stored(&env, &first).await;
    let (found, _) = dedup_host::contract::lookup_marked(&store, "handler")
        .await
        .unwrap();
    let dedup_host::contract::Lookup::Recorded(record, _) = found else {
        panic!("recorded: {found:?}");
    };
    let mark = dedup_host::contract::Changing {
        to: record.contract.clone(),
        since_ms: 7,
        run: None,
    };
    let marked = dedup_host::contract::encode(&record, Some(&mark));
    store.put("handler", marked).await.unwrap();

    let (_, grown) = grown(&env, &path);
    let moved = dedup_host::ownership::migrate(&env.js, &grown)
        .await
        .unwrap();
    assert!(!moved.is_empty(), "the former name moves");
    let (_, value) = stored(&env, &first).await;
    assert!(
        dedup_host::contract::is_marked(&value),
        "the mark is kept: {}",
        String::from_utf8_lossy(&value)
    );
    let (found, changing) = dedup_host::contract::lookup_marked(&store, "handler")
        .await
        .unwrap();
    let dedup_host::contract::Lookup::Recorded(record, _) = found else {
        panic!("recorded: {found:?}");
    };
    assert_eq!(record.deployment, Some(grown.deployment_name()));
    assert_eq!(changing, Some(mark));
}

/// A move that stops part-way (here: the contracts bucket refuses the write) is finished by
/// running it again: the consumers, the only proof of the former name, move last.
#[tokio::test]
async fn a_move_that_stopped_part_way_is_finished_by_running_it_again() {
    let env = TestEnv::start().await;
    let (path, first) = team(&env, "shipping");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let consumer = dedup_host::setup::route_consumer_name(&first, "handler");
    let (_, grown) = grown(&env, &path);
    let new = grown.deployment_name();

    // The contracts bucket refuses every write for a while.
    let kv_stream = format!("KV_{}", dedup_host::contract::bucket_name(&first));
    let mut stream = env.js.get_stream(&kv_stream).await.unwrap();
    let mut c = stream.info().await.unwrap().config.clone();
    let max = c.max_message_size;
    c.max_message_size = 16;
    env.js.update_stream(&c).await.unwrap();
    dedup_host::ownership::migrate(&env.js, &grown)
        .await
        .expect_err("the contract write is refused");
    c.max_message_size = max;
    env.js.update_stream(&c).await.unwrap();

    dedup_host::ownership::migrate(&env.js, &grown)
        .await
        .expect("run again");
    assert_eq!(
        owners(&env, &grown, &consumer).await,
        [Some(new.clone()), Some(new.clone()), Some(new.clone())],
        "everything moved"
    );
}

/// The filters of consumer `name` of the source stream, however the server holds them.
async fn consumer_filters(env: &TestEnv, config: &Config, name: &str) -> Vec<String> {
    let stream = env.js.get_stream(&config.source.stream).await.unwrap();
    let c = stream.consumer_info(name).await.unwrap().config;
    let mut filters = c.filter_subjects;
    if !c.filter_subject.is_empty() {
        filters.push(c.filter_subject);
    }
    filters.sort();
    filters
}

/// A deployment with an unrouted consumer (a source subject no route takes) that adds a
/// source subject re-filters that consumer, still recorded under its former default name:
/// its route consumer proves the name its own, so `setup --plan`, `--apply` and `setup`
/// re-filter it and move it to the new name. A config of a real other deployment (its
/// name set) is still refused and re-filters nothing.
#[tokio::test]
async fn a_deployment_with_an_unrouted_consumer_adds_a_subject_and_keeps_it() {
    let env = TestEnv::start().await;
    let (path, _) = team(&env, "shipping");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        r#"subjects = ["shipping.*"]"#,
        r#"subjects = ["shipping.*", "returns.*"]"#,
    );
    std::fs::write(&path, &text).unwrap();
    let first = Config::load(&path).expect("valid");
    let (code, out) = cli(&path, &["setup"]).await;
    assert_eq!(code, 0, "{out}");
    let unrouted = first.source.consumer.clone();
    let old = first.deployment_name();
    assert_eq!(consumer_owner(&env, &first, &unrouted).await, Some(old));
    assert_eq!(
        consumer_filters(&env, &first, &unrouted).await,
        ["returns.*"]
    );

    let wider = text.replace(r#""returns.*"]"#, r#""returns.*", "refunds.*"]"#);
    std::fs::write(&path, &wider).unwrap();
    let grown = Config::load(&path).expect("valid");
    let new = grown.deployment_name();
    for args in [&["setup", "--plan"][..], &["setup", "--apply"], &["setup"]] {
        let (code, out) = cli(&path, args).await;
        assert_eq!(code, 0, "{args:?} takes its own unrouted consumer: {out}");
    }
    assert_eq!(
        consumer_filters(&env, &grown, &unrouted).await,
        ["refunds.*", "returns.*"]
    );
    assert_eq!(
        consumer_owner(&env, &grown, &unrouted).await,
        Some(new.clone())
    );

    // Another deployment, named, that would re-filter it again is refused.
    let other_path = env.path("other.toml");
    let other = wider.replace(r#""refunds.*"]"#, r#""refunds.*", "claims.*"]"#)
        + "\n[deployment]\nname = \"shop\"\n";
    std::fs::write(&other_path, other).unwrap();
    for args in [&["setup", "--plan"][..], &["setup"]] {
        let (code, out) = cli(&other_path, args).await;
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(
            out.contains(&format!(
                "consumer `{unrouted}` belongs to deployment `{new}`"
            )),
            "{args:?}: {out}"
        );
    }
    assert_eq!(
        consumer_filters(&env, &grown, &unrouted).await,
        ["refunds.*", "returns.*"]
    );
    assert_eq!(consumer_owner(&env, &grown, &unrouted).await, Some(new));
}
