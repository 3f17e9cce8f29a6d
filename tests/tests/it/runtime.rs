//! The component runtime: each example guest through a real engine, outcomes and load errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use dedup_host::bindings::{Event, Header};
use dedup_host::runtime::{
    EngineSettings, Handler, InvokeOptions, LoadError, Outcome, Runtime, TrapKind,
};
use dedup_host_tests::guests::guest;

/// One engine for the whole test binary: each guest is compiled once.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| Runtime::new(&EngineSettings::default()).expect("runtime"))
}

fn load(name: &str) -> Handler {
    runtime()
        .load_file(&guest(name))
        .unwrap_or_else(|e| panic!("load {name}: {e}"))
}

fn event(subject: &str, payload: &[u8], attempt: u32) -> Event {
    Event {
        subject: subject.into(),
        payload: payload.to_vec(),
        headers: vec![Header {
            name: "Nats-Msg-Id".into(),
            value: "m-1".into(),
        }],
        key: "k-1".into(),
        attempt,
        fencing_token: 7,
        stream_sequence: 42,
        route: "test".into(),
    }
}

fn options(config: &[(&str, &str)]) -> InvokeOptions {
    let config: BTreeMap<String, String> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    InvokeOptions {
        config: Arc::new(config),
        ..InvokeOptions::default()
    }
}

#[tokio::test]
async fn uppercase_returns_one_upper_cased_output() {
    let handler = load("uppercase");
    let inv = handler
        .invoke(event("orders.new", b"hello, world", 1), &options(&[]))
        .await;
    let Outcome::Success(outputs) = inv.outcome else {
        panic!("expected success: {:?}", inv.outcome)
    };
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].subject, "orders.new.done");
    assert_eq!(outputs[0].payload, b"HELLO, WORLD");
    assert!(inv
        .logs
        .iter()
        .any(|l| l.level == "debug" && l.message.contains("upper-casing")));
    assert!(handler.digest().starts_with("sha256:"));
}

#[tokio::test]
async fn ledger_accepts_a_valid_adjustment() {
    let handler = load("ledger");
    let body = br#"{"account":"acc-1","amount":-250,"transaction_id":"tx-9"}"#;
    let inv = handler
        .invoke(event("ledger.adjust", body, 1), &options(&[]))
        .await;
    let Outcome::Success(outputs) = inv.outcome else {
        panic!("expected success: {:?}", inv.outcome)
    };
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].subject, "ledger.entries.acc-1.tx-9");
    let entry: serde_json::Value = serde_json::from_slice(&outputs[0].payload).unwrap();
    assert_eq!(entry["amount"], -250);
    assert_eq!(entry["transaction_id"], "tx-9");
    assert_eq!(entry["idempotency_key"], "k-1");
    assert_eq!(entry["fencing_token"], 7);
}

#[tokio::test]
async fn ledger_rejects_malformed_input_with_a_reason() {
    let handler = load("ledger");
    for body in [
        &b"not json"[..],
        br#"{"account":"a","amount":"x","transaction_id":"t"}"#,
        br#"{"account":"a b","amount":5,"transaction_id":"t"}"#,
    ] {
        let inv = handler
            .invoke(event("ledger.adjust", body, 1), &options(&[]))
            .await;
        match inv.outcome {
            Outcome::Reject { reason } => {
                assert!(reason.contains("malformed adjustment"), "{reason}")
            }
            other => panic!(
                "expected reject for {:?}, got {other:?}",
                String::from_utf8_lossy(body)
            ),
        }
    }
}

#[tokio::test]
async fn flaky_retries_below_the_configured_attempt_then_succeeds() {
    let handler = load("flaky");
    let opts = options(&[("succeed_on_attempt", "3")]);
    for attempt in 1..3 {
        let inv = handler.invoke(event("jobs.x", b"", attempt), &opts).await;
        match inv.outcome {
            Outcome::Retry { reason, delay } => {
                assert!(
                    reason.contains(&format!("attempt {attempt} of 3")),
                    "{reason}"
                );
                assert_eq!(delay, None);
            }
            other => panic!("attempt {attempt}: expected retry, got {other:?}"),
        }
    }
    let inv = handler.invoke(event("jobs.x", b"", 3), &opts).await;
    let Outcome::Success(outputs) = inv.outcome else {
        panic!("expected success: {:?}", inv.outcome)
    };
    assert_eq!(outputs[0].payload, b"succeeded on attempt 3");

    let bad = handler
        .invoke(
            event("jobs.x", b"", 1),
            &options(&[("succeed_on_attempt", "soon")]),
        )
        .await;
    assert!(
        matches!(bad.outcome, Outcome::Reject { .. }),
        "{:?}",
        bad.outcome
    );
}

