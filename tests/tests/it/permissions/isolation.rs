//! Two deployments on one server and one source stream (issue 47), each with the host and
//! operator sets `dedup-host permissions` prints for it: B's host user is refused A's route
//! consumer, A's inbox, A's buckets and A's route contracts, B's `reload` does not reach A's
//! hosts, and both deployments run, each within its own set.
//!
//! The two cannot share a route name: the route contracts of a stream are one bucket, and a
//! second consumer of a route name on the stream would share its claim keys, which `setup`
//! refuses (`edges_deployments`). So B's route has its own name beside A's `upper`.

use std::path::Path;
use std::time::Duration;

use async_nats::Client;
use dedup_host::config::Config;
use dedup_host_tests::guests::cli;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, BUCKET, CONSUMER, UPPER_ROUTE};

use super::{connect_as, pulls, violations, Deployment};

const B_ROUTE: &str = r#"
[[routes]]
name = "lower"
subject = "in.lower.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.lower.*.done"]
"#;

/// Deployment `a` (the harness's names) or `b` (names of its own for everything but the
/// source stream, the output stream and the contracts of the stream), as `user`.
fn deployment(text: &str, which: &str, user: &str) -> String {
    let mut text = text.replace(
        "[nats]\n",
        &format!(
            "[deployment]\nname = \"{which}\"\n\n[nats]\nuser = \"{user}\"\npassword = \"pw\"\ninbox_prefix = \"_INBOX_{which}\"\n"
        ),
    );
    if which == "b" {
        text = text
            .replace(&format!("consumer = \"{CONSUMER}\""), "consumer = \"b\"")
            .replace(&format!("bucket = \"{BUCKET}\""), "bucket = \"claims-b\"")
            .replace("subject = \"dead.letters\"", "subject = \"dead.b\"")
            .replace("stream = \"DEAD\"", "stream = \"DEAD_B\"");
        text.push_str("\n[components]\nbucket = \"components-b\"\nstatus_bucket = \"hosts-b\"\n");
    }
    text
}

const USERS: [(&str, &str, &str); 4] = [
    ("a", "host", "host-a"),
    ("a", "operator", "op-a"),
    ("b", "host", "host-b"),
    ("b", "operator", "op-b"),
];

/// The server config: each deployment's users restricted to the sets printed for it.
fn server_conf(a: &str, b: &str) -> String {
    let mut conf = String::from("log_file: \"{dir}/nats.log\"\n");
    let mut users = String::from("    { user: \"admin\", password: \"pw\" }\n");
    for (which, role, user) in USERS {
        let text = if which == "a" { a } else { b };
        let file = Deployment::new(&deployment(text, which, "any"));
        let printed = cli(&file.file, &["permissions", "--role", role]);
        assert_eq!(printed.code, 0, "{printed:?}");
        let var = format!("DEDUP_{}_PERMISSIONS", role.to_uppercase());
        let mine = format!("{}_{var}", which.to_uppercase());
        conf.push_str(&printed.stdout.replace(&var, &mine));
        users.push_str(&format!(
            "    {{ user: \"{user}\", password: \"pw\", permissions: ${mine} }}\n"
        ));
    }
    conf.push_str(&format!("authorization {{\n  users = [\n{users}  ]\n}}\n"));
    conf
}

/// Waits for the server's log to say it refused a `what` (`Publish`, `Subscription`) to
/// `subject`.
async fn refused(env: &TestEnv, what: &str, subject: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("the refusal of {what} `{subject}` logged"),
        || async {
            let (kind, subject) = (format!("{what} Violation"), format!("\"{subject}\""));
            violations(env)
                .iter()
                .any(|l| l.contains(&kind) && l.contains(&subject))
                .then_some(())
        },
    )
    .await;
}

