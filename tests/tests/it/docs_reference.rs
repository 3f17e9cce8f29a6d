//! The reference pages agree with the code, both ways: every config key the parser takes is in
//! docs/src/reference/config.md under its section (and every key there is taken), and every
//! metric series and outcome label a host exports is in the book's metrics table
//! (docs/src/reference/metrics.md; and nothing there is missing from the host).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dedup_host::config::Config;
use dedup_host::metrics::Metrics;

/// The book's configuration reference.
const CONFIG_PAGE: &str = "docs/src/reference/config.md";
/// The book's metrics reference.
const METRICS_PAGE: &str = "docs/src/reference/metrics.md";

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The keys the parser accepts in a section, from the error it gives for an unknown one.
fn accepted_keys(section: &str) -> BTreeSet<String> {
    let text = format!("{section}\nzz_not_a_key = 1\n");
    let err = Config::parse(&text, Path::new("probe.toml"), PathBuf::from("."))
        .expect_err("an unknown key is refused")
        .to_string();
    let expected = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("{section}: no key list in `{err}`"))
        .1;
    let keys: BTreeSet<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!keys.is_empty(), "{section}: {err}");
    keys
}

/// The keys the configuration reference lists in the table under `heading`.
fn documented_keys(page: &str, heading: &str) -> BTreeSet<String> {
    let start = page
        .find(heading)
        .unwrap_or_else(|| panic!("{CONFIG_PAGE} has no `{heading}` section"));
    page[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(k, _)| k.to_string()))
        .collect()
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_exists() {
    let page = repo_file(CONFIG_PAGE);
    let sections = [
        ("[nats]", "## `[nats]`"),
        ("[host]", "## `[host]`"),
        ("[source]", "## `[source]`"),
        ("[claims]", "## `[claims]`"),
        ("[dead_letter]", "## `[dead_letter]`"),
        ("[[output_streams]]", "## `[[output_streams]]`"),
        ("[components]", "## `[components]`"),
        ("[telemetry]", "## `[telemetry]`"),
        ("[console]", "## `[console]`"),
        ("[deployment]", "## `[deployment]`"),
        ("[[routes]]", "## `[[routes]]`"),
        ("[[routes]]\n[routes.limits]", "## `[routes.limits]`"),
    ];
    let top = accepted_keys("");
    for (section, heading) in sections {
        let table = section.lines().last().unwrap();
        let name = table.trim_matches(['[', ']']);
        assert!(
            top.contains(name) || name == "routes.limits",
            "`{name}` is not a top-level key: {top:?}"
        );
        let code = accepted_keys(section);
        let docs = documented_keys(&page, heading);
        let undocumented: Vec<_> = code.difference(&docs).collect();
        let unknown: Vec<_> = docs.difference(&code).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "{section}: keys missing from {CONFIG_PAGE}: {undocumented:?}; documented keys the parser refuses: {unknown:?}"
        );
    }
}

#[test]
fn every_metric_and_outcome_is_in_the_book_and_nothing_else_is() {
    let page = repo_file(METRICS_PAGE);
    let start = page.find("# Metrics").expect("a Metrics title");
    let end = start
        + page[start..]
            .find("Alert rules and a Grafana")
            .expect("its end");
    let table = &page[start..end];

    let metrics = Metrics::new();
    // Families without a series are not exported: give the lazily made ones one each.
    let route = metrics.route("r");
    route.outcome(dedup_host::metrics::MessageOutcome::Processed);
    route.trap("timeout");
    route.serving(Some("sha256:0"));
    route.rollout.run("candidate", "shadow");
    route.rollout.shadow("match");
    route.rollout.difference("payload");
    route.rollout.rollback();
    route.rollout.promotion();
    metrics.consumer_info("r", "EVENTS", "hosts-r");
    metrics.http_calls("r")(dedup_host::runtime::http::CallResult::Sent);
    metrics
        .batches()
        .batch("OUT", 2, dedup_host::metrics::BatchResult::Committed);
    let exposition = metrics.encode();
    let mut exported = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let name = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            exported.insert(name);
        }
    }
    for name in &exported {
        assert!(
            table.contains(&format!("`{name}")) || table.contains(&format!(", `{name}")),
            "metric `{name}` is not in the metrics table of {METRICS_PAGE}"
        );
    }
    let mentioned: BTreeSet<String> = table
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("dedup_"))
        .map(str::to_string)
        .collect();
    for name in &mentioned {
        assert!(
            exported.contains(name),
            "the metrics table of {METRICS_PAGE} names `{name}`, which no host exports: {exported:?}"
        );
    }

    let mut labels = BTreeSet::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        for label in ["outcome", "layer"] {
            if let Some(rest) = line.split_once(&format!("{label}=\"")) {
                labels.insert(rest.1.split('"').next().unwrap().to_string());
            }
        }
    }
    assert!(labels.contains("coalesced"), "{labels:?}");
    for label in &labels {
        assert!(
            table
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|word| word == label),
            "label value `{label}` is not explained in the metrics table of {METRICS_PAGE}"
        );
    }
}

#[test]
fn the_generated_reference_pages_match_the_code() {
    use clap::CommandFactory;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference");
    let pages = dedup_host::reference::pages(dedup_host::cli::Cli::command());
    let stale = dedup_host::reference::stale(&pages, &dir);
    assert!(
        stale.is_empty(),
        "{stale:?} in docs/src/reference differ from what the code generates: run \
         `target/release/dedup-host reference docs/src/reference` and commit the pages"
    );
}

#[test]
fn every_environment_variable_the_host_reads_is_in_the_reference() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut read = BTreeSet::new();
    let mut dirs = vec![
        root.join("host/src"),
        root.join("host/runtime/src"),
        root.join("host/delivery/src"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                // `var("X")`, `env("X")`, `env = "X"` (clap) and quoted OTEL_ names.
                for (i, _) in line.match_indices('"') {
                    let rest = &line[i + 1..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    let before = &line[..i];
                    let reads = before.ends_with("var(")
                        || before.ends_with("var_os(")
                        || before.ends_with("env(")
                        || before.ends_with("env = ")
                        || name.starts_with("OTEL_");
                    if reads && name.len() > 2 && rest[name.len()..].starts_with('"') {
                        read.insert(name);
                    }
                }
            }
        }
    }
    // Test-only switches are not for users.
    read.retain(|name| !name.starts_with("DEDUP_HOST_TEST_") && name != "DEDUP_INSTALL");
    let page = repo_file("docs/src/reference/cli.md");
    let section = &page[page
        .find("## Environment variables")
        .expect("an environment section")..];
    for name in &read {
        assert!(
            section.contains(&format!("`{name}`")),
            "the host reads `{name}`, which docs/src/reference/cli.md does not list: add it to \
             `dedup_host::reference::env::DIRECT` and regenerate"
        );
    }
    assert!(
        read.contains("DEDUP_CONSOLE_TOKEN") && read.contains("DEDUP_HOST_CONFIG"),
        "{read:?}"
    );
}
