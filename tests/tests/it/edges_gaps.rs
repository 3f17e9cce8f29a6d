//! Gaps left at the edges (issue 42): a reset header only a proven replay may carry, and
//! the other edge guarantees pinned here.

use std::time::Duration;

use dedup_host::claim::record::RESET_REVISION;
use dedup_host::claim::ClaimState;
use dedup_host_tests::harness::{TestEnv, Timing};

/// `upper`, keyed by the subject's last token, so two messages can share a key.
const KEYED_BY_TOKEN: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
key = { subject_token = 2 }
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
"#;

/// A producer that writes `Dedup-Reset-Revision` itself (DESIGN rule 22: only the replay
/// command may) on a message of a completed key: the header is not honoured (no read is taken
/// for stale, the message is acked as a duplicate on its first delivery), nothing is reset,
/// and the key does not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_reset_revision_is_ignored_and_resets_nothing() {
    let env = TestEnv::start().await;
    let host = env.host(&Timing::default(), KEYED_BY_TOKEN, "a").await;
    env.publish("in.upper.k", "first", &[], "a").await;
    env.wait_completed("upper", &["k"], Duration::from_secs(30))
        .await;
    let before = env.claim("upper", "k").await.expect("the key's record");

    let forged = [(RESET_REVISION, "1000000")];
    env.publish("in.upper.k", "forged", &forged, "a").await;
    env.wait_drained(Duration::from_secs(60)).await;

    let stats = host.stats();
    assert_eq!(
        stats.duplicates, 1,
        "acked as the completed key's duplicate"
    );
    assert_eq!(stats.busy, 0, "no read was taken for stale: {stats:?}");
    assert_eq!(stats.processed, 1, "the key ran once: {stats:?}");
    let after = env.claim("upper", "k").await.expect("the key's record");
    assert_eq!(after.state, ClaimState::Completed);
    assert_eq!(after, before, "nothing was reset");
    assert_eq!(env.outputs().await.len(), 1, "one output set");
    host.shutdown().await.unwrap();
}

/// An exclusive route (plain, or coalescing) with `uppercase`, entity = the subject's last
/// token.
fn exclusive_upper(extra: &str) -> String {
    format!(
        r#"
[[routes]]
name = "ex"
subject = "in.ex.*"
component = "{{guest:uppercase}}"
exclusive_by = {{ subject_token = 2 }}
allowed_outputs = ["in.ex.*.done"]
{extra}
"#
    )
}

/// A message with an unparsable header block on an exclusive route is handled as on a plain
/// route: dead-lettered on its first delivery with the reason and its raw block, the host's
/// connection survives, and later messages of its entity and of others run.
async fn unreadable_on_an_exclusive_route(extra: &str) {
    use super::edges_headers::{connection_ids, monitored_env, publish_raw};
    use dedup_host::pipeline::effects::headers;
    use dedup_host_tests::harness::{wait_for, DEAD};

    let (env, monitor) = monitored_env().await;
    let mut config = env.config(&Timing::default(), &exclusive_upper(extra));
    config.host.instance_id = Some("x".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    env.publish("in.ex.e1", "before", &[], "a").await;
    env.wait_completed("ex", &["before"], Duration::from_secs(30))
        .await;
    let name = "dedup-host x";
    let connections = connection_ids(monitor, name);
    assert!(!connections.is_empty(), "the host is connected as `{name}`");

    let port = env.server().port();
    let not_utf8: &[u8] = b"NATS/1.0\r\nNats-Msg-Id: not-utf8\r\nX-Bad: \xff\r\n\r\n";
    let no_colon: &[u8] = b"NATS/1.0\r\nNats-Msg-Id: no-colon\r\nno colon\r\n\r\n";
    publish_raw(port, "in.ex.e1", not_utf8, b"poison-1").await;
    publish_raw(port, "in.ex.e2", no_colon, b"poison-2").await;
    env.publish("in.ex.e1", "same-entity", &[], "b").await;
    env.publish("in.ex.e2", "other-entity", &[], "c").await;
    env.publish("in.ex.e3", "third-entity", &[], "d").await;

    env.wait_completed(
        "ex",
        &["same-entity", "other-entity", "third-entity"],
        Duration::from_secs(60),
    )
    .await;
    let letters = wait_for(Duration::from_secs(30), "both dead letters", || async {
        let letters = env.messages(DEAD).await;
        (letters.len() >= 2).then_some(letters)
    })
    .await;
    for (payload, block) in [(&b"poison-1"[..], not_utf8), (&b"poison-2"[..], no_colon)] {
        let letter = letters
            .iter()
            .find(|l| &l.payload[..] == payload)
            .unwrap_or_else(|| panic!("a letter for {payload:?}: {letters:?}"));
        let reason = letter
            .headers
            .get(headers::REASON)
            .map(|v| v.to_string())
            .unwrap_or_default();
        assert!(reason.contains("invalid header block"), "{reason}");
        let raw = letter
            .headers
            .get(headers::RAW_HEADERS)
            .map(|v| v.to_string())
            .unwrap_or_default();
        assert!(!raw.is_empty(), "the raw block is kept for {block:?}");
    }
    env.wait_drained(Duration::from_secs(30)).await;
    assert_eq!(env.messages(DEAD).await.len(), 2, "one letter each");
    assert_eq!(env.outputs().await.len(), 4, "every readable message ran");
    assert_eq!(connection_ids(monitor, name), connections, "no reconnect");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_header_block_on_an_exclusive_route_is_dead_lettered() {
    unreadable_on_an_exclusive_route("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparsable_header_block_on_a_coalescing_route_is_dead_lettered() {
    unreadable_on_an_exclusive_route("coalesce = true").await;
}

/// Route `name` of `uppercase` on `subject`, keyed by the subject's last token.
fn rename_route(name: &str, subject: &str) -> String {
    format!(
        r#"
[[routes]]
name = "{name}"
subject = "{subject}"
component = "{{guest:uppercase}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.*.*.done"]
"#
    )
}

/// Runs `dedup-host ARGS --config PATH` off the runtime's threads: (exit code, all output).
async fn cli(config: &std::path::Path, args: &[&str]) -> (i32, String) {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = dedup_host_tests::guests::cli(&config, &args);
        (run.code, format!("{}{}", run.stdout, run.stderr))
    })
    .await
    .unwrap()
}

