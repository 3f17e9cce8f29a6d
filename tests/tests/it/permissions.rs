//! Least-privilege NATS permissions (issue 47): every role works within exactly the set
//! `dedup-host permissions` prints for it, against a nats-server whose users are restricted
//! to those sets; the server's log then holds no violation. With one permission missing, the
//! host names the refused subject and the fix instead of timing out unexplained.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod console_grants;
mod console_writes;
mod contract_follow;
mod ephemeral;
mod isolation;

use dedup_host::claim::ClaimState;
use dedup_host::config::Config;
use dedup_host_tests::console::{request, ConsoleProcess};
use dedup_host_tests::guests::{cli, host_binary};
use dedup_host_tests::harness::{
    stop_gracefully, wait_for, TestEnv, Timing, DEAD, OUTPUTS, UPPER_ROUTE,
};

/// Window routes of every kind: claim before (`upper`), claim after, exclusive, and one whose
/// handler rejects (`fixme`, the hostile guest: `sleep-reject:<ms>`) for dead letters.
const ROUTES: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]

[[routes]]
name = "after"
subject = "in.after.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.after.*.done"]
claim = "after"
limits = { deadline = "1s" }

[[routes]]
name = "excl"
subject = "in.excl.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.excl.*.done"]
exclusive_by = { subject_token = 2 }

[[routes]]
name = "fixme"
subject = "in.fixme.*"
component = "{guest:hostile}"
allowed_outputs = ["in.fixme.*.done"]
limits = { deadline = "1s" }
"#;

/// A fenced route (its outputs and completion one atomic batch on the fenced output stream).
const FENCED_ROUTE: &str = r#"
[[routes]]
name = "fan"
subject = "in.fan.*"
component = "{guest:flaky}"
key = { subject_token = 2 }
allowed_outputs = ["in.fan.*.done"]
effects = "fenced"
config = { succeed_on_attempt = "1", outputs = "2", work_ms = "10" }
"#;

const ROLES: [(&str, &str); 3] = [("host", "host"), ("operator", "op"), ("console", "con")];

/// The deployment's config text as `user` (password `pw`), with the deployment's own inbox
/// prefix (its users subscribe to their own replies only).
fn as_user(text: &str, user: &str) -> String {
    text.replace(
        "[nats]\n",
        &format!(
            "[nats]\nuser = \"{user}\"\npassword = \"pw\"\ninbox_prefix = \"_INBOX_orders\"\n"
        ),
    )
}

/// A server config with one user per role, restricted to what `dedup-host permissions`
/// prints for it (the host's set without `missing`), an unrestricted `admin` for the test's
/// own reads, and a log file in the server's directory.
fn server_conf(deployment: &Path, missing: Option<&str>) -> String {
    server_conf_without(deployment, "host", missing)
}

/// [`server_conf`], with `missing` taken out of the set of role `without`.
fn server_conf_without(deployment: &Path, without: &str, missing: Option<&str>) -> String {
    let mut conf = String::from("log_file: \"{dir}/nats.log\"\n");
    for (role, _) in ROLES {
        let printed = cli(deployment, &["permissions", "--role", role]);
        assert_eq!(printed.code, 0, "{printed:?}");
        let mut text = printed.stdout;
        if let (Some(subject), true) = (missing, role == without) {
            let line = format!("      \"{subject}\"\n");
            assert!(
                text.contains(&line),
                "`{subject}` is not in the {role}'s set: {text}"
            );
            text = text.replace(&line, "");
        }
        conf.push_str(&text);
    }
    conf.push_str("authorization {\n  users = [\n    { user: \"admin\", password: \"pw\" }\n");
    for (role, user) in ROLES {
        let var = format!("DEDUP_{}_PERMISSIONS", role.to_uppercase());
        conf.push_str(&format!(
            "    {{ user: \"{user}\", password: \"pw\", permissions: ${var} }}\n"
        ));
    }
    conf.push_str("  ]\n}\n");
    conf
}

