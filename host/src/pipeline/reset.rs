//! Whether a message's [`RESET_REVISION`] header is honoured (DESIGN rule 22).
//!
//! The header tells a host that the key was reset at that revision before the message was
//! published, so a read of the key below it comes from a lagging replica and is read again.
//! Only `dedup-host dead-letters replay` sets it, and anyone who may publish on a source
//! subject could forge it: it counts only on a message the dead-letter stream proves a replay
//! of the very key it runs under ([`replayed::proven`]), and only when the claim store's
//! leader holds the key at that revision or later ([`reset_written`]); on any other message
//! it is ignored. A reset honoured so is honoured on every delivery: a replica may lag for
//! longer than a few deliveries, and the key must still run once it answers.

use thiserror::Error;

use super::message::Delivery;
use super::replayed::{self, ProofUnavailable};
use super::Shared;
use crate::claim::record::RESET_REVISION;
use crate::claim::{ClaimError, ClaimStore};
use crate::idempotency;
use crate::routes::Route;

/// Whether a replay's reset is honoured is unknown for now; the delivery is retried.
#[derive(Debug, Error)]
pub enum ResetUnknown {
    /// The dead-letter stream did not answer.
    #[error(transparent)]
    Proof(#[from] ProofUnavailable),
    /// The claim store's leader did not answer.
    #[error("cannot read claim key `{key}` from its store's leader to check a replay's reset ({source}); it is retried")]
    Leader {
        /// The claim key.
        key: String,
        /// What failed.
        source: ClaimError,
    },
}

impl<S: ClaimStore> Shared<S> {
    /// Records on `d` the revision its replay reset `key` at, when it carries one and the
    /// dead-letter stream proves it the replay of `key`; any other reset header is ignored.
    pub(super) async fn prove_reset(
        &self,
        d: &Delivery,
        route: &Route,
        key: &str,
    ) -> Result<(), ResetUnknown> {
        let m = &d.message;
        let Some(revision) = claimed_revision(m.headers.as_ref()) else {
            return Ok(());
        };
        let proven = match idempotency::replay_claim(&route.key, m.headers.as_ref()) {
            Some(claim) if claim.0 == key => {
                let stream = &self.config.dead_letter.stream;
                replayed::proven(&self.js, stream, claim, &m.subject, &m.payload).await?
            }
            _ => false,
        };
        if !proven {
            tracing::warn!(
                route = route.name,
                sequence = d.sequence,
                "`{RESET_REVISION}` on a message that is not a proven replay of key `{}`: ignored",
                key.escape_debug()
            );
            return Ok(());
        }
        let claim_key = route.claim_key(key);
        let store = self.claimer.store().as_ref();
        match reset_written(store, &claim_key, revision).await {
            Ok(true) => d.reset_at(revision),
            Ok(false) => tracing::warn!(
                route = route.name,
                sequence = d.sequence,
                "`{RESET_REVISION}: {revision}` names a reset of key `{}` that its claim store's leader does not hold (purged since, or the bucket was recreated): ignored",
                key.escape_debug()
            ),
            // A corrupt record is the claim's to report (it dead-letters the message).
            Err(ClaimError::Corrupt { .. }) => {}
            Err(source) => {
                return Err(ResetUnknown::Leader {
                    key: claim_key,
                    source,
                })
            }
        }
        Ok(())
    }
}

/// Whether `store`'s leader holds `key` at `revision` or later: the reset a proven replay
/// names was written (a later write, such as the replay's own run, supersedes it but still
/// shows it happened). Asked of the leader, not a replica: a lagging replica would answer
/// with the record from before the reset, which is the very read the header corrects.
pub async fn reset_written<S: ClaimStore>(
    store: &S,
    key: &str,
    revision: u64,
) -> Result<bool, ClaimError> {
    let read = store.get_from_leader(key).await?;
    Ok(read.is_some_and(|(_, current)| current >= revision))
}

/// The revision a message's single [`RESET_REVISION`] header names, if it names one.
fn claimed_revision(headers: Option<&async_nats::HeaderMap>) -> Option<u64> {
    let mut values = headers?.get_all(RESET_REVISION);
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    value.as_str().trim().parse().ok().filter(|r| *r > 0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::claim::memory::MemoryClaimStore;
    use crate::claim::{ClaimOutcome, ClaimRecord, Claimer};

    /// A replicated store whose direct reads come from a replica that stopped before the
    /// replay's reset, while its leader holds every write.
    struct ReplicaLags {
        leader: MemoryClaimStore,
        replica: std::sync::Mutex<Option<(ClaimRecord, u64)>>,
    }

    impl ClaimStore for ReplicaLags {
        async fn get(&self, _: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
            Ok(self.replica.lock().unwrap().clone())
        }
        async fn get_from_leader(
            &self,
            key: &str,
        ) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
            self.leader.get(key).await
        }
        async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
            self.leader.create(key, record).await
        }
        async fn update(
            &self,
            key: &str,
            record: &ClaimRecord,
            revision: u64,
        ) -> Result<u64, ClaimError> {
            self.leader.update(key, record, revision).await
        }
    }