/// `setup --rename-route old new` refuses, changing nothing, when the new route also
/// changes its subject (the new consumer starts where the old one stopped, on another
/// subject), and while a key of `old` is unsettled (it may have published outputs under ids
/// of `old` that a run under `new` would publish again); once the key settled, it renames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_refuses_a_subject_change_and_unsettled_keys() {
    use dedup_host::claim::key;
    use dedup_host_tests::harness::{BUCKET, CONSUMER, SOURCE};

    let env = TestEnv::start().await;
    let timing = Timing::default();
    let host = env
        .host(&timing, &rename_route("old", "in.ren.*"), "h1")
        .await;
    env.publish("in.ren.a", "a", &[], "x").await;
    env.wait_completed("old", &["a"], Duration::from_secs(30))
        .await;
    host.shutdown().await.unwrap();
    // Key `z` was left in progress by a host that died mid-run.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    let mut unsettled = env.claim("old", "a").await.unwrap();
    unsettled.state = ClaimState::InProgress;
    unsettled.outputs.clear();
    kv.put(key::encode("old", "z"), unsettled.to_bytes())
        .await
        .unwrap();

    let source = env.js.get_stream(SOURCE).await.unwrap();
    let (old, new) = (format!("{CONSUMER}-old"), format!("{CONSUMER}-new"));
    let unchanged = || async {
        assert!(source.consumer_info(&old).await.is_ok(), "`{old}` kept");
        assert!(source.consumer_info(&new).await.is_err(), "no `{new}`");
        assert!(env.claim("new", "a").await.is_none(), "no claim copied");
    };
    let path = env.path("renamed.toml");
    let write = |subject: &str| {
        let text = env.config_text(&timing, &rename_route("new", subject));
        std::fs::write(&path, text).unwrap();
    };
    let rename = ["setup", "--rename-route", "old", "new"];

    write("in.moved.*");
    let (code, out) = cli(&path, &rename).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("route `new` consumes `in.moved.*`")
            && out.contains("rename with `subject = \"in.ren.*\"`"),
        "names both subjects and the fix: {out}"
    );
    unchanged().await;

    write("in.ren.*");
    let (code, out) = cli(&path, &rename).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("1 unsettled claim key(s)")
            && out.contains(&key::encode("old", "z"))
            && out.contains("until they settle"),
        "names the key and the fix: {out}"
    );
    unchanged().await;

    // Settled (as a host serving `old` would have left it): the rename goes ahead.
    let mut settled = env.claim("old", "a").await.unwrap();
    settled.state = ClaimState::Completed;
    kv.put(key::encode("old", "z"), settled.to_bytes())
        .await
        .unwrap();
    let (code, out) = cli(&path, &rename).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 claim record(s) carried over"), "{out}");
}
