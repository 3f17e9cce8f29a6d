//! The shipped deployment files (issue 47) agree with what the binary serves and needs: the
//! Kubernetes probes ask a real host for paths it answers on the port its config serves them
//! on, and the termination grace period (and systemd's stop timeout) outlast the config's
//! drain. Rendering and schema validation run in `tests/run.sh` (kubectl kustomize,
//! kubernetes-validate).

use std::path::Path;
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host_tests::guests::workspace_root;
use dedup_host_tests::harness::{http_get, wait_for, TestEnv, Timing, UPPER_ROUTE};

fn read(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join(path)).unwrap_or_else(|e| panic!("`{path}`: {e}"))
}

/// The value of the first `key:` at or after line `from` (quotes dropped).
fn value_after(text: &str, from: usize, key: &str) -> (usize, String) {
    text.lines()
        .enumerate()
        .skip(from)
        .find_map(|(i, line)| {
            let rest = line.trim_start().strip_prefix(&format!("{key}:"))?;
            Some((i, rest.trim().trim_matches('"').to_string()))
        })
        .unwrap_or_else(|| panic!("no `{key}:` after line {from}"))
}

/// The hosts' config as shipped, without the files only a pod has (credentials, CA).
fn shipped_config() -> Config {
    let text: String = read("deploy/kubernetes/base/host.toml")
        .lines()
        .filter(|l| !l.starts_with("creds_file") && !l.starts_with("tls_"))
        .map(|l| format!("{l}\n"))
        .collect();
    Config::parse(&text, Path::new("host.toml"), ".".into()).expect("the shipped config is valid")
}

/// (path, port name) of the probe named `probe` in the Deployment.
fn probe(deployment: &str, probe: &str) -> (String, String) {
    let (at, _) = value_after(deployment, 0, probe);
    let (at, path) = value_after(deployment, at, "path");
    let (_, port) = value_after(deployment, at, "port");
    (path, port)
}

// The endpoints answer on this runtime while the test waits on them with blocking reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_grace_match_what_the_host_serves_and_needs() {
    let config = shipped_config();
    let deployment = read("deploy/kubernetes/base/deployment.yaml");
    let metrics = config
        .host
        .metrics_addr
        .expect("the shipped config serves metrics");

    // The port named `metrics` is the one the config serves on.
    let (at, name) = value_after(&deployment, 0, "- name");
    let (at, _) = value_after(&deployment, at + 1, "ports");
    let (at, port_name) = value_after(&deployment, at, "- name");
    let (_, container_port) = value_after(&deployment, at, "containerPort");
    assert_eq!(
        (name.as_str(), port_name.as_str()),
        ("dedup-host", "metrics")
    );
    assert_eq!(container_port, metrics.port().to_string());
    let (ready, ready_port) = probe(&deployment, "readinessProbe");
    let (live, live_port) = probe(&deployment, "livenessProbe");
    assert_eq!(
        (ready_port.as_str(), live_port.as_str()),
        ("metrics", "metrics")
    );
    assert_eq!(ready, "/readyz");

    // A real host answers both paths (its own free port; the rest of its [host] as shipped).
    let env = TestEnv::start().await;
    let mut host_config = env.config(&Timing::default(), UPPER_ROUTE);
    host_config.host.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    host_config.host.drain_timeout = config.host.drain_timeout;
    let host = dedup_host::serve::start(host_config).await.unwrap();
    let addr = host.metrics_addr().unwrap();
    for path in [&ready, &live] {
        wait_for(
            Duration::from_secs(30),
            &format!("200 on {path}"),
            || async { (http_get(addr, path)?.0 == 200).then_some(()) },
        )
        .await;
    }
    host.shutdown().await.unwrap();

    // The kubelet's SIGKILL and systemd's stop timeout come after the drain.
    let (_, grace) = value_after(&deployment, 0, "terminationGracePeriodSeconds");
    let grace = Duration::from_secs(grace.parse().unwrap());
    assert!(
        grace > config.host.drain_timeout + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace:?} does not outlast host.drain_timeout {:?}",
        config.host.drain_timeout
    );
    let unit = read("deploy/systemd/dedup-host.service");
    let (_, stop) = value_after(&unit.replace('=', ": "), 0, "TimeoutStopSec");
    let stop = Duration::from_secs(stop.parse().unwrap());
    assert!(stop > config.host.drain_timeout, "TimeoutStopSec {stop:?}");

    // The Service and ServiceMonitor scrape that port at /metrics.
    let monitor = read("deploy/kubernetes/base/servicemonitor.yaml");
    assert_eq!(value_after(&monitor, 0, "- port").1, "metrics");
    assert_eq!(value_after(&monitor, 0, "path").1, "/metrics");
    let service = read("deploy/kubernetes/base/service.yaml");
    assert_eq!(
        value_after(&service, 0, "port").1,
        metrics.port().to_string()
    );
    assert_eq!(value_after(&service, 0, "targetPort").1, "metrics");
}

