//! The canary of `coalesced-message-settled` against a real claim store (the simulation stopped
//! finding it once the copier stored each source message once: 280,000 runs, no seed): a
//! coalesced key's own message delivered again, its coalescing delivery's host paused past the
//! ack wait before it acked, is settled. Run, it could start beside its entity's next message
//! once that late ack lets the partition hand the next one out.

use std::sync::Arc;
use std::time::Duration;

use dedup_delivery::revert::{self, Fix};
use dedup_host::claim::kv::KvClaimStore;
use dedup_host::claim::{ClaimOutcome, Claimer};
use dedup_host_tests::harness::TestEnv;

/// Claims message 7 of key `k`, coalesces it, and answers what a second host's claim of the
/// same message gets, with `reverted` reverted on this thread.
async fn redelivery_after_coalesce(
    env: &TestEnv,
    bucket: &str,
    reverted: &[Fix],
) -> ClaimOutcome<KvClaimStore> {
    let kv = env
        .js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: bucket.into(),
            history: 1,
            ..Default::default()
        })
        .await
        .expect("claim bucket");
    let store = Arc::new(KvClaimStore::new(kv));
    let claimer = |owner: &str| {
        Claimer::new(
            store.clone(),
            owner,
            Duration::from_secs(30),
            Duration::ZERO,
        )
    };
    let (first, second) = (claimer("paused"), claimer("other"));
    revert::set(reverted);
    let ClaimOutcome::Acquired(lease) = first.claim_message("k", "d", 0, Some(7)).await.unwrap()
    else {
        panic!("the first delivery of message 7 wins its key")
    };
    lease.coalesce().await.expect("the coalesce write lands");
    let again = second.claim_message("k", "d", 0, Some(7)).await.unwrap();
    revert::set(&[]);
    again
}

/// Message 7, coalesced, is settled for its next delivery; with the fix reverted the claim is
/// won again (it would run): the test fails when the fix is reverted.
#[tokio::test]
async fn a_coalesced_keys_own_message_delivered_again_is_settled_in_the_claim_store() {
    let env = TestEnv::start().await;
    let kept = redelivery_after_coalesce(&env, "CLAIMS_KEPT", &[]).await;
    assert!(
        matches!(kept, ClaimOutcome::Completed),
        "a coalesced key's own message delivered again must be a duplicate"
    );
    let reverted =
        redelivery_after_coalesce(&env, "CLAIMS_REVERTED", &[Fix::CoalescedMessageSettled]).await;
    assert!(
        matches!(reverted, ClaimOutcome::Acquired(_)),
        "with coalesced-message-settled reverted the redelivery wins the key again (the canary shows nothing)"
    );
}
