//! Per-invocation limits: a misbehaving guest ends in a trap outcome naming the limit, and the
//! same handler keeps working afterwards.

use std::sync::OnceLock;
use std::time::Duration;

use dedup_host::bindings::Event;
use dedup_host::limits::Limits;
use dedup_host::runtime::{EngineSettings, Handler, InvokeOptions, Outcome, Runtime, TrapKind};
use dedup_host_tests::guests::guest;

fn hostile() -> Handler {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| Runtime::new(&EngineSettings::default()).expect("runtime"));
    rt.load_file(&guest("hostile")).expect("load hostile")
}

fn event(payload: &str) -> Event {
    Event {
        subject: "h.x".into(),
        payload: payload.as_bytes().to_vec(),
        headers: Vec::new(),
        key: "k".into(),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: 1,
        route: "hostile".into(),
    }
}

fn tight() -> InvokeOptions {
    InvokeOptions {
        limits: Limits {
            deadline: Duration::from_millis(200),
            memory_bytes: 16 << 20,
            max_outputs: 100,
            max_output_bytes: 1 << 20,
            max_log_lines: 50,
            // The CPU deadline is what these cases test: a wall-clock limit far above it, so
            // that a machine busy with other work never trips the wall clock first.
            wall: Some(Duration::from_secs(120)),
            ..Limits::default()
        },
        ..InvokeOptions::default()
    }
}

async fn trap(handler: &Handler, payload: &str) -> (TrapKind, String) {
    let inv = handler.invoke(event(payload), &tight()).await;
    match inv.outcome {
        Outcome::Trap(t) => (t.kind, t.message),
        other => panic!("`{payload}` should trap, got {other:?}"),
    }
}

#[tokio::test]
async fn each_limit_traps_with_its_kind_and_the_handler_keeps_working() {
    let h = hostile();
    let cases = [
        ("loop", TrapKind::Timeout, "deadline of 200ms"),
        ("alloc", TrapKind::Memory, "over the limit of 16777216"),
        ("recurse", TrapKind::StackOverflow, ""),
        ("big-output", TrapKind::Memory, ""),
        (
            "many-outputs",
            TrapKind::OutputLimit,
            "over the limit of 100",
        ),
        ("log-flood", TrapKind::LogLimit, "budget of 50 lines"),
        ("panic", TrapKind::Guest, "guest panicked on purpose"),
    ];
    for (payload, kind, text) in cases {
        let (got, message) = trap(&h, payload).await;
        assert_eq!(got, kind, "`{payload}`: {message}");
        assert!(message.contains(text), "`{payload}`: {message}");
        let ok = h.invoke(event("still fine"), &tight()).await;
        assert!(
            matches!(ok.outcome, Outcome::Success(_)),
            "after `{payload}`: {:?}",
            ok.outcome
        );
    }
}

#[tokio::test]
async fn output_bytes_are_limited() {
    let h = hostile();
    let mut opts = tight();
    opts.limits.memory_bytes = 200 << 20;
    // Writing 64 MiB takes longer than `tight`'s 200 ms on a machine busy with other work;
    // this test is about the output limit, not the deadline.
    opts.limits.deadline = Duration::from_secs(30);
    let inv = h.invoke(event("big-output"), &opts).await;
    let Outcome::Trap(t) = inv.outcome else {
        panic!("{:?}", inv.outcome)
    };
    assert_eq!(t.kind, TrapKind::OutputLimit, "{}", t.message);
    assert!(t.message.contains("output bytes"), "{}", t.message);
}

#[tokio::test]
async fn guests_see_no_environment_arguments_or_files() {
    let h = hostile();
    let inv = h.invoke(event("env"), &tight()).await;
    let Outcome::Success(out) = inv.outcome else {
        panic!("{:?}", inv.outcome)
    };
    assert_eq!(String::from_utf8_lossy(&out[0].payload), "env=[] args=[]");
    let inv = h.invoke(event("file"), &tight()).await;
    match inv.outcome {
        Outcome::Reject { reason } => assert!(reason.starts_with("file:"), "{reason}"),
        other => panic!("reading /etc/passwd must fail: {other:?}"),
    }
}

/// Eight guests that each compute until 400 ms of wall time have passed, taking turns on one
/// long-running lane: each gets an eighth of the lane, about 50 ms of CPU, well inside a 200 ms
/// deadline. A deadline in wall time (the old rule) ends every one of them; in CPU time
/// (DESIGN.md rule 21) a machine too busy to run them at once only makes them slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_machine_stretches_a_guest_without_ending_it() {
    let rt = Runtime::new(&EngineSettings {
        long_running_lanes: 1,
        ..EngineSettings::default()
    })
    .expect("runtime");
    let h = rt.load_file(&guest("hostile")).expect("load hostile");
    let mut opts = tight();
    opts.limits.wall = Some(Duration::from_secs(60));
    let runs = (0..8).map(|_| h.invoke(event("spin-sleep:400:0"), &opts));
    for (i, inv) in futures::future::join_all(runs)
        .await
        .into_iter()
        .enumerate()
    {
        assert!(
            matches!(inv.outcome, Outcome::Success(_)),
            "guest {i} ended after {:?}: {:?}",
            inv.elapsed,
            inv.outcome
        );
    }
}

/// A guest that sleeps uses no CPU: its wall-clock limit ends it, even while it is parked in
/// the host's sleep, and the reason says what it used.
#[tokio::test]
async fn a_sleeping_guest_is_ended_at_its_wall_limit() {
    let h = hostile();
    let mut opts = tight();
    opts.limits.wall = Some(Duration::from_millis(400));
    let inv = h.invoke(event("sleep:20000"), &opts).await;
    let Outcome::Trap(t) = inv.outcome else {
        panic!("{:?}", inv.outcome)
    };
    assert_eq!(t.kind, TrapKind::Timeout, "{}", t.message);
    assert!(
        t.message
            .contains("wall-clock limit of 400ms (limits.wall) having used"),
        "{}",
        t.message
    );
    assert!(inv.elapsed < Duration::from_secs(20), "{:?}", inv.elapsed);
}
