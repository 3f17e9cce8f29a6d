//! The Grafana dashboard and the Prometheus alert rules in `deploy/` (issue 29): the rules pass
//! `promtool check rules` and their unit tests, and every metric and label either uses is one
//! a real host exports after a workload.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use dedup_host_tests::harness::{http_get, wait_for, TestEnv, Timing};

/// Labels Prometheus adds at scrape time or that histograms carry.
const SCRAPE_LABELS: [&str; 3] = ["instance", "job", "le"];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs promtool, failing with how to install it when it is missing.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy().join("prometheus"))
        .output()
        .expect("promtool is installed by tests/setup.sh (Debian package `prometheus`)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "dedup-host-rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "dedup-host-rules.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test.
    let rules = std::fs::read_to_string(deploy().join("prometheus/dedup-host-rules.yml")).unwrap();
    let tests =
        std::fs::read_to_string(deploy().join("prometheus/dedup-host-rules.test.yml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        let fires = format!("alertname: {alert}");
        assert!(
            tests.matches(&fires).count() >= 2,
            "{alert}: fires and stays silent"
        );
        let runbook = rules.split(&format!("- alert: {alert}")).nth(1).unwrap();
        let runbook = runbook.split("- alert:").next().unwrap();
        for field in ["summary:", "description:", "runbook:"] {
            assert!(runbook.contains(field), "{alert} has no {field}");
        }
    }
}

/// Every PromQL expression of the dashboard and the rules.
fn expressions() -> Vec<String> {
    let text = std::fs::read_to_string(deploy().join("grafana/dedup-host.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    // What Grafana needs to import it.
    for field in ["title", "uid", "schemaVersion", "panels", "templating"] {
        assert!(dashboard.get(field).is_some(), "dashboard has no `{field}`");
    }
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for field in ["id", "type", "title", "gridPos", "datasource"] {
            assert!(panel.get(field).is_some(), "panel {panel} has no `{field}`");
        }
        let targets = panel["targets"]
            .as_array()
            .expect("a panel queries something");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        out.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_string()),
        );
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            out.push(definition.to_string());
        }
    }
    let rules = std::fs::read_to_string(deploy().join("prometheus/dedup-host-rules.yml")).unwrap();
    out.extend(
        rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: "))
            .map(str::to_string),
    );
    out
}

/// The metric names in `expr`, each with the label names of its selector.
fn metrics_of(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("dedup_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut labels = Vec::new();
        if let Some(selector) = tail[end..].strip_prefix('{') {
            let selector = &selector[..selector.find('}').unwrap()];
            for matcher in selector.split(',') {
                let label = matcher.split(['=', '!']).next().unwrap().trim();
                labels.push(label.to_string());
            }
        }
        out.push((name, labels));
        rest = &tail[end..];
    }
    out
}

/// The labels of `by (...)`, `on (...)`, `group_left (...)` clauses in `expr`.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for keyword in ["by (", "on (", "group_left ("] {
        for part in expr.split(keyword).skip(1) {
            let list = &part[..part.find(')').unwrap()];
            out.extend(list.split(',').map(|l| l.trim().to_string()));
        }
    }
    out
}

/// Sample name → label names, from an OpenMetrics scrape; and the families it declares.
fn scraped(text: &str) -> (BTreeMap<String, BTreeSet<String>>, BTreeSet<String>) {
    let (mut samples, mut families) = (BTreeMap::new(), BTreeSet::new());
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            families.insert(family.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap();
        let labels: &mut BTreeSet<String> =
            samples.entry(line[..name_end].to_string()).or_default();
        if line[name_end..].starts_with('{') {
            let body = &line[name_end + 1..line.find('}').unwrap()];
            for pair in body.split("\",") {
                if let Some((label, _)) = pair.split_once('=') {
                    labels.insert(label.trim().to_string());
                }
            }
        }
    }
    (samples, families)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_the_dashboard_and_rules_use_is_exported() {
    // Fenced routes, so the fenced batch series have samples too.
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    let routes = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
effects = "fenced"

[[routes]]
name = "bad"
subject = "in.bad.*"
component = "{guest:hostile}"
allowed_outputs = ["in.bad.*.done"]
effects = "fenced"
"#;
    let mut config = env.config(&Timing::default(), routes);
    config.host.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    config.host.instance_id = Some("scraped".into());
    let host = dedup_host::serve::start(config).await.expect("host starts");
    let addr = host.metrics_addr().unwrap();
    for i in 0..3 {
        env.publish(&format!("in.upper.e{i}"), &format!("m{i}"), &[], "hi")
            .await;
    }
    // A trap, retried until dead-lettered.
    env.publish("in.bad.p", "p", &[], "panic").await;
    let text = wait_for(
        Duration::from_secs(60),
        "a scrape after the workload",
        || async {
            let (_, text) = http_get(addr, "/metrics")?;
            let done = text
                .contains("dedup_messages_total{route=\"upper\",outcome=\"processed\"} 3")
                && text.contains("dedup_traps_total{")
                && text.contains("dedup_consumer_info{");
            done.then_some(text)
        },
    )
    .await;
    let (samples, families) = scraped(&text);
    let mut problems = Vec::new();
    for expr in expressions() {
        let used = metrics_of(&expr);
        assert!(!used.is_empty(), "no dedup_ metric in `{expr}`");
        let mut known: BTreeSet<String> = SCRAPE_LABELS.iter().map(|l| l.to_string()).collect();
        for (name, labels) in &used {
            let family = name
                .trim_end_matches("_total")
                .trim_end_matches("_bucket")
                .to_string();
            if !families.contains(&family) {
                problems.push(format!("`{name}` (in `{expr}`) is not exported"));
                continue;
            }
            // Families only a fault fills (a refused version) have no samples to read labels from.
            let Some(have) = samples.get(name) else {
                if name != "dedup_refusals_total" {
                    problems.push(format!("`{name}` has no samples after the workload"));
                }
                continue;
            };
            known.extend(have.iter().cloned());
            for label in labels {
                if !have.contains(label) && !SCRAPE_LABELS.contains(&label.as_str()) {
                    problems.push(format!("`{name}` has no label `{label}` (in `{expr}`)"));
                }
            }
        }
        for label in grouping_labels(&expr) {
            if !known.contains(&label) {
                problems.push(format!("no metric of `{expr}` has label `{label}`"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    host.shutdown().await.unwrap();
}
