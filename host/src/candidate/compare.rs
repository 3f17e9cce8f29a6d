//! Comparing two runs of one event: outcome, then each output's subject, headers and payload,
//! and the outbound HTTP requests each run made (method, URL, body digest).
//! Payloads that both parse as JSON are compared value by value, leaving out `ignore` paths;
//! others byte by byte. Each difference names its kind and where it is, so a difference seen
//! between two live runs (noise) can be told apart from the candidate's own.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::runtime::{Invocation, Outcome};

/// What one run did, kept to compare and to show in a sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// `success`, `reject`, `retry` or `trap:<kind>`.
    pub outcome: String,
    /// The failure reason, if it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The outputs of a success, in order.
    #[serde(default)]
    pub outputs: Vec<OutputSummary>,
    /// Guest time, in microseconds.
    pub time_us: u64,
    /// Fuel used, when metered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
    /// The outbound HTTP requests it made, in call order: `POST http://h/p sha256:...` (no
    /// digest when the call was refused before its body was read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<String>,
}

/// One output of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSummary {
    /// Its subject.
    pub subject: String,
    /// Its headers, in order.
    pub headers: Vec<(String, String)>,
    /// Its payload as text (lossy), cut to [`SAMPLE_PAYLOAD`] bytes in samples.
    pub payload: String,
    /// The payload's bytes (compared, never stored).
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// The longest payload a stored sample keeps, in bytes.
pub const SAMPLE_PAYLOAD: usize = 4096;

impl Summary {
    /// Summarizes an invocation.
    pub fn of(invocation: &Invocation) -> Self {
        let outputs = match &invocation.outcome {
            Outcome::Success(outputs) => outputs
                .iter()
                .map(|o| OutputSummary {
                    subject: o.subject.clone(),
                    headers: o
                        .headers
                        .iter()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect(),
                    payload: String::from_utf8_lossy(cut(&o.payload)).into_owned(),
                    bytes: o.payload.clone(),
                })
                .collect(),
            _ => Vec::new(),
        };
        let outcome = match &invocation.outcome {
            Outcome::Trap(trap) => format!("trap:{}", trap.kind.as_str()),
            other => other.kind().to_string(),
        };
        Self {
            outcome,
            reason: invocation.outcome.reason(),
            outputs,
            time_us: invocation.elapsed.as_micros() as u64,
            fuel: invocation.fuel,
            calls: invocation.calls.iter().map(call_text).collect(),
        }
    }
}

/// One request as a summary shows it (and the diffs bucket keeps it): its URL with secrets
/// masked ([`dedup_delivery::redact::mask_url`]), followed, when masking changed it, by a
/// short digest of the exact URL, so two requests that differ only in a secret still differ.
fn call_text(call: &dedup_delivery::journal::CallRequest) -> String {
    use sha2::Digest as _;
    let masked = dedup_delivery::redact::mask_url(&call.url);
    let url = match masked == call.url {
        true => masked,
        false => {
            let digest = sha2::Sha256::digest(call.url.as_bytes());
            format!("{masked} (url sha256:{})", &hex::encode(digest)[..12])
        }
    };
    match call.body_digest.is_empty() {
        true => format!("{} {url}", call.method),
        false => format!("{} {url} {}", call.method, call.body_digest),
    }
}

fn cut(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(SAMPLE_PAYLOAD)]
}

/// The kinds of difference, the `kind` label of `dedup_shadow_differences_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Success vs reject vs retry vs a trap kind.
    Outcome,
    /// A different number of outputs.
    OutputCount,
    /// An output's subject.
    Subject,
    /// An output's headers.
    Headers,
    /// An output's payload.
    Payload,
    /// The outbound HTTP requests made (their number, or one's method, URL or body).
    Calls,
}

impl Kind {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Outcome => "outcome",
            Kind::OutputCount => "output_count",
            Kind::Subject => "subject",
            Kind::Headers => "headers",
            Kind::Payload => "payload",
            Kind::Calls => "calls",
        }
    }
}

/// One difference: its kind and where (`outputs[0].payload/amount`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Difference {
    /// What differs.
    pub kind: Kind,
    /// Where.
    pub path: String,
}

/// Every difference between `a` and `b`, leaving out payload paths under `ignore`.
pub fn diff(a: &Summary, b: &Summary, ignore: &[String]) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut add = |kind, path: String| out.push(Difference { kind, path });
    if a.outcome != b.outcome {
        add(Kind::Outcome, "outcome".into());
        return out;
    }
    if a.outputs.len() != b.outputs.len() {
        add(Kind::OutputCount, "outputs".into());
    }
    for i in 0..a.calls.len().max(b.calls.len()) {
        if a.calls.get(i) != b.calls.get(i) {
            add(Kind::Calls, format!("calls[{i}]"));
        }
    }
    for (i, (x, y)) in a.outputs.iter().zip(&b.outputs).enumerate() {
        if x.subject != y.subject {
            add(Kind::Subject, format!("outputs[{i}].subject"));
        }
        if x.headers != y.headers {
            add(Kind::Headers, format!("outputs[{i}].headers"));
        }
        if x.bytes == y.bytes {
            continue;
        }
        match (
            serde_json::from_slice::<Value>(&x.bytes),
            serde_json::from_slice::<Value>(&y.bytes),
        ) {
            (Ok(jx), Ok(jy)) => {
                let mut paths = Vec::new();
                json_diff(&jx, &jy, &mut String::new(), ignore, &mut paths);
                for p in paths {
                    add(Kind::Payload, format!("outputs[{i}].payload{p}"));
                }
            }
            _ => add(Kind::Payload, format!("outputs[{i}].payload")),
        }
    }
    out
}

