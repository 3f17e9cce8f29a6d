//! Fenced effects: a route's outputs and its completed claim record are one atomic batch on
//! the output stream, which the server refuses if the claim moved. Every test runs with a 1 s
//! duplicate window on the output stream, so that no window can hide a second output set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_host::bindings::Output;
use dedup_host::claim::host::HostClaimStore;
use dedup_host::claim::kv::KvClaimStore;
use dedup_host::claim::{key, ClaimOutcome, ClaimState, Claimer, LeaseLost};
use dedup_host::fenced;
use dedup_host_tests::harness::{signal, stop_gracefully, wait_for, TestEnv, Timing, OUTPUTS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A fenced route of the `flaky` guest, succeeding at once with `outputs` outputs on
/// `in.fan.<key>.done` after `work_ms`.
fn route(outputs: u32, work_ms: u32) -> String {
    format!(
        r#"
[[routes]]
name = "fan"
subject = "in.fan.*"
component = "{{guest:flaky}}"
key = {{ subject_token = 2 }}
allowed_outputs = ["in.fan.*.done"]
effects = "fenced"
config = {{ succeed_on_attempt = "1", outputs = "{outputs}", work_ms = "{work_ms}" }}
"#
    )
}

async fn fenced_env() -> TestEnv {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    env
}

/// How many outputs each key has in the output stream.
async fn sets(env: &TestEnv) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for m in env.outputs().await {
        let key = m.subject.split('.').nth(2).unwrap_or_default().to_string();
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// Waits until the output stream's last sequence has not moved for 300 ms.
async fn settled(env: &TestEnv) {
    let last = || async {
        let mut stream = env.js.get_stream(OUTPUTS).await.expect("output stream");
        stream
            .info()
            .await
            .expect("stream info")
            .state
            .last_sequence
    };
    let mut seen = last().await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = last().await;
        if now == seen {
            return;
        }
        seen = now;
    }
}

fn outputs(n: usize, tag: &str) -> Vec<Output> {
    (0..n)
        .map(|i| Output {
            subject: "in.fan.k1.done".into(),
            payload: format!("{tag} {i}").into_bytes(),
            headers: Vec::new(),
        })
        .collect()
}

/// The mechanism itself, without heartbeats: an owner whose lease was reclaimed and
/// completed by another commits late, and the server refuses the whole batch, now and after
/// the duplicate window has long passed.
#[tokio::test]
async fn the_server_refuses_a_stale_owners_commit_at_any_time() {
    let env = fenced_env().await;
    let config = env.config(&Timing::default(), &route(3, 0));
    let setup = dedup_host::setup::ensure(&env.js, &config).await.unwrap();
    let store = Arc::new(HostClaimStore::new(
        KvClaimStore::new(setup.claims),
        env.js.clone(),
    ));
    let claimer = |owner: &str| {
        Claimer::new(
            store.clone(),
            owner,
            Duration::from_millis(300),
            Duration::ZERO,
        )
    };
    let (stale, fresh) = (claimer("stale"), claimer("fresh"));
    let subject = fenced::claim_subject(OUTPUTS, &key::encode("fan", "k1"));
    let ClaimOutcome::Acquired(old) = stale.claim(&subject, "d").await.unwrap() else {
        panic!("the first claim wins")
    };
    // The stale owner is paused past its lease; another takes the key over and completes it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ClaimOutcome::Acquired(new) = fresh.claim(&subject, "d").await.unwrap() else {
        panic!("a lapsed lease is reclaimed")
    };
    let theirs = outputs(3, "fresh");
    new.complete_with(3, |record, revision| {
        let (js, subject, theirs) = (&env.js, &subject, &theirs);
        async move {
            fenced::commit::commit(js, subject, "fan.k.k1", &record, revision, theirs, &[]).await
        }
    })
    .await
    .expect("the owner's commit lands");

    // The stale owner resumes and commits: refused, now and long after the window.
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        tokio::time::sleep(wait).await;
        let mine = outputs(3, "stale");
        let refused = old
            .complete_with(3, |record, revision| {
                let (js, subject, mine) = (&env.js, &subject, &mine);
                async move {
                    fenced::commit::commit(js, subject, "fan.k.k1", &record, revision, mine, &[])
                        .await
                }
            })
            .await;
        assert!(
            matches!(refused, Err(LeaseLost::Reclaimed)),
            "stale commit must be refused: {refused:?}"
        );
    }
    // A stale lease object says so without asking again; ask the server with a new one too.
    let (record, revision) = env.fenced_claim("fan", "k1").await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_str()),
        (ClaimState::Completed, "fresh")
    );
    assert_eq!(record.batch_outputs, Some(3));
    let late = outputs(3, "late");
    let refused = fenced::commit::commit(
        &env.js,
        &subject,
        "fan.k.k1",
        &record,
        revision - 1,
        &late,
        &[],
    )
    .await;
    assert!(
        matches!(refused, Err(dedup_host::claim::ClaimError::Conflict)),
        "a batch expecting an old revision is refused: {refused:?}"
    );
    let stored = env.outputs().await;
    let payloads: Vec<String> = stored
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(payloads, ["fresh 0", "fresh 1", "fresh 2"]);
    // The outputs are the sequences right before the record's own.
    let sequences: Vec<u64> = stored.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [revision - 3, revision - 2, revision - 1]);
}

