//! A contract change's decisions and its move of claim records over in-memory stores.

use futures::FutureExt as _;

use super::*;
use crate::claim::memory::MemoryClaimStore;
use crate::claim::record::sample;

const WINDOW_TO_FENCED: Claims<'static> = Claims {
    from: "bucket claims",
    to: "stream OUT",
    window_to_fenced: true,
};

const BUCKET_TO_BUCKET: Claims<'static> = Claims {
    from: "bucket claims",
    to: "bucket claims-next",
    window_to_fenced: false,
};

fn none(_: &str) -> bool {
    false
}

fn records() -> Vec<(String, ClaimRecord)> {
    vec![
        ("r.done".into(), sample(ClaimState::Completed, false)),
        ("r.open".into(), sample(ClaimState::Failed, false)),
        ("r.running".into(), sample(ClaimState::InProgress, false)),
        ("r.dead".into(), sample(ClaimState::Failed, true)),
    ]
}

#[test]
fn every_record_moves_between_any_two_stores_settled_or_not() {
    let copies = plan(records(), BUCKET_TO_BUCKET, &none, "change").unwrap();
    let keys: Vec<&str> = copies.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(keys, ["r.done", "r.open", "r.running", "r.dead"]);
    assert!(copies.iter().all(|c| !c.accepted));
}

#[test]
fn window_to_fenced_is_refused_while_a_key_is_open_naming_it() {
    let refused = plan(records(), WINDOW_TO_FENCED, &none, "change").unwrap_err();
    assert_eq!(
        refused,
        Refused::Unsettled {
            count: 2,
            keys: vec!["r.open".into(), "r.running".into()]
        }
    );
}

#[test]
fn a_key_dead_after_its_outputs_moves_to_fenced_only_accepted_and_marked() {
    let mut dead = sample(ClaimState::Failed, true);
    dead.unknown_effects = true;
    let records = vec![("r.dead".to_string(), dead)];
    let refused = plan(records.clone(), WINDOW_TO_FENCED, &none, "c").unwrap_err();
    assert!(matches!(refused, Refused::DeadWithEffects { count: 1, .. }));
    let accepts = |k: &str| k == "r.dead";
    let copies = plan(records, WINDOW_TO_FENCED, &accepts, "c").unwrap();
    assert!(copies[0].accepted && copies[0].record.is_accepted_dead());
}

#[test]
fn a_copy_writes_over_an_older_record_and_not_over_the_same_one() {
    let to = MemoryClaimStore::new();
    let done = sample(ClaimState::Completed, false);
    let open = sample(ClaimState::Failed, false);
    let copy = |r: &ClaimRecord| copy_record(&to, "k", r).now_or_never().unwrap().unwrap();
    assert!(copy(&open), "created");
    assert!(copy(&done), "written over the older record");
    assert!(!copy(&done), "already there");
    let (there, _) = to.get("k").now_or_never().unwrap().unwrap().unwrap();
    assert_eq!(there, done);
}

#[test]
fn a_run_records_changes_calls_off_or_leaves_the_record() {
    assert_eq!(run(false, false, true), Run::Record);
    assert_eq!(run(true, true, false), Run::Unchanged);
    assert_eq!(run(true, true, true), Run::CallOff);
    assert_eq!(run(true, false, true), Run::Change);
    assert_eq!(run(true, false, false), Run::Change);
}

#[test]
fn only_a_first_run_refused_before_moving_clears_its_mark() {
    assert_eq!(stop(false, true, true), Stop::Clear);
    assert_eq!(stop(false, true, false), Stop::Release);
    assert_eq!(stop(false, false, true), Stop::Release);
    assert_eq!(stop(true, true, true), Stop::Leave);
}

#[test]
fn only_a_change_away_from_claim_after_waits_for_its_open_messages() {
    assert!(open_refuses(true, false, 1));
    assert!(!open_refuses(true, false, 0));
    assert!(
        !open_refuses(true, true, 3),
        "claim after again: run as before"
    );
    assert!(
        !open_refuses(false, false, 3),
        "claim before records its key first"
    );
}

