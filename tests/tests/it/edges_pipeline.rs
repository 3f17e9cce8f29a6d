//! Guarantees at the seams of the pipeline (issue 42): a consumer re-bound after a reload
//! keeps the route's one-at-a-time settings, a deleted contract is never re-recorded by a
//! host, outputs are sized as the server counts them, coalescing never skips a message
//! whose newer sibling will not run, and a duplicate window below the outage backoff is
//! refused at start.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use dedup_host::components::status;
use dedup_host::config::Config;
use dedup_host::contract;
use dedup_host::serve::RunningHost;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, CONSUMER, SOURCE};

/// A route on `in.<name>.*` running `uppercase`; `extra` adds settings.
fn route(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nsubject = \"in.{name}.*\"\ncomponent = \"{{guest:uppercase}}\"\nallowed_outputs = [\"in.{name}.*.done\"]\n{extra}\n"
    )
}

/// The config of an in-process host with `routes`.
fn config(env: &TestEnv, routes: &str, instance_id: &str) -> Config {
    let mut config = env.config(&Timing::default(), routes);
    config.host.instance_id = Some(instance_id.into());
    config
}

/// The durable consumer of route `name` on the source stream, as the server has it.
async fn route_consumer(env: &TestEnv, name: &str) -> Option<pull::Config> {
    let source = env.js.get_stream(SOURCE).await.ok()?;
    let info = source
        .consumer_info(format!("{CONSUMER}-{name}"))
        .await
        .ok()?;
    Some(pull::Config {
        durable_name: info.config.durable_name.clone(),
        ack_wait: info.config.ack_wait,
        max_ack_pending: info.config.max_ack_pending,
        ..Default::default()
    })
}

/// Deletes route `name`'s consumer and waits for its host to re-create it; returns its
/// (max ack pending, ack wait) as re-created.
async fn delete_and_rebound(env: &TestEnv, name: &str) -> (i64, Duration) {
    let source = env.js.get_stream(SOURCE).await.unwrap();
    source
        .delete_consumer(&format!("{CONSUMER}-{name}"))
        .await
        .unwrap();
    let back = wait_for(
        Duration::from_secs(60),
        "the deleted consumer re-created by its host",
        || route_consumer(env, name),
    )
    .await;
    (back.max_ack_pending, back.ack_wait)
}

