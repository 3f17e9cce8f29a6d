//! The metrics reference page, made from a host's own registry: every family with its labels,
//! type and help text, as `/metrics` exports them.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use crate::metrics::{BatchResult, DedupLayer, MessageOutcome, Metrics};

/// The page's opening.
const INTRO: &str = "\
What a host serves on `/metrics` (with `[host] metrics_addr`), in the OpenMetrics text format.
Labels are bounded: `route` (`_unrouted` for messages no route takes), `outcome`, `trap`,
`layer`, `stream` (a configured fenced output stream), `result`, `version`, `mode`, `kind`;
never a subject or a key. The digest a route serves is only on `dedup_serving_info`.
";

/// The page's closing.
const OUTRO: &str = "
Alert rules and a Grafana dashboard built on these ship in `deploy/`: [dashboard and
alerts](../operate/alerts.md). Group commit: [fenced effects](../how/fenced.md); candidates:
[changing a handler safely](../deploy/safe-changes.md); spans: [traces](../operate/traces.md).
";

/// One exported family.
struct Family {
    name: String,
    kind: String,
    help: String,
    labels: BTreeSet<String>,
}

/// The page, generated from a fresh registry in which every family has one series.
pub fn page() -> String {
    let mut out = String::from("# Metrics\n\n");
    out.push_str(super::GENERATED);
    out.push('\n');
    out.push_str(INTRO);
    out.push_str("\n| series | type | what |\n|---|---|---|\n");
    for family in families(&sample().encode()) {
        let labels = match family.labels.is_empty() {
            true => String::new(),
            false => format!(
                "{{{}}}",
                family.labels.into_iter().collect::<Vec<_>>().join(",")
            ),
        };
        let _ = writeln!(
            out,
            "| `{}{labels}` | {} | {} |",
            family.name,
            family.kind,
            super::cell(&family.help)
        );
    }
    out.push_str(OUTRO);
    out
}

/// A registry in which every family has a series, so each is exported with its labels.
pub fn sample() -> Metrics {
    let metrics = Metrics::new();
    let route = metrics.route("r");
    route.outcome(MessageOutcome::Processed);
    route.hit(DedupLayer::Claim, 1);
    route.outputs(1);
    route.trap("timeout");
    route.guest_time(Duration::from_millis(1));
    route.claim_write(Duration::from_millis(1));
    route.end_to_end(Duration::from_millis(1));
    route.set_free_slots(1);
    route.set_consumer(0, 0);
    route.set_bound(true);
    route.serving(Some("sha256:0"));
    route.refusal();
    drop(route.in_flight());
    route.rollout.run("candidate", "shadow");
    route.rollout.shadow("match");
    route.rollout.difference("payload");
    route.rollout.canary_share(0);
    route.rollout.rollback();
    route.rollout.promotion();
    metrics.consumer_info("r", "EVENTS", "hosts-r");
    metrics.http_calls("r")(crate::runtime::http::CallResult::Sent);
    metrics.batches().batch("OUT", 2, BatchResult::Committed);
    metrics.set_ready(true);
    metrics.set_stranded(0);
    metrics.spans_dropped().inc();
    metrics
}

/// The families of an exposition, in its order, with the label names their series carry.
fn families(exposition: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    let mut help = String::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest
                .split_once(' ')
                .map(|(_, h)| h)
                .unwrap_or("")
                .to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let name = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            out.push(Family {
                name,
                kind: kind.to_string(),
                help: std::mem::take(&mut help),
                labels: BTreeSet::new(),
            });
        } else if let (Some(family), Some((_, labels))) = (out.last_mut(), line.split_once('{')) {
            let labels = labels.split('}').next().unwrap_or("");
            for pair in labels.split(',') {
                if let Some((name, _)) = pair.split_once('=') {
                    if name != "le" {
                        family.labels.insert(name.to_string());
                    }
                }
            }
        }
    }
    out
}