/// A success without outputs is the completed record alone (no batch: at one replica on file
/// storage the server would stage it in a file store of its own), fenced the same way: the
/// owner's lands, a stale owner's is refused.
#[tokio::test]
async fn a_commit_without_outputs_is_the_record_alone_and_fenced_the_same() {
    let env = fenced_env().await;
    let config = env.config(&Timing::default(), &route(0, 0));
    let setup = dedup_host::setup::ensure(&env.js, &config).await.unwrap();
    let store = Arc::new(HostClaimStore::new(
        KvClaimStore::new(setup.claims),
        env.js.clone(),
    ));
    let ttl = Duration::from_millis(300);
    let stale = Claimer::new(store.clone(), "stale", ttl, Duration::ZERO);
    let fresh = Claimer::new(store.clone(), "fresh", ttl, Duration::ZERO);
    let subject = fenced::claim_subject(OUTPUTS, &key::encode("fan", "k0"));
    let ClaimOutcome::Acquired(old) = stale.claim(&subject, "d").await.unwrap() else {
        panic!("the first claim wins")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ClaimOutcome::Acquired(new) = fresh.claim(&subject, "d").await.unwrap() else {
        panic!("a lapsed lease is reclaimed")
    };
    let commit = |lease: Box<dedup_host::claim::Lease<HostClaimStore>>| {
        let (js, subject) = (env.js.clone(), subject.clone());
        async move {
            lease
                .complete_with(0, |record, revision| async move {
                    fenced::commit::commit(&js, &subject, "fan.k.k0", &record, revision, &[], &[])
                        .await
                })
                .await
        }
    };
    commit(new).await.expect("the owner's record lands");
    let refused = commit(old).await;
    assert!(
        matches!(refused, Err(LeaseLost::Reclaimed)),
        "a stale owner's record is refused: {refused:?}"
    );
    let (record, revision) = env.fenced_claim("fan", "k0").await.unwrap();
    assert_eq!(
        (record.state, record.owner.as_str(), record.batch_outputs),
        (ClaimState::Completed, "fresh", Some(0))
    );
    let stored = env
        .js
        .get_stream(OUTPUTS)
        .await
        .unwrap()
        .get_raw_message(revision)
        .await
        .unwrap();
    let headers = stored.headers;
    assert!(
        headers.get(fenced::commit::headers::BATCH_ID).is_none(),
        "no batch: {headers:?}"
    );
    assert!(env.outputs().await.is_empty());
}

/// Claim subjects keep at most two records, as a claim bucket with history 2 does: a
/// heartbeat's renewal replaces what came before it, and the commit leaves the record it
/// replaces beside the completion (it purges nothing); readers see the completion.
#[tokio::test]
async fn a_claim_subject_keeps_at_most_two_records_and_the_commit_purges_nothing() {
    let env = fenced_env().await;
    // k-slow runs through several heartbeats (300 ms), k-fast through none.
    let host = env.host(&Timing::default(), &route(1, 1200), "h").await;
    env.publish("in.fan.k-slow", "k-slow", &[], "x").await;
    env.wait_completed("fan", &["k-slow"], Duration::from_secs(30))
        .await;
    host.shutdown().await.unwrap();
    let host = env.host(&Timing::default(), &route(1, 0), "h").await;
    env.publish("in.fan.k-fast", "k-fast", &[], "x").await;
    env.wait_completed("fan", &["k-fast"], Duration::from_secs(30))
        .await;
    host.shutdown().await.unwrap();

    let stream = env.js.get_stream(OUTPUTS).await.unwrap();
    for k in ["k-slow", "k-fast"] {
        let subject = fenced::claim_subject(OUTPUTS, &key::encode("fan", k));
        let mut counts = stream.info_with_subjects(subject.clone()).await.unwrap();
        let mut held = 0;
        while let Some(entry) = futures::StreamExt::next(&mut counts).await {
            held += entry.unwrap().1;
        }
        assert_eq!(held, 2, "`{k}`: the completion and the record before it");
        let (record, revision) = env.fenced_claim("fan", k).await.unwrap();
        assert_eq!(
            (record.state, record.owner.as_str()),
            (ClaimState::Completed, "h")
        );
        let stored = stream.get_raw_message(revision).await.unwrap();
        assert!(
            stored
                .headers
                .get(dedup_host::claim::stream::ROLLUP)
                .is_none(),
            "`{k}`: the commit purges nothing: {:?}",
            stored.headers
        );
    }
    assert_eq!(sets(&env).await.len(), 2, "one output per key");
}

/// A host process frozen mid-run until another host has reclaimed and completed the key:
/// when it resumes, nothing of its attempt is stored, whatever the 1 s window says.
#[tokio::test]
async fn a_host_frozen_past_its_lease_stores_nothing_when_it_resumes() {
    let env = fenced_env().await;
    let timing = Timing::default();
    let routes = route(3, 1500);
    let stale = env.host_process(&timing, &routes, "stale").await;
    env.publish("in.fan.k1", "k1", &[], "x").await;
    wait_for(Duration::from_secs(20), "stale to claim k1", || async {
        env.claim("fan", "k1")
            .await
            .filter(|r| r.owner == "stale" && r.state == ClaimState::InProgress)
    })
    .await;
    signal(&stale, "-STOP");
    let host = env.host(&timing, &routes, "fresh").await;
    env.wait_completed("fan", &["k1"], Duration::from_secs(30))
        .await;
    let record = env.claim("fan", "k1").await.unwrap();
    assert_eq!(record.owner, "fresh");
    // Past the output stream's duplicate window before the stale owner resumes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(&stale, "-CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = stop_gracefully(stale);
    assert_eq!(stats.lost_claims, 1, "{stats:?}");
    assert_eq!(
        (stats.processed, stats.outputs_published),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(
        env.claim("fan", "k1").await.unwrap(),
        record,
        "the stale owner wrote nothing"
    );
    let stored = env.outputs().await;
    assert_eq!(stored.len(), 3, "one output set");
    let token = format!("token {}", record.fencing_token.unwrap());
    for m in &stored {
        let payload = String::from_utf8_lossy(&m.payload);
        assert!(
            payload.ends_with(&token),
            "`{payload}` is the new owner's ({token})"
        );
    }
    env.wait_drained(Duration::from_secs(10)).await;
    host.shutdown().await.unwrap();
}

/// A TCP proxy to `upstream` that, the first time a client sends a batch commit, forwards it
/// and then drops the connection without passing the server's answer back.
async fn commit_cutting_proxy(upstream: String) -> (String, Arc<AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("nats://{}", listener.local_addr().unwrap());
    let cut = Arc::new(AtomicBool::new(false));
    let done = cut.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            tokio::spawn(pump(client, server, done.clone()));
        }
    });
    (url, cut)
}

