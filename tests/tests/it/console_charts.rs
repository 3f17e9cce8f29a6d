//! The console for people (issue 46 item 6), against a real deployment: a route's page under
//! load draws its charts on the server (rate by outcome, guest time and the latency the host
//! added at p50/p99, pending, a latency histogram), shows its config as the TOML a user
//! writes with defaults marked, and the activity log names who acted. Hostile text in every
//! new field (guest config keys, header names, component paths, `--as` names) stays text in
//! a real Chromium. Screenshots go to `target/test-output/console/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedup_host_tests::browser::Browser;
use dedup_host_tests::console::{request, ConsoleProcess};
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{stop_gracefully, wait_for, TestEnv, Timing};
use fantoccini::Locator;

const TOKEN: &str = "console-charts-token-0123";
const HOSTILE_CONFIG_KEY: &str = "<script>window.__pwned=1</script>";
const HOSTILE_HEADER: &str = "X-<script>window.__pwned=2</script>";
const HOSTILE_FILE: &str = "<img src=x onerror=window.__pwned=3>.wasm";
const HOSTILE_ACTOR: &str = "<script>window.__pwned=4</script>";

fn shots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("test-output/console")
}

/// Host processes, killed when a failed assertion unwinds past them.
struct Hosts(Vec<Child>);

impl Hosts {
    fn stop(mut self) {
        for host in self.0.drain(..) {
            stop_gracefully(host);
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in &mut self.0 {
            let _ = host.kill();
            let _ = host.wait();
        }
    }
}

/// `dedup-host ARGS --config CONFIG` with `envs` set and `removed` unset.
fn cli(config: &Path, args: &[&str], envs: &[(&str, &str)], removed: &[&str]) -> Output {
    let mut command = Command::new(host_binary());
    command.args(args).arg("--config").arg(config);
    for name in removed {
        command.env_remove(name);
    }
    command.envs(envs.iter().copied());
    let out = command.output().expect("run dedup-host");
    assert!(
        out.status.success(),
        "dedup-host {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `d` of the chart line labelled `label`.
fn line_of<'a>(page: &'a str, label: &str) -> &'a str {
    let at = format!("data-label=\"{label}\" d=\"");
    let Some(start) = page.find(&at) else {
        return "";
    };
    let rest = &page[start + at.len()..];
    &rest[..rest.find('"').unwrap_or(0)]
}

/// How many points a chart line has.
fn points(d: &str) -> usize {
    d.matches(['M', 'L']).count()
}

/// The counts of the histogram bars labelled `label`.
fn bars(page: &str, label: &str) -> Vec<u64> {
    let at = format!("data-label=\"{label}\" data-bucket=\"");
    page.match_indices(&at)
        .filter_map(|(i, _)| {
            let rest = &page[i..];
            let count = rest.split("data-count=\"").nth(1)?;
            count[..count.find('"')?].parse().ok()
        })
        .collect()
}

async fn pwned(b: &Browser) -> String {
    b.client
        .execute("return typeof window.__pwned;", vec![])
        .await
        .expect("execute")
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn text_of(b: &Browser, css: &str) -> String {
    let el = b
        .client
        .wait()
        .at_most(Duration::from_secs(120))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("`{css}`: {e}"));
    el.text().await.expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_page_under_load_charts_rates_latencies_and_pending_and_shows_its_config_as_toml() {
    let env = TestEnv::start().await;
    let hostile_component = env.path(HOSTILE_FILE);
    std::fs::copy(guest("uppercase"), &hostile_component).unwrap();
    let routes = format!(
        r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{upper}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.upper.*.done"]
concurrency = 4

[routes.limits]
deadline = "5s"

[routes.config]
"{HOSTILE_CONFIG_KEY}" = "a-secret-value"

[[routes]]
name = "odd"
subject = "in.odd.*"
component = "{odd}"
key = {{ header = "{HOSTILE_HEADER}" }}

[[routes]]
name = "stored"
subject = "in.stored.*"
"#,
        upper = guest("uppercase").display(),
        odd = hostile_component.display(),
    );
    let timing = Timing::default();
    let hosts = Hosts(vec![
        env.host_process(&timing, &routes, "host-a").await,
        env.host_process(&timing, &routes, "host-b").await,
    ]);
    let config = env.path("console.toml");
    std::fs::write(&config, env.config_text(&timing, &routes)).unwrap();

    // A deploy whose actor is hostile text: recorded under that name, shown as text.
    let upper = guest("uppercase").display().to_string();
    let deploy = [
        "deploy",
        "--route",
        "stored",
        "--component",
        &upper,
        "--skip-check",
        "--as",
    ];
    cli(&config, &[&deploy[..], &[HOSTILE_ACTOR]].concat(), &[], &[]);

    // Load: every key published twice (the second a duplicate), for as long as it takes.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let js = env.js.clone();
        let stop = stop.clone();
        async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..50 {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", format!("m{i}").as_str());
                    let subject = format!("in.upper.k{}", i / 2);
                    if let Ok(ack) = js
                        .publish_with_headers(subject, headers, "hello".into())
                        .await
                    {
                        let _ = ack.await;
                    }
                    i += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            i
        }
    });