/// The deployment: its config text (no user) written to `deployment.toml` in a scratch dir
/// for `dedup-host permissions`, which needs no server.
struct Deployment {
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl Deployment {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("deployment.toml");
        std::fs::write(&file, text).unwrap();
        Self { _dir: dir, file }
    }
}

/// Starts a server for `routes` restricted as [`server_conf`] says; returns the env (the
/// test's client is `admin`) and the config text of the deployment (URLs filled in).
async fn restricted(routes: &str, fenced: bool, missing: Option<&str>) -> (TestEnv, String) {
    restricted_timed(routes, fenced, missing, &Timing::default()).await
}

/// [`restricted`], with the config's timing.
async fn restricted_timed(
    routes: &str,
    fenced: bool,
    missing: Option<&str>,
    timing: &Timing,
) -> (TestEnv, String) {
    // The names and subjects do not depend on the server's address: derive them first.
    let mut scratch = TestEnv::start().await;
    scratch.fenced_outputs = fenced;
    let deployment = Deployment::new(&as_user(&scratch.config_text(timing, routes), "any"));
    let conf = server_conf(&deployment.file, missing);
    drop(scratch);
    let mut env = TestEnv::start_with_conf(&conf, "admin", "pw").await;
    env.fenced_outputs = fenced;
    let text = env.config_text(timing, routes);
    (env, text)
}

/// Writes the config of `user` into the env's dir.
fn config_file(env: &TestEnv, text: &str, user: &str) -> PathBuf {
    let path = env.path(&format!("{user}.toml"));
    std::fs::write(&path, as_user(text, user)).unwrap();
    path
}

/// Every violation the server logged.
fn violations(env: &TestEnv) -> Vec<String> {
    let path = env.dir.path().join("nats.log");
    let log = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the server's log {}: {e}", path.display()));
    assert!(
        !log.is_empty(),
        "the server logged nothing to {}",
        path.display()
    );
    log.lines()
        .filter(|l| l.contains("Violation"))
        .map(str::to_string)
        .collect()
}