#[test]
fn the_scaler_watches_the_route_consumers_of_the_shipped_config() {
    let config = shipped_config();
    let scaler = read("deploy/kubernetes/base/scaledobject.yaml");
    assert_eq!(value_after(&scaler, 0, "stream").1, config.source.stream);
    let consumers: Vec<String> = scaler
        .lines()
        .filter_map(|l| l.trim().strip_prefix("consumer:"))
        .map(|c| c.trim().trim_matches('"').to_string())
        .collect();
    let routes: Vec<String> = config
        .routes
        .iter()
        .map(|r| dedup_host::consumers::route_consumer_name(&config, &r.name))
        .collect();
    assert_eq!(consumers, routes, "one trigger per route consumer");
}

/// `tests/deploy_check.sh` with PATH holding only the shell tools it needs (no kubectl,
/// kustomize, kubernetes-validate or systemd-analyze) and `strict` as
/// DEDUP_DEPLOY_CHECK_STRICT.
fn deploy_check_without_tools(strict: &str) -> std::process::Output {
    let bin = tempfile::tempdir().unwrap();
    for tool in [
        "bash", "mktemp", "rm", "dirname", "basename", "grep", "sed", "tail", "cat",
    ] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let path = String::from_utf8(found.stdout).unwrap();
        std::os::unix::fs::symlink(path.trim(), bin.path().join(tool)).unwrap();
    }
    std::process::Command::new(bin.path().join("bash"))
        .arg(workspace_root().join("tests/deploy_check.sh"))
        .env("PATH", bin.path())
        .env("DEDUP_DEPLOY_CHECK_STRICT", strict)
        .output()
        .unwrap()
}

/// A runner that lost its tools passes the deploy check only by skipping, and says so; in
/// strict mode (CI, `tests/run.sh` where the tools are installed) it fails, naming the step.
#[test]
fn the_deploy_check_in_strict_mode_fails_when_a_tool_is_missing() {
    let lenient = deploy_check_without_tools("0");
    let stderr = String::from_utf8_lossy(&lenient.stderr);
    assert!(lenient.status.success(), "{stderr}");
    assert!(
        stderr.contains("SKIPPED rendering deploy/kubernetes"),
        "{stderr}"
    );
    let strict = deploy_check_without_tools("1");
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(!strict.status.success(), "{stderr}");
    assert!(
        stderr.contains("FAILED (DEDUP_DEPLOY_CHECK_STRICT=1): rendering deploy/kubernetes"),
        "{stderr}"
    );
}

/// The systemd unit's dynamic user reads the NATS credentials through `LoadCredential=`
/// (a private copy under /run/credentials), so the file itself stays root-only instead of
/// world-readable; the config line it needs is in the unit.
#[test]
fn the_systemd_unit_hands_its_dynamic_user_the_credentials_privately() {
    let unit = read("deploy/systemd/dedup-host.service");
    assert!(unit.lines().any(|l| l == "DynamicUser=yes"), "{unit}");
    let load = unit
        .lines()
        .find_map(|l| l.strip_prefix("LoadCredential="))
        .expect("a LoadCredential= line");
    let (name, source) = load.split_once(':').expect("LoadCredential=NAME:PATH");
    assert!(source.starts_with("/etc/dedup-host/"), "{load}");
    let config_line = format!("creds_file = \"/run/credentials/dedup-host.service/{name}\"");
    assert!(unit.contains(&config_line), "the unit says {config_line}");
}

/// The base's KEDA trigger reads the global account (`$G`, right only for a server without
/// accounts); the production overlay, whose users are least-privilege users in an account,
/// names that account for every trigger.
#[test]
fn the_production_scaler_names_its_nats_account() {
    let base = read("deploy/kubernetes/base/scaledobject.yaml");
    let triggers = base.matches("- type: nats-jetstream").count();
    let overlay = read("deploy/kubernetes/overlays/production/kustomization.yaml");
    for i in 0..triggers {
        let path = format!("path: /spec/triggers/{i}/metadata/account");
        let at = overlay
            .find(&path)
            .unwrap_or_else(|| panic!("the production overlay patches trigger {i}'s account"));
        let (_, value) = value_after(&overlay[at..], 0, "value");
        assert!(
            !value.is_empty() && value != "$G",
            "trigger {i}: account {value}"
        );
    }
}
