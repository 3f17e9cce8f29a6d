//! The hostile-guest suite, through the real pipeline: each misbehaviour gets its outcome and
//! reason (in the dead letter and the claim record), the host survives, and a well-behaved
//! route on the same host keeps processing.

use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use dedup_host::claim::ClaimState;
use dedup_host::pipeline::effects::headers;
use dedup_host_tests::harness::{wait_for, TestEnv, Timing, DEAD, OUTPUTS};

/// `hostile` retries traps (two attempts); `strict` fails them at once; `metered` has a fuel
/// budget; `reader` may read one directory; `upper` is the well-behaved neighbour. The looping
/// cases share the host's one long-running lane, so each gets a fraction of it: their wall
/// limit is raised for the loops to reach their CPU deadline.
pub(crate) const ROUTES: &str = r#"
[[routes]]
name = "hostile"
subject = "in.hostile.*"
component = "{guest:hostile}"
allowed_outputs = ["in.hostile.*.done"]
limits = { deadline = "300ms", wall = "20s", memory_bytes = 100_000_000, max_outputs = 10, max_output_bytes = 1_000_000, max_log_lines = 100 }

[[routes]]
name = "strict"
subject = "in.strict.*"
component = "{guest:hostile}"
allowed_outputs = ["in.strict.*.done"]
limits = { deadline = "300ms", wall = "20s" }
permanent_traps = ["timeout"]

[[routes]]
name = "metered"
subject = "in.metered.*"
component = "{guest:hostile}"
allowed_outputs = ["in.metered.*.done"]
limits = { fuel = 1_000_000 }

[[routes]]
name = "reader"
subject = "in.reader.*"
component = "{guest:hostile}"
allowed_outputs = ["in.reader.*.done"]
read_only_dir = "granted"

