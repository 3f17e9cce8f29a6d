//! `--wait` waits for what it says (issue 46): every live host running the candidate in the
//! asked mode, not only its digest (a host still running it in shadow has not taken a canary).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;

/// Keeps host `name`'s status entry fresh, as it is, while the host is stopped: a live host
/// that is slow to take a change.
fn keep_fresh(d: &Deployment, name: &str, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let js = d.env.js.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        let kv = js.get_key_value("dedup-hosts-EVENTS").await.unwrap();
        while !stop.load(Ordering::SeqCst) {
            let bytes = kv.get(&name).await.unwrap().expect("the host's status");
            let mut entry: status::HostStatus = serde_json::from_slice(&bytes).unwrap();
            entry.updated_ms = dedup_host::claim::record::now_ms();
            kv.put(&name, serde_json::to_vec(&entry).unwrap().into())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// What host `name` reports running beside the live version.
async fn candidate_of(d: &Deployment, name: &str) -> Option<String> {
    let kv = d.env.js.get_key_value("dedup-hosts-EVENTS").await.unwrap();
    let all = status::read_all(&kv).await.unwrap();
    let host = all.iter().find(|h| h.instance_id == name)?;
    host.routes.get("ledger")?.candidate.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_wait_returns_only_once_every_live_host_runs_the_candidate_in_the_asked_mode() {
    let d = Deployment::start(&["host-a", "host-b"]).await;
    let next = path("ledger-next");
    let digest = dedup_host::runtime::digest(&std::fs::read(guest("ledger-next")).unwrap());
    let shadow = ok(
        &d.config,
        &[
            "deploy", "--route", "ledger", "--shadow", &next, "--wait", "60s",
        ],
    );
    assert!(
        shadow.contains(&format!(
            "all 2 live host(s) have candidate {digest} shadow"
        )),
        "{shadow}"
    );

    // host-b is live (its status stays fresh) but takes no change: the same digest as a
    // canary is not in effect everywhere, so the wait runs out naming host-b.
    signal(&d.hosts["host-b"], "-STOP");
    let stop = Arc::new(AtomicBool::new(false));
    let refresher = keep_fresh(&d, "host-b", stop.clone());
    let canary = ["deploy", "--route", "ledger", "--canary", "20%", &next];
    let (success, text) = cli(&d.config, &[&canary[..], &["--wait", "15s"]].concat());
    assert!(
        !success,
        "returned while host-b still runs the candidate in shadow: {text}"
    );
    assert!(
        text.contains("\"host-b\"") && text.contains(&format!("candidate {digest} canary 20%")),
        "{text}"
    );
    assert_eq!(
        candidate_of(&d, "host-b").await,
        Some(format!("{digest} shadow"))
    );
    stop.store(true, Ordering::SeqCst);
    refresher.await.unwrap();
    signal(&d.hosts["host-b"], "-CONT");
    // Live again by its own status (the refresher's entry goes stale meanwhile): it has taken
    // the 20 % canary. On a busy machine a resumed host can take seconds to write it, and a
    // wait that began before would count one live host.
    wait_for(
        Duration::from_secs(60),
        "host-b to take the canary",
        || async {
            let now = candidate_of(&d, "host-b").await?;
            (now == format!("{digest} canary 20%")).then_some(())
        },
    )
    .await;

    // A change of share: when the wait returns, both hosts run the new share.
    let wider = ok(
        &d.config,
        &[
            "deploy", "--route", "ledger", "--canary", "30%", &next, "--wait", "60s",
        ],
    );
    assert!(wider.contains("all 2 live host(s)"), "{wider}");
    for host in ["host-a", "host-b"] {
        assert_eq!(
            candidate_of(&d, host).await,
            Some(format!("{digest} canary 30%")),
            "{host}: {wider}"
        );
    }
    d.stop();
}

/// Every host's status is listed while the hosts rewrite it: `--wait` counts the live hosts
/// from this listing, and a host missing from one read made `deploy --wait` answer "all 1 live
/// host(s)" with two running (`Store::keys()` missed a key rewritten during the listing in
/// about two listings of five; `dedup_host::kv_keys`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_host_is_listed_while_the_hosts_rewrite_their_status() {
    let env = TestEnv::start().await;
    let kv = status::open(&env.js, &dedup_host::config::Config::default())
        .await
        .unwrap();
    let hosts = ["host-a", "host-b"];
    let status_of = |name: &str| {
        let entry = status::HostStatus {
            instance_id: name.to_string(),
            updated_ms: dedup_host::claim::record::now_ms(),
            routes: BTreeMap::new(),
            config_refused: None,
        };
        bytes::Bytes::from(serde_json::to_vec(&entry).unwrap())
    };
    // Both hosts are in the bucket before the first listing: on a busy machine the writers
    // below may not have run yet when it is read.
    for name in hosts {
        kv.put(name, status_of(name)).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = hosts
        .iter()
        .map(|name| {
            let (kv, stop, name) = (kv.clone(), stop.clone(), name.to_string());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    kv.put(&name, status_of(&name)).await.unwrap();
                }
            })
        })
        .collect();
    let mut short = BTreeMap::<Vec<String>, usize>::new();
    for _ in 0..300 {
        let mut listed: Vec<String> = (status::read_all(&kv).await.unwrap().into_iter())
            .map(|h| h.instance_id)
            .collect();
        listed.sort();
        if listed != hosts {
            *short.entry(listed).or_default() += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        short.is_empty(),
        "listings that missed a host (listed: how many times): {short:?}"
    );
}