/// `client` publishes to `subject` (a request to the JetStream API or a KV write).
async fn publish(client: &Client, subject: &str) {
    client
        .publish(subject.to_string(), "x".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_on_one_stream_stay_apart_within_their_printed_sets() {
    let timing = Timing::default();
    let scratch = TestEnv::start().await;
    let (a, b) = (
        scratch.config_text(&timing, UPPER_ROUTE),
        scratch.config_text(&timing, B_ROUTE),
    );
    let conf = server_conf(&a, &b);
    drop(scratch);
    let env = TestEnv::start_with_conf(&conf, "admin", "pw").await;
    let (a, b) = (
        env.config_text(&timing, UPPER_ROUTE),
        env.config_text(&timing, B_ROUTE),
    );
    for (which, text, user) in [("a", &a, "op-a"), ("b", &b, "op-b")] {
        let path = env.path(&format!("{user}.toml"));
        std::fs::write(&path, deployment(text, which, user)).unwrap();
        let setup = cli(&path, &["setup"]);
        assert_eq!(setup.code, 0, "setup of deployment {which}: {setup:?}");
    }
    let mut hosts = Vec::new();
    for (which, text, user) in [("a", &a, "host-a"), ("b", &b, "host-b")] {
        let text = deployment(text, which, user);
        let mut config = Config::parse(&text, Path::new("host.toml"), env.dir.path().into())
            .expect("the host's config");
        config.host.instance_id = Some(format!("host-{which}"));
        let host = dedup_host::serve::start(config)
            .await
            .unwrap_or_else(|e| panic!("host {which} starts: {e:#}"));
        hosts.push(host);
    }
    env.publish("in.upper.k1", "u1", &[], "hello").await;
    env.publish("in.lower.k1", "l1", &[], "hello").await;
    wait_for(
        Duration::from_secs(60),
        "both deployments' outputs",
        || async {
            let outputs: Vec<String> = env
                .outputs()
                .await
                .iter()
                .map(|m| m.subject.to_string())
                .collect();
            let both = ["in.upper.k1.done", "in.lower.k1.done"];
            both.iter()
                .all(|s| outputs.iter().any(|o| o == s))
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        violations(&env),
        Vec::<String>::new(),
        "both ran within their sets"
    );

    // B's host user against A's consumer, inbox and buckets.
    let host_b = connect_as(&env, "host-b", "_INBOX_b").await;
    assert!(!pulls(&env, &host_b, "EVENTS", "hosts-upper").await);
    let _spy = host_b.subscribe("_INBOX_a.>").await.unwrap();
    host_b.flush().await.unwrap();
    refused(&env, "Subscription", "_INBOX_a.>").await;
    // The contracts bucket is the stream's, shared: B's host reads and follows only its own
    // route's record, neither by a direct get nor by a consumer of its own making.
    let contracts = "dedup-contracts-EVENTS";
    for subject in [
        format!("$KV.{BUCKET}.u1"),
        "$JS.API.DIRECT.GET.KV_claims".to_string(),
        "$KV.dedup-hosts-EVENTS.host-a".to_string(),
        "$JS.API.CONSUMER.CREATE.EVENTS.hosts-upper".to_string(),
        format!("$JS.API.DIRECT.GET.KV_{contracts}.$KV.{contracts}.upper"),
        format!("$JS.API.DIRECT.GET.KV_{contracts}"),
        format!("$JS.API.CONSUMER.CREATE.KV_{contracts}"),
        format!("$JS.API.CONSUMER.CREATE.KV_{contracts}.spy.$KV.{contracts}.upper"),
    ] {
        publish(&host_b, &subject).await;
        refused(&env, "Publish", &subject).await;
    }
    let b_reaches_a = b_reload_reaches_a(&env, &hosts, &a, &b).await;
    assert!(
        !b_reaches_a,
        "B's `dedup-host reload` reached the subject A's hosts follow"
    );
    for host in hosts {
        host.shutdown().await.unwrap();
    }
}

/// Runs `dedup-host reload` as B's operator (B's host answers it), then has A's operator
/// publish a marker on A's reload subject: whether the first thing A's hosts' subscription
/// (A's host user, A's subject) receives is B's request rather than the marker. B's request
/// was flushed before the marker was sent, so it would have come first.
async fn b_reload_reaches_a(
    env: &TestEnv,
    hosts: &[dedup_host::serve::RunningHost],
    a: &str,
    b: &str,
) -> bool {
    use futures::StreamExt as _;
    let parse = |text: &str| {
        Config::parse(text, Path::new("host.toml"), env.dir.path().into()).expect("config")
    };
    let (config_a, config_b) = (
        parse(&deployment(a, "a", "host-a")),
        parse(&deployment(b, "b", "host-b")),
    );
    let host_a = connect_as(env, "host-a", "_INBOX_a").await;
    let mut a_follows = host_a.subscribe(config_a.reload_subject()).await.unwrap();
    host_a.flush().await.unwrap();
    let op_b = env.path("op-b.toml");
    let reload = tokio::task::spawn_blocking(move || cli(&op_b, &["reload", "--json"]));
    let request = tokio::time::timeout(Duration::from_secs(60), hosts[1].reload_requested())
        .await
        .expect("B's host got B's reload")
        .expect("B's host follows reloads");
    let report = hosts[1].reload(Ok(config_b)).await;
    hosts[1].answer(request, &report).await;
    let reload = reload.await.unwrap();
    assert_eq!(reload.code, 0, "B's reload: {reload:?}");
    assert!(reload.stdout.contains("host-b"), "{reload:?}");
    let op_a = connect_as(env, "op-a", "_INBOX_a").await;
    op_a.publish(config_a.reload_subject(), "marker".into())
        .await
        .unwrap();
    op_a.flush().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(60), a_follows.next())
        .await
        .expect("the marker arrives")
        .expect("subscribed");
    &first.payload[..] != b"marker"
}
