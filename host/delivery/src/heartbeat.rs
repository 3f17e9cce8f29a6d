//! Keeping a claim and its delivery alive while the handler works and its outcome is recorded
//! (rule 16).
//!
//! The heartbeat is a future polled beside the message's work, in the message's own task: no
//! task, channel or timer exists until it is polled, and a message settled before the first
//! interval costs one timer entry. Its time comes from a [`Clock`]: tokio's in the host, the
//! virtual one in the simulation.

use std::future::Future;
use std::time::Duration;

use crate::claim::{ClaimStore, Lease, LeaseLost};
use crate::clock::Clock;

/// What keeps a delivery from being redelivered while its work runs: a JetStream progress
/// ack (`+WPI`) in the host.
pub trait Progress: Sync {
    /// Tells the source the delivery is still being worked on.
    fn progress(&self) -> impl Future<Output = Result<(), String>> + Send;

    /// A renewal went unanswered: the lease may lapse without the store saying so, which
    /// costs the key an attempt. Nothing by default; the simulation notes it.
    fn unanswered(&self) {}

    /// The lease lapsed by this host's clock and the work stops (not a takeover the store
    /// reported). Nothing by default; the simulation notes it.
    fn lapsed(&self) {}
}

/// Every interval, renews a lease and sends a progress ack for its delivery.
pub struct Heartbeat<'a, S: ClaimStore, P: Progress, C: Clock> {
    lease: &'a Lease<S>,
    progress: &'a P,
    interval: Duration,
    clock: &'a C,
}

impl<'a, S: ClaimStore, P: Progress, C: Clock> Heartbeat<'a, S, P, C> {
    /// A heartbeat for `lease` and the delivery `progress` keeps alive, every `interval` of
    /// `clock`.
    pub fn new(lease: &'a Lease<S>, progress: &'a P, interval: Duration, clock: &'a C) -> Self {
        Self {
            lease,
            progress,
            interval,
            clock,
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
            self.clock.sleep(self.interval).await;
            let left = self.lease.left_locally();
            let renewed = match self.clock.timeout(left, self.lease.renew()).await {
                Some(renewed) => renewed,
                None => return self.lapsed(),
            };
            match renewed {
                Ok(()) => {
                    if let Err(e) = self.progress.progress().await {
                        tracing::warn!("progress ack failed: {e}");
                    }
                }
                Err(LeaseLost::Reclaimed) => return,
                // Lapsed meanwhile, though the renewal failed at once rather than hung (a
                // server that answers only "no responders", say).
                Err(LeaseLost::Unavailable(_)) if self.lease.left_locally().is_zero() => {
                    return self.lapsed()
                }
                Err(LeaseLost::Unavailable(e)) => {
                    self.progress.unanswered();
                    tracing::warn!("lease renewal failed, will retry: {e}");
                }
            }
        }
    }

    /// Says why the work stops: its lease lapsed by this host's clock.
    fn lapsed(&self) {
        self.progress.lapsed();
        tracing::warn!(
            "lease lapsed by this host's clock (no renewal answered for a whole lease): stopping the work; another host may now run the key"
        );
    }
}