#[test]
fn evidence_names_each_serving_host_once_with_every_fact() {
    let status = vec!["h1".to_string(), "h2".to_string()];
    let lines = evidence(Some("h1"), &status);
    assert_eq!(
        lines,
        [
            "host `h1` answered that it serves it and its status says so",
            "host `h2`'s status says it serves it"
        ]
    );
    assert!(evidence(None, &[]).is_empty());
}

/// A move between two in-memory stores. `late`: a write a draining host sent to the old store
/// before it stopped (key, record, the revision it held), landing as the move reaches the key.
/// `vanish`: a key deleted (or aged out) in the old store as the move reaches it (key, its
/// revision).
struct Memory {
    old: MemoryClaimStore,
    new: MemoryClaimStore,
    keys: Vec<String>,
    late: Option<(String, ClaimRecord, u64)>,
    vanish: Option<(String, u64)>,
}

impl Stores for Memory {
    type Old = MemoryClaimStore;
    type To = MemoryClaimStore;
    type Error = Box<dyn std::error::Error>;

    async fn records(&mut self) -> Result<Vec<(String, ClaimRecord)>, Self::Error> {
        let mut records = Vec::new();
        for key in &self.keys {
            if let Some((record, _)) = self.old.get_from_leader(key).await? {
                records.push((key.clone(), record));
            }
        }
        Ok(records)
    }

    async fn planned(&mut self, _: &[Copy]) -> Result<(), Self::Error> {
        Ok(())
    }

    async fn before(&mut self, _: usize) -> Result<(), Self::Error> {
        if let Some((key, record, revision)) = self.late.take() {
            self.old.update(&key, &record, revision).await?;
        }
        if let Some((key, revision)) = self.vanish.take() {
            self.old.remove(&key, revision)?;
        }
        Ok(())
    }

    fn old(&self, claim_key: &str) -> (&MemoryClaimStore, String) {
        (&self.old, claim_key.to_string())
    }

    fn to(&self, claim_key: &str) -> (&MemoryClaimStore, String) {
        (&self.new, claim_key.to_string())
    }

    async fn remove(&mut self, claim_key: &str, revision: u64) -> Result<(), Self::Error> {
        Ok(self.new.remove(claim_key, revision)?)
    }

    fn moved(&mut self) {}
}

/// Old and new stores, `r.k` claimed in the old one (by a host still holding the revision).
fn claimed() -> (Memory, ClaimRecord, u64) {
    let old = MemoryClaimStore::new();
    let running = sample(ClaimState::InProgress, false);
    let held = old.create("r.k", &running).now_or_never().unwrap().unwrap();
    let stores = Memory {
        old,
        new: MemoryClaimStore::new(),
        keys: vec!["r.k".into()],
        late: None,
        vanish: None,
    };
    (stores, running, held)
}

fn moved(stores: &mut Memory) -> Moved {
    (move_claims(stores, BUCKET_TO_BUCKET, &none, "change").now_or_never())
        .expect("in-memory")
        .expect("moved")
}

fn record(store: &MemoryClaimStore) -> (ClaimRecord, u64) {
    store.get("r.k").now_or_never().unwrap().unwrap().unwrap()
}

#[test]
fn a_draining_hosts_write_landing_after_the_move_is_refused_by_the_fence() {
    let (mut stores, running, held) = claimed();
    assert_eq!(moved(&mut stores).claims, 1);
    assert_eq!(record(&stores.new).0, running);
    // The host's outcome, sent at the revision it held before it drained, lands late.
    let failed = sample(ClaimState::Failed, true);
    let late = stores
        .old
        .update("r.k", &failed, held)
        .now_or_never()
        .unwrap();
    assert!(matches!(late, Err(ClaimError::Conflict)), "{late:?}");
    assert_eq!(
        record(&stores.old).0,
        running,
        "the old store holds what moved"
    );
}

#[test]
fn a_draining_hosts_write_landing_before_the_fence_moves_as_fenced() {
    let (mut stores, _, held) = claimed();
    // Lands after the keys were listed and planned, before the key is fenced and copied.
    let failed = sample(ClaimState::Failed, false);
    stores.late = Some(("r.k".into(), failed.clone(), held));
    moved(&mut stores);
    assert_eq!(record(&stores.old).0, failed);
    assert_eq!(
        record(&stores.new).0,
        failed,
        "copied as fenced, not as listed"
    );
}

