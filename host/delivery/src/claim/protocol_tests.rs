//! Unit tests of the claim protocol on the in-memory store.
use super::*;
use crate::claim::memory::MemoryClaimStore;
use crate::claim::LeaseLost;

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

/// A store where one update's answer is lost and the write lands only after the writer read
/// the key back (a late answer, or a read served by a lagging replica).
struct LandsLate {
    inner: MemoryClaimStore,
    delay_next: std::sync::atomic::AtomicBool,
    late: std::sync::Mutex<Option<(String, ClaimRecord, u64)>>,
    /// How many reads after the late write landed still see the key as it was before (a
    /// lagging replica).
    stale_reads: std::sync::atomic::AtomicU32,
    before: std::sync::Mutex<Option<(ClaimRecord, u64)>>,
}

impl ClaimStore for LandsLate {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        let read = self.inner.get(key).await;
        let late = self.late.lock().unwrap().take();
        if let Some((key, record, revision)) = late {
            *self.before.lock().unwrap() = read.as_ref().ok().cloned().flatten();
            self.inner.update(&key, &record, revision).await.unwrap();
            return read;
        }
        let stale = self.stale_reads.load(std::sync::atomic::Ordering::SeqCst);
        if stale > 0 && self.before.lock().unwrap().is_some() {
            self.stale_reads
                .store(stale - 1, std::sync::atomic::Ordering::SeqCst);
            return Ok(self.before.lock().unwrap().clone());
        }
        read
    }
    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        self.inner.create(key, record).await
    }
    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        if self
            .delay_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            *self.late.lock().unwrap() = Some((key.to_string(), record.clone(), revision));
            return Err(ClaimError::Unavailable("timed out".into()));
        }
        self.inner.update(key, record, revision).await
    }
}

/// Finding 7: a renewal that landed after its read-back left the lease at a stale revision,
/// so the next write conflicted and the host abandoned healthy work.
#[tokio::test]
async fn a_renewal_that_lands_after_its_read_back_keeps_the_lease() {
    renewal_landing_late_keeps_the_lease(0).await;
}

/// The simulation's finding (docs/src/how/simulation.md): after the conflict, the reads that should
/// show the late write come from a lagging replica. One stale read made the host give up a
/// healthy lease; reads at or below the revision held are now read again.
#[tokio::test]
async fn a_renewal_that_lands_late_keeps_the_lease_through_stale_reads() {
    renewal_landing_late_keeps_the_lease(2).await;
}

async fn renewal_landing_late_keeps_the_lease(stale_reads: u32) {
    let store = Arc::new(LandsLate {
        inner: MemoryClaimStore::new(),
        delay_next: false.into(),
        late: Default::default(),
        stale_reads: stale_reads.into(),
        before: Default::default(),
    });
    let a = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    store
        .delay_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(
        lease.renew().await,
        Err(LeaseLost::Unavailable(_))
    ));
    lease
        .renew()
        .await
        .expect("the late write is ours: its revision is adopted");
    lease.complete(Vec::new()).await.unwrap();
    assert!(matches!(
        a.claim("k", "d").await.unwrap(),
        ClaimOutcome::Completed
    ));
}

/// Finding 6: a coalesced key never ran, so a later message with its key runs (and is not a
/// further attempt); a completed one does not.
#[tokio::test]
async fn a_coalesced_key_runs_again_for_a_later_message() {
    let store = Arc::new(MemoryClaimStore::new());
    let a = claimer(&store, "a", 10_000);
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    l.coalesce().await.unwrap();
    let ClaimOutcome::Acquired(l) = a.claim("k", "d").await.unwrap() else {
        panic!("a coalesced key is claimed again")
    };
    assert_eq!(l.attempt(), 1, "coalescing used up no attempt");
    l.complete(Vec::new()).await.unwrap();
    assert!(matches!(
        a.claim("k", "d").await.unwrap(),
        ClaimOutcome::Completed
    ));
}