#[tokio::test]
async fn a_panicking_guest_traps_and_the_next_invocation_works() {
    let handler = load("hostile");
    let inv = handler.invoke(event("x", b"panic", 1), &options(&[])).await;
    let Outcome::Trap(trap) = inv.outcome else {
        panic!("expected trap: {:?}", inv.outcome)
    };
    assert_eq!(trap.kind, TrapKind::Guest);
    assert!(
        trap.message.contains("guest panicked on purpose"),
        "{}",
        trap.message
    );

    let inv = handler.invoke(event("x", b"fine", 1), &options(&[])).await;
    let Outcome::Success(outputs) = inv.outcome else {
        panic!("expected success: {:?}", inv.outcome)
    };
    assert_eq!(outputs[0].payload, b"fine");
}

/// Freed pool slots keep the pages an instance wrote and reset them in place (or give them
/// back, with `keep_resident_bytes = 0`): either way the next instance in the slot must see
/// none of it, whether the pages are in the memory image (a static) or zero-initialised.
#[tokio::test]
async fn no_state_survives_from_one_invocation_to_the_next() {
    for keep in [0, 16 << 20, 64 << 20] {
        let runtime = Runtime::new(&EngineSettings {
            keep_resident_bytes: keep,
            ..EngineSettings::default()
        })
        .expect("runtime");
        let handler = runtime.load_file(&guest("hostile")).expect("hostile loads");
        for i in 0..50 {
            let inv = handler
                .invoke(event("x", b"remember", 1), &options(&[]))
                .await;
            let Outcome::Success(outputs) = inv.outcome else {
                panic!("expected success: {:?}", inv.outcome)
            };
            let seen = String::from_utf8_lossy(&outputs[0].payload).to_string();
            assert_eq!(seen, "counter=0 dirty=0", "keep {keep}, invocation {i}");
        }
    }
}

fn load_err(file: &str, bytes: &[u8]) -> (LoadError, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    std::fs::write(&path, bytes).unwrap();
    let err = runtime().load_file(&path).expect_err("load must fail");
    let shown = err.to_string();
    assert!(
        shown.contains(&path.display().to_string()),
        "error must name the file: {shown}"
    );
    (err, shown)
}

#[test]
fn a_non_wasm_file_is_refused() {
    let (err, shown) = load_err("notes.wasm", b"hello, I am text");
    assert!(matches!(err, LoadError::NotWasm { .. }), "{shown}");
}

#[test]
fn a_core_module_is_refused() {
    // The smallest valid core module: magic plus version 1.
    let (err, shown) = load_err("core.wasm", b"\0asm\x01\0\0\0");
    assert!(matches!(err, LoadError::CoreModule { .. }), "{shown}");
    assert!(shown.contains("not a component"), "{shown}");
}

#[test]
fn a_component_without_the_handler_export_is_refused() {
    let (err, shown) = load_err("empty.wat", b"(component)");
    assert!(matches!(err, LoadError::MissingExport { .. }), "{shown}");
    assert!(shown.contains("dedup:handler/handler@0.1.0"), "{shown}");
}

#[test]
fn a_component_with_an_unknown_import_is_refused() {
    let wat = br#"(component (import "acme:net/raw-socket@1.0.0" (instance)))"#;
    let (err, shown) = load_err("sneaky.wat", wat);
    assert!(shown.contains("does not provide"), "{shown}");
    match err {
        LoadError::UnknownImport { import, .. } => assert_eq!(import, "acme:net/raw-socket@1.0.0"),
        other => panic!("expected UnknownImport, got {other:?}"),
    }
}

#[test]
fn a_missing_file_is_a_read_error() {
    let err = runtime()
        .load_file(Path::new("/nonexistent/x.wasm"))
        .expect_err("must fail");
    assert!(matches!(err, LoadError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/x.wasm"));
}
