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

/// Every interval, renews a lease and sends a progress ack for its delivery.
pub struct Heartbeat<'a, S: ClaimStore> {
    lease: &'a Lease<S>,
    acker: &'a Acker,
    interval: Duration,
}

impl<'a, S: ClaimStore> Heartbeat<'a, S> {
    /// A heartbeat for `lease` and the delivery `acker` settles, every `interval`.
    pub fn new(lease: &'a Lease<S>, acker: &'a Acker, interval: Duration) -> Self {
        Self {
            lease,
            acker,
            interval,
        }
    }

    /// Runs `work` while beating. `None` when the lease was found taken over first: `work`
    /// is dropped at its current await point and must touch nothing more (rule 5). A lease
    /// write of `work` in progress is never cut: the lease serializes writes, so a beat that
    /// finds the loss cannot finish while one is in flight.
    pub async fn beside<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = work => Some(out),
            () = self.until_lost() => None,
        }
    }

    /// Beats until the lease is found taken over; an unanswered renewal is retried at the
    /// next beat (the lease outlasts three of them).
    async fn until_lost(&self) {
        loop {
            tokio::time::sleep(self.interval).await;
            match self.lease.renew().await {
                Ok(()) => {
                    if let Err(e) = self.acker.ack_with(AckKind::Progress).await {
                        tracing::warn!("progress ack failed: {e}");
                    }
                }
                Err(LeaseLost::Reclaimed) => return,
                Err(LeaseLost::Unavailable(e)) => {
                    tracing::warn!("lease renewal failed, will retry: {e}");
                }
            }
        }
    }
}