    /// A key dead-lettered, then reset for a replay on the leader only: the store, a claimer
    /// on it, and the reset's revision.
    async fn reset_behind_a_lagging_replica() -> (Arc<ReplicaLags>, Claimer<ReplicaLags>, u64) {
        let store = Arc::new(ReplicaLags {
            leader: MemoryClaimStore::new(),
            replica: Default::default(),
        });
        let claimer = Claimer::new(store.clone(), "a", Duration::from_secs(10), Duration::ZERO);
        let ClaimOutcome::Acquired(lease) = claimer.claim("k", "d").await.unwrap() else {
            panic!("a fresh key is acquired")
        };
        lease.give_up("out of attempts").await.unwrap();
        let dead = store.leader.get("k").await.unwrap().unwrap();
        *store.replica.lock().unwrap() = Some(dead.clone());
        let mut reset = dead.0.clone();
        reset.reset_for_replay(1);
        let revision = store.leader.update("k", &reset, dead.1).await.unwrap();
        (store, claimer, revision)
    }

    /// Finding 10 (f): the replica the host reads from still has the dead letter's record,
    /// however many times the replay is delivered. The leader decides: it holds the reset, so
    /// the reset is honoured and the claim waits for the replica instead of answering
    /// "dead-lettered"; a revision the leader does not hold (forged, or the key purged since)
    /// is not honoured.
    #[tokio::test]
    async fn a_reset_the_leader_holds_is_honoured_while_the_replica_lags() {
        let (store, claimer, revision) = reset_behind_a_lagging_replica().await;
        assert!(reset_written(store.as_ref(), "k", revision).await.unwrap());
        assert!(matches!(
            claimer.claim_fresh("k", "d", revision).await.unwrap(),
            ClaimOutcome::Busy { .. }
        ));
        assert!(!reset_written(store.as_ref(), "k", revision + 1)
            .await
            .unwrap());
        assert!(!reset_written(store.as_ref(), "gone", 1).await.unwrap());
        // Once the replica applies the reset, the replay runs.
        *store.replica.lock().unwrap() = store.leader.get("k").await.unwrap();
        assert!(matches!(
            claimer.claim_fresh("k", "d", revision).await.unwrap(),
            ClaimOutcome::Acquired(_)
        ));
    }

    /// An honoured reset is honoured on every delivery of the replay, not on its first few:
    /// a replica may lag for longer than that, and the key must still run.
    #[tokio::test]
    async fn an_honoured_reset_holds_past_the_fifth_delivery() {
        // A client that never reaches a server: a delivery only needs one to ack.
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:1")
            .await
            .unwrap();
        let message = async_nats::Message {
            subject: "in.a".into(),
            reply: None,
            payload: Default::default(),
            headers: None,
            status: None,
            description: None,
            length: 0,
            raw_headers: None,
        };
        let message = async_nats::jetstream::Message {
            message,
            context: async_nats::jetstream::new(client),
        };
        let d = Delivery::new(message, 1, 50);
        d.reset_at(7);
        assert_eq!(d.fresh_from(), 7);
    }

    #[test]
    fn one_positive_revision_is_claimed() {
        let mut h = async_nats::HeaderMap::new();
        assert_eq!(claimed_revision(Some(&h)), None);
        h.insert(RESET_REVISION, "7");
        assert_eq!(claimed_revision(Some(&h)), Some(7));
        h.append(RESET_REVISION, "8");
        assert_eq!(claimed_revision(Some(&h)), None, "two values");
        let mut zero = async_nats::HeaderMap::new();
        zero.insert(RESET_REVISION, "0");
        assert_eq!(claimed_revision(Some(&zero)), None);
        assert_eq!(claimed_revision(None), None);
    }
}