    let console_process = ConsoleProcess::start(&config, Some(TOKEN));
    let addr = console_process.addr;
    let bearer = format!("Bearer {TOKEN}");
    let get = |path: &str| {
        let (status, page) = request(addr, "GET", path, &[("Authorization", &bearer)], "");
        assert_eq!(status, 200, "GET {path}: {page}");
        page
    };
    // Five points of each line: a minute of traffic at least, drawn from the hosts' feed.
    let page = wait_for(
        Duration::from_secs(400),
        "five points of rate, guest time and added latency on the route's page",
        || async {
            let page = get("/routes/upper");
            let drawn = [
                "processed",
                "duplicate",
                "guest p50",
                "guest p99",
                "added p50",
                "added p99",
            ]
            .iter()
            .all(|label| points(line_of(&page, label)) >= 5);
            let counted = bars(&page, "added by the host").iter().sum::<u64>() > 0
                && bars(&page, "guest time").iter().sum::<u64>() > 0;
            (drawn && counted).then_some(page)
        },
    )
    .await;
    for text in [
        ">msg/s</text>",
        ">ms</text>",
        ">messages</text>",
        ">now</text>",
        ">-5 min</text>",
        "Messages per second by outcome",
        "Latency histogram",
        "pending",
    ] {
        assert!(page.contains(text), "`{text}` on the route's page");
    }
    assert_eq!(
        points(line_of(&page, "pending")),
        60,
        "one pending point per step"
    );

    // The config as the TOML its user writes, defaults marked, no Rust values.
    let start = page.find("id=\"config\"").expect("the config block");
    let shown = &page[start..start + page[start..].find("</pre>").unwrap()];
    for want in [
        "key = { subject_token = 2 }",
        "concurrency = 4<",
        "name = &quot;upper&quot;<",
        "[routes.limits]",
        "deadline = &quot;5s&quot;<",
        "missing_key = &quot;dead_letter&quot;  # default",
        "max_outputs = 1000  # default",
        "# wall = &quot;15s&quot;  # not set: 3 x deadline",
        "# partitions = 16  # not set: default",
        "# &quot;&lt;script&gt;window.__pwned=1&lt;/script&gt;&quot; = (value not shown)",
    ] {
        assert!(shown.contains(want), "`{want}` in\n{shown}");
    }
    for rust in ["SubjectToken", "None", "Limits {", "a-secret-value"] {
        assert!(!shown.contains(rust), "`{rust}` in\n{shown}");
    }
    // Hostile text in the new fields is escaped in the HTML itself.
    let odd = get("/routes/odd");
    assert!(
        odd.contains("X-&lt;script&gt;window.__pwned=2&lt;/script&gt;")
            && odd.contains("&lt;img src=x onerror=window.__pwned=3&gt;.wasm"),
        "{odd}"
    );
    for page in [&page, &odd] {
        assert!(!page.contains("<script>window") && !page.contains("<img src=x"));
    }

