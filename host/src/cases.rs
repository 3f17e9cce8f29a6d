//! A handler's test cases (`cases.toml`), run through the runtime by `dedup-host test`: each
//! case is an event and the outcome it must have.
//!
//! ```toml
//! component = "handler.wasm"          # relative to this file; --component overrides it
//!
//! [[case]]
//! name = "uppercases the payload"
//! subject = "orders.created.42"
//! payload = "hello"                   # or payload_file = "event.json"
//! headers = { Content-Type = "text/plain" }
//! key = "order-42"                    # default: the case name
//! attempt = 1
//! config = { greeting = "hi" }
//! expect.outputs = [{ subject = "orders.created.42.done", payload = "HELLO" }]
//!
//! [[case]]
//! name = "rejects malformed input"
//! subject = "orders.created.43"
//! payload = "{"
//! expect.reject = "malformed"         # a substring of the reason; "" accepts any
//! ```
//!
//! An expected output matches on its subject and one of: `payload` (exact), `contains` (a
//! substring) or `json` (a JSON subset: every field given must be there with that value).
//! Other expectations: `retry = true`, `trap = "<kind>"` (as the host names it, e.g.
//! `timeout`, `memory limit`). Beside any of them, `expect.logs` lists log lines the guest must
//! write: `{ level = "info", message = "greeting", fields = { key = "order-42" } }`, where
//! `message` is a substring, `level` is optional and `fields` a subset.
//!
//! A handler's outbound HTTP calls are answered from canned responses, never the network:
//! `[[cases.http]]` for every case, `[[case.http]]` for one ([`canned`]). A call none
//! answers fails its case, naming the call and the entry to add.

pub mod canned;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::bindings::{Event, Header, Output};
use crate::runtime::{Handler, InvokeOptions, LogLine, Outcome};
use canned::{Answers, CannedResponse};

/// A case file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseFile {
    /// The component to test, relative to the file.
    pub component: Option<PathBuf>,
    /// The cases, in order.
    #[serde(rename = "case", default)]
    pub cases: Vec<Case>,
    /// What every case shares (`[cases]`).
    #[serde(rename = "cases", default)]
    pub shared: Shared,
}

/// What every case of a file shares.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// Canned answers to outbound HTTP calls, in every case (`[[cases.http]]`).
    #[serde(default)]
    pub http: Vec<CannedResponse>,
}

/// One event and its expected outcome.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// What the case checks, shown in reports.
    pub name: String,
    /// The event's subject.
    pub subject: String,
    /// The payload as text.
    pub payload: Option<String>,
    /// A file holding the payload, relative to the case file.
    pub payload_file: Option<PathBuf>,
    /// The event's headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The idempotency key the guest sees (default: the case name).
    pub key: Option<String>,
    /// The attempt number (default 1).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// Route configuration values (merged over the route's, when a config is given).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Canned answers to outbound HTTP calls in this case, tried before the file's
    /// (`[[case.http]]`).
    #[serde(default)]
    pub http: Vec<CannedResponse>,
    /// What must happen.
    pub expect: Expect,
}

fn first_attempt() -> u32 {
    1
}

/// The expected outcome: exactly one of its fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Success with these outputs, in order.
    pub outputs: Option<Vec<ExpectedOutput>>,
    /// A rejection whose reason contains this text.
    pub reject: Option<String>,
    /// A retry request.
    pub retry: Option<bool>,
    /// A trap of this kind.
    pub trap: Option<String>,
    /// Log lines the guest must write (besides the outcome), in any order.
    #[serde(default)]
    pub logs: Vec<ExpectedLog>,
}

/// One expected log line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedLog {
    /// Its level (`trace` .. `error`); any when absent.
    pub level: Option<String>,
    /// A substring of its message.
    pub message: String,
    /// Fields it must carry, with these values (others may be there too).
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// One expected output.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedOutput {
    /// Its subject, exactly.
    pub subject: String,
    /// Its payload, exactly.
    pub payload: Option<String>,
    /// A substring of its payload.
    pub contains: Option<String>,
    /// A JSON subset its payload must contain.
    pub json: Option<toml::Value>,
}

/// Why a case file cannot be run.
#[derive(Debug, Error)]
pub enum CaseError {
    /// Unreadable or malformed file.
    #[error("cases `{path}`: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line for TOML errors.
        message: String,
    },
    /// A case is not well formed.
    #[error("cases `{path}`, case `{case}`: {message}")]
    Case {
        /// The file.
        path: PathBuf,
        /// The case's name.
        case: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// `None` when it passed; otherwise expected versus actual.
    pub failure: Option<String>,
    /// How long the invocation took.
    pub elapsed: Duration,
}

