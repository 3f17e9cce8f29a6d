//! Unit tests of the claim-after run on the in-memory store: what it does, in which order.

use std::sync::{Arc, Mutex};

use super::*;
use crate::claim::memory::MemoryClaimStore;
use crate::claim::ClaimState;

/// The nak delay of an outage in these tests.
const OUTAGE: Duration = Duration::from_secs(5);
/// The backoff after a failed attempt in these tests.
const BACKOFF: Duration = Duration::from_secs(1);

/// A claim-after delivery of key `k` whose handler does what it is given, logging its I/O.
struct Fake {
    claimer: Claimer<MemoryClaimStore>,
    handled: Mutex<Option<Handled<u32>>>,
    delivered: u64,
    publish_ok: bool,
    /// Another host settles the key while this one runs.
    settled_meanwhile: bool,
    /// Whether another version is still offered to the route's hosts.
    offered: bool,
    log: Mutex<Vec<String>>,
}

impl Fake {
    fn new(store: &Arc<MemoryClaimStore>, handled: Handled<u32>) -> Self {
        Self {
            claimer: claimer(store, "a"),
            handled: Mutex::new(Some(handled)),
            delivered: 1,
            publish_ok: true,
            settled_meanwhile: false,
            offered: false,
            log: Mutex::new(Vec::new()),
        }
    }