    // In a real browser: the charts under load, and no hostile text runs.
    let browser = Browser::start().await;
    let b = &browser;
    let base = format!("http://{addr}");
    b.client.goto(&format!("{base}/login")).await.unwrap();
    let token = b
        .client
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    token.send_keys(TOKEN).await.unwrap();
    b.client
        .find(Locator::Css("#login"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.client
        .wait()
        .for_element(Locator::Css("#routes"))
        .await
        .unwrap();
    b.client
        .goto(&format!("{base}/routes/upper"))
        .await
        .unwrap();
    let title = text_of(b, "#chart-rate .title").await;
    assert_eq!(title, "Messages per second by outcome");
    b.client
        .execute(
            "document.querySelector('h2 + p.meta').scrollIntoView();",
            vec![],
        )
        .await
        .unwrap();
    browser.screenshot(&shots().join("route-charts.png")).await;
    // Live: under load the charts are redrawn from the server in place, the page not reloaded
    // (a mark set on this page's window survives).
    let rate_line = || async {
        b.client
            .execute(
                "const l = document.querySelector('#chart-rate [data-label=\"processed\"]'); return l ? l.getAttribute('d') : '';",
                vec![],
            )
            .await
            .expect("execute")
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    b.client
        .execute("window.__samePage = 'yes'; return null;", vec![])
        .await
        .expect("execute");
    let drawn = rate_line().await;
    wait_for(
        Duration::from_secs(180),
        "the rate chart redrawn without reloading the page",
        || async { (rate_line().await != drawn).then_some(()) },
    )
    .await;
    let same = b
        .client
        .execute("return window.__samePage || 'reloaded';", vec![])
        .await
        .expect("execute");
    assert_eq!(same.as_str(), Some("yes"), "the page was reloaded");
    b.client
        .execute(
            "document.getElementById('config').scrollIntoView();",
            vec![],
        )
        .await
        .unwrap();
    browser.screenshot(&shots().join("route-config.png")).await;
    assert_eq!(pwned(b).await, "undefined", "the route page ran page text");
    b.client.goto(&format!("{base}/routes/odd")).await.unwrap();
    assert!(text_of(b, "#config").await.contains(HOSTILE_HEADER));
    assert_eq!(pwned(b).await, "undefined", "a header name ran");
    b.client.goto(&format!("{base}/activity")).await.unwrap();
    let first = text_of(b, "#activity tbody tr").await;
    assert!(
        first.contains(&format!("cli {HOSTILE_ACTOR}@")) && first.contains("deploy"),
        "{first}"
    );
    assert_eq!(pwned(b).await, "undefined", "an actor's name ran");
    browser.close().await;

    stop.store(true, Ordering::Relaxed);
    let published = load.await.unwrap();
    assert!(published > 0);
    drop(console_process);
    hosts.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_activity_log_names_the_cli_user_by_as_by_its_environment_or_by_user_id() {
    let env = TestEnv::start().await;
    let routes = "[[routes]]\nname = \"stored\"\nsubject = \"in.stored.*\"\n";
    let timing = Timing::default();
    let config_path = env.path("ops.toml");
    std::fs::write(&config_path, env.config_text(&timing, routes)).unwrap();
    let config = env.config(&timing, routes);
    let upper = guest("uppercase").display().to_string();
    let deploy = [
        "deploy",
        "--route",
        "stored",
        "--component",
        &upper,
        "--skip-check",
    ];
    let undeploy = ["undeploy", "--route", "stored"];
    let anonymous = ["USER", "LOGNAME", "DEDUP_HOST_AS"];
    cli(
        &config_path,
        &[&deploy[..], &["--as", "alice"]].concat(),
        &[],
        &[],
    );
    cli(&config_path, &undeploy, &[("DEDUP_HOST_AS", "bob")], &[]);
    cli(&config_path, &deploy, &[], &anonymous);
    let entries = dedup_host::activity::list(&env.js, &config, 10)
        .await
        .unwrap();
    let who: Vec<&str> = entries.iter().rev().map(|e| e.who.as_str()).collect();
    assert_eq!(who.len(), 3, "{who:?}");
    assert!(who[0].starts_with("cli alice@"), "{who:?}");
    assert!(who[1].starts_with("cli bob@"), "{who:?}");
    assert!(
        who[2].starts_with("cli uid ") && !who[2].contains("unknown"),
        "{who:?}"
    );
}
