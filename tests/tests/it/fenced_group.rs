//! Group commit of fenced routes (host/src/fenced/group.rs): the commits of several messages
//! sent as one atomic batch, each still fenced by its own claim. The output stream has a 1 s
//! duplicate window, so no window can hide a second output set.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use dedup_host::bindings::Output;
use dedup_host::claim::host::HostClaimStore;
use dedup_host::claim::kv::KvClaimStore;
use dedup_host::claim::{key, ClaimError, ClaimOutcome, ClaimRecord, ClaimState, Claimer};
use dedup_host::fenced::commit::{headers, prepare, BatchMessage};
use dedup_host::fenced::{self, group};
use dedup_host::metrics::{BatchResult, Metrics};
use dedup_host_tests::harness::{TestEnv, Timing, OUTPUTS};

const ROUTE: &str = r#"
[[routes]]
name = "fan"
subject = "in.fan.*"
component = "{guest:flaky}"
key = { subject_token = 2 }
allowed_outputs = ["in.fan.*.done"]
effects = "fenced"
"#;

/// The claim store of route `fan`'s fenced claims (set up once per test).
async fn claim_store(env: &TestEnv) -> Arc<HostClaimStore> {
    let config = env.config(&Timing::default(), ROUTE);
    let setup = dedup_host::setup::ensure(&env.js, &config).await.unwrap();
    Arc::new(HostClaimStore::new(
        KvClaimStore::new(setup.claims),
        env.js.clone(),
    ))
}

/// Claims `keys` of route `fan` as owner `a` (300 ms leases) and returns each claim's record
/// and revision as `a` holds it.
async fn claimed(
    env: &TestEnv,
    store: &Arc<HostClaimStore>,
    keys: &[String],
) -> Vec<(ClaimRecord, u64)> {
    let owner = Claimer::new(
        store.clone(),
        "a",
        Duration::from_millis(300),
        Duration::ZERO,
    );
    let mut held = Vec::new();
    for k in keys {
        let subject = fenced::claim_subject(OUTPUTS, &key::encode("fan", k));
        let ClaimOutcome::Acquired(_) = owner.claim(&subject, "d").await.unwrap() else {
            panic!("a fresh key is acquired")
        };
        held.push(env.fenced_claim("fan", k).await.expect("claimed"));
    }
    held
}

/// One commit of key `k` completing `record` over `revision`, with two outputs.
fn completion(k: &str, record: &ClaimRecord, revision: u64) -> Vec<BatchMessage> {
    let mut done = record.clone();
    done.state = ClaimState::Completed;
    done.batch_outputs = Some(2);
    let outputs: Vec<Output> = (0..2)
        .map(|i| Output {
            subject: format!("in.fan.{k}.done"),
            payload: format!("{k} {i}").into_bytes(),
            headers: Vec::new(),
        })
        .collect();
    let claim_key = key::encode("fan", k);
    let subject = fenced::claim_subject(OUTPUTS, &claim_key);
    prepare((&subject, &claim_key), &done, revision, &outputs, &[])
}

/// Every stored output's key, with the sequences of its outputs.
async fn stored(env: &TestEnv) -> HashMap<String, Vec<u64>> {
    let mut by_key: HashMap<String, Vec<u64>> = HashMap::new();
    for m in env.outputs().await {
        let k = m.subject.split('.').nth(2).unwrap_or_default().to_string();
        by_key.entry(k).or_default().push(m.sequence);
    }
    by_key
}