/// A coalesced key's own message, delivered again (its coalescing delivery's host paused past
/// the ack wait before acking), is a duplicate: run, it could start beside the entity's next
/// message once the late ack lets the partition hand that one out (the simulation's seed 10901
/// `--fenced --coalesce`). A later message with the key still runs it, and so does a claim
/// that names no message.
#[tokio::test]
async fn a_coalesced_keys_own_message_delivered_again_is_a_duplicate() {
    let store = Arc::new(MemoryClaimStore::new());
    let (a, b) = (claimer(&store, "a", 10_000), claimer(&store, "b", 10_000));
    let ClaimOutcome::Acquired(l) = a.claim_message("k", "d", 0, Some(7)).await.unwrap() else {
        panic!()
    };
    l.coalesce().await.unwrap();
    assert!(
        matches!(
            b.claim_message("k", "d", 0, Some(7)).await.unwrap(),
            ClaimOutcome::Completed
        ),
        "message 7 coalesced is settled"
    );
    let ClaimOutcome::Acquired(later) = b.claim_message("k", "d", 0, Some(9)).await.unwrap() else {
        panic!("a later message with the key runs it")
    };
    later.coalesce().await.unwrap();
    assert!(matches!(
        b.claim("k", "d").await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
}

/// A claim of an older message of a key coalesced under a later one (a stale copy of a
/// producer's earlier send of it) is a duplicate: reclaimed, it could run after the entity's
/// newer update, or be coalesced again under its own sequence, and the named message's
/// redelivery, no longer settled by the record, could then run beside the entity's next
/// message. Later messages still reclaim it.
#[tokio::test]
async fn an_older_message_of_a_key_coalesced_under_a_later_one_is_a_duplicate() {
    let store = Arc::new(MemoryClaimStore::new());
    let (a, b) = (claimer(&store, "a", 10_000), claimer(&store, "b", 10_000));
    let ClaimOutcome::Acquired(l) = a.claim_message("k", "d", 0, Some(9)).await.unwrap() else {
        panic!()
    };
    l.coalesce().await.unwrap();
    for older in [Some(3), Some(9)] {
        let claimed = b.claim_message("k", "d", 0, older).await.unwrap();
        assert!(
            matches!(claimed, ClaimOutcome::Completed),
            "message {older:?}, coalesced under 9, is settled"
        );
    }
    let (record, _) = store.get("k").await.unwrap().unwrap();
    assert_eq!(record.source_sequence, Some(9), "nothing relabelled it");
    assert!(matches!(
        b.claim_message("k", "d", 0, Some(10)).await.unwrap(),
        ClaimOutcome::Acquired(_)
    ));
}

/// A store whose next `lag` reads of any key return `snapshot` (a lagging replica's view).
struct Lagging {
    inner: MemoryClaimStore,
    snapshot: std::sync::Mutex<Option<(ClaimRecord, u64)>>,
    lag: std::sync::atomic::AtomicU32,
}

impl ClaimStore for Lagging {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        use std::sync::atomic::Ordering::SeqCst;
        let lag = self.lag.load(SeqCst);
        if lag > 0 {
            self.lag.store(lag - 1, SeqCst);
            return Ok(self.snapshot.lock().unwrap().clone());
        }
        self.inner.get(key).await
    }
    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        self.inner.create(key, record).await
    }
    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        self.inner.update(key, record, revision).await
    }
}

/// A dead-lettered key reset for a replay, then read from a replica that still has the dead
/// letter's record: the claim reads again (a replay carries the reset's revision as
/// `fresh_from`), then answers Busy rather than dropping the replay as dead-lettered.
#[tokio::test]
async fn a_replay_read_from_a_lagging_replica_is_read_again_then_busy() {
    use crate::claim::after::{found, Found};
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(Lagging {
        inner: MemoryClaimStore::new(),
        snapshot: Default::default(),
        lag: 0.into(),
    });
    let a = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!()
    };
    lease.give_up("out of attempts").await.unwrap();
    let dead = store.inner.get("k").await.unwrap().unwrap();
    let mut reset = dead.0.clone();
    reset.reset_for_replay(7);
    let fresh_from = store.inner.update("k", &reset, dead.1).await.unwrap();
    *store.snapshot.lock().unwrap() = Some(dead.clone());

    // Claim-after routes decide on one read.
    assert_eq!(found(Some(&dead), fresh_from), Found::Stale);
    assert_eq!(found(Some(&dead), 0), Found::FailedForGood);
    let read = store.inner.get("k").await.unwrap().unwrap();
    let reset = Some(fresh_from);
    assert_eq!(found(Some(&read), fresh_from), Found::Run { reset });

    // Without the reset's revision, the lagging read ends the replay.
    store.lag.store(1, SeqCst);
    assert!(matches!(
        a.claim("k", "d").await.unwrap(),
        ClaimOutcome::DeadLettered
    ));
    // With it, reads that lag are read again...
    store
        .lag
        .store(crate::claim::record::STALE_READS - 1, SeqCst);
    let ClaimOutcome::Acquired(lease) = a.claim_fresh("k", "d", fresh_from).await.unwrap() else {
        panic!("the replay runs once a read shows the reset")
    };
    assert_eq!(lease.attempt(), 1);
    lease.release("test", Duration::ZERO).await.unwrap();
    // ...and a replica that keeps lagging gets the message redelivered, not dropped.
    store.lag.store(crate::claim::record::STALE_READS, SeqCst);
    assert!(matches!(
        a.claim_fresh("k", "d", fresh_from).await.unwrap(),
        ClaimOutcome::Busy { .. }
    ));
}

