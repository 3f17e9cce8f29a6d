//! Unit tests of a window route's claim naming the version that begins the key's effects
//! (`Claimer::claim_window_message`) on the in-memory store.
use super::*;
use crate::claim::memory::MemoryClaimStore;

fn claimer(store: &Arc<MemoryClaimStore>) -> Claimer<MemoryClaimStore> {
    Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO)
}

async fn window_claim(c: &Claimer<MemoryClaimStore>, digest: &str) -> Box<Lease<MemoryClaimStore>> {
    match c
        .claim_window_message("k", digest, 0, Some(1))
        .await
        .unwrap()
    {
        ClaimOutcome::Acquired(lease) => lease,
        _ => panic!("the claim must be won"),
    }
}

async fn effects_by(store: &MemoryClaimStore) -> (Option<String>, u64) {
    let (record, revision) = store.get("k").await.unwrap().expect("a record");
    (record.effects_by, revision)
}

#[tokio::test]
async fn the_claim_names_the_version_so_effects_begin_without_a_write() {
    let store = Arc::new(MemoryClaimStore::new());
    let lease = window_claim(&claimer(&store), "v1").await;
    let (named, claimed_at) = effects_by(&store).await;
    assert_eq!(named.as_deref(), Some("v1"));
    lease.begin_effects().await.unwrap();
    assert_eq!(
        effects_by(&store).await.1,
        claimed_at,
        "no write of its own"
    );
    // Outputs went out: a retry keeps the name, so the key's next run is v1's.
    lease.fail("publish failed", Duration::ZERO).await.unwrap();
    assert_eq!(effects_by(&store).await.0.as_deref(), Some("v1"));
    let again = window_claim(&claimer(&store), "v2").await;
    assert_eq!(
        again.digest().await,
        "v1",
        "pinned to the version that began"
    );
}

#[tokio::test]
async fn an_outcome_before_any_output_clears_the_name() {
    let store = Arc::new(MemoryClaimStore::new());
    let lease = window_claim(&claimer(&store), "v1").await;
    lease
        .fail("the guest asked to retry", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(effects_by(&store).await.0, None);
    // The next run is the version chosen then.
    let again = window_claim(&claimer(&store), "v2").await;
    assert_eq!(again.digest().await, "v2");
    again.complete(Vec::new()).await.unwrap();
    assert_eq!(
        effects_by(&store).await.0,
        None,
        "no outputs: nothing began"
    );
}

#[tokio::test]
async fn a_name_from_an_earlier_run_stays_whatever_this_run_does() {
    let store = Arc::new(MemoryClaimStore::new());
    let first = window_claim(&claimer(&store), "v1").await;
    first.begin_effects().await.unwrap();
    first
        .release("publish outage", Duration::ZERO)
        .await
        .unwrap();
    let second = window_claim(&claimer(&store), "v2").await;
    assert_eq!(second.digest().await, "v1");
    second
        .fail("the guest asked to retry", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(effects_by(&store).await.0.as_deref(), Some("v1"));
}

#[tokio::test]
async fn a_plain_claim_names_nothing_until_effects_begin() {
    let store = Arc::new(MemoryClaimStore::new());
    let ClaimOutcome::Acquired(lease) = claimer(&store)
        .claim_message("k", "v1", 0, Some(1))
        .await
        .unwrap()
    else {
        panic!("the claim must be won")
    };
    let (named, claimed_at) = effects_by(&store).await;
    assert_eq!(named, None);
    lease.begin_effects().await.unwrap();
    let (named, marked_at) = effects_by(&store).await;
    assert_eq!(named.as_deref(), Some("v1"));
    assert!(marked_at > claimed_at, "one write names it");
}