/// A group with one stale member (its claim was reclaimed by another owner): the server
/// refuses the whole batch, each member is sent again alone, the fresh ones land with their
/// outputs right before their records, and the stale one stores nothing.
#[tokio::test]
async fn a_stale_member_costs_the_group_a_retry_and_stores_nothing_itself() {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    let keys: Vec<String> = (1..=5).map(|i| format!("k{i}")).collect();
    let store = claim_store(&env).await;
    let held = claimed(&env, &store, &keys).await;
    // Owner `a` is paused past its lease on k3; `b` reclaims it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let other = Claimer::new(store, "b", Duration::from_secs(30), Duration::ZERO);
    let k3 = fenced::claim_subject(OUTPUTS, &key::encode("fan", "k3"));
    let ClaimOutcome::Acquired(_) = other.claim(&k3, "d").await.unwrap() else {
        panic!("a lapsed lease is reclaimed")
    };

    let commits = keys
        .iter()
        .zip(&held)
        .map(|(k, (record, revision))| completion(k, record, *revision))
        .collect();
    let (result, answers) = group::commit_group(&env.js, commits).await;
    assert_eq!(result, BatchResult::Refused);

    let outputs = stored(&env).await;
    for (k, answer) in keys.iter().zip(answers) {
        if k == "k3" {
            assert!(
                matches!(answer, Err(ClaimError::Conflict)),
                "the stale member is refused: {answer:?}"
            );
            assert!(!outputs.contains_key(k), "nothing of the stale member");
            let (record, _) = env.fenced_claim("fan", k).await.unwrap();
            assert_eq!(
                (record.state, record.owner.as_str()),
                (ClaimState::InProgress, "b")
            );
            continue;
        }
        let sequence = answer.expect("a fresh member lands");
        let (record, revision) = env.fenced_claim("fan", k).await.unwrap();
        assert_eq!((record.state, revision), (ClaimState::Completed, sequence));
        assert_eq!(outputs[k], [sequence - 2, sequence - 1], "{k}'s outputs");
    }
}

/// Commits arriving together from many messages go out in fewer batches than commits, and
/// each answer is its own record's sequence, with its own outputs right before it.
#[tokio::test]
async fn commits_arriving_together_share_batches_and_each_gets_its_own_sequence() {
    let mut env = TestEnv::start().await;
    env.fenced_outputs = true;
    let keys: Vec<String> = (1..=40).map(|i| format!("g{i}")).collect();
    let held = claimed(&env, &claim_store(&env).await, &keys).await;
    let metrics = Metrics::new();
    let commits = group::GroupCommits::new(env.js.clone(), metrics.batches());
    let sent = keys.iter().zip(&held).map(|(k, (record, revision))| {
        let left = Duration::from_secs(60); // a lease that does not lapse meanwhile
        commits.commit(OUTPUTS, completion(k, record, *revision), left)
    });
    let answers = futures::future::join_all(sent).await;

    let outputs = stored(&env).await;
    let stream = env.js.get_stream(OUTPUTS).await.unwrap();
    let mut batches = HashSet::new();
    for (k, answer) in keys.iter().zip(answers) {
        let sequence = answer.expect("every commit lands");
        let (record, revision) = env.fenced_claim("fan", k).await.unwrap();
        assert_eq!((record.state, revision), (ClaimState::Completed, sequence));
        assert_eq!(outputs[k], [sequence - 2, sequence - 1], "{k}'s outputs");
        let message = stream.get_raw_message(sequence).await.unwrap();
        let id = message.headers.get(headers::BATCH_ID).expect("a batch");
        batches.insert(id.to_string());
    }
    assert!(
        batches.len() < keys.len(),
        "{} commits went out in {} batches",
        keys.len(),
        batches.len()
    );
    // The series say the same: every batch committed, 40 commits in all.
    let text = metrics.encode();
    let series = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("`{name}` in:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let labels = format!("{{stream=\"{OUTPUTS}\"}}");
    assert_eq!(
        series(&format!("dedup_fenced_batch_commits_sum{labels}")),
        40.0
    );
    assert_eq!(
        series(&format!("dedup_fenced_batch_commits_count{labels}")),
        batches.len() as f64
    );
    let committed =
        format!("dedup_fenced_batches_total{{stream=\"{OUTPUTS}\",result=\"committed\"}}");
    assert_eq!(series(&committed), batches.len() as f64);
}