/// A store whose updates land at once but are answered only at `answer_at` (virtual ms): the
/// writer's clock jumps meanwhile, as over a connection the network held back.
/// A store whose updates (or, with `creates`, whose creates) are answered at `answer_at`
/// (virtual time).
struct LateAnswers {
    inner: MemoryClaimStore,
    answer_at: u64,
    creates: bool,
}

impl LateAnswers {
    fn answered<T>(&self, late: bool, r: T) -> T {
        if late {
            crate::claim::record::virtual_clock::set(Some(self.answer_at));
        }
        r
    }
}

impl ClaimStore for LateAnswers {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        self.inner.get(key).await
    }
    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        let r = self.inner.create(key, record).await;
        self.answered(self.creates, r)
    }
    async fn update(
        &self,
        key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> Result<u64, ClaimError> {
        let r = self.inner.update(key, record, revision).await;
        self.answered(!self.creates, r)
    }
}

/// A lease that lapsed by its owner's clock is not renewed, although nobody took the key over
/// yet: a host that saw the lapse (an exclusive partition's next message) may have gone ahead.
/// A renewal answered only after the lapse does not revive it either.
#[tokio::test]
async fn a_lease_lapsed_by_its_owners_clock_is_neither_renewed_nor_revived_nor_settled() {
    use crate::claim::record::virtual_clock;
    const T0: u64 = 1_000_000;
    virtual_clock::set(Some(T0));
    let store = Arc::new(LateAnswers {
        inner: MemoryClaimStore::new(),
        answer_at: T0 + 10_001,
        creates: false,
    });
    let a = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!("a claims")
    };
    // Sent at 5 s, answered after the lease (10 s) ran out by the owner's clock.
    virtual_clock::set(Some(T0 + 5_000));
    let renewed = lease.renew().await;
    assert!(
        matches!(renewed, Err(LeaseLost::Unavailable(_))),
        "{renewed:?}"
    );
    assert_eq!(lease.left_locally(), Duration::ZERO);
    // Past the lapse, nothing renewing is sent at all.
    let before = store.get("k").await.unwrap();
    let renewed = lease.renew().await;
    assert!(
        matches!(renewed, Err(LeaseLost::Unavailable(_))),
        "{renewed:?}"
    );
    let marked = lease.begin_effects().await;
    assert!(
        matches!(marked, Err(LeaseLost::Unavailable(_))),
        "{marked:?}"
    );
    // Nor the outcome: a host that wakes past its lease with its work done must not
    // complete the key after another host went ahead (an exclusive entity's next message).
    let completed = lease.complete(Vec::new()).await;
    assert!(
        matches!(completed, Err(LeaseLost::Unavailable(_))),
        "{completed:?}"
    );
    assert_eq!(store.get("k").await.unwrap(), before, "nothing was written");
    virtual_clock::set(None);
}

/// A claim answered late holds its lease from when the claim was sent, as its record tells
/// every other host, not from when the answer came: the owner stops renewing where the others
/// see the lapse.
#[tokio::test]
async fn a_claims_lease_runs_from_when_the_claim_was_sent() {
    use crate::claim::record::virtual_clock;
    const T0: u64 = 2_000_000;
    virtual_clock::set(Some(T0));
    let store = Arc::new(LateAnswers {
        inner: MemoryClaimStore::new(),
        answer_at: T0 + 4_000,
        creates: true,
    });
    let a = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
    let ClaimOutcome::Acquired(lease) = a.claim("k", "d").await.unwrap() else {
        panic!("a claims")
    };
    // Answered 4 s after it was sent: 6 s of the 10 s lease are left.
    assert_eq!(lease.left_locally(), Duration::from_secs(6));
    // At 10 s after the send (6 s after the answer) the lease lapsed: no renewal is sent.
    virtual_clock::set(Some(T0 + 10_000));
    let before = store.get("k").await.unwrap();
    assert!(matches!(
        lease.renew().await,
        Err(LeaseLost::Unavailable(_))
    ));
    assert_eq!(store.get("k").await.unwrap(), before, "nothing was written");
    virtual_clock::set(None);
}
