//! The web console against a real deployment (nats-server, two `dedup-host run` processes,
//! `dedup-host console`), looked at in a real headless Chromium: the overview's hosts and
//! exact counts, a key's story, a filtered bulk replay after a fix that completes each key
//! once, the activity log, hostile text rendered as text, and changes refused without the
//! token or the CSRF value. Screenshots of each page go to `target/test-output/console/`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use dedup_host::config::ConsoleConfig;
use dedup_host::console::auth::Access;
use dedup_host_tests::browser::Browser;
use dedup_host_tests::console::{login, request, ConsoleProcess};
use dedup_host_tests::guests::{guest, host_binary};
use dedup_host_tests::harness::{stop_gracefully, wait_for, TestEnv, Timing, DEAD};
use fantoccini::Locator;

const TOKEN: &str = "console-test-token-0123";
/// Hostile text a producer controls: in a key, a header and a payload.
const HOSTILE_KEY: &str = "\"><img src=x onerror=window.__pwned=1>";
const HOSTILE_HEADER: &str = "<script>window.__pwned=2</script>";
const HOSTILE_PAYLOAD: &str = "sleep-reject:0<script>window.__pwned=3</script>\u{1b}[31m\u{7}";

fn shots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("test-output/console")
}

/// One POST: the status.
fn post(addr: SocketAddr, path: &str, cookie: Option<&str>, body: &str) -> u16 {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
    request(addr, "POST", path, &headers, body).0
}

async fn text_of(b: &Browser, css: &str) -> String {
    // Waits for the element: a click on a form's button returns before a slow answer loads.
    let found = b
        .client
        .wait()
        .at_most(Duration::from_secs(120))
        .for_element(Locator::Css(css));
    match found.await {
        Ok(el) => el.text().await.expect("text"),
        Err(e) => {
            let page = b.client.source().await.unwrap_or_default();
            let url = b
                .client
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            panic!(
                "`{css}` is not on {url}: {e}\n{}",
                &page[..page.len().min(3000)]
            )
        }
    }
}

