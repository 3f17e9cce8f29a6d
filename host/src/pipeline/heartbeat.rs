//! Keeping a claim and its JetStream delivery alive while the guest works and its outcome is
//! recorded (rule 16): the delivery crate's [`Heartbeat`], beating on tokio's clock
//! ([`dedup_delivery::clock::Tokio`]) beside the message's work, in the message's own task, on
//! the I/O runtime (guests burning the guest threads cannot delay it). Its progress acks are
//! JetStream's `+WPI` (`super::delivering`). The tests below run it on tokio's paused clock.

pub use dedup_delivery::heartbeat::{Heartbeat, Progress};

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use std::time::Duration;

    use dedup_delivery::clock::Tokio;

    use super::*;
    use crate::claim::memory::MemoryClaimStore;
    use crate::claim::{ClaimError, ClaimOutcome, ClaimRecord, ClaimStore, Claimer};

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
        let heartbeat = Heartbeat::new(&lease, &NoProgress, Duration::from_millis(500), &Tokio);
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
        let heartbeat = Heartbeat::new(&lease, &NoProgress, Duration::from_millis(500), &Tokio);
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