fn setup_as_operator(env: &TestEnv, text: &str) -> PathBuf {
    let operator = config_file(env, text, "op");
    let setup = cli(&operator, &["setup"]);
    assert_eq!(setup.code, 0, "setup as the operator: {setup:?}");
    operator
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_works_within_the_permissions_printed_for_it() {
    let (env, text) = restricted(ROUTES, false, None).await;
    let operator = setup_as_operator(&env, &text);

    // The host creates nothing: everything it needs is in place.
    let host_config = config_file(&env, &text, "host");
    let host = Command::new(host_binary())
        .args(["run", "--config"])
        .arg(&host_config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    env.publish("in.upper.k1", "u1", &[], "hello").await;
    env.publish("in.after.k1", "a1", &[], "hello").await;
    env.publish("in.excl.e1", "x1", &[], "one").await;
    env.publish("in.excl.e1", "x2", &[], "two").await;
    env.publish("in.fixme.k1", "f1", &[], "sleep-reject:0")
        .await;
    let within = Duration::from_secs(60);
    env.wait_completed("upper", &["u1"], within).await;
    env.wait_completed("after", &["a1"], within).await;
    env.wait_completed("excl", &["x1", "x2"], within).await;
    let letters = |n: usize| {
        let env = &env;
        async move { (env.messages(DEAD).await.len() >= n).then_some(()) }
    };
    wait_for(within, "the dead letter of f1", || letters(1)).await;
    let outputs: Vec<String> = env
        .messages(OUTPUTS)
        .await
        .iter()
        .map(|m| m.subject.to_string())
        .collect();
    for subject in ["in.upper.k1.done", "in.after.k1.done", "in.excl.e1.done"] {
        assert!(outputs.iter().any(|s| s == subject), "{outputs:?}");
    }

    // The operator's commands.
    let inspect = cli(&operator, &["inspect", "--route", "upper", "--key", "u1"]);
    assert_eq!(inspect.code, 0, "{inspect:?}");
    assert!(inspect.stdout.contains("completed"), "{inspect:?}");
    let audit = cli(&operator, &["audit"]);
    assert_eq!(audit.code, 0, "{audit:?}");
    // The host answers on the operator's inbox prefix, with `allow_responses` only.
    let reload = cli(&operator, &["reload"]);
    assert_eq!(reload.code, 0, "{reload:?}");
    assert!(reload.stderr.contains("1 host(s) answered"), "{reload:?}");
    let replay = cli(&operator, &["dead-letters", "replay", "--all"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    // Replayed, the key runs again, is rejected again, and is dead-lettered once more.
    wait_for(within, "the replayed key's second letter", || letters(2)).await;

    // The console serves its pages from what it may read.
    let console_config = config_file(&env, &text, "con");
    let console = ConsoleProcess::start(&console_config, None);
    for page in ["/", "/letters", "/routes/upper", "/deploys", "/activity"] {
        let (status, body) = request(console.addr, "GET", page, &[], "");
        assert_eq!(status, 200, "{page}: {body}");
    }
    let (_, letters_page) = request(console.addr, "GET", "/letters", &[], "");
    assert!(letters_page.contains("fixme"), "{letters_page}");
    drop(console);

    stop_gracefully(host);
    assert_eq!(violations(&env), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_route_runs_within_the_host_permissions() {
    let (env, text) = restricted(FENCED_ROUTE, true, None).await;
    setup_as_operator(&env, &text);
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let host = dedup_host::serve::start(config).await.expect("host starts");
    env.publish("in.fan.k1", "m1", &[], "x").await;
    wait_for(Duration::from_secs(60), "k1 completed", || async {
        let record = env.fenced_claim("fan", "k1").await?.0;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    assert_eq!(env.outputs().await.len(), 2);
    host.shutdown().await.unwrap();
    assert_eq!(violations(&env), Vec::<String>::new());
}

#[tokio::test]
async fn a_host_missing_one_permission_names_the_subject_and_the_fix() {
    let missing = "$JS.API.CONSUMER.CREATE.EVENTS.hosts-upper";
    let (env, text) = restricted(UPPER_ROUTE, false, Some(missing)).await;
    setup_as_operator(&env, &text);
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let err = dedup_host::serve::start(config)
        .await
        .err()
        .expect("the host cannot bind its consumer");
    let text = format!("{err:#}");
    assert!(text.contains(&format!("`{missing}`")), "{text}");
    assert!(text.contains("dedup-host permissions"), "{text}");
}

#[tokio::test]
async fn a_host_finding_nothing_set_up_says_setup_is_the_operators() {
    let (env, text) = restricted(UPPER_ROUTE, false, None).await;
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let err = dedup_host::serve::start(config)
        .await
        .err()
        .expect("the host may not create the source stream");
    let text = format!("{err:#}");
    assert!(text.contains("`$JS.API.STREAM.CREATE.EVENTS`"), "{text}");
}

/// Connects as role user `user` of the deployment (its inbox prefix), answers within 2 s.
async fn connect_as(env: &TestEnv, user: &str, inbox_prefix: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into())
        .custom_inbox_prefix(inbox_prefix)
        .request_timeout(Some(Duration::from_secs(2)))
        .connect(env.servers.urls())
        .await
        .expect("connect")
}

/// Whether `client` may pull from durable `consumer` of `stream` (the server answers), and,
/// if not, that the server logged it refused.
async fn pulls(env: &TestEnv, client: &async_nats::Client, stream: &str, consumer: &str) -> bool {
    let subject = format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}");
    let answer = client
        .request(
            subject.clone(),
            r#"{"batch":1,"expires":1000000000}"#.into(),
        )
        .await;
    // The server answers a pull it accepts (a message, or a status when none is waiting);
    // a refused one it drops, saying so on the connection and in its log.
    if answer.is_ok() {
        return true;
    }
    wait_for(
        Duration::from_secs(30),
        &format!("the refusal of `{subject}` logged"),
        || async {
            violations(env)
                .iter()
                .any(|l| l.contains(&subject))
                .then_some(())
        },
    )
    .await;
    false
}

/// The host's set pulls only from its own durables (issue 47): a downstream service's durable
/// on an output stream, and another consumer on the source stream, are refused to the host's
/// user (the server logs each refusal).
#[tokio::test]
async fn the_host_role_is_refused_pulling_another_durable() {
    let (env, text) = restricted(UPPER_ROUTE, false, None).await;
    setup_as_operator(&env, &text);
    for (stream, subject) in [(OUTPUTS, "out.billing.1"), ("EVENTS", "in.other.1")] {
        let config = async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("billing".into()),
            ..Default::default()
        };
        let s = env.js.get_stream(stream).await.unwrap();
        s.create_consumer(config).await.unwrap();
        env.js
            .publish(subject, "x".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let host = connect_as(&env, "host", "_INBOX_orders").await;
    assert!(!pulls(&env, &host, OUTPUTS, "billing").await);
    assert!(!pulls(&env, &host, "EVENTS", "billing").await);
}

/// Window routes, claim before (`upper`) and after (`after`), whose outputs one filter covers:
/// the filter a test takes out of the host's set.
const REFUSED_FILTER: &str = "in.*.*.done";
const REFUSED_ROUTES: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.*.*.done"]

[[routes]]
name = "after"
subject = "in.after.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.*.*.done"]
claim = "after"
limits = { deadline = "1s" }
"#;

/// Gives every role its whole printed set again (the server reads its config anew), and
/// waits until the server says it did.
async fn grant_everything(env: &TestEnv, text: &str) {
    let deployment = Deployment::new(&as_user(text, "any"));
    let conf = server_conf(&deployment.file, None);
    let conf = conf.replace("{dir}", &env.dir.path().display().to_string());
    std::fs::write(env.path("nats-server.conf"), conf).unwrap();
    env.servers.nodes[0].reload();
    wait_for(Duration::from_secs(30), "the server's reload", || async {
        let log = std::fs::read_to_string(env.path("nats.log")).unwrap_or_default();
        log.contains("Reloaded server configuration").then_some(())
    })
    .await;
}

/// The letters of the dead-letter stream whose reason names `filter` as the permission to
/// grant (never the refused subject alone), by their original subjects.
async fn refused_letters(env: &TestEnv, filter: &str) -> Vec<String> {
    let mut subjects = Vec::new();
    for letter in env.messages(DEAD).await {
        let headers = &letter.headers;
        let reason = headers.get("Dedup-Reason").map(|v| v.to_string());
        let reason = reason.unwrap_or_default();
        if reason.contains("refused this host permission") {
            assert!(
                reason.contains(&format!("grant publish on `{filter}`")),
                "{reason}"
            );
            assert!(reason.contains("dead-letters replay"), "{reason}");
            let original = headers.get("Dedup-Original-Subject").map(|v| v.to_string());
            subjects.push(original.unwrap_or_default());
        }
    }
    subjects.sort();
    subjects
}

/// A host whose user may not publish one route's outputs does not retry without end: each
/// message is dead-lettered at once, its reason naming the route's `allowed_outputs` filter
/// to grant, and once granted, a replay runs it (claim before and after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_the_host_may_not_publish_is_dead_lettered_naming_the_filter_and_replays_once_granted(
) {
    let (env, text) = restricted(REFUSED_ROUTES, false, Some(REFUSED_FILTER)).await;
    let operator = setup_as_operator(&env, &text);
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let host = dedup_host::serve::start(config).await.expect("host starts");
    env.publish("in.upper.k1", "u1", &[], "hello").await;
    env.publish("in.after.k1", "a1", &[], "hello").await;
    let within = Duration::from_secs(90);
    wait_for(within, "both refused messages dead-lettered", || async {
        let letters = refused_letters(&env, REFUSED_FILTER).await;
        (letters == ["in.after.k1", "in.upper.k1"]).then_some(())
    })
    .await;
    let record = env.claim("upper", "u1").await.expect("u1's record");
    assert_eq!(record.state, ClaimState::Failed, "{record:?}");
    assert!(env.outputs().await.is_empty());

    grant_everything(&env, &text).await;
    let replay = cli(&operator, &["dead-letters", "replay", "--all"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    env.wait_completed("upper", &["u1"], within).await;
    env.wait_completed("after", &["a1"], within).await;
    let outputs: Vec<String> = env
        .outputs()
        .await
        .iter()
        .map(|m| m.subject.to_string())
        .collect();
    assert!(
        outputs.contains(&"in.upper.k1.done".to_string()),
        "{outputs:?}"
    );
    assert!(
        outputs.contains(&"in.after.k1.done".to_string()),
        "{outputs:?}"
    );
    host.shutdown().await.unwrap();
}

/// The same on a fenced route: the batch whose outputs the server refused is not sent again
/// without end; the message is dead-lettered naming the filter, and replays once granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_output_the_host_may_not_publish_is_dead_lettered_naming_the_filter() {
    let filter = "in.fan.*.done";
    let (env, text) = restricted(FENCED_ROUTE, true, Some(filter)).await;
    let operator = setup_as_operator(&env, &text);
    let config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().into(),
    )
    .unwrap();
    let host = dedup_host::serve::start(config).await.expect("host starts");
    env.publish("in.fan.k1", "m1", &[], "x").await;
    let within = Duration::from_secs(90);
    wait_for(within, "the refused message dead-lettered", || async {
        let letters = refused_letters(&env, filter).await;
        (letters == ["in.fan.k1"]).then_some(())
    })
    .await;
    grant_everything(&env, &text).await;
    let replay = cli(&operator, &["dead-letters", "replay", "--all"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    wait_for(within, "k1 completed", || async {
        let record = env.fenced_claim("fan", "k1").await?.0;
        (record.state == ClaimState::Completed).then_some(())
    })
    .await;
    assert_eq!(env.outputs().await.len(), 2);
    host.shutdown().await.unwrap();
}

/// The hostile-guest suite (sandbox.rs) with its host connected as the host role: every
/// misbehaviour gets its outcome, the neighbour keeps processing, and nothing a guest does
/// reaches a subject outside the host's set (the server logs no violation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_suite_passes_under_the_host_role() {
    let timing = crate::sandbox::timing();
    // The `reader` route's directory, by an absolute path: `permissions` reads the config from
    // a scratch folder before the server exists.
    let granted = tempfile::tempdir().unwrap();
    std::fs::write(granted.path().join("hello.txt"), "hello from the operator").unwrap();
    let routes = crate::sandbox::ROUTES.replace(
        "read_only_dir = \"granted\"",
        &format!("read_only_dir = {:?}", granted.path().display().to_string()),
    );
    assert_ne!(
        routes,
        crate::sandbox::ROUTES,
        "the reader route names its directory"
    );
    let (env, text) = restricted_timed(&routes, false, None, &timing).await;
    setup_as_operator(&env, &text);
    let mut config = Config::parse(
        &as_user(&text, "host"),
        Path::new("host.toml"),
        env.dir.path().to_path_buf(),
    )
    .expect("the host's config");
    config.host.instance_id = Some("h".into());
    let host = dedup_host::serve::start(config)
        .await
        .expect("the host starts within the host role's permissions");
    crate::sandbox::run_suite(&env, host).await;
    assert_eq!(violations(&env), Vec::<String>::new());
}