[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
"#;

/// The suite's timing: two attempts, short backoff.
pub(crate) fn timing() -> Timing {
    Timing {
        backoff: r#"["200ms"]"#,
        max_deliver: 2,
        ..Timing::default()
    }
}

/// One misbehaviour: the payload that triggers it on a route, and what must come of it.
struct Case {
    route: &'static str,
    payload: &'static str,
    /// Attempts made before giving up.
    attempts: u32,
    /// Text the failure reason must contain.
    reason: &'static str,
}

const CASES: &[Case] = &[
    Case {
        route: "hostile",
        payload: "loop",
        attempts: 2,
        reason: "timeout: ran past its deadline of 300ms",
    },
    Case {
        route: "hostile",
        payload: "alloc",
        attempts: 2,
        reason: "memory limit: linear memory would grow to",
    },
    Case {
        route: "hostile",
        payload: "recurse",
        attempts: 2,
        reason: "stack overflow",
    },
    Case {
        route: "hostile",
        payload: "big-output",
        attempts: 2,
        reason: "output limit: returned 67108",
    },
    Case {
        route: "hostile",
        payload: "many-outputs",
        attempts: 2,
        reason: "output limit: returned 100000 outputs",
    },
    Case {
        route: "hostile",
        payload: "forbidden",
        attempts: 1,
        reason: "forbidden output: output 0: subject `forbidden.subject`",
    },
    Case {
        route: "hostile",
        payload: "file",
        attempts: 1,
        reason: "file: ",
    },
    Case {
        route: "hostile",
        payload: "socket",
        attempts: 1,
        reason: "access-denied",
    },
    Case {
        route: "hostile",
        payload: "log-flood",
        attempts: 2,
        reason: "log limit: guest logged past its budget of 100 lines",
    },
    Case {
        route: "hostile",
        payload: "trap-midway",
        attempts: 2,
        reason: "guest trap: wasm trap: wasm `unreachable`",
    },
    Case {
        route: "hostile",
        payload: "panic",
        attempts: 2,
        reason: "guest panicked on purpose",
    },
    Case {
        route: "strict",
        payload: "loop",
        attempts: 1,
        reason: "timeout: ran past its deadline of 300ms",
    },
    Case {
        route: "metered",
        payload: "loop",
        attempts: 2,
        reason: "fuel exhausted",
    },
    Case {
        route: "reader",
        payload: "read:/etc/hostname",
        attempts: 1,
        reason: "read: ",
    },
];

fn header(m: &StreamMessage, name: &str) -> String {
    m.headers
        .get(name)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_guest_gets_its_outcome_and_the_neighbour_keeps_processing() {
    let env = TestEnv::start().await;
    prepare(&env);
    let host = env.host(&timing(), ROUTES, "h").await;
    run_suite(&env, host).await;
}

/// The directory the `reader` route may read, with one file in it.
pub(crate) fn prepare(env: &TestEnv) {
    std::fs::create_dir(env.path("granted")).unwrap();
    std::fs::write(env.path("granted/hello.txt"), "hello from the operator").unwrap();
}

/// Publishes every case and the neighbour's messages to `host` (serving [`ROUTES`] with
/// [`timing`]) and checks each outcome, the neighbour's outputs and the host's counts.
pub(crate) async fn run_suite(env: &TestEnv, host: dedup_host::serve::RunningHost) {
    for (i, case) in CASES.iter().enumerate() {
        let subject = format!("in.{}.c{i}", case.route);
        env.publish(&subject, &format!("case-{i}"), &[], case.payload)
            .await;
        // The neighbour's messages are interleaved with the hostile ones.
        env.publish("in.upper.x", &format!("upper-{i}"), &[], format!("n{i}"))
            .await;
    }
    env.publish("in.hostile.env", "env", &[], "env").await;
    env.publish("in.reader.ok", "granted", &[], "read:/data/hello.txt")
        .await;
    let expected_outputs = CASES.len() + 2;

    let dead = wait_for(
        Duration::from_secs(60),
        "a dead letter per case",
        || async {
            let m = env.messages(DEAD).await;
            (m.len() >= CASES.len()).then_some(m)
        },
    )
    .await;
    for (i, case) in CASES.iter().enumerate() {
        let key = format!("case-{i}");
        let letter = dead
            .iter()
            .find(|m| header(m, headers::KEY) == key)
            .unwrap_or_else(|| panic!("no dead letter for {} `{}`", case.route, case.payload));
        let reason = header(letter, headers::REASON);
        assert!(
            reason.contains(case.reason),
            "{} `{}`: reason `{reason}` lacks `{}`",
            case.route,
            case.payload,
            case.reason
        );
        assert_eq!(&letter.payload[..], case.payload.as_bytes(), "the original");
        let record = env.claim(case.route, &key).await.unwrap();
        assert_eq!(
            (record.state, record.permanent, record.attempt),
            (ClaimState::Failed, true, case.attempts),
            "{} `{}`: {record:?}",
            case.route,
            case.payload
        );
        assert!(record.reason.as_deref().unwrap_or("").contains(case.reason));
    }

    let outputs = wait_for(Duration::from_secs(30), "the good outputs", || async {
        let m = env.messages(OUTPUTS).await;
        (m.len() >= expected_outputs).then_some(m)
    })
    .await;
    env.wait_drained(Duration::from_secs(20)).await;
    let payload_of = |subject: &str| {
        outputs
            .iter()
            .find(|m| &*m.subject == subject)
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
    };
    let upper = outputs
        .iter()
        .filter(|m| m.subject.starts_with("in.upper."))
        .count();
    assert_eq!(upper, CASES.len(), "every neighbour message processed");
    assert_eq!(
        payload_of("in.hostile.env.done").as_deref(),
        Some("env=[] args=[]"),
        "no environment, no arguments"
    );
    assert_eq!(
        payload_of("in.reader.ok.done").as_deref(),
        Some("hello from the operator"),
        "the granted directory is readable"
    );
    assert!(
        outputs.iter().all(|m| &m.payload[..] != b"partial"),
        "nothing a trapped guest produced is published"
    );
    assert_eq!(outputs.len(), expected_outputs);
    let stats = host.shutdown().await.unwrap();
    assert_eq!(stats.dead_lettered, CASES.len() as u64);
}