/// Appends the JSON pointers where `a` and `b` differ, below `at`.
fn json_diff(a: &Value, b: &Value, at: &mut String, ignore: &[String], out: &mut Vec<String>) {
    if ignored(at, ignore) {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let len = at.len();
                let _ = write!(at, "/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(vx), Some(vy)) => json_diff(vx, vy, at, ignore, out),
                    _ if ignored(at, ignore) => {}
                    _ => out.push(at.clone()),
                }
                at.truncate(len);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (vx, vy)) in x.iter().zip(y).enumerate() {
                let len = at.len();
                let _ = write!(at, "/{i}");
                json_diff(vx, vy, at, ignore, out);
                at.truncate(len);
            }
        }
        _ if a == b => {}
        _ => out.push(if at.is_empty() {
            "/".into()
        } else {
            at.clone()
        }),
    }
}

/// Whether pointer `at` is one of `ignore` (`*` matches any one segment) or below one.
fn ignored(at: &str, ignore: &[String]) -> bool {
    let segments: Vec<&str> = at.split('/').skip(1).collect();
    ignore.iter().any(|pattern| {
        let pattern: Vec<&str> = pattern.split('/').skip(1).collect();
        pattern.len() <= segments.len()
            && !pattern.is_empty()
            && pattern
                .iter()
                .zip(&segments)
                .all(|(p, s)| *p == "*" || p == s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn success(payloads: &[&str]) -> Summary {
        Summary {
            outcome: "success".into(),
            reason: None,
            outputs: payloads
                .iter()
                .map(|p| OutputSummary {
                    subject: "out.a".into(),
                    headers: vec![],
                    payload: p.to_string(),
                    bytes: p.as_bytes().to_vec(),
                })
                .collect(),
            time_us: 10,
            fuel: None,
            calls: Vec::new(),
        }
    }

    #[test]
    fn a_calls_secrets_are_masked_in_a_summary_and_a_change_in_them_still_shows() {
        use dedup_delivery::journal::CallRequest;
        let text = |url: &str| call_text(&CallRequest::new("POST", url, b""));
        let one = text("https://api.example.com/send?token=abc&to=1");
        let other = text("https://api.example.com/send?token=xyz&to=1");
        assert!(one.starts_with("POST https://api.example.com/send?token=***&to=1 (url sha256:"));
        assert!(
            !one.contains("abc") && !other.contains("xyz"),
            "{one} / {other}"
        );
        assert_ne!(
            one, other,
            "a change only in the secret is still a difference"
        );
        let plain = text("https://api.example.com/send?to=1");
        assert!(
            plain.starts_with("POST https://api.example.com/send?to=1 sha256:"),
            "{plain}"
        );
    }

    #[test]
    fn json_payloads_differ_by_field_and_ignored_paths_do_not_count() {
        let a = success(&[r#"{"amount": 5, "ran_ms": [1, 2], "items": [{"id": 1, "n": 1}]}"#]);
        let b = success(&[r#"{"amount": 6, "ran_ms": [3, 4], "items": [{"id": 2, "n": 1}]}"#]);
        let paths: Vec<String> = diff(&a, &b, &["/ran_ms".into(), "/items/*/id".into()])
            .into_iter()
            .map(|d| d.path)
            .collect();
        assert_eq!(paths, ["outputs[0].payload/amount"]);
        assert!(diff(&a, &a, &[]).is_empty());
        // Key order and spacing are not differences.
        let c = success(&[r#"{"items":[{"n":1,"id":1}],"ran_ms":[1,2],"amount":5}"#]);
        assert!(diff(&a, &c, &[]).is_empty());
    }

    #[test]
    fn outcomes_counts_subjects_and_raw_payloads_differ_by_kind() {
        let a = success(&["x"]);
        let mut rejected = success(&[]);
        rejected.outcome = "reject".into();
        assert_eq!(diff(&a, &rejected, &[])[0].kind, Kind::Outcome);
        assert_eq!(
            diff(&a, &success(&["x", "y"]), &[])[0].kind,
            Kind::OutputCount
        );
        let mut moved = success(&["x"]);
        moved.outputs[0].subject = "out.b".into();
        assert_eq!(diff(&a, &moved, &[])[0].kind, Kind::Subject);
        assert_eq!(
            diff(&a, &success(&["z"]), &[])[0].path,
            "outputs[0].payload"
        );
        let mut called = success(&["x"]);
        called.calls = vec!["POST http://h/a sha256:1".into()];
        let mut other = called.clone();
        other.calls = vec!["POST http://h/a sha256:2".into(), "GET http://h/b".into()];
        let found = diff(&called, &other, &[]);
        let paths: Vec<&str> = found.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["calls[0]", "calls[1]"]);
        assert_eq!(found[0].kind, Kind::Calls);
    }
}
