//! Keeping a claim and its JetStream delivery alive while the guest works and its outcome is
//! recorded (rule 16).
//!
//! The heartbeat is a future polled beside the message's work, in the message's own task: no
//! task, channel or timer exists until it is polled, and a message settled before the first
//! interval costs one timer entry. It runs on the I/O runtime with the message, so guests
//! burning the guest threads cannot delay it.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::AckKind;

use crate::claim::{ClaimStore, Lease, LeaseLost};

/// What keeps a delivery from being redelivered while its work runs: a JetStream progress
/// ack (`+WPI`) in production.
pub trait Progress: Sync {
    /// Tells the source the delivery is still being worked on.
    fn progress(&self) -> impl Future<Output = Result<(), String>> + Send;
}

impl Progress for Acker {
    async fn progress(&self) -> Result<(), String> {
        self.ack_with(AckKind::Progress)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Every interval, renews a lease and sends a progress ack for its delivery.
pub struct Heartbeat<'a, S: ClaimStore, P: Progress = Acker> {
    lease: &'a Lease<S>,
    acker: &'a P,
    interval: Duration,
}

impl<'a, S: ClaimStore, P: Progress> Heartbeat<'a, S, P> {
    /// A heartbeat for `lease` and the delivery `acker` settles, every `interval`.
    pub fn new(lease: &'a Lease<S>, acker: &'a P, interval: Duration) -> Self {
        Self {
            lease,
            acker,
            interval,
        }
    }

    /// Runs `work` while beating. `None` when the lease was found taken over first, or lapsed
    /// by this host's clock: `work` is dropped at its current await point and must touch
    /// nothing more (rule 5). A takeover never cuts a lease write of `work` in progress (the
    /// lease serializes writes, so a beat that finds the loss cannot finish while one is in
    /// flight); a lapse may, as a crash would: a write still in flight either lands before a
    /// new owner's claim (and the key's next delivery finds it) or is refused by its revision.
    pub async fn beside<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = work => Some(out),
            () = self.until_lost() => None,
        }
    }

    /// Beats until the lease is found taken over, or has lapsed by this host's own clock; an
    /// unanswered renewal is retried at the next beat (the lease outlasts three of them).
    ///
    /// A renewal waits at most until the lease lapses by this host's clock: one that hangs (a
    /// connection the network cut without a word) must not outlive the lease it renews. A
    /// renewal cut that way may still land; a later write recognizes it as this claim's own
    /// (rule 13).
    async fn until_lost(&self) {
        loop {
            tokio::time::sleep(self.interval).await;
            let left = self.lease.left_locally();
            let renewed = match tokio::time::timeout(left, self.lease.renew()).await {
                Ok(renewed) => renewed,
                Err(_) => return lapsed(),
            };
            match renewed {
                Ok(()) => {
                    if let Err(e) = self.acker.progress().await {
                        tracing::warn!("progress ack failed: {e}");
                    }
                }
                Err(LeaseLost::Reclaimed) => return,
                // Lapsed meanwhile, though the renewal failed at once rather than hung (a
                // server that answers only "no responders", say).
                Err(LeaseLost::Unavailable(_)) if self.lease.left_locally().is_zero() => {
                    return lapsed()
                }
                Err(LeaseLost::Unavailable(e)) => {
                    tracing::warn!("lease renewal failed, will retry: {e}");
                }
            }
        }
    }
}

/// Says why the work stops: its lease lapsed by this host's clock.
fn lapsed() {
    tracing::warn!(
        "lease lapsed by this host's clock (no renewal answered for a whole lease): stopping the work; another host may now run the key"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::claim::memory::MemoryClaimStore;
    use crate::claim::{ClaimError, ClaimOutcome, ClaimRecord, Claimer};

    /// A claim store whose writes stop answering once `cut` is set: a host the network cut
    /// off without a word.
    #[derive(Default)]
    struct CutOff {
        inner: MemoryClaimStore,
        cut: AtomicBool,
    }

    impl CutOff {
        async fn hang_if_cut(&self) {
            if self.cut.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
        }
    }

    impl ClaimStore for CutOff {
        async fn get(&self, key: &str) -> Result<Option<(ClaimRecord, u64)>, ClaimError> {
            self.hang_if_cut().await;
            self.inner.get(key).await
        }
        async fn create(&self, key: &str, record: &ClaimRecord) -> Result<u64, ClaimError> {
            self.hang_if_cut().await;
            self.inner.create(key, record).await
        }
        async fn update(
            &self,
            key: &str,
            record: &ClaimRecord,
            revision: u64,
        ) -> Result<u64, ClaimError> {
            self.hang_if_cut().await;
            self.inner.update(key, record, revision).await
        }
    }

    struct NoProgress;

    impl Progress for NoProgress {
        async fn progress(&self) -> Result<(), String> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn work_stops_when_the_lease_lapses_by_the_hosts_own_clock_while_the_store_hangs() {
        let store = Arc::new(CutOff::default());
        let lease_for = Duration::from_secs(3);
        let claimer = Claimer::new(store.clone(), "a", lease_for, Duration::ZERO);
        let ClaimOutcome::Acquired(lease) = claimer.claim("k", "d").await.unwrap() else {
            panic!("the first claim wins")
        };
        store.cut.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let heartbeat = Heartbeat::new(&lease, &NoProgress, Duration::from_millis(500));
        // Work that would run far past the lease: it must be stopped, not left running on a
        // lease another host may already hold.
        let out = heartbeat
            .beside(tokio::time::sleep(Duration::from_secs(3600)))
            .await;
        assert!(
            out.is_none(),
            "the work ran to its end under a lapsed lease"
        );
        assert!(
            started.elapsed() <= lease_for + Duration::from_millis(500),
            "stopped only {:?} after the cut, past the {lease_for:?} lease",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn work_stops_when_the_lease_lapses_while_its_own_write_hangs_holding_the_lease() {
        let store = Arc::new(CutOff::default());
        let lease_for = Duration::from_secs(3);
        let claimer = Claimer::new(store.clone(), "a", lease_for, Duration::ZERO);
        let ClaimOutcome::Acquired(lease) = claimer.claim("k", "d").await.unwrap() else {
            panic!("the first claim wins")
        };
        store.cut.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        let heartbeat = Heartbeat::new(&lease, &NoProgress, Duration::from_millis(500));
        // The work's own write (the outcome's) hangs with the lease's lock held: the lapse
        // must still be seen by this host's clock, not when the write returns (never, here).
        let out =
            tokio::time::timeout(lease_for * 20, heartbeat.beside(lease.complete(Vec::new())))
                .await
                .expect("the heartbeat waited on the hung write instead of seeing the lapse");
        assert!(out.is_none(), "the hung write was not cut at the lapse");
        assert!(
            started.elapsed() <= lease_for + Duration::from_millis(500),
            "stopped only {:?} after the cut, past the {lease_for:?} lease",
            started.elapsed()
        );
    }
}