/// Waits until the element's text is `want` (the overview updates itself every few seconds).
async fn wait_text(b: &Browser, css: &str, want: &str) {
    wait_for(
        Duration::from_secs(120),
        &format!("`{css}` to read {want}"),
        || async {
            let el = b.client.find(Locator::Css(css)).await.ok()?;
            (el.text().await.ok()? == want).then_some(())
        },
    )
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_both_hosts_a_keys_story_and_replays_dead_letters_after_a_fix() {
    let env = TestEnv::start().await;
    let component = env.path("fixme.wasm");
    std::fs::copy(guest("hostile"), &component).unwrap();
    let routes = format!(
        r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{}"
allowed_outputs = ["in.upper.*.done"]

[[routes]]
name = "fixme"
subject = "in.fixme.*"
component = "{}"
allowed_outputs = ["in.fixme.*.done"]
max_payload_bytes = 65536
"#,
        guest("uppercase").display(),
        component.display()
    );
    let timing = Timing::default();
    let a = env.host_process(&timing, &routes, "host-a").await;
    let b_host = env.host_process(&timing, &routes, "host-b").await;
    for i in 0..5 {
        env.publish(&format!("in.upper.u{i}"), &format!("u{i}"), &[], "hi")
            .await;
    }
    for i in 0..3 {
        env.publish(
            &format!("in.fixme.f{i}"),
            &format!("f{i}"),
            &[],
            "sleep-reject:0",
        )
        .await;
    }
    env.publish(
        "in.fixme.evil",
        HOSTILE_KEY,
        &[("X-Evil", HOSTILE_HEADER)],
        HOSTILE_PAYLOAD,
    )
    .await;
    let big = format!("<script>window.__pwned=4</script>{}", "x".repeat(1_000_000));
    env.publish("in.fixme.big", "big", &[], big).await;
    wait_for(Duration::from_secs(120), "five dead letters", || async {
        (env.messages(DEAD).await.len() == 5).then_some(())
    })
    .await;

    let config = env.path("console.toml");
    std::fs::write(&config, env.config_text(&timing, &routes)).unwrap();
    let console_process = ConsoleProcess::start(&config, Some(TOKEN));
    let addr = console_process.addr;
    let base = format!("http://{addr}");
    let browser = Browser::start().await;
    let b = &browser;

    // Reads need the login: the token set in the environment.
    b.client.goto(&format!("{base}/")).await.unwrap();
    b.client
        .wait()
        .for_element(Locator::Css("#token"))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
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

    // The overview: both hosts, and the exact counts summed over them.
    wait_text(b, "[data-live='upper|outcomes|processed']", "5").await;
    wait_text(b, "[data-live='fixme|outcomes|dead_lettered']", "5").await;
    assert_eq!(
        text_of(b, "[data-live='fixme|outcomes|processed']").await,
        "0"
    );
    assert_eq!(
        text_of(b, "[data-live='upper|outcomes|retried']").await,
        "0"
    );
    b.client.refresh().await.unwrap();
    for host in ["host-a", "host-b"] {
        let row = text_of(b, &format!("tr[data-host='{host}']")).await;
        assert!(row.contains("ready"), "{host}: {row}");
    }
    browser.screenshot(&shots().join("overview.png")).await;
    // The page updates itself: more work shows up without a reload.
    b.client
        .execute("window.__same_page = true;", vec![])
        .await
        .unwrap();
    for i in 5..8 {
        env.publish(&format!("in.upper.u{i}"), &format!("u{i}"), &[], "hi")
            .await;
    }
    wait_text(b, "[data-live='upper|outcomes|processed']", "8").await;
    let same = b
        .client
        .execute("return window.__same_page === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same, serde_json::Value::Bool(true), "no reload happened");
    let refreshed = b
        .client
        .execute("return document.body.dataset.refreshed || '';", vec![])
        .await
        .unwrap();
    assert!(
        !refreshed.as_str().unwrap_or_default().is_empty(),
        "the script refreshed the page in place"
    );

    // A key's story from the search box.
    let search = b
        .client
        .find(Locator::Css("nav input[name=q]"))
        .await
        .unwrap();
    search.send_keys("f1").await.unwrap();
    b.client
        .find(Locator::Css("nav form.search button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let verdict = text_of(b, "article.story .verdict").await;
    assert!(
        verdict.starts_with("dead-lettered after attempt 1: rejected after sleeping"),
        "{verdict}"
    );
    browser.screenshot(&shots().join("key.png")).await;

    // Hostile text renders as text, and nothing it carries runs.
    b.client
        .goto(&format!("{base}/letters?route=fixme"))
        .await
        .unwrap();
    let listed = text_of(b, "#letters").await;
    assert!(listed.contains(HOSTILE_KEY), "{listed}");
    assert_eq!(pwned(b).await, "undefined");
    browser.screenshot(&shots().join("letters.png")).await;
    let letters = env.messages(DEAD).await;
    let evil = letters
        .iter()
        .find(|m| m.payload.starts_with(b"sleep-reject:0<script>"))
        .expect("the hostile letter");
    b.client
        .goto(&format!("{base}/letters/{}", evil.sequence))
        .await
        .unwrap();
    let payload = text_of(b, "pre[data-view=text]").await;
    assert!(
        payload.contains("<script>window.__pwned=3</script>\\u{1b}[31m\\u{7}"),
        "{payload}"
    );
    let headers = text_of(b, "table.headers").await;
    assert!(headers.contains(HOSTILE_HEADER), "{headers}");
    assert_eq!(pwned(b).await, "undefined");
    browser.screenshot(&shots().join("letter.png")).await;
    let big_letter = letters
        .iter()
        .find(|m| m.payload.starts_with(b"<script>window.__pwned=4"))
        .expect("the big letter");
    b.client
        .goto(&format!("{base}/letters/{}", big_letter.sequence))
        .await
        .unwrap();
    assert!(text_of(b, "pre[data-view=text]")
        .await
        .starts_with("<script>window.__pwned=4</script>xxx"));
    assert_eq!(pwned(b).await, "undefined");

    // Changes without the token or the CSRF value are refused.
    let access = Access::new(
        &ConsoleConfig {
            token: Some(TOKEN.into()),
            ..Default::default()
        },
        |_| None,
        addr,
    )
    .unwrap();
    let session = login(addr, TOKEN).expect("the token logs in");
    let replay_all = "route=fixme&confirmed=yes";
    assert_eq!(
        post(
            addr,
            "/letters/replay",
            None,
            &format!("{replay_all}&csrf={}", access.csrf())
        ),
        401
    );
    assert_eq!(
        post(addr, "/letters/replay", Some(&session), replay_all),
        403
    );
    assert_eq!(
        post(
            addr,
            "/letters/replay",
            Some(&session),
            &format!("{replay_all}&csrf=wrong")
        ),
        403
    );
    assert_eq!(env.messages(DEAD).await.len(), 5, "nothing was replayed");

    // The fix, then a bulk replay of the letters whose reason matches (not the oversized one).
    std::fs::copy(guest("uppercase"), &component).unwrap();
    let fixed = dedup_host::runtime::digest(&std::fs::read(guest("uppercase")).unwrap());
    let status = dedup_host::components::status::open(&env.js, &env.config(&timing, &routes))
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(120),
        "both hosts serve the fix",
        || async {
            let hosts = dedup_host::components::status::read_all(&status)
                .await
                .ok()?;
            let serving = hosts
                .iter()
                .filter(|h| {
                    h.routes.get("fixme").and_then(|r| r.digest.as_deref()) == Some(fixed.as_str())
                })
                .count();
            (serving == 2).then_some(())
        },
    )
    .await;
    b.client
        .goto(&format!("{base}/letters?route=fixme&reason=after+sleeping"))
        .await
        .unwrap();
    assert_eq!(
        b.client
            .find(Locator::Css("#matching"))
            .await
            .unwrap()
            .attr("data-count")
            .await
            .unwrap()
            .as_deref(),
        Some("4")
    );
    b.client
        .find(Locator::Css("#replay-all"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let confirm = text_of(b, "#confirm").await;
    assert!(confirm.contains("replay 4 dead letter(s)"), "{confirm}");
    browser.screenshot(&shots().join("confirm.png")).await;
    b.client
        .find(Locator::Css("#confirm-button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let summary = text_of(b, "#summary").await;
    assert!(summary.ends_with("4 replayed"), "{summary}");
    let results = b
        .client
        .find_all(Locator::Css("#results td.result"))
        .await
        .unwrap();
    assert_eq!(results.len(), 4);
    let big_row = format!("#results tr[data-sequence='{}']", big_letter.sequence);
    assert!(
        b.client.find(Locator::Css(&big_row)).await.is_err(),
        "the oversized letter is not replayed"
    );
    for r in results {
        assert_eq!(r.text().await.unwrap(), "replayed");
    }
    browser.screenshot(&shots().join("replayed.png")).await;
    env.wait_completed(
        "fixme",
        &["f0", "f1", "f2", HOSTILE_KEY],
        Duration::from_secs(120),
    )
    .await;
    // Exactly one output per replayed key.
    let outputs = env.outputs().await;
    for key in ["f0", "f1", "f2", HOSTILE_KEY] {
        let id = format!("{}#0", dedup_host::claim::key::encode("fixme", key));
        let n = outputs
            .iter()
            .filter(|m| {
                m.headers
                    .get("Nats-Msg-Id")
                    .is_some_and(|v| v.as_str() == id)
            })
            .count();
        assert_eq!(n, 1, "outputs of {key}");
    }
    // The oversized letter did not match the filter: not replayed, and every letter stays.
    assert_eq!(env.messages(DEAD).await.len(), 5);

    // The activity page lists the replay: who, what, how many.
    b.client.goto(&format!("{base}/activity")).await.unwrap();
    let first = text_of(b, "#activity tbody tr").await;
    assert!(
        first.contains("replay")
            && first.contains("console token@")
            && first.contains("4 replayed"),
        "{first}"
    );
    browser.screenshot(&shots().join("activity.png")).await;

    // The audit from the page (its form posts): no anomaly.
    b.client.goto(&format!("{base}/audit")).await.unwrap();
    b.client
        .find(Locator::Css("#run-audit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let anomalies = text_of(b, "#anomaly-count").await;
    if anomalies != "0" {
        panic!(
            "the audit found anomalies: {}",
            text_of(b, "#anomalies").await
        );
    }
    browser.screenshot(&shots().join("audit.png")).await;
    // The route's own page and the deploys page (routes served from files: no candidates here,
    // see deploys::console for them).
    b.client
        .goto(&format!("{base}/routes/fixme"))
        .await
        .unwrap();
    let history = text_of(b, "main").await;
    assert!(
        history.contains("Recent dead letters") && history.contains("Config"),
        "{history}"
    );
    browser.screenshot(&shots().join("route.png")).await;
    b.client.goto(&format!("{base}/deploys")).await.unwrap();
    assert!(text_of(b, "main").await.contains("Served from the file"));
    browser.screenshot(&shots().join("deploys.png")).await;
    browser.close().await;
    drop(console_process);
    stop_gracefully(a);
    stop_gracefully(b_host);
}

#[test]
fn a_console_on_a_network_address_without_a_token_exits_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[nats]\nurls = [\"nats://127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n",
    )
    .unwrap();
    let out = Command::new(host_binary())
        .args(["console", "--addr", "0.0.0.0:0", "--config"])
        .arg(&config)
        .env_remove("DEDUP_CONSOLE_TOKEN")
        .output()
        .expect("run dedup-host console");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("0.0.0.0:0, which is not a loopback address")
            && stderr.contains("DEDUP_CONSOLE_TOKEN"),
        "{stderr}"
    );
}
