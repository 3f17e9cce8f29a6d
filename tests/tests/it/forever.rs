//! Forever deduplication: a source stream and an output stream that keep one message per
//! subject and refuse a repeat however late, with the duplicate window set to 1 s to show
//! that the window plays no part.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::guests::host_binary;
use dedup_host_tests::harness::{TestEnv, Timing, BUCKET, OUTPUTS};

const ROUTE: &str = r#"
[[routes]]
name = "orders"
subject = "in.orders.*"
component = "{guest:uppercase}"
key = { subject_token = 2 }
allowed_outputs = ["in.orders.*.done"]
"#;

fn parse(env: &TestEnv, text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new("test.toml"), env.dir.path().to_path_buf())
        .map_err(|e| e.to_string())
}

/// `dedup-host publish`: its exit code and what it printed.
fn publish(env: &TestEnv, subject: &str, msg_id: &str) -> (i32, String) {
    let out = Command::new(host_binary())
        .args([
            "publish",
            "--subject",
            subject,
            "--msg-id",
            msg_id,
            "--payload",
            "hi",
        ])
        .env("DEDUP_HOST_NATS_URL", env.server().url())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forever_source_refuses_a_repeat_after_its_window_and_runs_it_once() {
    let env = TestEnv::start().await;
    let text = env.config_text(&Timing::default(), ROUTE).replace(
        "[source]\n",
        "[source]\ndedup = \"forever\"\nduplicate_window = \"1s\"\n",
    );
    let host = dedup_host::serve::start(parse(&env, &text).unwrap())
        .await
        .unwrap();

    let (code, out) = publish(&env, "in.orders.o-1", "first");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("stored as sequence 1 of stream `EVENTS`"),
        "{out}"
    );
    let (code, out) = publish(&env, "in.orders.o-1", "first");
    assert_eq!(code, 3, "{out}");
    assert!(out.starts_with("duplicate (window)"), "{out}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Past the window, and under a new message id: a producer's retry much later.
    let (code, out) = publish(&env, "in.orders.o-1", "retry-much-later");
    assert_eq!(code, 4, "{out}");
    assert!(
        out.starts_with("duplicate (forever: subject already holds a message): stream `EVENTS` keeps `in.orders.o-1` as sequence 1"),
        "{out}"
    );

    env.wait_completed("orders", &["o-1"], Duration::from_secs(10))
        .await;
    let outputs = env.messages(OUTPUTS).await;
    assert_eq!(outputs.len(), 1, "processed once");
    assert_eq!(outputs[0].subject.as_str(), "in.orders.o-1.done");
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.processed, stats.errors), (1, 0));

    // Every route's key must come from the subject.
    let header_keyed = text.replace("key = { subject_token = 2 }", "");
    let err = parse(&env, &header_keyed).unwrap_err();
    assert!(
        err.contains("routes[0].key") && err.contains("orders.created.<order-id>"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forever_output_stream_refuses_a_late_re_run_and_counts_it_as_a_duplicate() {
    let env = TestEnv::start().await;
    let text = env.config_text(&Timing::default(), ROUTE).replace(
        "duplicate_window = \"10m\"\n",
        "duplicate_window = \"1s\"\ndedup = \"forever\"\n",
    );
    let host = dedup_host::serve::start(parse(&env, &text).unwrap())
        .await
        .unwrap();
    env.publish("in.orders.o-7", "m1", &[], "ledger entry")
        .await;
    env.wait_completed("orders", &["o-7"], Duration::from_secs(10))
        .await;

    // The completed record is gone (the bucket's max age, say) and the window has passed:
    // a second delivery of the event runs the key again.
    let kv = env.js.get_key_value(BUCKET).await.unwrap();
    kv.purge(dedup_host::claim::key::encode("orders", "o-7"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.publish("in.orders.o-7", "m2", &[], "ledger entry")
        .await;
    dedup_host_tests::harness::wait_for(
        Duration::from_secs(10),
        "the re-run completed",
        || async {
            let r = env.claim("orders", "o-7").await?;
            (r.state == dedup_host::claim::ClaimState::Completed).then_some(r)
        },
    )
    .await;
    let record = env.claim("orders", "o-7").await.unwrap();
    assert_eq!(record.outputs.len(), 1);
    assert!(record.outputs[0].duplicate, "{:?}", record.outputs);
    assert_eq!(
        (
            record.outputs[0].stream.as_str(),
            record.outputs[0].sequence
        ),
        (OUTPUTS, 1)
    );
    assert_eq!(
        env.messages(OUTPUTS).await.len(),
        1,
        "the downstream sees it once"
    );
    let metrics = host.metrics().encode();
    assert!(
        metrics.contains(r#"dedup_hits_total{route="orders",layer="output"} 1"#),
        "{metrics}"
    );
    let stats = host.shutdown().await.unwrap();
    assert_eq!((stats.processed, stats.errors), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_stream_that_is_not_forever_is_refused_at_start() {
    let env = TestEnv::start().await;
    env.create_stream(OUTPUTS, &["in.*.*.done", "ledger.entries.>", "out.>"])
        .await;
    let text = env.config_text(&Timing::default(), ROUTE).replace(
        "duplicate_window = \"10m\"\n",
        "duplicate_window = \"1s\"\ndedup = \"forever\"\n",
    );
    let err = dedup_host::serve::start(parse(&env, &text).unwrap())
        .await
        .err()
        .expect("refused");
    let err = format!("{err:#}");
    assert!(
        err.contains(
            "stream `OUTPUTS` (`output_streams[0]`) exists but keeps -1 message(s) per subject"
        ),
        "{err}"
    );
}