async fn pump(client: tokio::net::TcpStream, server: tokio::net::TcpStream, cut: Arc<AtomicBool>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cutting = Arc::new(AtomicBool::new(false));
    let mute = cutting.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = server_rx.read(&mut buf).await {
            if n == 0 || mute.load(Ordering::SeqCst) {
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = client_rx.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let commit = buf[..n].windows(17).any(|w| w == b"Nats-Batch-Commit");
        if commit && !cut.swap(true, Ordering::SeqCst) {
            // The answer must never reach the client; the commit itself must reach the server.
            cutting.store(true, Ordering::SeqCst);
            let _ = server_tx.write_all(&buf[..n]).await;
            let deadline = Instant::now() + Duration::from_millis(100);
            while let Ok(Ok(n)) =
                tokio::time::timeout_at(deadline.into(), client_rx.read(&mut buf)).await
            {
                if n == 0 || server_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            break;
        }
        if server_tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    down.abort();
}

/// A commit whose answer is lost with the connection is recognized afterwards by its record
/// (owner, nonce, time): the key is completed on the first attempt, with one output set.
#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_recognized_without_a_second_set() {
    let env = fenced_env().await;
    let timing = Timing::default();
    let upstream = env.server().url().trim_start_matches("nats://").to_string();
    let (url, cut) = commit_cutting_proxy(upstream).await;
    let mut config = env.config(&timing, &route(3, 0));
    config.nats.urls = vec![url];
    config.host.instance_id = Some("cut".into());
    let host = dedup_host::serve::start(config).await.unwrap();
    env.publish("in.fan.k1", "k1", &[], "x").await;
    env.wait_completed("fan", &["k1"], Duration::from_secs(30))
        .await;
    assert!(
        cut.load(Ordering::SeqCst),
        "the proxy cut the commit's connection"
    );
    let record = env.claim("fan", "k1").await.unwrap();
    assert_eq!(
        (record.owner.as_str(), record.attempt, record.batch_outputs),
        ("cut", 1, Some(3)),
        "the first commit landed and was recognized: no second attempt"
    );
    env.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(sets(&env).await, HashMap::from([("k1".to_string(), 3)]));
    host.shutdown().await.unwrap();
}

/// A message with 50 outputs, its host killed with -9 at random points again and again:
/// between kills, every key has all 50 outputs or none, and in the end exactly 50.
#[tokio::test]
async fn fifty_outputs_land_all_or_nothing_across_many_kills() {
    const KEYS: usize = 150;
    let env = fenced_env().await;
    let timing = Timing::default();
    // Long enough that the work spans several kills.
    let routes = route(50, 40);
    let config = env.config(&timing, &routes);
    dedup_host::setup::ensure(&env.js, &config).await.unwrap();
    for k in 0..KEYS {
        env.publish(&format!("in.fan.k{k}"), &format!("k{k}"), &[], "x")
            .await;
    }
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let (mut partial_seen, mut progress) = (Vec::new(), Vec::new());
    for round in 0..8 {
        let mut victim = env
            .host_process(&timing, &routes, &format!("victim-{round}"))
            .await;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(50 + seed % 400)).await;
        victim.kill().expect("kill -9");
        let _ = victim.wait();
        // A commit the victim sent just before dying may still be being applied: count what
        // landed once the stream stops growing, not a batch half-way through its application.
        settled(&env).await;
        let counts = sets(&env).await;
        progress.push(counts.len());
        partial_seen.extend(
            counts
                .iter()
                .filter(|(_, n)| **n != 50)
                .map(|(k, n)| (round, k.clone(), *n)),
        );
    }
    assert!(
        partial_seen.is_empty(),
        "partial output sets: {partial_seen:?}"
    );
    let host = env.host(&timing, &routes, "finisher").await;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // A generous deadline: one host finishes every key left by the kills (fifty outputs each,
    // after the victims' leases lapse), which takes minutes on a loaded machine.
    env.wait_completed("fan", &keys, Duration::from_secs(240))
        .await;
    env.wait_drained(Duration::from_secs(60)).await;
    let counts = sets(&env).await;
    assert_eq!(counts.len(), KEYS, "{counts:?}");
    assert!(counts.values().all(|n| *n == 50), "{counts:?}");
    for k in &keys {
        let record = env.claim("fan", k).await.unwrap();
        assert_eq!(record.batch_outputs, Some(50));
    }
    host.shutdown().await.unwrap();
}

/// The fenced stream loses its quorum while the handler runs, so the commit fails; the key
/// runs again once the nodes are back, long after the 1 s window, and the downstream still
/// sees one output set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_failed_by_a_leader_outage_is_never_doubled() {
    let mut env = TestEnv::start_cluster().await;
    env.fenced_outputs = true;
    let timing = Timing::default();
    let routes = route(3, 1500);
    let mut host = env.host_process(&timing, &routes, "first").await;
    env.publish("in.fan.k1", "k1", &[], "x").await;
    wait_for(Duration::from_secs(20), "first to claim k1", || async {
        env.claim("fan", "k1")
            .await
            .filter(|r| r.owner == "first" && r.state == ClaimState::InProgress)
    })
    .await;
    let outage = Instant::now();
    env.servers.nodes[1].kill();
    env.servers.nodes[2].kill();
    tokio::time::sleep(Duration::from_secs(6)).await;
    env.servers.nodes[1].restart();
    env.servers.nodes[2].restart();
    env.wait_completed("fan", &["k1"], Duration::from_secs(90))
        .await;
    let record = env.claim("fan", "k1").await.unwrap();
    println!(
        "completed {:?} after the outage began, attempt {}, by {}",
        outage.elapsed(),
        record.attempt,
        record.owner
    );
    assert!(outage.elapsed() > Duration::from_secs(6));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sets(&env).await, HashMap::from([("k1".to_string(), 3)]));
    let token = format!("token {}", record.fencing_token.unwrap());
    for m in env.outputs().await {
        let payload = String::from_utf8_lossy(&m.payload).into_owned();
        assert!(
            payload.ends_with(&token),
            "`{payload}` is the recorded owner's ({token})"
        );
    }
    let _ = host.kill();
    let _ = host.wait();
}