impl CaseFile {
    /// Reads and checks a case file.
    pub fn load(path: &Path) -> Result<Self, CaseError> {
        let file_error = |message: String| CaseError::File {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let file: CaseFile = toml::from_str(&text).map_err(|e| file_error(e.to_string()))?;
        if file.cases.is_empty() {
            return Err(file_error("no `[[case]]`: add at least one".into()));
        }
        let shared = file.shared.http.iter().filter_map(CannedResponse::problem);
        if let Some(problem) = shared.into_iter().next() {
            return Err(file_error(format!("[[cases.http]]: {problem}")));
        }
        for c in &file.cases {
            if let Some(problem) = c.http.iter().find_map(CannedResponse::problem) {
                return Err(CaseError::Case {
                    path: path.to_path_buf(),
                    case: c.name.clone(),
                    message: problem,
                });
            }
            let e = &c.expect;
            let kinds = [
                e.outputs.is_some(),
                e.reject.is_some(),
                e.retry.is_some(),
                e.trap.is_some(),
            ];
            let message = match kinds.iter().filter(|k| **k).count() {
                1 if c.payload.is_some() && c.payload_file.is_some() => {
                    "give `payload` or `payload_file`, not both"
                }
                1 => continue,
                0 => "no expectation: set one of expect.outputs, expect.reject, expect.retry, expect.trap",
                _ => "more than one expectation: keep one of expect.outputs, expect.reject, expect.retry, expect.trap",
            };
            return Err(CaseError::Case {
                path: path.to_path_buf(),
                case: c.name.clone(),
                message: message.into(),
            });
        }
        Ok(file)
    }
}

/// Runs every case through `handler` with `options` (the route's limits and configuration,
/// or the defaults); each case's `config` is merged over the options' configuration, and its
/// outbound calls are answered from its canned responses, then `shared`'s.
pub async fn run(
    handler: &Handler,
    options: &InvokeOptions,
    cases: &[Case],
    shared: &Shared,
    base: &Path,
) -> Result<Vec<CaseResult>, CaseError> {
    let mut results = Vec::with_capacity(cases.len());
    for case in cases {
        let payload = match (&case.payload, &case.payload_file) {
            (_, Some(file)) => std::fs::read(base.join(file)).map_err(|e| CaseError::Case {
                path: base.to_path_buf(),
                case: case.name.clone(),
                message: format!("payload_file `{}`: {e}", file.display()),
            })?,
            (Some(text), None) => text.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        let event = Event {
            subject: case.subject.clone(),
            payload,
            headers: case
                .headers
                .iter()
                .map(|(name, value)| Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            key: case.key.clone().unwrap_or_else(|| case.name.clone()),
            attempt: case.attempt,
            fencing_token: 1,
            stream_sequence: 1,
            route: "test".into(),
        };
        let mut config = (*options.config).clone();
        config.extend(case.config.clone());
        let answers = Answers::new(&case.http, &shared.http);
        let options = InvokeOptions {
            config: Arc::new(config),
            http: Some(answers.grant(options.http.clone())),
            ..options.clone()
        };
        let invocation = handler.invoke(event, &options).await;
        results.push(CaseResult {
            name: case.name.clone(),
            failure: answers
                .failure()
                .or_else(|| judge(&case.expect, &invocation.outcome))
                .or_else(|| missing_log(&case.expect.logs, &invocation.logs)),
            elapsed: invocation.elapsed,
        });
    }
    Ok(results)
}

/// `None` when `outcome` is what `expect` says; otherwise expected versus actual.
fn judge(expect: &Expect, outcome: &Outcome) -> Option<String> {
    let actual = describe(outcome);
    let fail = |expected: String| Some(format!("expected {expected}\n  actual   {actual}"));
    if let Some(outputs) = &expect.outputs {
        let Outcome::Success(got) = outcome else {
            return fail(format!("success with {} output(s)", outputs.len()));
        };
        if got.len() != outputs.len() {
            return fail(format!("{} output(s)", outputs.len()));
        }
        for (i, (want, got)) in outputs.iter().zip(got).enumerate() {
            if let Some(problem) = output_problem(want, got) {
                return fail(format!("output {i}: {problem}"));
            }
        }
        return None;
    }
    if let Some(reason) = &expect.reject {
        return match outcome {
            Outcome::Reject { reason: r } if r.contains(reason.as_str()) => None,
            _ => fail(format!("reject with a reason containing {reason:?}")),
        };
    }
    if expect.retry.is_some() {
        return match outcome {
            Outcome::Retry { .. } => None,
            _ => fail("retry".into()),
        };
    }
    if let Some(kind) = &expect.trap {
        return match outcome {
            Outcome::Trap(t) if t.kind.as_str() == kind => None,
            _ => fail(format!("trap {kind:?}")),
        };
    }
    None
}

/// The first expected log line the guest did not write, with the lines it did.
fn missing_log(expected: &[ExpectedLog], got: &[LogLine]) -> Option<String> {
    let matches = |want: &ExpectedLog, line: &LogLine| {
        want.level.as_deref().is_none_or(|l| l == line.level)
            && line.message.contains(want.message.as_str())
            && want
                .fields
                .iter()
                .all(|(k, v)| line.fields.iter().any(|(gk, gv)| gk == k && gv == v))
    };
    let want = expected
        .iter()
        .find(|want| !got.iter().any(|line| matches(want, line)))?;
    let lines: Vec<String> = got
        .iter()
        .map(|l| format!("{} {:?} {:?}", l.level, l.message, l.fields))
        .collect();
    Some(format!(
        "expected a log line {} {:?} with fields {:?}\n  actual   {}",
        want.level.as_deref().unwrap_or("(any level)"),
        want.message,
        want.fields,
        if lines.is_empty() {
            "no log lines".to_string()
        } else {
            lines.join("; ")
        }
    ))
}

fn output_problem(want: &ExpectedOutput, got: &Output) -> Option<String> {
    let text = String::from_utf8_lossy(&got.payload);
    if want.subject != got.subject {
        return Some(format!("subject {:?}", want.subject));
    }
    if let Some(p) = &want.payload {
        if *p != text {
            return Some(format!("payload {p:?}"));
        }
    }
    if let Some(c) = &want.contains {
        if !text.contains(c.as_str()) {
            return Some(format!("payload containing {c:?}"));
        }
    }
    if let Some(subset) = &want.json {
        let subset = serde_json::to_value(subset).expect("TOML values are JSON");
        let value: Option<serde_json::Value> = serde_json::from_slice(&got.payload).ok();
        if !value.as_ref().is_some_and(|v| contains_json(v, &subset)) {
            return Some(format!("JSON payload containing {subset}"));
        }
    }
    None
}

/// Whether `value` holds every field of `subset` with the same value (recursively).
fn contains_json(value: &serde_json::Value, subset: &serde_json::Value) -> bool {
    match (value, subset) {
        (serde_json::Value::Object(v), serde_json::Value::Object(s)) => s
            .iter()
            .all(|(k, sv)| v.get(k).is_some_and(|vv| contains_json(vv, sv))),
        _ => value == subset,
    }
}

/// One line saying what the guest did.
fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Success(outputs) => {
            let list: Vec<String> = outputs
                .iter()
                .map(|o| format!("{} {:?}", o.subject, String::from_utf8_lossy(&o.payload)))
                .collect();
            format!(
                "success with {} output(s) [{}]",
                outputs.len(),
                list.join(", ")
            )
        }
        Outcome::Retry { reason, .. } => format!("retry: {reason}"),
        Outcome::Reject { reason } => format!("reject: {reason}"),
        Outcome::Trap(t) => format!("trap {:?}: {}", t.kind.as_str(), t.message),
    }
}

/// The results as a JUnit XML report (one test suite named `suite`).
pub fn junit(suite: &str, results: &[CaseResult]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut s = TestSuite::new(suite);
    for r in results {
        let status = match &r.failure {
            None => TestCaseStatus::success(),
            Some(message) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_message(message.clone());
                status
            }
        };
        let mut case = TestCase::new(r.name.clone(), status);
        case.set_time(r.elapsed);
        s.add_test_case(case);
    }
    let mut report = Report::new("dedup-host test");
    report.add_test_suite(s);
    report.to_string().expect("JUnit report serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_subset_matches_nested_fields_and_nothing_else() {
        let v = serde_json::json!({"a": 1, "b": {"c": "x", "d": 2}});
        assert!(contains_json(&v, &serde_json::json!({"b": {"c": "x"}})));
        assert!(!contains_json(&v, &serde_json::json!({"b": {"c": "y"}})));
        assert!(!contains_json(&v, &serde_json::json!({"e": 1})));
    }

    #[test]
    fn a_wrong_expectation_shows_expected_and_actual() {
        let expect = Expect {
            reject: Some("malformed".into()),
            ..Expect::default()
        };
        let failure = judge(&expect, &Outcome::Success(Vec::new())).unwrap();
        assert_eq!(
            failure,
            "expected reject with a reason containing \"malformed\"\n  actual   success with 0 output(s) []"
        );
    }
}
