//! Candidates seen and decided from the web console: a shadow's differences and samples on the
//! Deploys page, promoted there on every host, another aborted there, and each change in the
//! route's deploy history and the activity log beside the CLI's own deploys.

use dedup_host::config::ConsoleConfig;
use dedup_host::console::auth::Access;
use dedup_host_tests::console::{request, ConsoleProcess};

use super::*;

const TOKEN: &str = "deploys-console-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_candidate_is_compared_promoted_and_a_second_aborted_from_the_console() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let next = d.shadow_next().await;
    d.publish(0..40, |i| i64::from(i) + 1).await;
    d.wait_settled(40).await;
    wait_compared(&d.config, 40).await;

    let console = ConsoleProcess::start(&d.config, Some(TOKEN));
    let addr = console.addr;
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("Authorization", bearer.as_str())];
    let get = |path: &str| {
        let (status, page) = request(addr, "GET", path, &auth, "");
        assert_eq!(status, 200, "GET {path}: {page}");
        page
    };
    let csrf = Access::new(
        &ConsoleConfig {
            token: Some(TOKEN.into()),
            ..Default::default()
        },
        |_| None,
        addr,
    )
    .unwrap()
    .csrf();

    // The Deploys page: the candidate, its counts and a sample of each kind.
    let page = get("/deploys");
    assert!(page.contains(&next), "{page}");
    assert!(page.contains("outputs[0].payload/currency"), "{page}");
    let count = |name: &str| -> u64 {
        let cell = format!("<th>{name}</th><td class=\"num\">");
        let at = page
            .find(&cell)
            .unwrap_or_else(|| panic!("no `{name}` count: {page}"));
        let rest = &page[at + cell.len()..];
        rest[..rest.find('<').unwrap()].parse().unwrap()
    };
    assert!(
        count("compared") > 0 && count("differences") == count("compared"),
        "{page}"
    );

    // Promote: first the confirmation, then on every host.
    let form = format!(
        "route=ledger&digest={}&csrf={csrf}",
        next.replace(':', "%3A")
    );
    let (status, confirm) = request(addr, "POST", "/deploys/promote", &auth, &form);
    assert_eq!(status, 200, "{confirm}");
    assert!(
        confirm.contains("id=\"confirm\" data-count=\"1\""),
        "{confirm}"
    );
    let (status, done) = request(
        addr,
        "POST",
        "/deploys/promote",
        &auth,
        &format!("{form}&confirmed=yes"),
    );
    assert_eq!(status, 200);
    assert!(
        done.contains(&format!("every host now serves {next}")),
        "{done}"
    );
    d.wait_hosts(
        |r| r.digest.as_deref() == Some(next.as_str()) && r.candidate.is_none(),
        "every host serving the promoted version",
    )
    .await;

    // A second candidate, aborted from the console: every host drops it.
    let again = digest_of(&ok(
        &d.config,
        &["deploy", "--route", "ledger", "--shadow", &path("ledger")],
    ));
    d.wait_candidate(&again).await;
    let form = format!(
        "route=ledger&digest={}&csrf={csrf}&confirmed=yes",
        again.replace(':', "%3A")
    );
    let (status, done) = request(addr, "POST", "/deploys/abort", &auth, &form);
    assert_eq!(status, 200);
    assert!(
        done.contains("dropped; the live version runs every key"),
        "{done}"
    );
    d.wait_hosts(
        |r| r.candidate.is_none(),
        "every host dropping the candidate",
    )
    .await;

    // The route's deploy history and the activity log: the CLI's deploys and the console's
    // decisions, newest first.
    let history = get("/routes/ledger");
    let history = &history[history.find("Deploy history").expect("a deploy history")..];
    let rows: Vec<&str> = history.split("<tr>").skip(2).collect();
    assert!(rows.len() >= 4, "{history}");
    assert!(
        rows[0].contains("abort") && rows[0].contains("console token@"),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains("deploy") && rows[1].contains("cli "),
        "{}",
        rows[1]
    );
    assert!(
        rows[2].contains("promote") && rows[2].contains("console token@"),
        "{}",
        rows[2]
    );
    assert!(
        rows[3].contains("deploy") && rows[3].contains(&next),
        "{}",
        rows[3]
    );
    let activity = get("/activity");
    assert!(
        activity.contains("abort") && activity.contains("promote"),
        "{activity}"
    );
    drop(console);
    d.stop();
}