    fn note(&self, line: String) {
        self.log.lock().expect("log").push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

fn claimer(store: &Arc<MemoryClaimStore>, owner: &str) -> Claimer<MemoryClaimStore> {
    Claimer::new(
        store.clone(),
        owner,
        Duration::from_secs(10),
        Duration::ZERO,
    )
}

impl AfterDelivery for Fake {
    type Store = MemoryClaimStore;
    type Outputs = u32;

    fn claimer(&self) -> &Claimer<MemoryClaimStore> {
        &self.claimer
    }

    fn claim_key(&self) -> &str {
        "k"
    }

    fn fresh_from(&self) -> u64 {
        0
    }

    fn delivered(&self) -> u64 {
        self.delivered
    }

    fn digest(&self) -> &str {
        "d"
    }

    fn may_publish(&self) -> bool {
        true
    }

    fn count(&self, outcome: MessageOutcome) {
        self.note(format!("count {outcome:?}"));
    }

    fn hit(&self, layer: DedupLayer) {
        self.note(format!("hit {layer:?}"));
    }

    async fn settle(&self, how: Settlement) {
        self.note(format!("settle {how:?}"));
    }

    /// Notes the key's state as the settlement finds it.
    async fn settle_recorded(&self, how: Settlement) {
        let read = self.claimer.store().get("k").await.expect("read");
        let state = read.map(|(r, _)| (r.state, r.permanent));
        self.note(format!("recorded {how:?} with {state:?}"));
    }

    fn outage_delay(&self) -> Duration {
        OUTAGE
    }

    fn release_delay(&self) -> Duration {
        OUTAGE
    }

    fn pool_full_delay(&self) -> Duration {
        OUTAGE
    }

    fn retries(&self, _attempt: u32) -> Retries {
        Retries {
            max: 3,
            backoff: BACKOFF,
            max_backoff: BACKOFF,
        }
    }

    async fn unreadable(&self, reason: &str) {
        self.note(format!("unreadable {reason}"));
    }

    async fn invoke(&self, attempt: u32) -> Result<Handled<u32>, String> {
        self.note(format!("invoke {attempt}"));
        if self.settled_meanwhile {
            let other = claimer(self.claimer.store(), "b");
            let record = other.settled("d", 1, Ok(Vec::new()));
            assert!(other.create_settled("k", &record).await.expect("create"));
        }
        Ok(self.handled.lock().expect("handled").take().expect("once"))
    }

    fn oversized(&self, _outputs: &u32) -> Option<String> {
        None
    }

    async fn publish(&self, outputs: u32) -> Result<Vec<OutputRef>, String> {
        self.note(format!("publish {outputs}"));
        match self.publish_ok {
            true => Ok(Vec::new()),
            false => Err("refused".into()),
        }
    }

    async fn dead_letter(&self, reason: &str, attempt: u32) -> Result<(), LetterRefused> {
        self.note(format!("dead letter {reason} on {attempt}"));
        Ok(())
    }

    async fn offered(&self, _digest: &str) -> Result<bool, String> {
        Ok(self.offered)
    }

    fn jittered(&self, ceiling: Duration) -> Duration {
        ceiling
    }

    fn pinned_gone(&self, digest: &str) -> String {
        format!("{digest} is gone")
    }
}

/// Issue 42, finding 8: a publish that failed part-way names its version; a delivery of
/// another version does not finish the key: it waits while that version is offered, and
/// dead-letters the key, still pinned to it, once it is gone.
#[tokio::test]
async fn a_key_another_version_published_part_way_is_not_finished_by_this_one() {
    let store = Arc::new(MemoryClaimStore::new());
    let mark = claimer(&store, "b").publish_failed("old", 1, "refused".into());
    assert_eq!(mark.effects_by.as_deref(), Some("old"));
    assert!(claimer(&store, "b")
        .create_settled("k", &mark)
        .await
        .unwrap());
    let mut waiting = Fake::new(&store, Handled::Succeeded(1));
    waiting.offered = true;
    run(&waiting).await;
    let ceiling = crate::pinned::not_loaded_ceiling(1);
    assert_eq!(
        waiting.lines(),
        ["count Busy".to_string(), format!("settle Nak({ceiling:?})")]
    );
    let gone = Fake::new(&store, Handled::Succeeded(1));
    run(&gone).await;
    assert_eq!(gone.lines()[0], "dead letter old is gone on 1");
    let dead = record(&store).await;
    assert!(
        dead.state == ClaimState::Failed && dead.permanent,
        "{dead:?}"
    );
    assert_eq!(
        (dead.digest.as_str(), dead.effects_by.as_deref()),
        ("old", Some("old"))
    );
}

async fn record(store: &MemoryClaimStore) -> ClaimRecord {
    store.get("k").await.expect("read").expect("a record").0
}

/// Publish, then record completed, then ack: the ack finds the key completed.
#[tokio::test]
async fn a_success_publishes_then_records_completed_then_acks() {
    let store = Arc::new(MemoryClaimStore::new());
    let a = Fake::new(&store, Handled::Succeeded(2));
    run(&a).await;
    assert_eq!(
        a.lines(),
        [
            "invoke 1",
            "publish 2",
            "count Processed",
            "recorded Ack with Some((Completed, false))"
        ]
    );
}

/// A key completed already is acked without running.
#[tokio::test]
async fn a_key_completed_already_is_acked_without_running() {
    let store = Arc::new(MemoryClaimStore::new());
    let a = Fake::new(&store, Handled::Succeeded(1));
    let done = a.claimer.settled("d", 1, Ok(Vec::new()));
    assert!(a.claimer.create_settled("k", &done).await.unwrap());
    run(&a).await;
    assert_eq!(a.lines(), ["count Duplicate", "settle Ack"]);
}

/// Another host settled the key while this one ran: its write loses, the delivery is a
/// duplicate of that run, acked (its outputs carried the same ids).
#[tokio::test]
async fn a_host_that_finishes_second_counts_a_duplicate_and_acks() {
    let store = Arc::new(MemoryClaimStore::new());
    let mut a = Fake::new(&store, Handled::Succeeded(1));
    a.settled_meanwhile = true;
    run(&a).await;
    assert_eq!(
        a.lines(),
        [
            "invoke 1",
            "publish 1",
            "count Duplicate",
            "hit Claim",
            "recorded Ack with Some((Completed, false))"
        ]
    );
}

/// A publish that fails part-way marks the key (its window outputs may be stored) and naks
/// with the outage backoff; nothing is recorded as settled.
#[tokio::test]
async fn a_failed_publish_marks_the_key_and_naks() {
    let store = Arc::new(MemoryClaimStore::new());
    let mut a = Fake::new(&store, Handled::Succeeded(1));
    a.publish_ok = false;
    run(&a).await;
    assert_eq!(
        a.lines(),
        ["invoke 1", "publish 1", "count Error", "settle Nak(5s)"]
    );
    let r = record(&store).await;
    assert_eq!((r.state, r.permanent), (ClaimState::Failed, false));
    assert!(r.may_have_effects());
}

/// A failed publish is the infrastructure's failure: its mark spends no attempt, whatever the
/// delivery's number (a claim-before route counts the record's attempts after
/// `setup --change-route`: seed 6613 `--claim-after`).
#[tokio::test]
async fn a_failed_publish_marks_the_key_without_spending_an_attempt() {
    let store = Arc::new(MemoryClaimStore::new());
    let mut a = Fake::new(&store, Handled::Succeeded(1));
    a.publish_ok = false;
    a.delivered = 3;
    run(&a).await;
    assert_eq!(record(&store).await.attempt, 0);
}

/// A failed attempt before the last is naked after the backoff, with nothing recorded.
#[tokio::test]
async fn a_failed_attempt_is_retried_after_the_backoff() {
    let store = Arc::new(MemoryClaimStore::new());
    let retry = Handled::Retry {
        reason: "later".into(),
        delay: None,
    };
    let a = Fake::new(&store, retry);
    run(&a).await;
    assert_eq!(a.lines(), ["invoke 1", "count Retried", "settle Nak(1s)"]);
    assert!(store.get("k").await.unwrap().is_none());
}

/// The last allowed attempt's failure: dead-letter, record failed for good, then terminate.
#[tokio::test]
async fn the_last_failed_attempt_dead_letters_then_records_then_terminates() {
    let store = Arc::new(MemoryClaimStore::new());
    let retry = Handled::Retry {
        reason: "later".into(),
        delay: None,
    };
    let mut a = Fake::new(&store, retry);
    a.delivered = 3;
    run(&a).await;
    assert_eq!(
        a.lines(),
        [
            "invoke 3",
            "dead letter later (attempt 3 of 3, none left) on 3",
            "count DeadLettered",
            "recorded Term with Some((Failed, true))"
        ]
    );
}