/// The review's finding 6: a key deleted (or aged out) in the old store between the listing
/// and its fence must not leave the new store's older copy of it (from an earlier life of the
/// route there: claims moved A to B and back to A) standing for it.
#[test]
fn a_key_gone_from_the_old_store_by_its_fence_leaves_no_stale_copy_in_the_new_one() {
    let (mut stores, _, held) = claimed();
    let stale = sample(ClaimState::Completed, false);
    stores
        .new
        .create("r.k", &stale)
        .now_or_never()
        .unwrap()
        .unwrap();
    stores.vanish = Some(("r.k".into(), held));
    assert_eq!(moved(&mut stores).claims, 1, "the removal counts");
    let there = stores.new.get("r.k").now_or_never().unwrap().unwrap();
    assert_eq!(
        there, None,
        "the stale copy stands for a key the old store no longer holds"
    );
    assert_eq!(stores.old.get("r.k").now_or_never().unwrap().unwrap(), None);
    // The new store never held it: nothing to remove, nothing counted.
    let (mut stores, _, held) = claimed();
    stores.vanish = Some(("r.k".into(), held));
    assert_eq!(moved(&mut stores).claims, 0);
}

/// A store where a write lands right after the first read from the leader (between the
/// fence's read and its compare-and-swap).
struct Racing {
    inner: MemoryClaimStore,
    late: std::sync::Mutex<Option<(ClaimRecord, u64)>>,
}

impl ClaimStore for Racing {
    async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
        let read = self.inner.get(key).await;
        let late = self.late.lock().unwrap().take();
        if let Some((record, revision)) = late {
            self.inner.update(key, &record, revision).await?;
        }
        read
    }

    async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
        self.inner.create(key, record).await
    }

    async fn update(&self, key: &str, r: &ClaimRecord, revision: u64) -> Result<u64, ClaimError> {
        self.inner.update(key, r, revision).await
    }
}

#[test]
fn a_fence_meeting_a_write_that_landed_meanwhile_reads_again_and_fences_that() {
    let inner = MemoryClaimStore::new();
    let running = sample(ClaimState::InProgress, false);
    let held = inner
        .create("r.k", &running)
        .now_or_never()
        .unwrap()
        .unwrap();
    let done = sample(ClaimState::Completed, false);
    let store = Racing {
        inner,
        late: std::sync::Mutex::new(Some((done.clone(), held))),
    };
    let fenced = fence(&store, "r.k").now_or_never().unwrap().unwrap();
    assert_eq!(fenced, Some(done.clone()));
    let (there, revision) = store
        .inner
        .get("r.k")
        .now_or_never()
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(there, done);
    assert!(revision > held + 1, "written again after the late write");
    assert_eq!(
        fence(&store, "r.gone").now_or_never().unwrap().unwrap(),
        None
    );
}

/// A host still holding a lease in the old store (cut off while the change ran) whose write
/// then meets the fence must lose the key: it must not take the fence for a late write of
/// its own and write its outcome over it (reviewer's finding; with the fence writing the
/// record back as read, the lease's read-back adopted it).
#[tokio::test]
async fn a_lease_still_held_in_the_old_store_loses_the_key_to_the_fence() {
    use crate::claim::{ClaimOutcome, Claimer, LeaseLost};
    let store = std::sync::Arc::new(MemoryClaimStore::new());
    let claimer = Claimer::new(
        store.clone(),
        "h",
        std::time::Duration::from_secs(30),
        std::time::Duration::ZERO,
    );
    let ClaimOutcome::Acquired(lease) = claimer.claim("r.k", "v1").await.unwrap() else {
        panic!("the claim must be won")
    };
    // A heartbeat: the record now bears the lease's fencing token.
    lease.renew().await.unwrap();
    assert!(fence(store.as_ref(), "r.k").await.unwrap().is_some());
    let at_fence = store.get("r.k").await.unwrap();
    let outcome = lease.complete(Vec::new()).await;
    assert!(matches!(outcome, Err(LeaseLost::Reclaimed)), "{outcome:?}");
    assert_eq!(
        store.get("r.k").await.unwrap(),
        at_fence,
        "nothing written over the fence"
    );
}
