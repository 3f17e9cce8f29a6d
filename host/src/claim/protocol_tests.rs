//! Unit tests of the claim protocol on the in-memory store.
use super::*;
use crate::claim::memory::MemoryClaimStore;

fn claimer(store: &Arc<MemoryClaimStore>, owner: &str, lease_ms: u64) -> Claimer<MemoryClaimStore> {
    Claimer::new(
        store.clone(),
        owner,
        Duration::from_millis(lease_ms),
        Duration::from_millis(0),
    )
}

#[tokio::test]
async fn first_claim_wins_and_others_see_busy_then_completed() {
    let store = Arc::new(MemoryClaimStore::new());
    let (a, b) = (claimer(&store, "a", 10_000), claimer(&store, "b", 10_000));
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!("a must win")
    };
    assert_eq!(lease.attempt(), 1);
    assert!(matches!(
        b.claim("k", "d").await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
    lease.complete(Vec::new()).await.unwrap();
    assert!(matches!(
        b.claim("k", "d").await.unwrap(),
        ClaimOutcome::Completed
    ));
}

#[tokio::test]
async fn a_lapsed_lease_is_reclaimed_and_the_stale_owner_cannot_write() {
    let store = Arc::new(MemoryClaimStore::new());
    let (a, b) = (claimer(&store, "a", 50), claimer(&store, "b", 10_000));
    let ClaimOutcome::Acquired(stale) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(80)).await;
    let ClaimOutcome::Acquired(fresh) = b.claim("k", "d").await.unwrap() else {
        panic!("b reclaims")
    };
    assert_eq!(fresh.attempt(), 2);
    assert!(fresh.fencing_token() > stale.fencing_token());
    assert!(matches!(stale.confirm().await, Err(LeaseLost::Reclaimed)));
    assert!(matches!(
        stale.complete(Vec::new()).await,
        Err(LeaseLost::Reclaimed)
    ));
    fresh.complete(Vec::new()).await.unwrap();
}

#[tokio::test]
async fn failed_keys_are_reclaimed_with_the_next_attempt_and_permanent_ones_are_not() {
    let store = Arc::new(MemoryClaimStore::new());
    let a = claimer(&store, "a", 10_000);
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    l.fail("boom", Duration::ZERO).await.unwrap();
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    assert_eq!(l.attempt(), 2);
    assert_eq!(l.previous_reason().await.as_deref(), Some("boom"));
    l.give_up("no").await.unwrap();
    assert!(matches!(
        a.claim("k", "d").await.unwrap(),
        ClaimOutcome::DeadLettered
    ));
}

/// A store whose writes land but whose next answer is lost, as on an R3 leader change.
struct LosesAnswers {
    inner: MemoryClaimStore,
    lose: std::sync::atomic::AtomicBool,
}

impl LosesAnswers {
    fn answer(&self, r: Result<u64, ClaimError>) -> Result<u64, ClaimError> {
        if self.lose.swap(false, std::sync::atomic::Ordering::SeqCst) {
            Err(ClaimError::Unavailable("timed out".into()))
        } else {
            r
        }
    }
}

impl ClaimStore for LosesAnswers {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        self.inner.get(key).await
    }
    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        let r = self.inner.create(key, record).await;
        self.answer(r)
    }
    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let r = self.inner.update(key, record, revision).await;
        self.answer(r)
    }
}

#[tokio::test]
async fn a_write_that_landed_without_an_answer_keeps_the_lease() {
    let store = Arc::new(LosesAnswers {
        inner: MemoryClaimStore::new(),
        lose: true.into(),
    });
    let a = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!("a create that landed is ours")
    };
    store.lose.store(true, std::sync::atomic::Ordering::SeqCst);
    lease
        .renew()
        .await
        .expect("a renewal that landed is adopted");
    lease
        .renew()
        .await
        .expect("and the next one uses its revision");
    store.lose.store(true, std::sync::atomic::Ordering::SeqCst);
    lease.complete(Vec::new()).await.unwrap();
    assert!(matches!(
        a.claim("k", "d").await.unwrap(),
        ClaimOutcome::Completed
    ));
}

#[tokio::test]
async fn a_failed_key_is_busy_until_its_backoff_and_a_release_counts_no_attempt() {
    let store = Arc::new(MemoryClaimStore::new());
    let a = claimer(&store, "a", 10_000);
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    l.fail("later", Duration::from_millis(300)).await.unwrap();
    let ClaimOutcome::Busy { retry_in } = a.claim("k", "d").await.unwrap() else {
        panic!("a failed key is not due before its backoff")
    };
    assert!(retry_in <= Duration::from_millis(300) && retry_in > Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(320)).await;
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!("due after the backoff")
    };
    assert_eq!(l.attempt(), 2);
    l.release("publish failed", Duration::ZERO).await.unwrap();
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    assert_eq!(l.attempt(), 2, "a release does not use up an attempt");
}