const EXCLUSIVE: &str = "exclusive_by = { subject_token = 2 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_made_exclusive_by_a_reload_stays_one_at_a_time_through_a_rebind() {
    let env = TestEnv::start().await;
    let host = env
        .host(&Timing::default(), &route("plain", ""), "reloading")
        .await;
    let after = [route("plain", ""), route("ex", EXCLUSIVE)].concat();
    let report = host.reload(Ok(config(&env, &after, "reloading"))).await;
    assert!(report.applied && report.problems.is_empty(), "{report:?}");
    let bound = wait_for(
        Duration::from_secs(30),
        "the added route's consumer",
        || route_consumer(&env, "ex"),
    )
    .await;
    assert_eq!(bound.max_ack_pending, dedup_host::exclusive::COPY_WINDOW);
    // A deleted consumer (an operator, a re-created stream) is re-created by the loop.
    let (pending, ack_wait) = delete_and_rebound(&env, "ex").await;
    assert_eq!(
        (pending, ack_wait),
        (
            dedup_host::exclusive::COPY_WINDOW,
            dedup_host::exclusive::ORDER_ACK_WAIT
        ),
        "a re-bound exclusive route still feeds its copier"
    );
    // It still serves, in order: a message of the route runs.
    env.publish("in.ex.a", "ex-1", &[], "hello").await;
    env.wait_completed("ex", &["ex-1"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_no_longer_exclusive_after_a_reload_is_not_rebound_one_at_a_time() {
    let env = TestEnv::start().await;
    // The route's contract says not exclusive (a first host recorded it) ...
    let first = env
        .host(&Timing::default(), &route("ex", ""), "first")
        .await;
    first.shutdown().await.unwrap();
    // ... so a host started with it exclusive refuses it, until a reload agrees.
    let host = env
        .host(&Timing::default(), &route("ex", EXCLUSIVE), "reloading")
        .await;
    let report = host
        .reload(Ok(config(&env, &route("ex", ""), "reloading")))
        .await;
    assert!(report.applied && report.problems.is_empty(), "{report:?}");
    let ack_wait = config(&env, &route("r", ""), "x").source.ack_wait;
    let (pending, wait) = delete_and_rebound(&env, "ex").await;
    assert_eq!(
        (pending, wait),
        (1000, ack_wait),
        "the route is served as it is now, not as the host started"
    );
    env.publish("in.ex.a", "ex-1", &[], "hello").await;
    env.wait_completed("ex", &["ex-1"], Duration::from_secs(60))
        .await;
    host.shutdown().await.unwrap();
}

/// Config text whose output stream keeps message ids for 4 minutes: longer than the gap
/// between two runs without the outage backoff (under 3 minutes at the test timing), shorter
/// than with it.
fn four_minute_window(env: &TestEnv) -> String {
    let text = env.config_text(&Timing::default(), &route("w", ""));
    let short = text.replace("duplicate_window = \"10m\"", "duplicate_window = \"4m\"");
    assert_ne!(short, text, "the harness config changed shape");
    short
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_window_below_the_outage_backoff_is_refused_with_stream_window_minimum_and_fix() {
    let env = TestEnv::start().await;
    let config = env.config(&Timing::default(), &route("w", ""));
    let gap = config.longest_rerun_gap();
    assert!(
        gap > dedup_host::config::OUTAGE_BACKOFF_MAX,
        "the gap counts the outage backoff: {gap:?}"
    );
    // In the config: refused when parsed.
    let err = Config::parse(
        &four_minute_window(&env),
        std::path::Path::new("t.toml"),
        env.dir.path().to_path_buf(),
    )
    .unwrap_err()
    .to_string();
    for part in [
        "output_streams[0].duplicate_window",
        "output stream `OUTPUTS`",
        "240s",
        &format!("{gap:?}"),
        "outage backoff",
        "raise its duplicate_window",
    ] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
    // On the server: an output stream an operator created with that window is refused at
    // start, whatever the config says.
    env.js
        .create_stream(async_nats::jetstream::stream::Config {
            name: dedup_host_tests::harness::OUTPUTS.into(),
            subjects: vec![
                "in.*.*.done".into(),
                "ledger.entries.>".into(),
                "out.>".into(),
            ],
            duplicate_window: Duration::from_secs(240),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = dedup_host::serve::start(config)
        .await
        .err()
        .expect("refused at start")
        .to_string();
    for part in [
        "stream `OUTPUTS`",
        "240s",
        &format!("{gap:?}"),
        "outage backoff",
        "setup --apply",
    ] {
        assert!(err.contains(part), "`{part}` missing from: {err}");
    }
}

/// A host on route `r` of a config whose output stream accepts fenced batches and keeps
/// message ids for 10 minutes, so the route can run with either effects.
async fn either_effects_host(env: &TestEnv, effects: &str, instance: &str) -> RunningHost {
    let text = env
        .config_text(&Timing::default(), &route("r", effects))
        .replace(
            "duplicate_window = \"10m\"",
            "duplicate_window = \"10m\"\neffects = \"fenced\"",
        );
    let mut config = Config::parse(
        &text,
        std::path::Path::new("t.toml"),
        env.dir.path().to_path_buf(),
    )
    .expect("valid config");
    config.host.instance_id = Some(instance.into());
    dedup_host::serve::start(config).await.expect("host starts")
}

/// Per host: why it does not serve route `r` (`None`: it serves it).
async fn refusals(env: &TestEnv) -> BTreeMap<String, Option<String>> {
    let config = env.config(&Timing::default(), &route("r", ""));
    let store = status::open(&env.js, &config).await.expect("status bucket");
    status::read_all(&store)
        .await
        .expect("statuses")
        .into_iter()
        .filter_map(|h| Some((h.instance_id, h.routes.get("r")?.contract_refused.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_contract_is_not_re_recorded_by_a_refused_host_and_the_fenced_hosts_keep_serving()
{
    let env = TestEnv::start().await;
    let fenced = "effects = \"fenced\"";
    let f1 = either_effects_host(&env, fenced, "fenced-1").await;
    let f2 = either_effects_host(&env, fenced, "fenced-2").await;
    let window = either_effects_host(&env, "", "window").await;
    let before = wait_for(Duration::from_secs(30), "three hosts reporting", || async {
        let r = refusals(&env).await;
        (r.len() == 3 && r["window"].is_some()).then_some(r)
    })
    .await;
    assert_eq!((&before["fenced-1"], &before["fenced-2"]), (&None, &None));
    let refused = before["window"].clone().unwrap();
    assert!(
        refused.contains("--change-route r") && !refused.contains("delete"),
        "{refused}"
    );

    // The operator deletes the record (what an older refusal text told them to do).
    let config = env.config(&Timing::default(), &route("r", ""));
    let store = env
        .js
        .get_key_value(contract::bucket_name(&config))
        .await
        .unwrap();
    store.delete("r").await.unwrap();
    // The refused host saw the deletion and stays refused, pointed at the set-up command.
    let after = wait_for(
        Duration::from_secs(30),
        "the refused host reporting the deleted contract",
        || async {
            let r = refusals(&env).await;
            r["window"]
                .as_ref()
                .is_some_and(|why| why.contains("was deleted"))
                .then_some(r)
        },
    )
    .await;
    let why = after["window"].clone().unwrap();
    assert!(
        why.contains("dedup-host setup --config <this config> --change-route r"),
        "{why}"
    );
    // The fenced hosts keep serving, fenced.
    env.publish("in.r.a", "after-delete", &[], "hello").await;
    wait_for(
        Duration::from_secs(60),
        "the message completed under the fenced contract",
        || async {
            let (record, _) = env.fenced_claim("r", "after-delete").await?;
            (record.state == dedup_host::claim::ClaimState::Completed).then_some(())
        },
    )
    .await;
    assert!(
        env.claim("r", "after-delete").await.is_none(),
        "no claim in the window bucket"
    );
    assert!(
        matches!(
            contract::lookup(&store, "r").await.unwrap(),
            contract::Lookup::Deleted(_)
        ),
        "no host recorded the contract again"
    );
    let statuses = refusals(&env).await;
    assert_eq!(
        (&statuses["fenced-1"], &statuses["fenced-2"]),
        (&None, &None)
    );
    assert_eq!(window.stats().processed, 0, "the refused host ran nothing");
    for host in [f1, f2, window] {
        host.shutdown().await.unwrap();
    }
}

/// A coalescing exclusive route on `in.co.*` (entity: the subject's last token).
fn coalescing(extra: &str) -> String {
    route("co", &format!("{EXCLUSIVE}\ncoalesce = true\n{extra}"))
}

/// Queues a message of route `co` as the host's source loop would (its copy in the
/// exclusive queue, with the original's headers), without a host running.
async fn queue_directly(
    env: &TestEnv,
    config: &Config,
    subject: &str,
    msg_id: &str,
    payload: &str,
    sequence: u64,
) {
    let mut original = async_nats::HeaderMap::new();
    original.insert("Nats-Msg-Id", msg_id);
    let headers = dedup_host::exclusive::queued_headers(Some(&original), "co", subject, sequence);
    let entity = subject.rsplit('.').next().unwrap();
    let work =
        dedup_host::exclusive::work_subject(config, "co", config.routes[0].partitions(), entity);
    env.js
        .publish_with_headers(work, headers, payload.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_not_coalesced_for_a_newer_one_whose_key_already_completed() {
    let env = TestEnv::start().await;
    let routes = coalescing("");
    let config = config(&env, &routes, "first");
    // Key `k-b` completes (an earlier message; the newer one below is its resend after the
    // source's duplicate window).
    let first = env.host(&Timing::default(), &routes, "first").await;
    env.publish("in.co.other", "k-b", &[], "earlier").await;
    env.wait_completed("co", &["k-b"], Duration::from_secs(60))
        .await;
    first.shutdown().await.unwrap();
    // A, then B of the same entity, both waiting in the queue when the next host starts:
    // A runs with B newer and waiting, but B's key is done, so B will not run.
    queue_directly(&env, &config, "in.co.e1", "k-a", "alpha", 1001).await;
    queue_directly(&env, &config, "in.co.e1", "k-b", "beta", 1002).await;
    let host = env.host(&Timing::default(), &routes, "second").await;
    env.wait_completed("co", &["k-a"], Duration::from_secs(60))
        .await;
    let a = env.claim("co", "k-a").await.unwrap();
    assert!(
        !a.is_coalesced(),
        "A was skipped for B, which will not run: {a:?}"
    );
    wait_for(Duration::from_secs(60), "A's output", || async {
        env.outputs()
            .await
            .iter()
            .any(|m| m.subject.as_str() == "in.co.e1.done" && m.payload.as_ref() == b"ALPHA")
            .then_some(())
    })
    .await;
    // B was a duplicate: its earlier output is the only one of `k-b`.
    env.wait_drained(Duration::from_secs(30)).await;
    let outputs: Vec<_> = env
        .outputs()
        .await
        .iter()
        .map(|m| m.payload.clone())
        .collect();
    assert_eq!(outputs, ["EARLIER", "ALPHA"]);
    host.shutdown().await.unwrap();
}

/// A producer's trace context, with a long `tracestate` (the host carries both to outputs).
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Bytes nats-server counts for a publish with `headers` and a payload of `payload` bytes:
/// `NATS/1.0\r\n`, each `name: value\r\n`, the final `\r\n`, the payload.
fn counted(headers: &[(&str, &str)], payload: usize) -> usize {
    let lines: usize = headers.iter().map(|(n, v)| n.len() + 2 + v.len() + 2).sum();
    10 + lines + 2 + payload
}

/// The payload size that makes output 0 of key `key` of route `big` exactly `target` bytes
/// as the server counts it (`uppercase` republishes the payload, no headers of its own).
fn payload_for(target: usize, key: &str, tracestate: &str, fenced: bool) -> usize {
    let id = format!("big.k.{key}#0");
    let batch_id = "0".repeat(32);
    let mut headers = vec![("traceparent", TRACEPARENT), ("tracestate", tracestate)];
    match fenced {
        // A commit of its own: batch sequence 1.
        true => headers.extend([
            ("Dedup-Output-Id", id.as_str()),
            ("Nats-Batch-Id", batch_id.as_str()),
            ("Nats-Batch-Sequence", "1"),
        ]),
        false => headers.push(("Nats-Msg-Id", id.as_str())),
    }
    target - counted(&headers, 0)
}

/// Outputs at the server's max_payload: one that fits to the byte is stored, one a byte
/// over is dead-lettered as the handler's fault (never published: the server would close
/// the connection), and the host keeps serving.
async fn outputs_are_sized_as_the_server_counts_them(fenced: bool) {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = fenced;
    let effects = if fenced { "effects = \"fenced\"" } else { "" };
    let host = env
        .host(&Timing::default(), &route("big", effects), "sizing")
        .await;
    let max = env.js.client().server_info().max_payload;
    let tracestate = format!("vendor={}", "x".repeat(3000));
    let trace = [
        ("traceparent", TRACEPARENT),
        ("tracestate", tracestate.as_str()),
    ];
    // Fenced outputs are checked with the batch sequence at its longest (4 digits): a
    // commit of its own fits 3 bytes under the maximum.
    let fits = payload_for(
        max - if fenced { 3 } else { 0 },
        "fits",
        &tracestate,
        fenced,
    );
    let over = payload_for(max + 1, "over", &tracestate, fenced);
    env.publish("in.big.a", "fits", &trace, "a".repeat(fits))
        .await;
    env.wait_completed("big", &["fits"], Duration::from_secs(60))
        .await;
    let stored = env.outputs().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(
        stored[0].payload.len(),
        fits,
        "the output that fits was stored"
    );

    env.publish("in.big.b", "over", &trace, "a".repeat(over))
        .await;
    let record = wait_for(
        Duration::from_secs(60),
        "the oversized output dead-lettered",
        || async {
            let r = env.claim("big", "over").await?;
            (r.state == dedup_host::claim::ClaimState::Failed && r.permanent).then_some(r)
        },
    )
    .await;
    let reason = record.reason.unwrap_or_default();
    // Fenced: counted with the batch sequence at its longest, 3 bytes more.
    let counted = max + 1 + if fenced { 3 } else { 0 };
    for part in [
        format!("{counted} bytes as published"),
        format!("max_payload of {max} bytes"),
    ] {
        assert!(reason.contains(&part), "`{part}` missing from: {reason}");
    }
    assert_eq!(env.messages(dedup_host_tests::harness::DEAD).await.len(), 1);
    // The connection stayed up: the next message runs.
    env.publish("in.big.c", "after", &[], "small").await;
    env.wait_completed("big", &["after"], Duration::from_secs(60))
        .await;
    assert_eq!(env.outputs().await.len(), 2, "nothing of the oversized one");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_outputs_are_sized_as_the_server_counts_them_with_a_long_inherited_trace_state() {
    outputs_are_sized_as_the_server_counts_them(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_outputs_are_sized_as_the_server_counts_them_with_a_long_inherited_trace_state() {
    outputs_are_sized_as_the_server_counts_them(true).await;
}
